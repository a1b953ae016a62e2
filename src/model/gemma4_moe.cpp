// gemma4's mixture-of-experts branch (GGUF-ARCH-FACTS C.5), on Ops::moe_route / matmul_id / moe_combine: the
// routing stays on the device (no host sync, fixed-size buffers), so decode steps can be recorded as graphs.
#include "model/gemma4_moe.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "model/weight_loader.h"

namespace tandem {

namespace {

constexpr size_t kAlign = 256;
size_t padded(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// Half `half` of a fused gate_up view: the whole {in, 2 n_ff_exp, n_expert}, or a tensor-split rank's
// {in, rows, 2, n_expert} (both halves cut, weight_loader.h).
Tensor fused_half(Tensor gu, int64_t n_ff_exp, int half) {
  if (gu.ne[1] == 2 * n_ff_exp && gu.ne[3] == 1) {  // whole: rows [0, n) are gate, [n, 2n) up
    const int64_t n = n_ff_exp;
    gu.ne = {gu.ne[0], n, 2, gu.ne[2]};
    gu.nb = {gu.nb[0], gu.nb[1], gu.nb[1] * size_t(n), gu.nb[2]};
  }
  Tensor v = gu;
  if (v.data) v.data = static_cast<char*>(v.data) + size_t(half) * gu.nb[2];
  v.ne = {gu.ne[0], gu.ne[1], gu.ne[3], 1};
  v.nb = {gu.nb[0], gu.nb[1], gu.nb[3], gu.nb[3] * size_t(gu.ne[3])};
  return v;
}

}  // namespace

Gemma4MoeWeights load_gemma4_moe(WeightLoader& ld, const ModelHparams& hp, int64_t il) {
  const int64_t E = hp.n_embd, ne = hp.n_expert, fe = hp.n_ff_exp;
  Gemma4MoeWeights w;
  w.router = ld.matrix(layer_tensor_name(il, "ffn_gate_inp.weight"), {E, ne});
  w.router_scale = ld.vector(layer_tensor_name(il, "ffn_gate_inp.scale"), E);
  w.pre_norm_2 = ld.vector(layer_tensor_name(il, "pre_ffw_norm_2.weight"), E);
  w.post_norm_1 = ld.vector(layer_tensor_name(il, "post_ffw_norm_1.weight"), E);
  w.post_norm_2 = ld.vector(layer_tensor_name(il, "post_ffw_norm_2.weight"), E);
  const std::string fused = layer_tensor_name(il, "ffn_gate_up_exps.weight");
  const std::string gate = layer_tensor_name(il, "ffn_gate_exps.weight"),
                    up = layer_tensor_name(il, "ffn_up_exps.weight");
  const bool has_fused = ld.has(fused), has_gate = ld.has(gate), has_up = ld.has(up);
  check(has_fused != (has_gate || has_up),
        has_fused ? "layer " + std::to_string(il) + " has both ffn_gate_up_exps and separate gate/up experts"
                  : "missing tensor " + fused + " (or " + gate + " and " + up + ")");
  if (has_fused) {
    const Tensor gu = ld.matrix(fused, {E, 2 * fe, ne});
    w.gate_exps = fused_half(gu, fe, 0);
    w.up_exps = fused_half(gu, fe, 1);
  } else {
    w.gate_exps = ld.matrix(gate, {E, fe, ne});
    w.up_exps = ld.matrix(up, {E, fe, ne});
  }
  w.down_exps = ld.matrix(layer_tensor_name(il, "ffn_down_exps.weight"), {fe, E, ne});
  w.down_scale = ld.optional_vector(layer_tensor_name(il, "ffn_down_exps.scale"), ne);
  return w;
}

size_t gemma4_moe_scratch_bytes(const ModelHparams& hp, int64_t n_ff_exp, int64_t max_rows) {
  const size_t T = size_t(max_rows), k = size_t(hp.n_expert_used), E = size_t(hp.n_embd);
  return padded(E * T * 4) + padded(size_t(hp.n_expert) * T * 4) + 2 * padded(k * T * 4) +
         2 * padded(size_t(n_ff_exp) * k * T * 4) + padded(E * k * T * 4) + padded(E * T * 4);
}

Gemma4MoeScratch gemma4_moe_scratch(const ModelHparams& hp, int64_t n_ff_exp, int64_t max_rows, void* base,
                                    DeviceId device) {
  const int64_t T = max_rows, k = hp.n_expert_used, E = hp.n_embd;
  char* p = static_cast<char*>(base);
  auto take = [&](DType dt, std::initializer_list<int64_t> shape) {
    Tensor t = Tensor::contiguous(dt, shape, p, device);
    p += padded(t.nbytes());
    return t;
  };
  Gemma4MoeScratch s;
  s.router_in = take(DType::F32, {E, T});
  s.logits = take(DType::F32, {hp.n_expert, T});
  s.ids = take(DType::I32, {k, T});
  s.weights = take(DType::F32, {k, T});
  s.gate = take(DType::F32, {n_ff_exp, k, T});
  s.up = take(DType::F32, {n_ff_exp, k, T});
  s.expert_out = take(DType::F32, {E, k, T});
  s.out = take(DType::F32, {E, T});
  return s;
}

Gemma4MoeOutputs gemma4_moe_experts(const BlockRun& run, const Gemma4MoeWeights& w, const Gemma4MoeScratch& sc,
                                    const ModelHparams& hp, const Tensor& x, const Tensor& h) {
  Stream& st = run.st;
  Ops& ops = run.ops;
  const int64_t T = x.ne[1], E = hp.n_embd, k = hp.n_expert_used, fe = w.gate_exps.ne[1];
  // The first T columns of each {.., max_rows} scratch tensor, contiguous.
  auto first = [&](const Tensor& t, std::initializer_list<int64_t> shape) {
    return Tensor::contiguous(t.type, shape, t.data, t.device);
  };
  const Tensor r = first(sc.router_in, {E, T}), logits = first(sc.logits, {hp.n_expert, T});
  const Tensor ids = first(sc.ids, {k, T}), weights = first(sc.weights, {k, T});
  const Tensor gate = first(sc.gate, {fe, k, T}), up = first(sc.up, {fe, k, T});
  const Tensor expert_out = first(sc.expert_out, {E, k, T});

  // Router: RMS(x) without weight, / sqrt(n_embd), * router scale; softmax, top-k, renormalise (C.5 2-5).
  // The experts' input h = RMS(x) * pre_ffw_norm_2 comes from the same norm (one launch where the backend can).
  ops.moe_input_norms(st, x, run.eps, 1.0f / std::sqrt(float(E)), w.router_scale, r, w.pre_norm_2, h);
  ops.matmul(st, w.router, r, logits);
  ops.moe_route(st, logits, w.down_scale ? &*w.down_scale : nullptr, ids, weights);

  // Experts on h, every selected expert reading the row's one input.
  const Tensor h_in = first(h, {E, 1, T});
  ops.matmul_id_geglu(st, w.gate_exps, w.up_exps, h_in, ids, gate, up, gate);  // one launch where the backend can
  ops.matmul_id(st, w.down_exps, gate, ids, expert_out);
  return {expert_out, weights};
}

}  // namespace tandem
