// The gemma4 layer body (GGUF-ARCH-FACTS C.3, C.4, C.6), shared by gemma4.cpp and diffusion_gemma.cpp:
// sliding and global layers with their own head dims, KV heads, rope bases and rotary dims (proportional
// partial rope on global layers through rope_freqs); per-head Q/K norms and an unweighted V norm, V = the raw
// K projection when attn_v is absent; attention scale 1; post-attention, pre- and post-FFN norms (plain
// RMS(x)*w); GELU-tanh MLP. Every branch is normed after its projection, so the layer is its own code rather
// than blocks.h's attention_block / dense_ffn_block.
#include "model/gemma4_base.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "core/error.h"
#include "model/scratch_views.h"
#include "parallel/comm.h"

namespace tandem {

Gemma4Base::Gemma4Base(ModelHparams hp, Gemma4Weights w, float softcap, std::unique_ptr<WeightLoader> loader,
                       const DecoderLoadContext& ctx)
    : hp_(std::move(hp)),
      w_(std::move(w)),
      softcap_(softcap),
      loader_(std::move(loader)),
      shard_(ctx.shard),
      comm_(ctx.comm) {
  check(shard_.mode != SplitMode::Tensor || shard_.n_ranks == 1 || comm_ != nullptr,
        "a tensor-split rank needs a communicator");
  for (size_t il = 0; il < hp_.layers.size(); ++il) {
    const LayerHparams& L = hp_.layers[il];
    LayerShape d = layer_shape(L, shard_, int64_t(il));
    d.attn_scale = 1.0f;  // C.4: no 1/sqrt(d); the Q/K norms keep the scores in range
    d.rope.mode = RopeMode::Neox;
    d.rope.freq_factors = w_.rope_freqs && L.rope_freq_factors ? &*w_.rope_freqs : nullptr;
    local_.push_back(d);
  }
}

std::vector<KvLayerShape> Gemma4Base::kv_layer_shapes() const {
  return kv_layer_shapes_of(local_, shard_.layers.begin, shard_.layers.end);
}

Tensor Gemma4Base::hidden_state(ForwardScratch& scratch, int64_t n_rows) const {
  return first_cols(static_cast<Gemma4Scratch&>(scratch).x, n_rows);
}

std::unique_ptr<ForwardScratch> Gemma4Base::plan_scratch(Device& device, int64_t max_rows, int64_t max_out,
                                                         WorkspacePlan& plan) const {
  auto s = std::make_unique<Gemma4Scratch>();
  const int64_t E = hp_.n_embd;
  s->buffer = plan_block_scratch(device, local_, E, max_rows, max_out, {}, s->x, s->blocks, s->xo, plan);
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
    s->ple = gemma4_ple_scratch(w_.ple->n_embd_pl, hp_.n_layer, max_rows, s->ple_buffer.data(), device.id());
    plan.max_matmul_in = std::max(plan.max_matmul_in, w_.ple->n_embd_pl);
  }
  if (comm_) comm_->reserve(size_t(E) * size_t(max_rows) * sizeof(float));
  return s;
}

std::optional<Tensor> Gemma4Base::shared_weight(const std::string& name) const {
  if (shard_.mode != SplitMode::None) return std::nullopt;
  if (name == "token_embd.weight") return w_.tok_embd;
  if (name == "output.weight") return w_.output;
  return std::nullopt;
}

Tensor Gemma4Base::residual(const ForwardInputs& in, std::span<const KvLayerView> kv,
                            Gemma4Scratch& sc) const {
  const int64_t T = in.n_rows;
  check(T >= 1 && T <= sc.x.ne[1],
        "batch of " + std::to_string(T) + " rows exceeds the planned " + std::to_string(sc.x.ne[1]));
  check(int64_t(kv.size()) == shard_.layers.size(), "KV cache has the wrong number of layers");
  return first_cols(sc.x, T);
}

void Gemma4Base::run_layer(const BlockRun& run, int64_t il, Gemma4Scratch& sc, const Tensor& x,
                           const ForwardInputs& in, std::span<const KvLayerView> kv, float out_scale) const {
  const size_t local = size_t(il - shard_.layers.begin);
  const Gemma4Layer& w = w_.layers[size_t(il)];
  // A KV-sharing layer attends over its source layer's cache (same rank: such models are not layer-split).
  const size_t kv_local = w.kv_source < 0 ? local : size_t(w.kv_source - shard_.layers.begin);
  attention(run, w, local_[size_t(il)], sc.blocks, x, in.positions, kv[kv_local], in.kv_group(kv_local));
  if (!w_.ple) {  // the output scale in the FFN's residual add
    ffn(run, w, local_[size_t(il)].n_ff, sc, x, out_scale);
    return;
  }
  ffn(run, w, local_[size_t(il)].n_ff, sc, x, 1.0f);
  gemma4_ple_layer(run, *w_.ple, sc.ple, il, x, slot_view(sc.blocks.proj, x.ne[0], x.ne[1]));
  if (out_scale != 1.0f) run.ops.scale(run.st, x, out_scale, x);
}

void Gemma4Base::tap(const BlockRun& run, const ForwardInputs& in, int layer, const Tensor& x) const {
  for (const LayerTap& t : in.taps)
    if (t.layer == layer) run.ops.copy(run.st, x, t.dst);
}

void Gemma4Base::output(const BlockRun& run, const ForwardInputs& in, Gemma4Scratch& sc,
                        const Tensor& x) const {
  output_head(run, w_.output_norm, w_.output, in, x, sc.xo);
  if (softcap_ > 0.0f && in.n_out > 0) run.ops.softcap(run.st, in.logits, softcap_, in.logits);
}

// x += RMS(Wo . attention(rope(RMS(Q)*qn), rope(RMS(K)*kn), RMS(V))) * post_attention_norm, on RMS(x)*w.
void Gemma4Base::attention(const BlockRun& run, const Gemma4Layer& w, const LayerShape& d,
                           const BlockScratch& sc, const Tensor& x, const Tensor& positions,
                           const KvLayerView& kv, const KvGroupInputs& group) {
  Stream& st = run.st;
  Ops& ops = run.ops;
  const int64_t T = x.ne[1];
  const Tensor h = slot_view(sc.h, x.ne[0], T), proj = slot_view(sc.proj, x.ne[0], T);
  const Tensor q2 = slot_view(sc.q, d.n_head * d.head_dim_k, T),
               k2 = slot_view(sc.k, d.n_head_kv * d.head_dim_k, T);
  const Tensor v2 = slot_view(sc.v, d.n_head_kv * d.head_dim_v, T);
  const Tensor attn2 = slot_view(sc.attn, d.n_head * d.head_dim_v, T);
  const Tensor q = split_heads(q2, d.head_dim_k), k = split_heads(k2, d.head_dim_k),
               v = split_heads(v2, d.head_dim_v);
  // The norm and the Q, K (and V) products in one launch where the backend can (h read once; at decode the
  // norm, three activation quantizations and three products become one quantization and one product).
  // A KV-sharing layer (kv_source >= 0) projects Q only: its source layer wrote these rows' K/V.
  const bool own_kv = w.kv_source < 0;
  const Tensor w_qkv[3] = {w.wq, w.wk, w.wv ? *w.wv : w.wk};
  const Tensor y_qkv[3] = {q2, k2, v2};
  const size_t n_proj = !own_kv ? 1 : w.wv ? 3 : 2;
  ops.norm_matmul_multi(st, x, w.attn_norm, run.eps, h, std::span(w_qkv, n_proj), std::span(y_qkv, n_proj));
  if (own_kv) {
    if (!w.wv) ops.copy(st, k2, v2);  // V = the raw K projection, taken before K's norm (C.4 step 3)
    // Q/K norms, the unweighted V norm, rope and the K/V store: one launch where the backend can.
    ops.qk_norm_rope_store(st, q, k, v, &w.q_norm, &w.k_norm, /*norm_v=*/true, run.eps, positions, d.rope, kv,
                           group.slot_mapping);
  } else {
    ops.rms_norm(st, q, &w.q_norm, run.eps, q);
    ops.rope(st, q, positions, d.rope);
  }
  ops.attention(st, q, kv, group.attention, d.attn_scale, split_heads(attn2, d.head_dim_v));
  ops.matmul(st, w.wo, attn2, proj);
  run.reduce(proj);  // tensor split: the whole projection before its norm
  ops.norm_residual_add(st, x, proj, w.post_attn_norm, run.eps, 1.0f);  // x += RMS(proj) * post_attn_norm
}

// x = (x + RMS(f) * post_ffw_norm) * out_scale with f = down(gelu_tanh(gate(g)) * up(g)), g = RMS(x) *
// ffn_norm; in a MoE layer f = RMS(f) * post_ffw_norm_1 + RMS(the expert branch) * post_ffw_norm_2
// (gemma4_moe.h), C.5.
void Gemma4Base::ffn(const BlockRun& run, const Gemma4Layer& w, int64_t n_ff, const Gemma4Scratch& scratch,
                     const Tensor& x, float out_scale) const {
  const BlockScratch& sc = scratch.blocks;
  Stream& st = run.st;
  Ops& ops = run.ops;
  const int64_t T = x.ne[1];
  const Tensor h = slot_view(sc.h, x.ne[0], T), proj = slot_view(sc.proj, x.ne[0], T);
  const Tensor gate = slot_view(sc.gate, n_ff, T), up = slot_view(sc.up, n_ff, T),
               act = slot_view(sc.act, n_ff, T);
  // The norm, gate and up and the GELU in one launch where the backend can.
  ops.norm_matmul_geglu(st, x, w.ffn_norm, run.eps, h, w.gate, w.up, gate, up, act);
  ops.matmul(st, w.down, act, proj);
  run.reduce(proj);
  if (!w.moe) {
    ops.norm_residual_add(st, x, proj, w.post_ffw_norm, run.eps, out_scale);
    return;
  }
  const Gemma4MoeOutputs experts = gemma4_moe_experts(run, *w.moe, scratch.moe, hp_, x, h);
  const Tensor moe_out = slot_view(scratch.moe.out, x.ne[0], T);
  if (run.comm != nullptr) {  // tensor split: each rank summed its slice of every expert's n_ff; reduce the sum
    ops.moe_combine(st, experts.expert_out, experts.weights, moe_out);
    run.reduce(moe_out);
    ops.moe_residual_add(st, x, proj, w.moe->post_norm_1, nullptr, nullptr, moe_out, w.moe->post_norm_2,
                         w.post_ffw_norm, run.eps, out_scale);
    return;
  }
  // The experts' weighted sum, the three post-norms, the sum of the branches and the residual add: one launch
  // where the backend can.
  ops.moe_residual_add(st, x, proj, w.moe->post_norm_1, &experts.expert_out, &experts.weights, moe_out,
                       w.moe->post_norm_2, w.post_ffw_norm, run.eps, out_scale);
}

float read_scalar_tensor(const gguf::GgufFile& file, const std::string& name) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  check(t != nullptr, "missing tensor " + name);
  check(t->type == DType::F32 && t->ne.size() >= 1 && t->ne[0] == 1,
        "tensor " + name + " must be a single F32 value");
  float v = 0.0f;
  std::memcpy(&v, file.tensor_data(*t), sizeof v);
  check(std::isfinite(v), "tensor " + name + " is not finite");
  return v;
}

Gemma4Weights load_gemma4_weights(const gguf::GgufFile& file, WeightLoader& ld, const ModelHparams& hp) {
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

  // C.7 (E2B/E4B): the last shared_kv_layers layers read the cache of the last own-KV layer of their kind.
  const std::string a = hp.arch + ".";
  const int64_t n_embd_pl = file.get_int(a + "embedding_length_per_layer_input", 0);
  const int64_t n_shared_kv = file.get_int(a + "attention.shared_kv_layers", 0);
  check(n_embd_pl >= 0 && n_embd_pl <= (int64_t(1) << 20),
        "GGUF key " + a + "embedding_length_per_layer_input must be >= 0");
  check(n_shared_kv >= 0 && n_shared_kv <= hp.n_layer - 2,
        "GGUF key " + a + "attention.shared_kv_layers (" + std::to_string(n_shared_kv) +
            ") must leave at least two layers with their own K/V (the model has " +
            std::to_string(hp.n_layer) + " layers)");
  check(hp.n_expert > 0 || !file.find_tensor("blk.0.ffn_gate_inp.weight"),
        file.path() + ": the file has expert router tensors (blk.0.ffn_gate_inp.weight) but no " + a +
            "expert_count");
  const int64_t first_shared = hp.n_layer - n_shared_kv;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerHparams& P = hp.layers[size_t(il)];
    Gemma4Layer L;
    if (il >= first_shared) {
      L.kv_source = P.sliding_window > 0 ? first_shared - 2 : first_shared - 1;
      const LayerHparams& S = hp.layers[size_t(L.kv_source)];
      check(S.sliding_window == P.sliding_window && S.head_dim_k == P.head_dim_k &&
                S.head_dim_v == P.head_dim_v && S.n_head_kv == P.n_head_kv,
            "layer " + std::to_string(il) + " shares the K/V of layer " + std::to_string(L.kv_source) +
                " (attention.shared_kv_layers), which is of another kind (window, head dims or KV heads "
                "differ)");
    }
    L.attn_norm = ld.vector(layer_tensor_name(il, "attn_norm.weight"), E);
    L.wq = ld.matrix(layer_tensor_name(il, "attn_q.weight"), {E, P.n_embd_q()});
    if (L.kv_source >= 0) {  // K/V weights of a sharing layer are unused (converters may keep them)
      (void)ld.optional_matrix(layer_tensor_name(il, "attn_k.weight"), {E, P.n_embd_k()});
      (void)ld.optional_matrix(layer_tensor_name(il, "attn_v.weight"), {E, P.n_embd_v()});
      (void)ld.optional_vector(layer_tensor_name(il, "attn_k_norm.weight"), P.head_dim_k);
    } else {
      L.wk = ld.matrix(layer_tensor_name(il, "attn_k.weight"), {E, P.n_embd_k()});
      L.wv = ld.optional_matrix(layer_tensor_name(il, "attn_v.weight"), {E, P.n_embd_v()});
    }
    check(L.kv_source >= 0 || L.wv || P.head_dim_v == P.head_dim_k,
          "layer " + std::to_string(il) + " has no attn_v (V = K) but its value length " +
              std::to_string(P.head_dim_v) + " differs from its key length " + std::to_string(P.head_dim_k));
    L.wo = ld.matrix(layer_tensor_name(il, "attn_output.weight"), {P.n_head * P.head_dim_v, E});
    L.q_norm = ld.vector(layer_tensor_name(il, "attn_q_norm.weight"), P.head_dim_k);
    if (L.kv_source < 0) L.k_norm = ld.vector(layer_tensor_name(il, "attn_k_norm.weight"), P.head_dim_k);
    L.post_attn_norm = ld.vector(layer_tensor_name(il, "post_attention_norm.weight"), E);
    L.ffn_norm = ld.vector(layer_tensor_name(il, "ffn_norm.weight"), E);
    L.gate = ld.matrix(layer_tensor_name(il, "ffn_gate.weight"), {E, P.n_ff});
    L.up = ld.matrix(layer_tensor_name(il, "ffn_up.weight"), {E, P.n_ff});
    L.down = ld.matrix(layer_tensor_name(il, "ffn_down.weight"), {P.n_ff, E});
    L.post_ffw_norm = ld.vector(layer_tensor_name(il, "post_ffw_norm.weight"), E);
    const std::string scale_name = layer_tensor_name(il, "layer_output_scale.weight");
    if (ld.has(scale_name)) {
      (void)ld.optional_vector(scale_name, 1);  // marks it used; the value is applied as a host scalar
      L.output_scale = read_scalar_tensor(file, scale_name);
    }
    if (hp.n_expert > 0) L.moe = load_gemma4_moe(ld, hp, il);
    w.layers.push_back(std::move(L));
  }
  if (n_embd_pl > 0) w.ple = load_gemma4_ple(ld, n_embd_pl, E, hp.n_layer, V);
  return w;
}

}  // namespace tandem
