// The default fused products of Ops (backend.h): each is the same work done one op at a time. They are what
// the CPU backend and any wrapper Ops run, and the reference the CUDA fused kernels are tested against.
#include "backend/backend.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace tandem {

void Ops::matmul_multi(Stream& s, std::span<const Tensor> W, const Tensor& x, std::span<const Tensor> y) {
  check(W.size() == y.size() && !W.empty() && W.size() <= 3,
        "matmul_multi: needs 1 to 3 weights and as many outputs");
  for (size_t i = 0; i < W.size(); ++i) matmul(s, W[i], x, y[i]);
}

void Ops::matmul_swiglu(Stream& s, const Tensor& W_gate, const Tensor& W_up, const Tensor& x,
                        const Tensor& gate, const Tensor& up, const Tensor& out) {
  matmul(s, W_gate, x, gate);
  matmul(s, W_up, x, up);
  silu_mul(s, gate, up, out);
}

void Ops::norm_matmul_multi(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                            std::span<const Tensor> W, std::span<const Tensor> y) {
  rms_norm(s, x, &norm, eps, h);
  matmul_multi(s, W, h, y);
}

void Ops::norm_matmul_swiglu(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                             const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                             const Tensor& out) {
  rms_norm(s, x, &norm, eps, h);
  matmul_swiglu(s, W_gate, W_up, h, gate, up, out);
}

void Ops::norm_matmul_geglu(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                            const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                            const Tensor& out) {
  rms_norm(s, x, &norm, eps, h);
  matmul(s, W_gate, h, gate);
  matmul(s, W_up, h, up);
  gelu_mul(s, gate, up, out);
}

void Ops::attention_project_add(Stream& s, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch,
                                float scale, const Tensor& out, const Tensor& out_rows, const Tensor& W_o,
                                const Tensor& tmp, const Tensor& y) {
  check(out.data == out_rows.data && out.nbytes() == out_rows.nbytes(),
        "attention_project_add: out_rows must be out's memory viewed as {n_head * head_dim_v, T}");
  attention(s, q, kv, batch, scale, out);
  matmul_add(s, W_o, out_rows, tmp, y);
}

void Ops::ffn_swiglu_add(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                         const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                         const Tensor& act, const Tensor& W_down, const Tensor& tmp, const Tensor& y) {
  norm_matmul_swiglu(s, x, norm, eps, h, W_gate, W_up, gate, up, act);
  matmul_add(s, W_down, act, tmp, y);
}

void Ops::matmul_add(Stream& s, const Tensor& W, const Tensor& x, const Tensor& tmp, const Tensor& y) {
  matmul(s, W, x, tmp);
  add(s, y, tmp, y);
}

void Ops::qk_norm_rope_store(Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor* q_norm, const Tensor* k_norm, bool norm_v, float eps,
                             const Tensor& positions, const RopeParams& rope_params, const KvLayerView& kv,
                             const Tensor& slot_mapping) {
  if (q_norm) rms_norm(s, q, q_norm, eps, q);
  if (k_norm) rms_norm(s, k, k_norm, eps, k);
  if (norm_v) rms_norm(s, v, nullptr, eps, v);
  rope(s, q, positions, rope_params);
  rope(s, k, positions, rope_params);
  kv_store(s, kv, k, v, slot_mapping);
}

void Ops::norm_residual_add(Stream& s, const Tensor& x, const Tensor& y, const Tensor& w, float eps,
                            float out_scale) {
  op_checks::no_alias("norm_residual_add", "x and y", {&x, &y});
  rms_norm(s, y, &w, eps, y);
  add(s, x, y, x);
  if (out_scale != 1.0f) scale(s, x, out_scale, x);
}

void Ops::moe_residual_add(Stream& s, const Tensor& x, const Tensor& dense, const Tensor& w_dense,
                           const Tensor* expert_out, const Tensor* weights, const Tensor& moe, const Tensor& w_moe,
                           const Tensor& w_out, float eps, float out_scale) {
  check((expert_out == nullptr) == (weights == nullptr),
        "moe_residual_add: give both the experts' outputs and their weights, or neither");
  op_checks::no_alias("moe_residual_add", "x, dense and moe", {&x, &dense, &moe});
  if (expert_out) moe_combine(s, *expert_out, *weights, moe);
  rms_norm(s, dense, &w_dense, eps, dense);
  rms_norm(s, moe, &w_moe, eps, moe);
  add(s, dense, moe, dense);
  Ops::norm_residual_add(s, x, dense, w_out, eps, out_scale);  // the composition all the way down
}

void Ops::matmul_id_geglu(Stream& s, const Tensor& W_gate, const Tensor& W_up, const Tensor& x, const Tensor& ids,
                          const Tensor& gate, const Tensor& up, const Tensor& out) {
  matmul_id(s, W_gate, x, ids, gate);
  matmul_id(s, W_up, x, ids, up);
  gelu_mul(s, gate, up, out);
}

void Ops::moe_input_norms(Stream& s, const Tensor& x, float eps, float r_factor, const Tensor& r_scale,
                          const Tensor& r, const Tensor& h_norm, const Tensor& h) {
  op_checks::no_alias("moe_input_norms", "x, r and h", {&x, &r, &h});
  rms_norm(s, x, nullptr, eps, r);
  scale(s, r, r_factor, r);
  mul(s, r, r_scale, r);
  rms_norm(s, x, &h_norm, eps, h);
}

}  // namespace tandem
