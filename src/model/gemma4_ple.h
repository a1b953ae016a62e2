// gemma4 E2B/E4B per-layer inputs (GGUF-ARCH-FACTS C.7): a small embedding per token and layer, mixed with a
// projection of the layer-0 input, and added by every layer through its own gate and projection.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/blocks.h"

namespace tandem {

class WeightLoader;

struct Gemma4PleLayer {
  Tensor inp_gate;   // blk.N.inp_gate.weight {n_embd, n_embd_pl}
  Tensor proj;       // blk.N.proj.weight {n_embd_pl, n_embd}
  Tensor post_norm;  // blk.N.post_norm.weight {n_embd}
};

struct Gemma4PleWeights {
  int64_t n_embd_pl = 0;
  Tensor token_embd;  // per_layer_token_embd.weight {n_embd_pl * n_layer, n_vocab}
  Tensor model_proj;  // per_layer_model_proj.weight {n_embd, n_embd_pl * n_layer}
  Tensor proj_norm;   // per_layer_proj_norm.weight {n_embd_pl}
  std::vector<Gemma4PleLayer> layers;
};

Gemma4PleWeights load_gemma4_ple(WeightLoader& ld, int64_t n_embd_pl, int64_t n_embd, int64_t n_layer,
                                 int64_t n_vocab);

// Scratch: the per-layer inputs {n_embd_pl, n_layer, T}, their token part, and one layer's gate {n_embd_pl,
// T}.
struct Gemma4PleScratch {
  Tensor inputs, token_part, gate;
};
size_t gemma4_ple_scratch_bytes(int64_t n_embd_pl, int64_t n_layer, int64_t max_rows);
Gemma4PleScratch gemma4_ple_scratch(int64_t n_embd_pl, int64_t n_layer, int64_t max_rows, void* base,
                                    DeviceId device);

// inputs = (RMS(model_proj . x0 / sqrt(n_embd)) * proj_norm + token_embd[tokens] * sqrt(n_embd_pl)) / sqrt(2)
// for the T rows of x0 (C.7 steps 1-3).
void gemma4_ple_inputs(const BlockRun& run, const Gemma4PleWeights& w, const Gemma4PleScratch& sc,
                       const Tensor& tokens, const Tensor& x0);
// x += RMS(proj_l(gelu_tanh(inp_gate_l . x) * inputs[:, l, :])) * post_norm_l (C.7 step 4); out is {n_embd,
// T} scratch.
void gemma4_ple_layer(const BlockRun& run, const Gemma4PleWeights& w, const Gemma4PleScratch& sc,
                      int64_t layer, const Tensor& x, const Tensor& out);

}  // namespace tandem
