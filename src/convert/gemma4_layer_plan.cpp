#include "convert/gemma4_layer_plan.h"

#include <cstdio>

#include "core/error.h"

namespace tandem::convert {
namespace {

const gguf::Value& need(const gguf::GgufFile& f, const std::string& key) {
  const gguf::Value* v = f.find(key);
  check(v != nullptr, f.path() + ": gemma4 file without the key " + key);
  return *v;
}

// A key that is a scalar or a per-layer array (feed_forward_length, attention.head_count_kv).
int64_t per_layer_int(const gguf::GgufFile& f, const std::string& key, int il, int n_layer) {
  const gguf::Value& v = need(f, key);
  if (v.type() != gguf::ValueType::ARRAY) return v.as_int();
  check(int64_t(v.as_array().size()) == n_layer, f.path() + ": " + key + " has " +
                                                     std::to_string(v.as_array().size()) + " entries for " +
                                                     std::to_string(n_layer) + " layers");
  return v.as_array()[size_t(il)].as_int();
}

int64_t int_or(const gguf::GgufFile& f, const std::string& key, int64_t fallback) {
  const gguf::Value* v = f.find(key);
  return v ? v->as_int() : fallback;
}

}  // namespace

std::vector<Gemma4LayerPlan> gemma4_layer_plan(const gguf::GgufFile& f) {
  const std::string a = "gemma4.";
  const int n_layer = int(need(f, a + "block_count").as_int());
  const std::string pattern_key = a + "attention.sliding_window_pattern";  // named: GCC 13 flags a reference
  const gguf::Value& pattern = need(f, pattern_key);                       // bound through a temporary key
  check(pattern.type() == gguf::ValueType::ARRAY && int64_t(pattern.as_array().size()) == n_layer,
        f.path() + ": " + a + "attention.sliding_window_pattern must have one entry per layer (" +
            std::to_string(n_layer) + ")");
  const int64_t shared = int_or(f, a + "attention.shared_kv_layers", 0);
  const int64_t n_expert = int_or(f, a + "expert_count", 0);
  std::vector<Gemma4LayerPlan> out;
  for (int il = 0; il < n_layer; ++il) {
    Gemma4LayerPlan p;
    p.layer = il;
    p.sliding = pattern.as_array()[size_t(il)].as_bool();
    const std::string swa = p.sliding ? "_swa" : "";
    p.head_dim = need(f, a + "attention.key_length" + swa).as_int();
    p.value_dim = need(f, a + "attention.value_length" + swa).as_int();
    p.n_head = per_layer_int(f, a + "attention.head_count", il, n_layer);
    p.n_head_kv = per_layer_int(f, a + "attention.head_count_kv", il, n_layer);
    p.rope_base = need(f, a + "rope.freq_base" + swa).as_float();
    p.rope_dims = need(f, a + "rope.dimension_count" + swa).as_int();
    p.rope_freqs = !p.sliding && f.find_tensor("rope_freqs.weight") != nullptr;
    p.n_ff = per_layer_int(f, a + "feed_forward_length", il, n_layer);
    p.ffn = n_expert > 0 ? "dense+moe" : "dense";
    if (n_expert > 0) {
      p.n_expert = n_expert;
      p.n_expert_used = need(f, a + "expert_used_count").as_int();
      p.n_ff_exp = need(f, a + "expert_feed_forward_length").as_int();
    }
    // facts C.7: the last `shared` layers reuse the last KV-owning layer of their type.
    if (shared > 0 && il >= n_layer - shared) p.kv_source = int(n_layer - shared - (p.sliding ? 2 : 1));
    out.push_back(p);
  }
  return out;
}

std::string gemma4_layer_plan_text(const std::vector<Gemma4LayerPlan>& plan) {
  std::string s =
      "  LAYER  ATTN     HEAD_DIM  HEADS  KV_HEADS  ROPE_BASE  ROPE_DIMS  N_FF   FFN                      "
      "KV\n";
  char buf[256];
  for (const auto& p : plan) {
    std::string ffn = p.ffn;
    if (p.n_expert > 0)
      ffn += " (" + std::to_string(p.n_expert_used) + "/" + std::to_string(p.n_expert) + " x " +
             std::to_string(p.n_ff_exp) + ")";
    const std::string kv = p.kv_source < 0 ? "own" : "layer " + std::to_string(p.kv_source);
    std::snprintf(buf, sizeof buf, "  %5d  %-7s  %8lld  %5lld  %8lld  %9.0f  %4lld%-5s  %5lld  %-23s  %s\n",
                  p.layer, p.sliding ? "sliding" : "global", static_cast<long long>(p.head_dim),
                  static_cast<long long>(p.n_head), static_cast<long long>(p.n_head_kv), p.rope_base,
                  static_cast<long long>(p.rope_dims), p.rope_freqs ? " +rf" : "",
                  static_cast<long long>(p.n_ff), ffn.c_str(), kv.c_str());
    s += buf;
  }
  return s + "  (+rf: global layer, rotation frequencies divided by rope_freqs.weight)\n";
}

nlohmann::json gemma4_layer_plan_json(const std::vector<Gemma4LayerPlan>& plan) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : plan) {
    nlohmann::json l = {
        {"layer", p.layer},
        {"attention", p.sliding ? "sliding" : "global"},
        {"head_dim", p.head_dim},
        {"value_dim", p.value_dim},
        {"n_head", p.n_head},
        {"n_head_kv", p.n_head_kv},
        {"rope_base", p.rope_base},
        {"rope_dims", p.rope_dims},
        {"rope_freqs", p.rope_freqs},
        {"ffn", p.ffn},
        {"n_ff", p.n_ff},
        {"kv_source_layer", p.kv_source < 0 ? nlohmann::json(nullptr) : nlohmann::json(p.kv_source)}};
    if (p.n_expert > 0) {
      l["n_expert"] = p.n_expert;
      l["n_expert_used"] = p.n_expert_used;
      l["n_ff_exp"] = p.n_ff_exp;
    }
    j.push_back(l);
  }
  return j;
}

}  // namespace tandem::convert
