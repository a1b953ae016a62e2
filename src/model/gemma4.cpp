// gemma4, dense layers (GGUF-ARCH-FACTS C.1-C.4, C.6): sliding and global layers with their own head dims,
// KV heads, rope bases and rotary dims (proportional partial rope on global layers through rope_freqs);
// per-head Q/K norms and an unweighted V norm, V = the raw K projection when attn_v is absent; attention
// scale 1; post-attention, pre- and post-FFN norms (all plain RMS(x)*w); GELU-tanh MLP; sqrt(n_embd)
// embedding scale; layer_output_scale on the whole residual stream; tied head; final logit softcap.
// Assembled from the blocks of blocks.h (embedding, output head) plus its own layer body, because every
// branch is normed after its projection.
#include "model/gemma4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "model/blocks.h"
#include "model/gemma4_moe.h"
#include "model/gemma4_ple.h"
#include "model/weight_loader.h"
#include "parallel/comm.h"

namespace tandem {

namespace {

std::string blk(int64_t layer, const char* name) {
  return "blk." + std::to_string(layer) + "." + name;
}

// The first n columns of a {width, max} scratch tensor.
Tensor cols(const Tensor& t, int64_t n) {
  Tensor v = t;
  v.ne[1] = n;
  v.nb[2] = v.nb[1] * size_t(n);
  v.nb[3] = v.nb[2];
  return v;
}

// A contiguous {width, n} tensor at the start of a scratch slot planned for the widest layer.
Tensor mat(const Tensor& slot, int64_t width, int64_t n) {
  return Tensor::contiguous(DType::F32, {width, n}, slot.data, slot.device);
}

// {n_head * head_dim, T} seen as {head_dim, n_head, T}.
Tensor heads(const Tensor& t, int64_t head_dim) {
  Tensor v = t;
  v.ne = {head_dim, t.ne[0] / head_dim, t.ne[1], 1};
  v.nb = {t.nb[0], t.nb[0] * size_t(head_dim), t.nb[1], t.nb[1] * size_t(t.ne[1])};
  return v;
}

struct Gemma4Layer {
  Tensor attn_norm, wq, wk, wo, q_norm, k_norm, post_attn_norm;
  std::optional<Tensor> wv;  // absent: V is the raw K projection
  int64_t kv_source = -1;  // C.7 KV sharing: the layer whose cache this one reads (it stores no K/V); -1: own
  Tensor ffn_norm, gate, up, down, post_ffw_norm;
  float output_scale = 1.0f;            // layer_output_scale (1 when absent)
  std::optional<Gemma4MoeWeights> moe;  // C.5: an expert branch beside the dense MLP
};

struct Gemma4Weights {
  Tensor tok_embd, output_norm, output;
  bool tied_output = false;
  std::optional<Tensor> rope_freqs;
  std::vector<Gemma4Layer> layers;
  std::optional<Gemma4PleWeights> ple;  // C.7 per-layer inputs (E2B/E4B)
};

struct Gemma4Scratch : ForwardScratch {
  Buffer buffer;
  Tensor x;  // {n_embd, max_rows}: the residual stream
  BlockScratch blocks;
  Tensor xo;
  Buffer moe_buffer;  // MoE models only
  Gemma4MoeScratch moe;
  Buffer ple_buffer;  // per-layer-input models only
  Gemma4PleScratch ple;
};

class Gemma4Model : public DecoderModel {
 public:
  Gemma4Model(ModelHparams hp, Gemma4Weights w, float softcap, std::unique_ptr<WeightLoader> loader,
              const DecoderLoadContext& ctx)
      : hp_(std::move(hp)),
        w_(std::move(w)),
        softcap_(softcap),
        loader_(std::move(loader)),
        shard_(ctx.shard),
        comm_(ctx.comm) {
    check(shard_.mode != SplitMode::Tensor || shard_.n_ranks == 1 || comm_ != nullptr,
          "a tensor-split rank needs a communicator");
    const bool tensor_split = shard_.mode == SplitMode::Tensor;
    for (size_t il = 0; il < hp_.layers.size(); ++il) {
      const LayerHparams& L = hp_.layers[il];
      const RankShard::LayerRanges lr = shard_.ranges_of(int64_t(il));
      LayerShape d;
      d.n_head = tensor_split ? lr.q_heads.size() : L.n_head;
      d.n_head_kv = tensor_split ? lr.kv_heads.size() : L.n_head_kv;
      d.n_ff = tensor_split ? lr.ff.size() : L.n_ff;
      d.head_dim_k = L.head_dim_k;
      d.head_dim_v = L.head_dim_v;
      d.sliding_window = L.sliding_window;
      d.attn_scale = 1.0f;  // C.4: no 1/sqrt(d); the Q/K norms keep the scores in range
      d.rope.n_rot = int(L.n_rot);
      d.rope.mode = RopeMode::Neox;
      d.rope.freq_base = L.rope_freq_base;
      d.rope.freq_factors = w_.rope_freqs && L.rope_freq_factors ? &*w_.rope_freqs : nullptr;
      local_.push_back(d);
    }
  }

  const ModelHparams& hparams() const override { return hp_; }
  const RankShard& shard() const override { return shard_; }

  std::vector<KvLayerShape> kv_layer_shapes() const override {
    std::vector<KvLayerShape> shapes;
    for (int64_t il = shard_.layers.begin; il < shard_.layers.end; ++il) {
      const LayerShape& d = local_[size_t(il)];
      shapes.push_back(KvLayerShape{d.head_dim_k, d.head_dim_v, d.n_head_kv, d.sliding_window});
    }
    return shapes;
  }

  Tensor hidden_state(ForwardScratch& scratch, int64_t n_rows) const override {
    return cols(static_cast<Gemma4Scratch&>(scratch).x, n_rows);
  }

  std::unique_ptr<ForwardScratch> plan_scratch(Device& device, int64_t max_rows, int64_t max_out,
                                               WorkspacePlan& plan) const override {
    check(max_rows >= 1 && max_out >= 0 && max_out <= max_rows, "bad scratch plan");
    auto s = std::make_unique<Gemma4Scratch>();
    auto widest = [&](auto width) {
      int64_t m = 0;
      for (const LayerShape& d : local_) m = std::max(m, int64_t(width(d)));
      return m;
    };
    const int64_t q_w = widest([](const LayerShape& d) { return d.n_head * d.head_dim_k; });
    const int64_t k_w = widest([](const LayerShape& d) { return d.n_head_kv * d.head_dim_k; });
    const int64_t v_w = widest([](const LayerShape& d) { return d.n_head_kv * d.head_dim_v; });
    const int64_t attn_w = widest([](const LayerShape& d) { return d.n_head * d.head_dim_v; });
    const int64_t ff_w = widest([](const LayerShape& d) { return d.n_ff; });
    const int64_t E = hp_.n_embd;
    const int64_t widths[] = {E, E, q_w, k_w, v_w, attn_w, E, ff_w, ff_w, ff_w};
    BlockScratch& b = s->blocks;
    Tensor* slots[] = {&s->x, &b.h, &b.q, &b.k, &b.v, &b.attn, &b.proj, &b.gate, &b.up, &b.act};
    constexpr size_t kAlign = 256;
    auto padded = [&](int64_t n) { return (size_t(n) * sizeof(float) + kAlign - 1) / kAlign * kAlign; };
    size_t total = padded(E * std::max<int64_t>(max_out, 1));
    for (int64_t w : widths) total += padded(w * max_rows);
    s->buffer = device.allocate(total);
    char* p = static_cast<char*>(s->buffer.data());
    for (size_t i = 0; i < std::size(widths); ++i) {
      *slots[i] = Tensor::contiguous(DType::F32, {widths[i], max_rows}, p, device.id());
      p += padded(widths[i] * max_rows);
    }
    s->xo = Tensor::contiguous(DType::F32, {E, std::max<int64_t>(max_out, 1)}, p, device.id());
    plan.max_rows = std::max(plan.max_rows, max_rows);
    plan.max_matmul_in = std::max({plan.max_matmul_in, E, ff_w, q_w, attn_w});
    plan.max_head_dim = std::max({plan.max_head_dim, widest([](const LayerShape& d) { return d.head_dim_k; }),
                                  widest([](const LayerShape& d) { return d.head_dim_v; })});
    plan.max_n_head = std::max(plan.max_n_head, widest([](const LayerShape& d) { return d.n_head; }));
    plan.max_vocab = std::max(plan.max_vocab, int64_t(shard_.vocab.size()));
    if (hp_.n_expert > 0) {
      const int64_t fe = n_ff_exp_local();
      s->moe_buffer = device.allocate(gemma4_moe_scratch_bytes(hp_, fe, max_rows));
      s->moe = gemma4_moe_scratch(hp_, fe, max_rows, s->moe_buffer.data(), device.id());
      plan.max_routed_rows = std::max(plan.max_routed_rows, hp_.n_expert_used * max_rows);
      plan.max_matmul_in = std::max(plan.max_matmul_in, fe);
    }
    if (w_.ple) {
      s->ple_buffer = device.allocate(gemma4_ple_scratch_bytes(w_.ple->n_embd_pl, hp_.n_layer, max_rows));
      s->ple =
          gemma4_ple_scratch(w_.ple->n_embd_pl, hp_.n_layer, max_rows, s->ple_buffer.data(), device.id());
      plan.max_matmul_in = std::max(plan.max_matmul_in, w_.ple->n_embd_pl);
    }
    if (comm_) comm_->reserve(size_t(E) * size_t(max_rows) * sizeof(float));
    return s;
  }

  void forward(Stream& st, Ops& ops, const ForwardInputs& in, std::span<const KvLayerView> kv,
               ForwardScratch& scratch_base) const override {
    auto& sc = static_cast<Gemma4Scratch&>(scratch_base);
    const int64_t T = in.n_rows;
    check(T >= 1 && T <= sc.x.ne[1],
          "batch of " + std::to_string(T) + " rows exceeds the planned " + std::to_string(sc.x.ne[1]));
    check(int64_t(kv.size()) == shard_.layers.size(), "KV cache has the wrong number of layers");
    const BlockRun run{st, ops, hp_.rms_eps, in.comm ? in.comm : comm_, shard_.rank};
    const Tensor x = cols(sc.x, T);
    if (shard_.first) embed_block(run, w_.tok_embd, hp_.embedding_scale, in, x);
    if (w_.ple) {  // from the layer-0 input (a per-layer-input model is not layer-split: every rank is first)
      check(in.tokens != nullptr, "gemma4 per-layer inputs need the batch's token ids");
      gemma4_ple_inputs(run, *w_.ple, sc.ple, *in.tokens, x);
    }
    auto tap = [&](int layer) {
      for (const LayerTap& t : in.taps)
        if (t.layer == layer) ops.copy(st, x, t.dst);
    };
    for (int64_t il = shard_.layers.begin; il < shard_.layers.end; ++il) {
      const size_t local = size_t(il - shard_.layers.begin);
      tap(int(il));
      const Gemma4Layer& wl = w_.layers[size_t(il)];
      // A KV-sharing layer attends over its source layer's cache (same rank: layer splits are refused).
      const size_t kv_local = wl.kv_source < 0 ? local : size_t(wl.kv_source - shard_.layers.begin);
      attention(run, wl, local_[size_t(il)], sc.blocks, x, in.positions, kv[kv_local], in.kv_group(kv_local));
      ffn(run, w_.layers[size_t(il)], local_[size_t(il)].n_ff, sc, x);
      if (w_.ple) gemma4_ple_layer(run, *w_.ple, sc.ple, il, x, mat(sc.blocks.proj, x.ne[0], T));
      if (w_.layers[size_t(il)].output_scale != 1.0f) ops.scale(st, x, w_.layers[size_t(il)].output_scale, x);
    }
    if (!shard_.last) return;
    tap(int(hp_.n_layer));
    output_head(run, w_.output_norm, w_.output, in, x, sc.xo);
    if (softcap_ > 0.0f && in.n_out > 0) ops.softcap(st, in.logits, softcap_, in.logits);
  }

  std::optional<Tensor> shared_weight(const std::string& name) const override {
    if (shard_.mode != SplitMode::None) return std::nullopt;
    if (name == "token_embd.weight") return w_.tok_embd;
    if (name == "output.weight") return w_.output;
    return std::nullopt;
  }

 private:
  // x += RMS(Wo . attention(rope(RMS(Q)*qn), rope(RMS(K)*kn), RMS(V))) * post_attention_norm, on RMS(x)*w.
  static void attention(const BlockRun& run, const Gemma4Layer& w, const LayerShape& d,
                        const BlockScratch& sc, const Tensor& x, const Tensor& positions,
                        const KvLayerView& kv, const KvGroupInputs& group) {
    Stream& st = run.st;
    Ops& ops = run.ops;
    const int64_t T = x.ne[1];
    const Tensor h = mat(sc.h, x.ne[0], T), proj = mat(sc.proj, x.ne[0], T);
    const Tensor q2 = mat(sc.q, d.n_head * d.head_dim_k, T), k2 = mat(sc.k, d.n_head_kv * d.head_dim_k, T);
    const Tensor v2 = mat(sc.v, d.n_head_kv * d.head_dim_v, T);
    const Tensor attn2 = mat(sc.attn, d.n_head * d.head_dim_v, T);
    const Tensor q = heads(q2, d.head_dim_k), k = heads(k2, d.head_dim_k), v = heads(v2, d.head_dim_v);
    ops.rms_norm(st, x, &w.attn_norm, run.eps, h);
    ops.matmul(st, w.wq, h, q2);
    ops.rms_norm(st, q, &w.q_norm, run.eps, q);
    ops.rope(st, q, positions, d.rope);
    if (w.kv_source < 0) {  // a KV-sharing layer stores nothing: its source layer wrote these rows' K/V
      ops.matmul(st, w.wk, h, k2);
      if (w.wv)
        ops.matmul(st, *w.wv, h, v2);
      else
        ops.copy(st, k2, v2);  // V = the raw K projection, taken before K's norm (C.4 step 3)
      ops.rms_norm(st, k, &w.k_norm, run.eps, k);
      ops.rms_norm(st, v, nullptr, run.eps, v);
      ops.rope(st, k, positions, d.rope);
      ops.kv_store(st, kv, k, v, group.slot_mapping);
    }
    ops.attention(st, q, kv, group.attention, d.attn_scale, heads(attn2, d.head_dim_v));
    ops.matmul(st, w.wo, attn2, proj);
    run.reduce(proj);  // tensor split: the whole projection before its norm
    ops.rms_norm(st, proj, &w.post_attn_norm, run.eps, proj);
    ops.add(st, x, proj, x);
  }

  int64_t n_ff_exp_local() const {
    return shard_.mode == SplitMode::Tensor ? shard_.ff_exp.size() : hp_.n_ff_exp;
  }

  // x += RMS(f) * post_ffw_norm with f = down(gelu_tanh(gate(g)) * up(g)), g = RMS(x) * ffn_norm; in a MoE
  // layer f = RMS(f) * post_ffw_norm_1 + the expert branch (gemma4_moe.h), C.5.
  void ffn(const BlockRun& run, const Gemma4Layer& w, int64_t n_ff, const Gemma4Scratch& scratch,
           const Tensor& x) const {
    const BlockScratch& sc = scratch.blocks;
    Stream& st = run.st;
    Ops& ops = run.ops;
    const int64_t T = x.ne[1];
    const Tensor h = mat(sc.h, x.ne[0], T), proj = mat(sc.proj, x.ne[0], T);
    const Tensor gate = mat(sc.gate, n_ff, T), up = mat(sc.up, n_ff, T), act = mat(sc.act, n_ff, T);
    ops.rms_norm(st, x, &w.ffn_norm, run.eps, h);
    ops.matmul(st, w.gate, h, gate);
    ops.matmul(st, w.up, h, up);
    ops.gelu_mul(st, gate, up, act);
    ops.matmul(st, w.down, act, proj);
    run.reduce(proj);
    if (w.moe) {
      ops.rms_norm(st, proj, &w.moe->post_norm_1, run.eps, proj);
      const Tensor moe_out = mat(scratch.moe.out, x.ne[0], T);
      gemma4_moe_branch(run, *w.moe, scratch.moe, hp_, x, h, moe_out);
      ops.add(st, proj, moe_out, proj);
    }
    ops.rms_norm(st, proj, &w.post_ffw_norm, run.eps, proj);
    ops.add(st, x, proj, x);
  }

  ModelHparams hp_;
  Gemma4Weights w_;
  float softcap_ = 0.0f;
  std::unique_ptr<WeightLoader> loader_;
  RankShard shard_;
  Comm* comm_ = nullptr;
  std::vector<LayerShape> local_;
};

// A {1} F32 scalar tensor's value, read from the file (layer_output_scale).
float read_scalar(const gguf::GgufFile& file, const std::string& name) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  check(t != nullptr, "missing tensor " + name);
  check(t->type == DType::F32 && t->ne.size() >= 1 && t->ne[0] == 1,
        "tensor " + name + " must be a single F32 value");
  float v = 0.0f;
  std::memcpy(&v, file.tensor_data(*t), sizeof v);
  check(std::isfinite(v), "tensor " + name + " is not finite");
  return v;
}

}  // namespace

ModelHparams gemma4_hparams(const gguf::GgufFile& file) {
  ModelHparams hp = read_decoder_hparams(file, "gemma4");
  hp.rope_mode = RopeMode::Neox;
  hp.qk_norm = true;
  hp.attn_scale = 1.0f;
  hp.embedding_scale = std::sqrt(float(hp.n_embd));
  return hp;
}

std::unique_ptr<DecoderModel> load_gemma4(const gguf::GgufFile& file, const ModelHparams& hp,
                                          const DecoderLoadContext& ctx) {
  check(!ctx.rules.empty(), "internal: the load context has no shard rules");
  check(hp.n_vocab > 0, "n_vocab is not set (read the hparams with read_model_hparams)");
  check(hp.n_expert > 0 || !file.find_tensor("blk.0.ffn_gate_inp.weight"),
        file.path() +
            ": the file has expert router tensors (blk.0.ffn_gate_inp.weight) but no "
            "gemma4.expert_count");
  // C.7 (E2B/E4B): per-layer inputs and KV sharing. Both reach across layers (the layer-0 input; another
  // layer's cache), so such a model is not split by layer.
  const int64_t n_embd_pl = file.get_int("gemma4.embedding_length_per_layer_input", 0);
  const int64_t n_shared_kv = file.get_int("gemma4.attention.shared_kv_layers", 0);
  check(n_embd_pl >= 0 && n_embd_pl <= (int64_t(1) << 20),
        "GGUF key gemma4.embedding_length_per_layer_input must be >= 0");
  check(n_shared_kv >= 0 && n_shared_kv <= hp.n_layer - 2,
        "GGUF key gemma4.attention.shared_kv_layers (" + std::to_string(n_shared_kv) +
            ") must leave at least two layers with their own K/V (the model has " +
            std::to_string(hp.n_layer) + " layers)");
  check(ctx.shard.mode != SplitMode::Layer || (n_embd_pl == 0 && n_shared_kv == 0),
        "a gemma4 model with per-layer inputs or KV sharing (E2B/E4B) cannot be split by layer yet; use "
        "--split-mode tensor or one device");
  const float softcap = float(file.get_float("gemma4.final_logit_softcapping", 0.0));
  check(std::isfinite(softcap) && softcap >= 0.0f, "GGUF key gemma4.final_logit_softcapping must be >= 0");

  auto loader =
      std::make_unique<WeightLoader>(file, ctx.device, ctx.rules, ctx.shard, ctx.dims, ctx.row_split);
  WeightLoader& ld = *loader;
  const int64_t E = hp.n_embd, V = hp.n_vocab;
  Gemma4Weights w;
  w.tok_embd = ld.matrix("token_embd.weight", {E, V});
  w.output_norm = ld.vector("output_norm.weight", E);
  if (auto out = ld.optional_matrix("output.weight", {E, V})) {
    w.output = *out;
  } else {  // tied head: token_embd read again under the output head's shard rule
    w.output = ld.matrix("token_embd.weight", {E, V}, "output.weight");
    w.tied_output = true;
  }
  int64_t global_rot = 0;
  for (const LayerHparams& L : hp.layers)
    if (L.rope_freq_factors) global_rot = std::max(global_rot, L.n_rot);
  if (global_rot > 0) w.rope_freqs = ld.optional_vector("rope_freqs.weight", global_rot / 2);

  const int64_t first_shared = hp.n_layer - n_shared_kv;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerHparams& P = hp.layers[size_t(il)];
    Gemma4Layer L;
    if (il >= first_shared) {  // C.7: the last own-KV layer of the same kind
      L.kv_source = P.sliding_window > 0 ? first_shared - 2 : first_shared - 1;
      const LayerHparams& S = hp.layers[size_t(L.kv_source)];
      check(S.sliding_window == P.sliding_window && S.head_dim_k == P.head_dim_k &&
                S.head_dim_v == P.head_dim_v && S.n_head_kv == P.n_head_kv,
            "layer " + std::to_string(il) + " shares the K/V of layer " + std::to_string(L.kv_source) +
                " (attention.shared_kv_layers), which is of another kind (window, head dims or KV heads "
                "differ)");
    }
    L.attn_norm = ld.vector(blk(il, "attn_norm.weight"), E);
    L.wq = ld.matrix(blk(il, "attn_q.weight"), {E, P.n_embd_q()});
    if (L.kv_source >= 0) {  // K/V weights of a sharing layer are unused (converters may keep them)
      (void)ld.optional_matrix(blk(il, "attn_k.weight"), {E, P.n_embd_k()});
      (void)ld.optional_matrix(blk(il, "attn_v.weight"), {E, P.n_embd_v()});
      (void)ld.optional_vector(blk(il, "attn_k_norm.weight"), P.head_dim_k);
    } else {
      L.wk = ld.matrix(blk(il, "attn_k.weight"), {E, P.n_embd_k()});
      L.wv = ld.optional_matrix(blk(il, "attn_v.weight"), {E, P.n_embd_v()});
    }
    check(L.kv_source >= 0 || L.wv || P.head_dim_v == P.head_dim_k,
          "layer " + std::to_string(il) + " has no attn_v (V = K) but its value length " +
              std::to_string(P.head_dim_v) + " differs from its key length " + std::to_string(P.head_dim_k));
    L.wo = ld.matrix(blk(il, "attn_output.weight"), {P.n_head * P.head_dim_v, E});
    L.q_norm = ld.vector(blk(il, "attn_q_norm.weight"), P.head_dim_k);
    if (L.kv_source < 0) L.k_norm = ld.vector(blk(il, "attn_k_norm.weight"), P.head_dim_k);
    L.post_attn_norm = ld.vector(blk(il, "post_attention_norm.weight"), E);
    L.ffn_norm = ld.vector(blk(il, "ffn_norm.weight"), E);
    L.gate = ld.matrix(blk(il, "ffn_gate.weight"), {E, P.n_ff});
    L.up = ld.matrix(blk(il, "ffn_up.weight"), {E, P.n_ff});
    L.down = ld.matrix(blk(il, "ffn_down.weight"), {P.n_ff, E});
    L.post_ffw_norm = ld.vector(blk(il, "post_ffw_norm.weight"), E);
    if (hp.n_expert > 0) L.moe = load_gemma4_moe(ld, hp, il);
    const std::string scale_name = blk(il, "layer_output_scale.weight");
    if (ld.has(scale_name)) {
      (void)ld.optional_vector(scale_name, 1);  // marks it used; the value is applied as a host scalar
      L.output_scale = read_scalar(file, scale_name);
    }
    w.layers.push_back(std::move(L));
  }
  if (n_embd_pl > 0) w.ple = load_gemma4_ple(ld, n_embd_pl, E, hp.n_layer, V);
  const std::vector<std::string> unused = ld.unused();
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 4; ++i) list += (i ? ", " : "") + unused[i];
    if (unused.size() > 4) list += ", ... (" + std::to_string(unused.size()) + " in all)";
    throw Error("the gemma4 model has tensors tandem does not know how to use: " + list);
  }
  return std::make_unique<Gemma4Model>(hp, std::move(w), softcap, std::move(loader), ctx);
}

}  // namespace tandem
