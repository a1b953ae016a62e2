#include "model/blocks.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/scratch_views.h"
#include "parallel/comm.h"

namespace tandem {

LayerShape layer_shape(const LayerHparams& L, const RankShard& shard, int64_t il) {
  // A tensor split gives each layer this rank's heads and rows of it (the same ranges when uniform).
  const bool tensor_split = shard.mode == SplitMode::Tensor;
  const RankShard::LayerRanges lr = shard.ranges_of(il);
  LayerShape d;
  d.n_head = tensor_split ? lr.q_heads.size() : L.n_head;
  d.n_head_kv = tensor_split ? lr.kv_heads.size() : L.n_head_kv;
  d.n_ff = tensor_split ? lr.ff.size() : L.n_ff;
  d.head_dim_k = L.head_dim_k;
  d.head_dim_v = L.head_dim_v;
  d.sliding_window = L.sliding_window;
  d.rope.n_rot = int(L.n_rot);
  d.rope.freq_base = L.rope_freq_base;
  return d;
}

std::vector<KvLayerShape> kv_layer_shapes_of(std::span<const LayerShape> layers, int64_t begin, int64_t end) {
  std::vector<KvLayerShape> shapes;
  for (int64_t il = begin; il < end; ++il) {
    const LayerShape& d = layers[size_t(il)];
    shapes.push_back(KvLayerShape{d.head_dim_k, d.head_dim_v, d.n_head_kv, d.sliding_window});
  }
  return shapes;
}

Buffer plan_block_scratch(Device& device, std::span<const LayerShape> layers, int64_t n_embd,
                          int64_t max_rows, int64_t max_out, std::span<const ScratchSlot> extra, Tensor& x,
                          BlockScratch& blocks, Tensor& xo, WorkspacePlan& plan) {
  check(max_rows >= 1 && max_out >= 0 && max_out <= max_rows, "bad scratch plan");
  auto widest = [&](auto width) {
    int64_t m = 0;
    for (const LayerShape& d : layers) m = std::max(m, int64_t(width(d)));
    return m;
  };
  const int64_t q_w = widest([](const LayerShape& d) { return d.n_head * d.head_dim_k; });
  const int64_t k_w = widest([](const LayerShape& d) { return d.n_head_kv * d.head_dim_k; });
  const int64_t v_w = widest([](const LayerShape& d) { return d.n_head_kv * d.head_dim_v; });
  const int64_t attn_w = widest([](const LayerShape& d) { return d.n_head * d.head_dim_v; });
  const int64_t ff_w = widest([](const LayerShape& d) { return d.n_ff; });
  BlockScratch& b = blocks;
  std::vector<ScratchSlot> slots = {{&x, n_embd}};
  slots.insert(slots.end(), extra.begin(), extra.end());
  slots.insert(slots.end(), {{&b.h, n_embd},
                             {&b.q, q_w},
                             {&b.k, k_w},
                             {&b.v, v_w},
                             {&b.attn, attn_w},
                             {&b.proj, n_embd},
                             {&b.gate, ff_w},
                             {&b.up, ff_w},
                             {&b.act, ff_w}});
  constexpr size_t kAlign = 256;
  auto padded = [&](int64_t n) { return (size_t(n) * sizeof(float) + kAlign - 1) / kAlign * kAlign; };
  const int64_t out_rows = std::max<int64_t>(max_out, 1);
  size_t total = padded(n_embd * out_rows);
  for (const ScratchSlot& slot : slots) total += padded(slot.width * max_rows);
  Buffer buffer = device.allocate(total);
  char* p = static_cast<char*>(buffer.data());
  for (const ScratchSlot& slot : slots) {
    *slot.tensor = Tensor::contiguous(DType::F32, {slot.width, max_rows}, p, device.id());
    p += padded(slot.width * max_rows);
  }
  xo = Tensor::contiguous(DType::F32, {n_embd, out_rows}, p, device.id());
  plan.max_rows = std::max(plan.max_rows, max_rows);
  plan.max_matmul_in = std::max({plan.max_matmul_in, n_embd, ff_w, q_w, attn_w});
  plan.max_head_dim = std::max({plan.max_head_dim, widest([](const LayerShape& d) { return d.head_dim_k; }),
                                widest([](const LayerShape& d) { return d.head_dim_v; })});
  plan.max_n_head = std::max(plan.max_n_head, widest([](const LayerShape& d) { return d.n_head; }));
  return buffer;
}

void BlockRun::reduce(const Tensor& t) const {
  if (comm) comm->all_reduce_sum(rank, st, t);
}

void embed_block(const BlockRun& run, const Tensor& tok_embd, float scale, const ForwardInputs& in,
                 const Tensor& x) {
  if (in.added == nullptr && scale == 1.0f) {  // plain token rows (every row has a token: the session checks)
    check(in.tokens != nullptr, "a batch needs tokens or embeddings");
    run.ops.get_rows(run.st, tok_embd, *in.tokens, x);
    return;
  }
  check(in.tokens != nullptr && (in.added == nullptr || in.added_rows != nullptr),
        "embed: the session must give token ids (kNoToken for none) and the added rows' indices");
  run.ops.embed_rows(run.st, tok_embd, *in.tokens, scale, in.added, in.added_rows, x);
}

void attention_block(const BlockRun& run, const AttentionWeights& w, const LayerShape& d,
                     const BlockScratch& sc, const Tensor& x, const Tensor& positions, const KvLayerView& kv,
                     const KvGroupInputs& group) {
  Stream& st = run.st;
  Ops& ops = run.ops;
  const int64_t T = x.ne[1];
  const Tensor h = slot_view(sc.h, x.ne[0], T), proj = slot_view(sc.proj, x.ne[0], T);
  const Tensor q2 = slot_view(sc.q, d.n_head * d.head_dim_k, T),
               k2 = slot_view(sc.k, d.n_head_kv * d.head_dim_k, T);
  const Tensor v2 = slot_view(sc.v, d.n_head_kv * d.head_dim_v, T),
               attn2 = slot_view(sc.attn, d.n_head * d.head_dim_v, T);
  const Tensor q = split_heads(q2, d.head_dim_k), k = split_heads(k2, d.head_dim_k),
               v = split_heads(v2, d.head_dim_v);
  const Tensor attn = split_heads(attn2, d.head_dim_v);
  // The norm and Q, K, V in one launch where the backend can (h read once; four small launches become one).
  const Tensor w_qkv[3] = {w.wq, w.wk, w.wv};
  const Tensor y_qkv[3] = {q2, k2, v2};
  ops.norm_matmul_multi(st, x, w.norm, run.eps, h, w_qkv, y_qkv);
  if (w.bq) ops.add(st, q2, *w.bq, q2);
  if (w.bk) ops.add(st, k2, *w.bk, k2);
  if (w.bv) ops.add(st, v2, *w.bv, v2);
  // Q/K norms, rope and the K/V store: one launch where the backend can.
  ops.qk_norm_rope_store(st, q, k, v, w.q_norm ? &*w.q_norm : nullptr, w.k_norm ? &*w.k_norm : nullptr,
                         /*norm_v=*/false, run.eps, positions, d.rope, kv, group.slot_mapping);
  if (run.comm == nullptr && !w.bo) {  // x += wo attn: the residual add in the product's epilogue, and (CUDA,
                                       // quantized wo) the attention output handed over already quantized
    ops.attention_project_add(st, q, kv, group.attention, d.attn_scale, attn, attn2, w.wo, proj, x);
    return;
  }
  ops.attention(st, q, kv, group.attention, d.attn_scale, attn);
  ops.matmul(st, w.wo, attn2, proj);
  run.reduce(proj);  // tensor split: partial sums over this rank's heads; the (mirrored) bias once, after
  if (w.bo) ops.add(st, proj, *w.bo, proj);
  ops.add(st, x, proj, x);
}

void dense_ffn_block(const BlockRun& run, const DenseFfnWeights& w, int64_t n_ff, const BlockScratch& sc,
                     const Tensor& x) {
  Stream& st = run.st;
  Ops& ops = run.ops;
  const int64_t T = x.ne[1];
  const Tensor h = slot_view(sc.h, x.ne[0], T), proj = slot_view(sc.proj, x.ne[0], T);
  const Tensor gate = slot_view(sc.gate, n_ff, T), up = slot_view(sc.up, n_ff, T),
               act = slot_view(sc.act, n_ff, T);
  if (!w.b_gate && !w.b_up && !w.b_down && run.comm == nullptr) {
    // The norm, gate and up in one launch with SwiGLU in its epilogue, then down with the residual add in its
    // epilogue; (CUDA, quantized weights) the SwiGLU output handed to down already quantized.
    ops.ffn_swiglu_add(st, x, w.norm, run.eps, h, w.gate, w.up, gate, up, act, w.down, proj, x);
    return;
  }
  if (!w.b_gate && !w.b_up) {  // the norm, gate and up in one launch, SwiGLU in its epilogue
    ops.norm_matmul_swiglu(st, x, w.norm, run.eps, h, w.gate, w.up, gate, up, act);
  } else {
    ops.rms_norm(st, x, &w.norm, run.eps, h);
    ops.matmul(st, w.gate, h, gate);
    ops.matmul(st, w.up, h, up);
    if (w.b_gate) ops.add(st, gate, *w.b_gate, gate);
    if (w.b_up) ops.add(st, up, *w.b_up, up);
    ops.silu_mul(st, gate, up, act);
  }
  if (run.comm == nullptr && !w.b_down) {
    ops.matmul_add(st, w.down, act, proj, x);
    return;
  }
  ops.matmul(st, w.down, act, proj);
  run.reduce(proj);
  if (w.b_down) ops.add(st, proj, *w.b_down, proj);
  ops.add(st, x, proj, x);
}

void output_head(const BlockRun& run, const Tensor& output_norm, const Tensor& output,
                 const ForwardInputs& in, const Tensor& x, const Tensor& xo_slot) {
  // Only the rows that want logits: a long prompt never materialises T x vocab logits.
  if (in.n_out == 0) return;
  check(in.n_out <= xo_slot.ne[1], "more logit rows than planned");
  const Tensor xo = slot_view(xo_slot, x.ne[0], in.n_out);
  if (in.out_rows_all) {
    run.ops.rms_norm(run.st, x, &output_norm, run.eps, xo);
  } else {
    run.ops.get_rows(run.st, x, in.out_rows, xo);
    run.ops.rms_norm(run.st, xo, &output_norm, run.eps, xo);
  }
  run.ops.matmul(run.st, output, xo, in.logits);
}

}  // namespace tandem
