#include "model/hparams.h"

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

int64_t read_uniform_layer_int(const gguf::GgufFile& file, const std::string& key, int64_t n_layer,
                               std::optional<int64_t> fallback) {
  const gguf::Value* v = file.find(key);
  if (!v) {
    check(fallback.has_value(), "missing GGUF key " + key);
    return *fallback;
  }
  if (v->type() != gguf::ValueType::ARRAY) {
    check(v->is_integer(), "GGUF key " + key + " must be an integer, got " + v->type_name());
    return v->as_int();
  }
  const std::vector<int64_t> values = v->as_int_array();
  check(int64_t(values.size()) == n_layer, "GGUF key " + key + " has " + std::to_string(values.size()) +
                                               " per-layer entries for " + std::to_string(n_layer) +
                                               " layers");
  check(!values.empty(), "GGUF key " + key + " is an empty array");
  for (int64_t x : values)
    check(x == values[0], "GGUF key " + key +
                              " differs between layers; per-layer values are not supported for " +
                              file.architecture() + " models");
  return values[0];
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
  hp.n_ff =
      positive(a + "feed_forward_length", read_uniform_layer_int(f, a + "feed_forward_length", hp.n_layer));
  hp.n_head =
      positive(a + "attention.head_count", read_uniform_layer_int(f, a + "attention.head_count", hp.n_layer));
  hp.n_head_kv = positive(a + "attention.head_count_kv",
                          read_uniform_layer_int(f, a + "attention.head_count_kv", hp.n_layer, hp.n_head));
  check(hp.n_head % hp.n_head_kv == 0, "attention.head_count (" + std::to_string(hp.n_head) +
                                           ") must be a multiple of attention.head_count_kv (" +
                                           std::to_string(hp.n_head_kv) + ")");
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

  check(f.get_int(a + "expert_count", 0) == 0,
        "mixture-of-experts " + arch + " models (" + a + "expert_count > 0) are not supported yet");

  if (const gguf::Value* v = f.find(a + "vocab_size")) {
    hp.n_vocab = positive(a + "vocab_size", v->as_int());
  } else if (const gguf::Value* t = f.find("tokenizer.ggml.tokens")) {
    check(t->type() == gguf::ValueType::ARRAY, "tokenizer.ggml.tokens must be an array");
    hp.n_vocab = int64_t(t->as_array().size());
  }
  return hp;
}

}  // namespace tandem
