// Hugging Face config.json -> the hyperparameters of a supported architecture, and the `<arch>.*` GGUF keys
// that llama.cpp's converter writes for them (../shared/GGUF-ARCH-FACTS.md B.1, B.6).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace tandem::convert {

// RoPE scaling from config.json "rope_scaling" (or "rope_parameters"); type "" means none.
struct RopeScaling {
  std::string type;  // "", "linear", "yarn" or "llama3"
  double factor = 1.0;
  int64_t original_context_length = 0;  // yarn, llama3 (original_max_position_embeddings)
  double low_freq_factor = 1.0;         // llama3
  double high_freq_factor = 4.0;        // llama3
};

struct ModelHparams {
  std::string hf_architecture;  // "Qwen3ForCausalLM"
  std::string arch;             // GGUF architecture: "qwen3" or "llama"
  int64_t n_layer = 0;
  int64_t n_ctx = 0;  // max_position_embeddings
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;             // from config "head_dim", else n_embd / n_head
  bool head_dim_in_config = false;  // llama.cpp writes key_length/value_length only then
  int64_t n_vocab = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v/o biases (config "attention_bias")
  bool mlp_bias = false;        // gate/up/down biases (llama config "mlp_bias")
  RopeScaling rope_scaling;

  int64_t n_rot() const { return head_dim; }  // both archs rotate the whole head
};

// "Qwen3ForCausalLM" -> "qwen3"; "" when unsupported.
std::string gguf_arch_for(std::string_view hf_architecture);
// "LlamaForCausalLM, Qwen3ForCausalLM", for messages.
std::string supported_architectures();

// Parse config.json text; source names the file in error messages. Throws Error for an unsupported
// architecture (listing the supported ones), missing or invalid hyperparameters, or an unsupported rope
// scaling type.
ModelHparams parse_hf_config(std::string_view json_text, const std::string& source);
// Reads hf_dir/config.json; a missing file is an Error that says so.
ModelHparams load_hf_config(const std::filesystem::path& hf_dir);

// Sets the `<arch>.*` hyperparameter keys (not general.* nor tokenizer.*) with llama.cpp's value types:
// UINT32 for counts and lengths, FLOAT32 for rope.freq_base, epsilons and scaling factors.
void add_hparams_metadata(const ModelHparams& hp, gguf::GgufWriter& w);

// llama3 rope scaling: the per-frequency divisors of `rope_freqs.weight` ({n_rot/2}, F32), facts B.6.
std::vector<float> llama3_rope_freqs(const ModelHparams& hp);

}  // namespace tandem::convert
