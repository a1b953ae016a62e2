// An Ops that passes every op to another Ops. A wrapper that changes a few ops (RowSplitOps distributes
// matmul) derives from it and overrides only those, so a new op in backend.h is forwarded here once.
#pragma once

#include "backend/backend.h"

namespace tandem {

class ForwardingOps : public Ops {
 public:
  explicit ForwardingOps(Ops& inner) : inner_(inner) {}

  void reserve(const WorkspacePlan& plan) override { inner_.reserve(plan); }
  void set_batch_invariant(bool on) override { inner_.set_batch_invariant(on); }
  void matmul(Stream& s, const Tensor& W, const Tensor& x, const Tensor& y) override {
    inner_.matmul(s, W, x, y);
  }
  void get_rows(Stream& s, const Tensor& t, const Tensor& ids, const Tensor& out) override {
    inner_.get_rows(s, t, ids, out);
  }
  void embed_rows(Stream& s, const Tensor& t, const Tensor& ids, float scale, const Tensor* added,
                  const Tensor* added_ids, const Tensor& out) override {
    inner_.embed_rows(s, t, ids, scale, added, added_ids, out);
  }
  void rms_norm(Stream& s, const Tensor& x, const Tensor* w, float eps, const Tensor& out) override {
    inner_.rms_norm(s, x, w, eps, out);
  }
  void rope(Stream& s, const Tensor& x, const Tensor& pos, const RopeParams& p) override {
    inner_.rope(s, x, pos, p);
  }
  void kv_store(Stream& s, const KvLayerView& kv, const Tensor& k, const Tensor& v,
                const Tensor& slots) override {
    inner_.kv_store(s, kv, k, v, slots);
  }
  void attention(Stream& s, const Tensor& q, const KvLayerView& kv, const AttentionBatch& b, float scale,
                 const Tensor& out) override {
    inner_.attention(s, q, kv, b, scale, out);
  }
  void silu_mul(Stream& s, const Tensor& g, const Tensor& u, const Tensor& out) override {
    inner_.silu_mul(s, g, u, out);
  }
  void gelu_mul(Stream& s, const Tensor& g, const Tensor& u, const Tensor& out) override {
    inner_.gelu_mul(s, g, u, out);
  }
  void add(Stream& s, const Tensor& a, const Tensor& b, const Tensor& out) override {
    inner_.add(s, a, b, out);
  }
  void mul(Stream& s, const Tensor& a, const Tensor& b, const Tensor& out) override {
    inner_.mul(s, a, b, out);
  }
  void scale(Stream& s, const Tensor& x, float f, const Tensor& out) override { inner_.scale(s, x, f, out); }
  void softcap(Stream& s, const Tensor& x, float cap, const Tensor& out) override {
    inner_.softcap(s, x, cap, out);
  }
  void fill(Stream& s, const Tensor& out, float v) override { inner_.fill(s, out, v); }
  void softmax_rows(Stream& s, const Tensor& x, const Tensor& out) override {
    inner_.softmax_rows(s, x, out);
  }
  void copy(Stream& s, const Tensor& src, const Tensor& dst) override { inner_.copy(s, src, dst); }
  void argmax_rows(Stream& s, const Tensor& logits, const Tensor& out) override {
    inner_.argmax_rows(s, logits, out);
  }
  void sample_rows(Stream& s, const Tensor& logits, const SamplerParams& p, const Tensor& u,
                   const Tensor& out) override {
    inner_.sample_rows(s, logits, p, u, out);
  }
  void diffusion_sample_rows(Stream& s, const Tensor& logits, float inv_temp, const Tensor& u,
                             const Tensor& am, const Tensor& ent, const Tensor& sampled) override {
    inner_.diffusion_sample_rows(s, logits, inv_temp, u, am, ent, sampled);
  }
  void moe_route(Stream& s, const Tensor& logits, const Tensor* expert_scale, const Tensor& ids,
                 const Tensor& weights) override {
    inner_.moe_route(s, logits, expert_scale, ids, weights);
  }
  void matmul_id(Stream& s, const Tensor& W, const Tensor& x, const Tensor& ids, const Tensor& y) override {
    inner_.matmul_id(s, W, x, ids, y);
  }
  void moe_combine(Stream& s, const Tensor& y, const Tensor& weights, const Tensor& out) override {
    inner_.moe_combine(s, y, weights, out);
  }

 protected:
  Ops& inner_;
};

}  // namespace tandem
