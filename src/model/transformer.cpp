#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "model/scratch_views.h"
#include "parallel/comm.h"

namespace tandem {

namespace {

// Scratch of one forward pass, planned for max_rows rows. Every tensor is {width, max_rows} contiguous; a
// step with T rows uses the first T columns (the same addresses every step, which CUDA graphs need).
struct TransformerScratch : ForwardScratch {
  Buffer buffer;
  Tensor x;  // {n_embd, max_rows}: the residual stream
  BlockScratch blocks;
  Tensor xo;  // {n_embd, max_out}: rows gathered for the head
};

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
  for (size_t il = 0; il < hp_.layers.size(); ++il) {
    const LayerHparams& L = hp_.layers[il];
    LayerShape d = layer_shape(L, shard_, int64_t(il));
    d.attn_scale = hp_.attn_scale != 0.0f ? hp_.attn_scale : 1.0f / std::sqrt(float(L.head_dim_k));
    d.rope.mode = hp_.rope_mode;
    d.rope.freq_scale = hp_.rope_freq_scale;
    d.rope.attn_factor = hp_.rope_attn_factor;
    d.rope.freq_factors = w_.rope_freqs && L.rope_freq_factors ? &*w_.rope_freqs : nullptr;
    local_.push_back(d);
  }
}

std::vector<KvLayerShape> Transformer::kv_layer_shapes() const {
  return kv_layer_shapes_of(local_, shard_.layers.begin, shard_.layers.end);
}

Tensor Transformer::hidden_state(ForwardScratch& scratch, int64_t n_rows) const {
  return first_cols(static_cast<TransformerScratch&>(scratch).x, n_rows);
}

std::unique_ptr<ForwardScratch> Transformer::plan_scratch(Device& device, int64_t max_rows, int64_t max_out,
                                                          WorkspacePlan& plan) const {
  auto s = std::make_unique<TransformerScratch>();
  s->buffer =
      plan_block_scratch(device, local_, hp_.n_embd, max_rows, max_out, {}, s->x, s->blocks, s->xo, plan);
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
  const BlockRun run{st, ops, hp_.rms_eps, in.comm ? in.comm : comm_, shard_.rank};
  const Tensor x = first_cols(sc.x, T);
  // Layer split: a rank that is not first starts from x, the previous rank's output (the session copied it).
  if (shard_.first) embed_block(run, w_.tok_embd, hp_.embedding_scale, in, x);
  auto tap = [&](int layer) {
    for (const LayerTap& t : in.taps)
      if (t.layer == layer) ops.copy(st, x, t.dst);
  };
  for (int64_t il = shard_.layers.begin; il < shard_.layers.end; ++il) {
    const TransformerLayerWeights& L = w_.layers[size_t(il)];
    const LayerShape& d = local_[size_t(il)];
    const size_t local = size_t(il - shard_.layers.begin);
    tap(int(il));
    attention_block(run, L.attn, d, sc.blocks, x, in.positions, kv[local], in.kv_group(local));
    dense_ffn_block(run, L.ffn, d.n_ff, sc.blocks, x);
  }
  if (!shard_.last) return;  // layer split: the next rank continues from x
  tap(int(hp_.n_layer));
  output_head(run, w_.output_norm, w_.output, in, x, sc.xo);
}

std::optional<Tensor> Transformer::shared_weight(const std::string& name) const {
  if (shard_.mode != SplitMode::None) return std::nullopt;  // only whole tensors are shared
  if (name == "token_embd.weight") return w_.tok_embd;
  if (name == "output.weight") return w_.output;
  return std::nullopt;
}

TransformerLayerWeights load_transformer_layer(WeightLoader& ld, const LayerHparams& P, int64_t il, int64_t E,
                                               const TransformerVariant& variant) {
  TransformerLayerWeights L;
  L.attn.norm = ld.vector(layer_tensor_name(il, "attn_norm.weight"), E);
  L.attn.wq = ld.matrix(layer_tensor_name(il, "attn_q.weight"), {E, P.n_embd_q()});
  L.attn.wk = ld.matrix(layer_tensor_name(il, "attn_k.weight"), {E, P.n_embd_k()});
  L.attn.wv = ld.matrix(layer_tensor_name(il, "attn_v.weight"), {E, P.n_embd_v()});
  L.attn.wo = ld.matrix(layer_tensor_name(il, "attn_output.weight"), {P.n_head * P.head_dim_v, E});
  if (variant.allow_qkv_bias) {
    L.attn.bq = ld.optional_vector(layer_tensor_name(il, "attn_q.bias"), P.n_embd_q());
    L.attn.bk = ld.optional_vector(layer_tensor_name(il, "attn_k.bias"), P.n_embd_k());
    L.attn.bv = ld.optional_vector(layer_tensor_name(il, "attn_v.bias"), P.n_embd_v());
  }
  if (variant.qk_norm) {
    L.attn.q_norm = ld.vector(layer_tensor_name(il, "attn_q_norm.weight"), P.head_dim_k);
    L.attn.k_norm = ld.vector(layer_tensor_name(il, "attn_k_norm.weight"), P.head_dim_k);
  }
  L.ffn.norm = ld.vector(layer_tensor_name(il, "ffn_norm.weight"), E);
  L.ffn.gate = ld.matrix(layer_tensor_name(il, "ffn_gate.weight"), {E, P.n_ff});
  L.ffn.up = ld.matrix(layer_tensor_name(il, "ffn_up.weight"), {E, P.n_ff});
  L.ffn.down = ld.matrix(layer_tensor_name(il, "ffn_down.weight"), {P.n_ff, E});
  if (variant.allow_out_ffn_bias) {
    L.attn.bo = ld.optional_vector(layer_tensor_name(il, "attn_output.bias"), E);
    L.ffn.b_gate = ld.optional_vector(layer_tensor_name(il, "ffn_gate.bias"), P.n_ff);
    L.ffn.b_up = ld.optional_vector(layer_tensor_name(il, "ffn_up.bias"), P.n_ff);
    L.ffn.b_down = ld.optional_vector(layer_tensor_name(il, "ffn_down.bias"), E);
  }
  return L;
}

std::unique_ptr<Transformer> load_transformer(const gguf::GgufFile& file, const ModelHparams& hp,
                                              const TransformerVariant& variant,
                                              const DecoderLoadContext& ctx) {
  check(!ctx.rules.empty(), "internal: the load context has no shard rules");
  auto loader =
      std::make_unique<WeightLoader>(file, ctx.device, ctx.rules, ctx.shard, ctx.dims, ctx.row_split);
  WeightLoader& ld = *loader;
  check(!ld.has("blk.0.attn_qkv.weight"),
        "tensor blk.0.attn_qkv.weight: fused QKV projections are not supported yet (convert with separate "
        "attn_q/attn_k/attn_v)");
  check(hp.n_expert == 0 && !ld.has("blk.0.ffn_gate_inp.weight"),
        "mixture-of-experts layers (blk.0.ffn_gate_inp.weight) are not "
        "supported yet");
  check(hp.n_vocab > 0, "n_vocab is not set (read the hparams with read_model_hparams)");
  const int64_t E = hp.n_embd, V = hp.n_vocab;
  TransformerWeights w;
  // A weight the file lacks may come from the model the context borrows from (same device, whole tensors).
  auto borrowed = [&](const std::string& name) -> std::optional<Tensor> {
    if (!ctx.borrow || ld.has(name)) return std::nullopt;
    std::optional<Tensor> t = ctx.borrow->shared_weight(name);
    if (!t) return std::nullopt;
    check(t->ne[0] == E && t->ne[1] == V, "the model shared from has " + name + " of shape {" +
                                              std::to_string(t->ne[0]) + ", " + std::to_string(t->ne[1]) +
                                              "}, this model needs {" + std::to_string(E) + ", " +
                                              std::to_string(V) + "}");
    check(t->device == ctx.device, "weights can be shared only between models on the same device");
    return t;
  };
  const std::optional<Tensor> shared_embd = borrowed("token_embd.weight");
  w.tok_embd = shared_embd ? *shared_embd : ld.matrix("token_embd.weight", {E, V});
  w.output_norm = ld.vector("output_norm.weight", E);
  if (auto out = ld.optional_matrix("output.weight", {E, V})) {
    w.output = *out;
  } else if (auto shared_out = shared_embd ? borrowed("output.weight") : std::nullopt) {
    w.output = *shared_out;  // no token_embd and no output of its own: the other model's head
  } else {                   // tied head: token_embd read again under the output head's shard rule
    w.output = ld.matrix("token_embd.weight", {E, V}, "output.weight");
    w.tied_output = true;
  }
  if (variant.allow_rope_freqs) w.rope_freqs = ld.optional_vector("rope_freqs.weight", hp.n_rot / 2);

  check(int64_t(hp.layers.size()) == hp.n_layer, "the per-layer hparams are not set (read_decoder_hparams)");
  for (int64_t il = 0; il < hp.n_layer; ++il)
    w.layers.push_back(load_transformer_layer(ld, hp.layers[size_t(il)], il, E, variant));
  ld.check_all_used(hp.arch, " (an unsupported variant of the architecture?)");
  return std::make_unique<Transformer>(hp, std::move(w), std::move(loader), ctx);
}

}  // namespace tandem
