// Hugging Face Gemma4ForCausalLM / Gemma4ForConditionalGeneration config.json (hyperparameters in
// "text_config" when present, else at the top level) -> the gemma4 hyperparameters and the `gemma4.*` GGUF
// keys that llama.cpp's converter writes (../shared/GGUF-ARCH-FACTS.md C.1, C.3, C.7).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace tandem::convert {

struct Gemma4Hparams {
  std::string hf_architecture;
  std::string tensor_prefix;  // "model." or "model.language_model." (ConditionalGeneration checkpoints)
  int64_t n_layer = 0, n_ctx = 131072, n_embd = 0, n_ff = 0, n_head = 0;
  int64_t n_head_kv = 0;         // sliding layers
  int64_t n_head_kv_global = 0;  // global layers (num_global_key_value_heads, else n_head_kv)
  bool kv_global_in_config = false;
  int64_t head_dim = 0;         // sliding layers
  int64_t global_head_dim = 0;  // global layers
  int64_t n_vocab = 0;          // config vocab_size (rows of embed_tokens)
  int64_t n_swa = 0;
  std::vector<bool> sliding;  // per layer, true = sliding_attention
  double rope_theta = 1e6, rope_theta_swa = 10000.0;
  double partial_rotary_swa = 1.0;     // top-level rope_parameters.partial_rotary_factor (facts C.1)
  double partial_rotary_global = 1.0;  // rope_parameters.full_attention.partial_rotary_factor (rope_freqs)
  double rms_norm_eps = 1e-6;
  int64_t shared_kv_layers = 0;
  bool double_wide_mlp = false;
  bool k_eq_v = false;  // attention_k_eq_v: global layers have no v_proj
  int64_t n_embd_per_layer = 0, n_vocab_per_layer = 0;
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  double final_logit_softcapping = 0.0;  // 0: absent
  bool tie_word_embeddings = true;

  bool is_sliding(int64_t il) const { return sliding[size_t(il)]; }
  int64_t head_dim_of(int64_t il) const { return is_sliding(il) ? head_dim : global_head_dim; }
  int64_t n_head_kv_of(int64_t il) const { return is_sliding(il) ? n_head_kv : n_head_kv_global; }
  bool kv_shared(int64_t il) const { return il >= n_layer - shared_kv_layers; }
  int64_t n_ff_of(int64_t il) const { return double_wide_mlp && kv_shared(il) ? 2 * n_ff : n_ff; }
};

bool is_gemma4_architecture(std::string_view hf_architecture);

// Throws Error naming the file and key for a missing or invalid value.
Gemma4Hparams parse_gemma4_config(std::string_view json_text, const std::string& source);
// Folds transformers 5.17's "per_layer_config" (full-attention layers' head_dim / num_key_value_heads) into
// global_head_dim / num_global_key_value_heads; an Error when layers disagree.
void fold_per_layer_config(nlohmann::json& text, const std::string& source);

// The gemma4.* keys (facts C.1). n_vocab_gguf: the token count the file gets (token_embd is trimmed to it).
// arch: the key prefix (diffusion-gemma writes the same keys under its own name, facts D.1).
void add_gemma4_metadata(const Gemma4Hparams& hp, gguf::GgufWriter& w, const std::string& arch = "gemma4");

// rope_freqs.weight ({global_head_dim/2}, F32): 1.0 for the first global_head_dim*partial_rotary_global/2
// entries, 1e30 after them ("proportional" partial rope on global layers, facts C.3).
std::vector<float> gemma4_rope_freqs(const Gemma4Hparams& hp);

}  // namespace tandem::convert
