// The per-layer plan of a gemma4 GGUF file, as its keys define it (../shared/GGUF-ARCH-FACTS.md C.1, C.3,
// C.7): sliding or global attention, head dims, KV heads, rope base and rotated dims, FFN kind and width, and
// which layer's KV cache a KV-sharing layer reads. Shown by `tandem inspect`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace tandem::convert {

struct Gemma4LayerPlan {
  int layer = 0;
  bool sliding = false;
  int64_t head_dim = 0, value_dim = 0, n_head = 0, n_head_kv = 0;
  double rope_base = 0;
  int64_t rope_dims = 0;
  bool rope_freqs = false;  // global layers use rope_freqs.weight (proportional partial rope)
  std::string ffn;          // "dense" or "dense+moe"
  int64_t n_ff = 0, n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  int kv_source = -1;  // -1: the layer has its own KV; else the layer whose KV it reuses
};

// Throws Error naming the key when a required gemma4 key is missing or a per-layer array has the wrong
// length.
std::vector<Gemma4LayerPlan> gemma4_layer_plan(const gguf::GgufFile& f);

std::string gemma4_layer_plan_text(const std::vector<Gemma4LayerPlan>& plan);
nlohmann::json gemma4_layer_plan_json(const std::vector<Gemma4LayerPlan>& plan);

}  // namespace tandem::convert
