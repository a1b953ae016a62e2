// The mixture-of-experts branch of a gemma4 layer (GGUF-ARCH-FACTS C.5): weights, scratch and forward. The
// layer (gemma4.cpp) runs its dense MLP as usual and adds this branch before the post-FFN norm.
#pragma once

#include <cstdint>
#include <optional>

#include "backend/backend.h"
#include "model/blocks.h"
#include "model/hparams.h"

namespace tandem {

class WeightLoader;

struct Gemma4MoeWeights {
  Tensor router;                                // ffn_gate_inp.weight {n_embd, n_expert}
  Tensor router_scale;                          // ffn_gate_inp.scale {n_embd}
  Tensor pre_norm_2, post_norm_1, post_norm_2;  // {n_embd}
  Tensor gate_exps, up_exps;  // {n_embd, n_ff_exp (this rank's rows), n_expert}, views of gate_up when fused
  Tensor down_exps;           // {n_ff_exp (this rank's columns), n_embd, n_expert}
  std::optional<Tensor> down_scale;  // ffn_down_exps.scale {n_expert}
};

// Loads layer il's expert tensors: the fused ffn_gate_up_exps or separate ffn_gate_exps / ffn_up_exps (Error
// when neither or both are present, or a shape does not match the hparams).
Gemma4MoeWeights load_gemma4_moe(WeightLoader& ld, const ModelHparams& hp, int64_t il);

// Scratch for T rows: the router input and logits, the routing, and the per-selected-expert activations.
struct Gemma4MoeScratch {
  Tensor router_in;   // {n_embd, T}
  Tensor logits;      // {n_expert, T}
  Tensor ids;         // I32 {k, T}
  Tensor weights;     // {k, T}
  Tensor gate, up;    // {n_ff_exp, k, T}
  Tensor expert_out;  // {n_embd, k, T}
  Tensor out;         // {n_embd, T}
};

// Bytes of scratch for max_rows rows (n_ff_exp: this rank's rows), and the views at `base`.
size_t gemma4_moe_scratch_bytes(const ModelHparams& hp, int64_t n_ff_exp, int64_t max_rows);
Gemma4MoeScratch gemma4_moe_scratch(const ModelHparams& hp, int64_t n_ff_exp, int64_t max_rows, void* base,
                                    DeviceId device);

// The selected experts' outputs of T rows: expert_out {n_embd, k, T} = down_e(gelu_tanh(gate_e(h)) * up_e(h))
// for the k experts e of each row, and their weights {k, T}: views into the scratch.
struct Gemma4MoeOutputs {
  Tensor expert_out, weights;
};

// The expert branch up to the experts' outputs (C.5 steps 1-7): h = RMS(x) * pre_ffw_norm_2 (into h), the
// experts e and weights w_j (times the per-expert down scale) chosen by the router on RMS(x) / sqrt(n_embd) *
// router_scale, each selected expert's output. Their weighted sum (moe_combine; all-reduced under a tensor
// split) and its post-norm (post_ffw_norm_2) are the caller's (Ops::moe_residual_add, with the dense branch's).
Gemma4MoeOutputs gemma4_moe_experts(const BlockRun& run, const Gemma4MoeWeights& w, const Gemma4MoeScratch& sc,
                                    const ModelHparams& hp, const Tensor& x, const Tensor& h);

}  // namespace tandem
