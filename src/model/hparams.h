// Hyperparameters of a decoder-only transformer, read from the GGUF metadata (GGUF-ARCH-FACTS B.1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"

namespace tandem {

// One layer's shape. Architectures with uniform layers have n_layer equal entries; gemma4-style models mix
// sliding-window layers (their own head dims, KV heads, rope) with global ones.
struct LayerHparams {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  int64_t n_rot = 0;
  int64_t n_ff = 0;
  float rope_freq_base = 10000.0f;
  bool rope_freq_factors = true;  // rope_freqs.weight (when the model has it) applies to this layer
  int32_t sliding_window = 0;     // > 0: the layer sees only the last sliding_window positions; 0 = global
  bool moe = false;               // feed-forward kind: dense (false) or mixture of experts

  int64_t n_embd_q() const { return n_head * head_dim_k; }
  int64_t n_embd_k() const { return n_head_kv * head_dim_k; }
  int64_t n_embd_v() const { return n_head_kv * head_dim_v; }
  bool operator==(const LayerHparams&) const = default;
};

struct ModelHparams {
  std::string arch;  // general.architecture
  std::string name;  // general.name, may be empty
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  int64_t n_rot = 0;
  float rms_eps = 1e-6f;
  float attn_scale = 0.0f;  // 0: 1/sqrt(head_dim_k)
  RopeMode rope_mode = RopeMode::Norm;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;
  float rope_attn_factor = 1.0f;
  std::string rope_scaling_type = "none";
  bool qk_norm = false;          // per-head RMS norm of Q and K before rope (qwen3)
  float embedding_scale = 1.0f;  // token embeddings are multiplied by it (gemma: sqrt(n_embd))
  // Mixture of experts (0 = none): experts per MoE layer, experts each row uses, each expert's n_ff.
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  // > 0: a batch row with an added embedding is a *feature row* of this width instead (a DFlash drafter's
  // fused target features, n_target_layers * n_embd): it carries no token and computes no logits, and a
  // batch holds feature rows only or token rows only (the session refuses a mix). 0: added rows are n_embd
  // wide and summed with the token embedding.
  int64_t n_embd_features = 0;
  // Token ids the input embedding accepts when it differs from the logits' vocabulary (a DFlash drafter
  // with a reduced draft vocabulary, d2t: it reads target token ids); 0 = n_vocab.
  int64_t n_vocab_input = 0;
  // Per layer (n_layer entries). The scalar fields above are the file's global keys (layer 0's head counts
  // and n_ff); every layer's when the layers are uniform.
  std::vector<LayerHparams> layers;

  int64_t n_embd_q() const { return n_head * head_dim_k; }
  int64_t n_embd_k() const { return n_head_kv * head_dim_k; }
  int64_t n_embd_v() const { return n_head_kv * head_dim_v; }
  int64_t n_embd_added() const { return n_embd_features > 0 ? n_embd_features : n_embd; }
  int64_t n_token_ids() const { return n_vocab_input > 0 ? n_vocab_input : n_vocab; }
  float attention_scale() const;
  // Whether every layer has the same attention and feed-forward shape (no sliding windows either).
  bool uniform_layers() const;
  // The largest of a per-layer quantity (scratch sizing).
  int64_t max_layer(int64_t LayerHparams::*field) const;
};

// Reads the keys every decoder of this family shares, with the defaults of B.1, for arch `arch` (the key
// prefix). n_vocab comes from <arch>.vocab_size, else the length of tokenizer.ggml.tokens, else 0 (the caller
// then takes it from token_embd). Checks every value's range and the relations between them (head_count_kv
// divides head_count, n_rot even and <= key_length, ...) and throws Error naming the key otherwise.
ModelHparams read_decoder_hparams(const gguf::GgufFile& file, const std::string& arch);

// A per-layer integer key: a scalar (every layer) or an array with one entry per layer; `fallback` when the
// key is absent (no fallback: required, Error).
std::vector<int64_t> read_layer_ints(const gguf::GgufFile& file, const std::string& key, int64_t n_layer,
                                     std::optional<int64_t> fallback = std::nullopt);

}  // namespace tandem
