// libFuzzer harness for what `tandem convert` reads as JSON: the bytes are used as config.json
// (parse_hf_config, then the GGUF hyperparameter keys) and as tokenizer.json (add_tokenizer_metadata, through
// a file in a private temporary directory). Each either succeeds or throws tandem::Error; a JSON library
// exception escaping, any other exception or a sanitizer report is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "convert/hf_config.h"
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
