#include "model/hparams.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"

namespace tandem {

namespace {

// A positive integer key that fits comfortably in int32 arithmetic (dims, counts).
int64_t positive(const std::string& key, int64_t v) {
  check(v > 0 && v <= (int64_t(1) << 31),
        "GGUF key " + key + " must be a positive integer, got " + std::to_string(v));
  return v;
}

}  // namespace

float ModelHparams::attention_scale() const {
  return attn_scale != 0.0f ? attn_scale : 1.0f / std::sqrt(float(head_dim_k));
}

bool ModelHparams::uniform_layers() const {
  for (const LayerHparams& l : layers)
    if (!(l == layers.front())) return false;
  return layers.empty() || layers.front().sliding_window == 0;
}

int64_t ModelHparams::max_layer(int64_t LayerHparams::*field) const {
  int64_t m = 0;
  for (const LayerHparams& l : layers) m = std::max(m, l.*field);
  return m;
}

std::vector<int64_t> read_layer_ints(const gguf::GgufFile& file, const std::string& key, int64_t n_layer,
                                     std::optional<int64_t> fallback) {
  const gguf::Value* v = file.find(key);
  if (!v) {
    check(fallback.has_value(), "missing GGUF key " + key);
    return std::vector<int64_t>(size_t(n_layer), *fallback);
  }
  if (v->type() != gguf::ValueType::ARRAY) {
    check(v->is_integer(), "GGUF key " + key + " must be an integer, got " + v->type_name());
    return std::vector<int64_t>(size_t(n_layer), v->as_int());
  }
  std::vector<int64_t> values = v->as_int_array();
  check(int64_t(values.size()) == n_layer, "GGUF key " + key + " has " + std::to_string(values.size()) +
                                               " per-layer entries for " + std::to_string(n_layer) +
                                               " layers");
  return values;
}

ModelHparams read_decoder_hparams(const gguf::GgufFile& f, const std::string& arch) {
  ModelHparams hp;
  const std::string a = arch + ".";
  hp.arch = arch;
  hp.name = f.get_string("general.name", std::string());
  hp.n_ctx_train = positive(a + "context_length", f.get_int(a + "context_length"));
  hp.n_embd = positive(a + "embedding_length", f.get_int(a + "embedding_length"));
  hp.n_layer = positive(a + "block_count", f.get_int(a + "block_count"));
  check(hp.n_layer <= 4096,
        "GGUF key " + a + "block_count is implausibly large: " + std::to_string(hp.n_layer));
  const std::vector<int64_t> n_ff = read_layer_ints(f, a + "feed_forward_length", hp.n_layer);
  const std::vector<int64_t> n_head = read_layer_ints(f, a + "attention.head_count", hp.n_layer);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    positive(a + "feed_forward_length", n_ff[size_t(il)]);
    positive(a + "attention.head_count", n_head[size_t(il)]);
  }
  const std::vector<int64_t> n_head_kv =
      read_layer_ints(f, a + "attention.head_count_kv", hp.n_layer, n_head[0]);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    positive(a + "attention.head_count_kv", n_head_kv[size_t(il)]);
    check(n_head[size_t(il)] % n_head_kv[size_t(il)] == 0,
          "attention.head_count (" + std::to_string(n_head[size_t(il)]) +
              ") must be a multiple of attention.head_count_kv (" + std::to_string(n_head_kv[size_t(il)]) +
              ")" + (hp.n_layer > 1 ? " in layer " + std::to_string(il) : std::string()));
  }
  hp.n_ff = n_ff[0];
  hp.n_head = n_head[0];
  hp.n_head_kv = n_head_kv[0];
  check(hp.n_embd % hp.n_head == 0 || f.find(a + "attention.key_length"),
        "embedding_length is not a multiple of head_count and attention.key_length is missing");
  hp.head_dim_k =
      positive(a + "attention.key_length", f.get_int(a + "attention.key_length", hp.n_embd / hp.n_head));
  hp.head_dim_v =
      positive(a + "attention.value_length", f.get_int(a + "attention.value_length", hp.n_embd / hp.n_head));
  hp.n_rot = positive(a + "rope.dimension_count", f.get_int(a + "rope.dimension_count", hp.head_dim_k));
  check(hp.n_rot % 2 == 0 && hp.n_rot <= hp.head_dim_k,
        "rope.dimension_count (" + std::to_string(hp.n_rot) +
            ") must be even and at most attention.key_length (" + std::to_string(hp.head_dim_k) + ")");
  hp.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon"));
  check(std::isfinite(hp.rms_eps) && hp.rms_eps > 0.0f,
        "GGUF key " + a + "attention.layer_norm_rms_epsilon must be positive");
  hp.attn_scale = float(f.get_float(a + "attention.scale", 0.0));
  check(std::isfinite(hp.attn_scale) && hp.attn_scale >= 0.0f,
        "GGUF key " + a + "attention.scale must be >= 0");

  hp.rope_freq_base = float(f.get_float(a + "rope.freq_base", 10000.0));
  check(std::isfinite(hp.rope_freq_base) && hp.rope_freq_base > 0.0f,
        "GGUF key " + a + "rope.freq_base must be positive");
  hp.rope_scaling_type = f.get_string(a + "rope.scaling.type", std::string("linear"));
  double factor = f.get_float(a + "rope.scaling.factor", f.get_float(a + "rope.scale_linear", 0.0));
  check(std::isfinite(factor) && factor >= 0.0, "GGUF key " + a + "rope.scaling.factor must be >= 0");
  if (hp.rope_scaling_type == "none") factor = 0.0;
  check(hp.rope_scaling_type == "none" || hp.rope_scaling_type == "linear",
        "rope scaling type '" + hp.rope_scaling_type + "' (" + a +
            "rope.scaling.type) is not supported yet; supported: none, linear (llama3 scaling comes as "
            "rope_freqs.weight)");
  hp.rope_freq_scale = factor == 0.0 ? 1.0f : float(1.0 / factor);
  hp.rope_attn_factor = float(f.get_float(a + "rope.scaling.attn_factor", 1.0));
  check(std::isfinite(hp.rope_attn_factor) && hp.rope_attn_factor > 0.0f,
        "GGUF key " + a + "rope.scaling.attn_factor must be positive");

  // Mixture of experts (gemma4 C.5; architectures without MoE support refuse n_expert > 0 in their loader).
  hp.n_expert = f.get_int(a + "expert_count", 0);
  check(hp.n_expert >= 0 && hp.n_expert <= 4096, "GGUF key " + a + "expert_count must be in 0..4096");
  if (hp.n_expert > 0) {
    hp.n_expert_used = f.get_int(a + "expert_used_count", 0);
    check(hp.n_expert_used >= 1 && hp.n_expert_used <= hp.n_expert,
          "GGUF key " + a + "expert_used_count (" + std::to_string(hp.n_expert_used) +
              ") must be between 1 and " + a + "expert_count (" + std::to_string(hp.n_expert) + ")");
    check(hp.n_expert_used <= Ops::kMaxMoeTopK, "GGUF key " + a + "expert_used_count: at most " +
                                                    std::to_string(Ops::kMaxMoeTopK) +
                                                    " experts per token are supported");
    hp.n_ff_exp = f.get_int(a + "expert_feed_forward_length", 0);
    check(hp.n_ff_exp >= 1 && hp.n_ff_exp <= (int64_t(1) << 24),
          "GGUF key " + a + "expert_feed_forward_length must be set and positive when " + a +
              "expert_count > 0");
  }

  // Sliding-window layers (gemma4's keys, read for every architecture of the family): a window, the layers
  // that use it (a per-layer bool pattern; no pattern = every layer), and their own head dims and rope.
  const int64_t window = f.get_int(a + "attention.sliding_window", 0);
  check(window >= 0 && window <= (int64_t(1) << 30),
        "GGUF key " + a + "attention.sliding_window must be >= 0");
  std::vector<bool> sliding(size_t(hp.n_layer), window > 0);
  if (const gguf::Value* pat = f.find(a + "attention.sliding_window_pattern"); pat && window > 0) {
    check(pat->type() == gguf::ValueType::ARRAY,
          "GGUF key " + a + "attention.sliding_window_pattern must be an array");
    const auto& items = pat->as_array();
    check(int64_t(items.size()) == hp.n_layer, "GGUF key " + a + "attention.sliding_window_pattern has " +
                                                   std::to_string(items.size()) + " entries for " +
                                                   std::to_string(hp.n_layer) + " layers");
    for (size_t il = 0; il < items.size(); ++il) sliding[il] = items[il].as_bool();
  }
  const bool any_sliding = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
  const bool mixed = any_sliding && std::find(sliding.begin(), sliding.end(), false) != sliding.end();
  hp.layers.resize(size_t(hp.n_layer));
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerHparams& L = hp.layers[size_t(il)];
    L.n_head = n_head[size_t(il)];
    L.n_head_kv = n_head_kv[size_t(il)];
    L.n_ff = n_ff[size_t(il)];
    L.head_dim_k = hp.head_dim_k;
    L.head_dim_v = hp.head_dim_v;
    L.n_rot = hp.n_rot;
    L.rope_freq_base = hp.rope_freq_base;
    L.moe = hp.n_expert > 0;  // gemma4 MoE models have experts in every layer (C.5)
    if (!sliding[size_t(il)]) continue;
    L.sliding_window = int32_t(window);
    L.rope_freq_factors =
        !mixed;  // mixed models: rope_freqs belongs to the global layers (GGUF-ARCH-FACTS C.3)
    L.head_dim_k =
        positive(a + "attention.key_length_swa", f.get_int(a + "attention.key_length_swa", hp.head_dim_k));
    L.head_dim_v = positive(a + "attention.value_length_swa",
                            f.get_int(a + "attention.value_length_swa", hp.head_dim_v));
    L.n_rot =
        positive(a + "rope.dimension_count_swa", f.get_int(a + "rope.dimension_count_swa", L.head_dim_k));
    check(L.n_rot % 2 == 0 && L.n_rot <= L.head_dim_k,
          "rope.dimension_count_swa (" + std::to_string(L.n_rot) +
              ") must be even and at most attention.key_length_swa (" + std::to_string(L.head_dim_k) + ")");
    L.rope_freq_base = float(f.get_float(a + "rope.freq_base_swa", hp.rope_freq_base));
    check(std::isfinite(L.rope_freq_base) && L.rope_freq_base > 0.0f,
          "GGUF key " + a + "rope.freq_base_swa must be positive");
  }
  if (const gguf::Value* v = f.find(a + "vocab_size")) {
    hp.n_vocab = positive(a + "vocab_size", v->as_int());
  } else if (const gguf::Value* t = f.find("tokenizer.ggml.tokens")) {
    check(t->type() == gguf::ValueType::ARRAY, "tokenizer.ggml.tokens must be an array");
    hp.n_vocab = int64_t(t->as_array().size());
  }
  return hp;
}

}  // namespace tandem
