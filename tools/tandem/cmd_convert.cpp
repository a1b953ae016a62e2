// `tandem convert HF_DIR -o OUT.gguf [--type T] [--threads N] [--vocab-only] [--name NAME]`:
// a Hugging Face checkpoint (config.json, *.safetensors, tokenizer.json) -> GGUF (see convert/hf_to_gguf.h).
#include <cstdio>
#include <memory>

#include "commands.h"
#include "convert/hf_to_gguf.h"
#include "core/error.h"
#include "core/interrupt_cleanup.h"
#include "flag_checks.h"

namespace tandem::cli {
namespace {

struct ConvertArgs {
  std::string hf_dir;
  std::string output;
  std::string type = "auto";
  int threads = 0;
  bool vocab_only = false;
  std::string name;
  std::string target_model_dir;
  bool quiet = false;
};

void run_convert(const ConvertArgs& a) {
  const auto type = convert::out_type_from_name(a.type);
  check(type.has_value(), "--type " + a.type + " is not one of: " + convert::out_type_names());
  check_threads_flag(a.threads);
  install_interrupt_cleanup();  // Ctrl-C leaves no OUTPUT.tmp behind
  convert::ConvertOptions o;
  o.hf_dir = a.hf_dir;
  o.output = a.output;
  o.type = *type;
  o.threads = a.threads;
  o.vocab_only = a.vocab_only;
  o.name = a.name;
  o.target_model_dir = a.target_model_dir;
  if (!a.quiet) o.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  const auto r = convert::convert_hf_to_gguf(o);
  if (a.vocab_only) {
    std::printf("wrote %s (vocab only, arch %s)\n", a.output.c_str(), r.arch.c_str());
  } else {
    std::printf("wrote %s (arch %s, type %s, %zu tensors)\n", a.output.c_str(), r.arch.c_str(),
                convert::out_type_name(r.type), r.n_tensors);
  }
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Convert a Hugging Face checkpoint directory (config.json, model.safetensors or sharded "
      "model.safetensors.index.json, tokenizer.json) to GGUF. Supported: LlamaForCausalLM, "
      "Qwen3ForCausalLM, Gemma 4, DFlashDraftModel (with --target-model-dir).");
  cmd->add_option("hf_dir", args->hf_dir, "Hugging Face model directory")->required();
  cmd->add_option("-o,--output", args->output,
                  "output .gguf file (written to OUT.tmp, renamed when complete)")
      ->required();
  cmd->add_option(
      "--type", args->type,
      "tensor type of the matrices: auto (bf16 if the checkpoint is bf16, else f16), f32, f16, bf16, "
      "q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m (q4_k / q5_k with q6_k for the output head and some "
      "attn_v / ffn_down, as `tandem quantize`); 1-D tensors (norms) are always f32");
  cmd->add_option("--threads", args->threads, "quantization threads (0: one per hardware thread)");
  cmd->add_flag("--vocab-only", args->vocab_only,
                "write only the tokenizer (tokenizer.json; config.json optional), no tensors");
  cmd->add_option("--name", args->name, "general.name (default: the directory name)");
  cmd->add_option("--target-model-dir", args->target_model_dir,
                  "DFlash drafters (DFlashDraftModel): the target model's HF directory (its tokenizer and "
                  "vocabulary go into the drafter file)");
  cmd->add_flag("-q,--quiet", args->quiet, "no per-tensor progress lines");
  cmd->callback([args] {
    if (parse_only()) return;
    run_convert(*args);
  });
}

}  // namespace tandem::cli
