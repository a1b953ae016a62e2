#include "model/transformer.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "parallel/comm.h"

namespace tandem {

namespace {

// Scratch of one forward pass, planned for max_rows rows. Every tensor is {width, max_rows} contiguous; a
// step with T rows uses the first T columns (the same addresses every step, which CUDA graphs need).
struct TransformerScratch : ForwardScratch {
  Buffer buffer;
  Tensor x, h, q, k, v, attn, proj, gate, up, act;  // {.., max_rows}
  Tensor xo;                                        // {n_embd, max_out}: rows gathered for the head
};

// The first n columns of a {width, max} scratch tensor.
Tensor cols(const Tensor& t, int64_t n) {
  Tensor v = t;
  v.ne[1] = n;
  v.nb[2] = v.nb[1] * size_t(n);
  v.nb[3] = v.nb[2];
  return v;
}

// {n_head * head_dim, T} seen as {head_dim, n_head, T}.
Tensor heads(const Tensor& t, int64_t head_dim) {
  Tensor v = t;
  v.ne = {head_dim, t.ne[0] / head_dim, t.ne[1], 1};
  v.nb = {t.nb[0], t.nb[0] * size_t(head_dim), t.nb[1], t.nb[1] * size_t(t.ne[1])};
  return v;
}

std::string blk(int64_t layer, const char* name) {
  return "blk." + std::to_string(layer) + "." + name;
}

}  // namespace

Transformer::Transformer(ModelHparams hp, TransformerWeights weights, std::unique_ptr<WeightLoader> loader,
                         const DecoderLoadContext& ctx)
    : hp_(std::move(hp)),
      w_(std::move(weights)),
      loader_(std::move(loader)),
      shard_(ctx.shard),
      comm_(ctx.comm) {
  n_head_ = shard_.q_heads.size();
  n_head_kv_ = shard_.kv_heads.size();
  n_ff_ = shard_.ff.size();
  n_vocab_ = shard_.vocab.size();
  check(shard_.mode != SplitMode::Tensor || shard_.n_ranks == 1 || comm_ != nullptr,
        "a tensor-split rank needs a communicator");
  rope_.n_rot = int(hp_.n_rot);
  rope_.mode = hp_.rope_mode;
  rope_.freq_base = hp_.rope_freq_base;
  rope_.freq_scale = hp_.rope_freq_scale;
  rope_.attn_factor = hp_.rope_attn_factor;
  rope_.freq_factors = w_.rope_freqs ? &*w_.rope_freqs : nullptr;
}

std::vector<KvLayerShape> Transformer::kv_layer_shapes() const {
  return std::vector<KvLayerShape>(size_t(shard_.layers.size()),
                                   KvLayerShape{hp_.head_dim_k, hp_.head_dim_v, n_head_kv_});
}

Tensor Transformer::hidden_state(ForwardScratch& scratch, int64_t n_rows) const {
  return cols(static_cast<TransformerScratch&>(scratch).x, n_rows);
}

std::unique_ptr<ForwardScratch> Transformer::plan_scratch(Device& device, int64_t max_rows, int64_t max_out,
                                                          WorkspacePlan& plan) const {
  check(max_rows >= 1 && max_out >= 0 && max_out <= max_rows, "bad scratch plan");
  auto s = std::make_unique<TransformerScratch>();
  const int64_t hk = hp_.head_dim_k, hv = hp_.head_dim_v;
  const int64_t widths[] = {hp_.n_embd,   hp_.n_embd, n_head_ * hk, n_head_kv_ * hk, n_head_kv_ * hv,
                            n_head_ * hv, hp_.n_embd, n_ff_,        n_ff_,           n_ff_};
  Tensor* slots[] = {&s->x, &s->h, &s->q, &s->k, &s->v, &s->attn, &s->proj, &s->gate, &s->up, &s->act};
  constexpr size_t kAlign = 256;
  auto padded = [&](int64_t n_floats) {
    return (size_t(n_floats) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  };
  size_t total = padded(hp_.n_embd * std::max<int64_t>(max_out, 1));
  for (int64_t w : widths) total += padded(w * max_rows);
  s->buffer = device.allocate(total);
  char* p = static_cast<char*>(s->buffer.data());
  for (size_t i = 0; i < std::size(widths); ++i) {
    *slots[i] = Tensor::contiguous(DType::F32, {widths[i], max_rows}, p, device.id());
    p += padded(widths[i] * max_rows);
  }
  s->xo = Tensor::contiguous(DType::F32, {hp_.n_embd, std::max<int64_t>(max_out, 1)}, p, device.id());

  plan.max_rows = std::max(plan.max_rows, max_rows);
  plan.max_matmul_in = std::max({plan.max_matmul_in, hp_.n_embd, n_ff_, n_head_ * hk, n_head_ * hv});
  plan.max_head_dim = std::max({plan.max_head_dim, hk, hv});
  plan.max_n_head = std::max(plan.max_n_head, n_head_);
  plan.max_vocab = std::max(plan.max_vocab, n_vocab_);
  if (comm_) comm_->reserve(size_t(hp_.n_embd) * size_t(max_rows) * sizeof(float));
  return s;
}

void Transformer::forward(Stream& st, Ops& ops, const ForwardInputs& in, std::span<const KvLayerView> kv,
                          ForwardScratch& scratch_base) const {
  auto& sc = static_cast<TransformerScratch&>(scratch_base);
  const int64_t T = in.n_rows;
  check(T >= 1 && T <= sc.x.ne[1],
        "batch of " + std::to_string(T) + " rows exceeds the planned " + std::to_string(sc.x.ne[1]));
  check(int64_t(kv.size()) == shard_.layers.size(), "KV cache has the wrong number of layers");
  const float eps = hp_.rms_eps;
  const Tensor x = cols(sc.x, T), h = cols(sc.h, T), proj = cols(sc.proj, T);
  const Tensor q2 = cols(sc.q, T), k2 = cols(sc.k, T), v2 = cols(sc.v, T), attn2 = cols(sc.attn, T);
  const Tensor q = heads(q2, hp_.head_dim_k), k = heads(k2, hp_.head_dim_k), v = heads(v2, hp_.head_dim_v);
  const Tensor attn = heads(attn2, hp_.head_dim_v);
  const Tensor gate = cols(sc.gate, T), up = cols(sc.up, T), act = cols(sc.act, T);
  const float scale = hp_.attention_scale();

  if (!shard_.first) {
    // Layer split: x already holds the previous rank's output (the session copied it).
  } else if (in.tokens) {
    ops.get_rows(st, w_.tok_embd, *in.tokens, x);
  } else {
    check(in.embeddings != nullptr, "a batch needs tokens or embeddings");
    ops.copy(st, *in.embeddings, x);
  }
  auto tap = [&](int layer) {
    for (const LayerTap& t : in.taps)
      if (t.layer == layer) ops.copy(st, x, t.dst);
  };

  // Tensor split: attention output and down hold partial sums over this rank's heads / rows until the
  // all-reduce; their biases (mirrored) are added once, after it.
  auto reduce = [&](const Tensor& t) {
    if (comm_) comm_->all_reduce_sum(shard_.rank, st, t);
  };
  for (int64_t il = shard_.layers.begin; il < shard_.layers.end; ++il) {
    const TransformerLayerWeights& L = w_.layers[size_t(il)];
    const KvLayerView& kvl = kv[size_t(il - shard_.layers.begin)];
    tap(int(il));
    // attention
    ops.rms_norm(st, x, &L.attn_norm, eps, h);
    ops.matmul(st, L.wq, h, q2);
    ops.matmul(st, L.wk, h, k2);
    ops.matmul(st, L.wv, h, v2);
    if (L.bq) ops.add(st, q2, *L.bq, q2);
    if (L.bk) ops.add(st, k2, *L.bk, k2);
    if (L.bv) ops.add(st, v2, *L.bv, v2);
    if (L.q_norm) ops.rms_norm(st, q, &*L.q_norm, eps, q);
    if (L.k_norm) ops.rms_norm(st, k, &*L.k_norm, eps, k);
    ops.rope(st, q, in.positions, rope_);
    ops.rope(st, k, in.positions, rope_);
    ops.kv_store(st, kvl, k, v, in.slot_mapping);
    ops.attention(st, q, kvl, in.attention, scale, attn);
    ops.matmul(st, L.wo, attn2, proj);
    reduce(proj);
    if (L.bo) ops.add(st, proj, *L.bo, proj);
    ops.add(st, x, proj, x);
    // feed-forward (SwiGLU)
    ops.rms_norm(st, x, &L.ffn_norm, eps, h);
    ops.matmul(st, L.gate, h, gate);
    ops.matmul(st, L.up, h, up);
    if (L.b_gate) ops.add(st, gate, *L.b_gate, gate);
    if (L.b_up) ops.add(st, up, *L.b_up, up);
    ops.silu_mul(st, gate, up, act);
    ops.matmul(st, L.down, act, proj);
    reduce(proj);
    if (L.b_down) ops.add(st, proj, *L.b_down, proj);
    ops.add(st, x, proj, x);
  }
  if (!shard_.last) return;  // layer split: the next rank continues from x
  tap(int(hp_.n_layer));

  // Head: only the rows that want logits (a long prompt never materialises T x vocab logits).
  if (in.n_out == 0) return;
  check(in.n_out <= sc.xo.ne[1], "more logit rows than planned");
  const Tensor xo = cols(sc.xo, in.n_out);
  if (in.out_rows_all) {
    ops.rms_norm(st, x, &w_.output_norm, eps, xo);
  } else {
    ops.get_rows(st, x, in.out_rows, xo);
    ops.rms_norm(st, xo, &w_.output_norm, eps, xo);
  }
  ops.matmul(st, w_.output, xo, in.logits);
}

std::unique_ptr<Transformer> load_transformer(const gguf::GgufFile& file, const ModelHparams& hp,
                                              const TransformerVariant& variant,
                                              const DecoderLoadContext& ctx) {
  auto loader = std::make_unique<WeightLoader>(file, ctx.device, ctx.shard, ctx.dims, ctx.row_split);
  WeightLoader& ld = *loader;
  check(!ld.has("blk.0.attn_qkv.weight"),
        "tensor blk.0.attn_qkv.weight: fused QKV projections are not supported yet (convert with separate "
        "attn_q/attn_k/attn_v)");
  check(!ld.has("blk.0.ffn_gate_inp.weight"),
        "mixture-of-experts layers (blk.0.ffn_gate_inp.weight) are not "
        "supported yet");
  check(hp.n_vocab > 0, "n_vocab is not set (read the hparams with read_model_hparams)");
  const int64_t E = hp.n_embd, V = hp.n_vocab;
  TransformerWeights w;
  w.tok_embd = ld.matrix("token_embd.weight", {E, V});
  w.output_norm = ld.vector("output_norm.weight", E);
  if (auto out = ld.optional_matrix("output.weight", {E, V})) {
    w.output = *out;
  } else {  // tied head: token_embd read again under the output head's shard rule
    w.output = ld.matrix("token_embd.weight", {E, V}, TensorRole::Output);
    w.tied_output = true;
  }
  if (variant.allow_rope_freqs) w.rope_freqs = ld.optional_vector("rope_freqs.weight", hp.n_rot / 2);

  for (int64_t il = 0; il < hp.n_layer; ++il) {
    TransformerLayerWeights L;
    L.attn_norm = ld.vector(blk(il, "attn_norm.weight"), E);
    L.wq = ld.matrix(blk(il, "attn_q.weight"), {E, hp.n_embd_q()});
    L.wk = ld.matrix(blk(il, "attn_k.weight"), {E, hp.n_embd_k()});
    L.wv = ld.matrix(blk(il, "attn_v.weight"), {E, hp.n_embd_v()});
    L.wo = ld.matrix(blk(il, "attn_output.weight"), {hp.n_head * hp.head_dim_v, E});
    if (variant.allow_qkv_bias) {
      L.bq = ld.optional_vector(blk(il, "attn_q.bias"), hp.n_embd_q());
      L.bk = ld.optional_vector(blk(il, "attn_k.bias"), hp.n_embd_k());
      L.bv = ld.optional_vector(blk(il, "attn_v.bias"), hp.n_embd_v());
    }
    if (variant.qk_norm) {
      L.q_norm = ld.vector(blk(il, "attn_q_norm.weight"), hp.head_dim_k);
      L.k_norm = ld.vector(blk(il, "attn_k_norm.weight"), hp.head_dim_k);
    }
    L.ffn_norm = ld.vector(blk(il, "ffn_norm.weight"), E);
    L.gate = ld.matrix(blk(il, "ffn_gate.weight"), {E, hp.n_ff});
    L.up = ld.matrix(blk(il, "ffn_up.weight"), {E, hp.n_ff});
    L.down = ld.matrix(blk(il, "ffn_down.weight"), {hp.n_ff, E});
    if (variant.allow_out_ffn_bias) {
      L.bo = ld.optional_vector(blk(il, "attn_output.bias"), E);
      L.b_gate = ld.optional_vector(blk(il, "ffn_gate.bias"), hp.n_ff);
      L.b_up = ld.optional_vector(blk(il, "ffn_up.bias"), hp.n_ff);
      L.b_down = ld.optional_vector(blk(il, "ffn_down.bias"), E);
    }
    w.layers.push_back(std::move(L));
  }
  const std::vector<std::string> unused = ld.unused();
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 4; ++i) list += (i ? ", " : "") + unused[i];
    if (unused.size() > 4) list += ", ... (" + std::to_string(unused.size()) + " in all)";
    throw Error("the " + hp.arch + " model has tensors tandem does not know how to use: " + list +
                " (an unsupported variant of the architecture?)");
  }
  return std::make_unique<Transformer>(hp, std::move(w), std::move(loader), ctx);
}

}  // namespace tandem
