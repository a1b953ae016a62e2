// gemma4 E2B/E4B per-layer inputs (GGUF-ARCH-FACTS C.7), on Ops only.
#include "model/gemma4_ple.h"

#include <cmath>
#include <string>

#include "model/weight_loader.h"

namespace tandem {

namespace {
constexpr size_t kAlign = 256;
size_t padded(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

Gemma4PleWeights load_gemma4_ple(WeightLoader& ld, int64_t n_embd_pl, int64_t n_embd, int64_t n_layer,
                                 int64_t n_vocab) {
  Gemma4PleWeights w;
  w.n_embd_pl = n_embd_pl;
  w.token_embd = ld.matrix("per_layer_token_embd.weight", {n_embd_pl * n_layer, n_vocab});
  w.model_proj = ld.matrix("per_layer_model_proj.weight", {n_embd, n_embd_pl * n_layer});
  w.proj_norm = ld.vector("per_layer_proj_norm.weight", n_embd_pl);
  for (int64_t il = 0; il < n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    Gemma4PleLayer L;
    L.inp_gate = ld.matrix(b + "inp_gate.weight", {n_embd, n_embd_pl});
    L.proj = ld.matrix(b + "proj.weight", {n_embd_pl, n_embd});
    L.post_norm = ld.vector(b + "post_norm.weight", n_embd);
    w.layers.push_back(L);
  }
  return w;
}

size_t gemma4_ple_scratch_bytes(int64_t n_embd_pl, int64_t n_layer, int64_t max_rows) {
  const size_t all = size_t(n_embd_pl * n_layer * max_rows) * sizeof(float);
  return 2 * padded(all) + padded(size_t(n_embd_pl * max_rows) * sizeof(float));
}

Gemma4PleScratch gemma4_ple_scratch(int64_t n_embd_pl, int64_t n_layer, int64_t max_rows, void* base,
                                    DeviceId device) {
  char* p = static_cast<char*>(base);
  Gemma4PleScratch s;
  s.inputs = Tensor::contiguous(DType::F32, {n_embd_pl, n_layer, max_rows}, p, device);
  p += padded(s.inputs.nbytes());
  s.token_part = Tensor::contiguous(DType::F32, {n_embd_pl, n_layer, max_rows}, p, device);
  p += padded(s.token_part.nbytes());
  s.gate = Tensor::contiguous(DType::F32, {n_embd_pl, max_rows}, p, device);
  return s;
}

void gemma4_ple_inputs(const BlockRun& run, const Gemma4PleWeights& w, const Gemma4PleScratch& sc,
                       const Tensor& tokens, const Tensor& x0) {
  Stream& st = run.st;
  Ops& ops = run.ops;
  const int64_t T = x0.ne[1], npl = w.n_embd_pl, L = int64_t(w.layers.size());
  const Tensor inputs = Tensor::contiguous(DType::F32, {npl * L, T}, sc.inputs.data, sc.inputs.device);
  const Tensor tok = Tensor::contiguous(DType::F32, {npl * L, T}, sc.token_part.data, sc.token_part.device);
  ops.embed_rows(st, w.token_embd, tokens, std::sqrt(float(npl)), nullptr, nullptr, tok);
  ops.matmul(st, w.model_proj, x0, inputs);
  ops.scale(st, inputs, 1.0f / std::sqrt(float(x0.ne[0])), inputs);
  const Tensor per_layer = Tensor::contiguous(DType::F32, {npl, L * T}, sc.inputs.data, sc.inputs.device);
  ops.rms_norm(st, per_layer, &w.proj_norm, run.eps, per_layer);
  ops.add(st, inputs, tok, inputs);
  ops.scale(st, inputs, 1.0f / std::sqrt(2.0f), inputs);
}

void gemma4_ple_layer(const BlockRun& run, const Gemma4PleWeights& w, const Gemma4PleScratch& sc,
                      int64_t layer, const Tensor& x, const Tensor& out) {
  Stream& st = run.st;
  Ops& ops = run.ops;
  const int64_t T = x.ne[1], npl = w.n_embd_pl, L = int64_t(w.layers.size());
  const Gemma4PleLayer& l = w.layers[size_t(layer)];
  const Tensor gate = Tensor::contiguous(DType::F32, {npl, T}, sc.gate.data, sc.gate.device);
  Tensor in_l =
      Tensor::contiguous(DType::F32, {npl, T}, sc.inputs.data, sc.inputs.device);  // inputs[:, l, :]
  in_l.data = static_cast<char*>(sc.inputs.data) + size_t(layer * npl) * sizeof(float);
  in_l.nb[1] = size_t(npl * L) * sizeof(float);
  in_l.nb[2] = in_l.nb[3] = in_l.nb[1] * size_t(T);
  ops.matmul(st, l.inp_gate, x, gate);
  ops.gelu_mul(st, gate, in_l, gate);
  ops.matmul(st, l.proj, gate, out);
  ops.rms_norm(st, out, &l.post_norm, run.eps, out);
  ops.add(st, x, out, x);
}

}  // namespace tandem
