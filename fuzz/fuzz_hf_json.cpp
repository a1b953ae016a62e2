// libFuzzer harness for what `tandem convert` reads as JSON: the bytes are used as config.json of every
// architecture family convert reads (the llama/qwen3 parser, Gemma 4, DiffusionGemma, DFlash: each parsed,
// then its GGUF keys written and its tensor plan made) and as tokenizer.json (add_tokenizer_metadata, through
// a file in a private temporary directory). For DiffusionGemma, bytes after a NUL are its
// generation_config.json. Each either succeeds or throws tandem::Error; a JSON library exception escaping,
// any other exception or a sanitizer report is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "convert/dflash_plan.h"
#include "convert/diffusion_gemma_config.h"
#include "convert/gemma4_config.h"
#include "convert/gemma4_plan.h"
#include "convert/hf_config.h"
#include "convert/tensor_plan.h"
#include "convert/tokenizer_to_gguf.h"
#include "core/error.h"
#include "gguf/gguf.h"

namespace {

const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("tandem_fuzz_hf_json_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tandem::convert::ModelHparams hp = tandem::convert::parse_hf_config(text, "config.json");
    tandem::gguf::GgufWriter w;
    tandem::convert::add_hparams_metadata(hp, w);
    if (hp.rope_scaling.type == "llama3") (void)tandem::convert::llama3_rope_freqs(hp);
    (void)tandem::convert::plan_tensors(hp);
  } catch (const tandem::Error&) {
  }
  const size_t nul = text.find('\0');
  const std::string_view config = text.substr(0, nul);
  const std::string_view generation =
      nul == std::string_view::npos ? std::string_view() : text.substr(nul + 1);
  try {
    const tandem::convert::Gemma4Hparams hp = tandem::convert::parse_gemma4_config(config, "config.json");
    tandem::gguf::GgufWriter w;
    tandem::convert::add_gemma4_metadata(hp, w);
    (void)tandem::convert::plan_gemma4_tensors(hp, hp.n_vocab);
    (void)tandem::convert::gemma4_rope_freqs(hp);
  } catch (const tandem::Error&) {
  }
  try {
    const tandem::convert::DiffusionGemmaConfig c = tandem::convert::parse_diffusion_gemma_config(
        config, "config.json", generation, "generation_config.json");
    tandem::gguf::GgufWriter w;
    tandem::convert::add_gemma4_metadata(c.text, w, "diffusion-gemma");
    (void)tandem::convert::plan_diffusion_gemma_tensors(c, c.text.n_vocab);
  } catch (const tandem::Error&) {
  }
  try {
    const tandem::convert::DflashConfig c = tandem::convert::parse_dflash_config(config, "config.json");
    tandem::gguf::GgufWriter w;
    tandem::convert::add_hparams_metadata(c.hp, w);
    (void)tandem::convert::plan_dflash_tensors(c, "model.");
  } catch (const tandem::Error&) {
  }
  try {
    {
      std::ofstream out(work_dir() / "tokenizer.json", std::ios::binary | std::ios::trunc);
      out.write(text.data(), std::streamsize(text.size()));
    }
    tandem::gguf::GgufWriter w;
    tandem::convert::add_tokenizer_metadata(work_dir(), w);
  } catch (const tandem::Error&) {
  }
  return 0;
}
