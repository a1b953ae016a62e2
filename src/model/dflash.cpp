// The dflash drafter (dflash.h; GGUF-ARCH-FACTS E.1, E.3). Its layers are the Qwen3 blocks of blocks.h; what
// is its own is the feature path: the fused target features become one hidden row g per position, and each
// layer stores K/V computed from g straight into the cache (no attention): that is how the target's context
// enters the drafter. A draft block then attends over that injected context and over itself.
#include "model/dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "core/error.h"
#include "core/half.h"
#include "model/blocks.h"
#include "model/hparams.h"
#include "model/scratch_views.h"
#include "model/transformer.h"
#include "model/weight_loader.h"

namespace tandem {

namespace {

using enum LayerPlacement;
using enum TensorCut;
using enum CutUnit;
using enum RowPlacement;

// The drafter runs unsplit (on the target's main device); the rules only say where each tensor lives.
// clang-format off
constexpr ShardRule kShardRules[] = {
  // GGUF name                 per layer  layer split  tensor split  unit  row split
  {"token_embd.weight",         false,     FirstRank,   Mirrored,     None, MainDevice},
  {"output_norm.weight",        false,     LastRank,    Mirrored,     None, MainDevice},
  {"output.weight",             false,     LastRank,    Mirrored,     None, MainDevice},
  {"fc.weight",                 false,     FirstRank,   Mirrored,     None, MainDevice},
  {"fc.scale",                  false,     FirstRank,   Mirrored,     None, MainDevice},
  {"enc.output_norm.weight",    false,     FirstRank,   Mirrored,     None, MainDevice},
  {"d2t",                       false,     LastRank,    Mirrored,     None, MainDevice},
  {"attn_norm.weight",          true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"attn_q.weight",             true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"attn_k.weight",             true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"attn_v.weight",             true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"attn_output.weight",        true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"attn_q_norm.weight",        true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"attn_k_norm.weight",        true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"ffn_norm.weight",           true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"ffn_gate.weight",           true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"ffn_up.weight",             true,      LayerOwner,  Mirrored,     None, MainDevice},
  {"ffn_down.weight",           true,      LayerOwner,  Mirrored,     None, MainDevice},
};
// clang-format on

struct DflashWeights {
  Tensor tok_embd;  // {n_embd, n_token_ids}: the draft's own or the target's
  Tensor output_norm;
  Tensor output;                       // {n_embd, n_vocab}
  Tensor fc;                           // {n_taps * n_embd, n_embd}
  std::optional<Tensor> fc_scale_vec;  // fc.scale of n_embd values (per channel), on the device
  float fc_scale = 1.0f;               // fc.scale of one value (a scalar, read at load)
  Tensor enc_norm;                     // {n_embd}
  std::vector<TransformerLayerWeights> layers;
};

struct DflashScratch : ForwardScratch {
  Buffer buffer;
  Tensor x;     // {n_embd, max_rows}: the residual stream (the block), or u = fc . features
  Tensor feat;  // {n_features, max_rows}: feature rows gathered in batch order
  BlockScratch blocks;
  Tensor xo;  // {n_embd, max_out}
};

class Dflash final : public DecoderModel {
 public:
  Dflash(ModelHparams hp, DflashWeights w, std::unique_ptr<WeightLoader> loader,
         const DecoderLoadContext& ctx)
      : hp_(std::move(hp)), w_(std::move(w)), loader_(std::move(loader)), shard_(ctx.shard) {
    for (size_t il = 0; il < hp_.layers.size(); ++il) {
      const LayerHparams& L = hp_.layers[il];
      LayerShape d = layer_shape(L, RankShard{}, int64_t(il));  // the drafter runs unsplit
      d.attn_scale = 1.0f / std::sqrt(float(L.head_dim_k));
      d.rope.mode = RopeMode::Neox;
      d.rope.freq_scale = hp_.rope_freq_scale;
      d.rope.attn_factor = hp_.rope_attn_factor;
      local_.push_back(d);
    }
  }

  const ModelHparams& hparams() const override { return hp_; }
  const RankShard& shard() const override { return shard_; }

  std::vector<KvLayerShape> kv_layer_shapes() const override {
    return kv_layer_shapes_of(local_, 0, int64_t(local_.size()));
  }

  Tensor hidden_state(ForwardScratch& scratch, int64_t n_rows) const override {
    return first_cols(static_cast<DflashScratch&>(scratch).x, n_rows);
  }

  std::unique_ptr<ForwardScratch> plan_scratch(Device& device, int64_t max_rows, int64_t max_out,
                                               WorkspacePlan& plan) const override {
    auto s = std::make_unique<DflashScratch>();
    const int64_t F = hp_.n_embd_features;
    const ScratchSlot feat[] = {{&s->feat, F}};  // the feature rows, between x and the blocks' scratch
    s->buffer =
        plan_block_scratch(device, local_, hp_.n_embd, max_rows, max_out, feat, s->x, s->blocks, s->xo, plan);
    plan.max_matmul_in = std::max(plan.max_matmul_in, F);  // fc . features
    plan.max_vocab = std::max(plan.max_vocab, hp_.n_vocab);
    return s;
  }

  void forward(Stream& st, Ops& ops, const ForwardInputs& in, std::span<const KvLayerView> kv,
               ForwardScratch& scratch_base) const override {
    auto& sc = static_cast<DflashScratch&>(scratch_base);
    const int64_t T = in.n_rows;
    check(T >= 1 && T <= sc.x.ne[1],
          "batch of " + std::to_string(T) + " rows exceeds the planned " + std::to_string(sc.x.ne[1]));
    check(kv.size() == local_.size(), "KV cache has the wrong number of layers");
    const BlockRun run{st, ops, hp_.rms_eps, nullptr, 0};
    const Tensor x = first_cols(sc.x, T);
    if (in.added != nullptr) {  // feature rows: K/V injection (the session checked that every row is one)
      check(in.added_rows != nullptr && in.n_out == 0, "dflash: feature rows compute no logits");
      const Tensor feat = first_cols(sc.feat, T);
      ops.get_rows(st, *in.added, *in.added_rows, feat);
      ops.matmul(st, w_.fc, feat, x);
      if (w_.fc_scale_vec) ops.mul(st, x, *w_.fc_scale_vec, x);
      if (w_.fc_scale != 1.0f) ops.scale(st, x, w_.fc_scale, x);
      const Tensor g = slot_view(sc.blocks.h, hp_.n_embd, T);
      ops.rms_norm(st, x, &w_.enc_norm, hp_.rms_eps, g);
      for (size_t il = 0; il < local_.size(); ++il) {
        const LayerShape& d = local_[il];
        const AttentionWeights& a = w_.layers[il].attn;
        const Tensor k2 = slot_view(sc.blocks.k, d.n_head_kv * d.head_dim_k, T);
        const Tensor v2 = slot_view(sc.blocks.v, d.n_head_kv * d.head_dim_v, T);
        const Tensor k = split_heads(k2, d.head_dim_k), v = split_heads(v2, d.head_dim_v);
        ops.matmul(st, a.wk, g, k2);
        ops.matmul(st, a.wv, g, v2);
        ops.rms_norm(st, k, &*a.k_norm, hp_.rms_eps, k);
        ops.rope(st, k, in.positions, d.rope);
        ops.kv_store(st, kv[il], k, v, in.kv_group(il).slot_mapping);
      }
      return;
    }
    embed_block(run, w_.tok_embd, 1.0f, in, x);  // no embedding scale (E.3)
    for (size_t il = 0; il < local_.size(); ++il) {
      const TransformerLayerWeights& L = w_.layers[il];
      attention_block(run, L.attn, local_[il], sc.blocks, x, in.positions, kv[il], in.kv_group(il));
      dense_ffn_block(run, L.ffn, local_[il].n_ff, sc.blocks, x);
    }
    output_head(run, w_.output_norm, w_.output, in, x, sc.xo);
  }

 private:
  ModelHparams hp_;
  DflashWeights w_;
  std::unique_ptr<WeightLoader> loader_;
  RankShard shard_;
  std::vector<LayerShape> local_;
  std::unique_ptr<WeightLoader> lender_loader_;  // owns the copies of a split target's token_embd / output

 public:
  void keep(std::unique_ptr<WeightLoader> l) { lender_loader_ = std::move(l); }
};

}  // namespace

ShardRuleTable dflash_shard_rules() {
  return kShardRules;
}

DflashInfo read_dflash_info(const gguf::GgufFile& f) {
  DflashInfo info;
  info.block_size = int32_t(f.get_int("dflash.block_size", 16));
  check(info.block_size >= 2 && info.block_size <= 4096,
        "GGUF key dflash.block_size must be in [2, 4096], got " + std::to_string(info.block_size));
  const gguf::Value* tl = f.find("dflash.target_layers");
  check(tl != nullptr,
        "missing GGUF key dflash.target_layers (the target layers whose inputs the drafter reads)");
  check(tl->type() == gguf::ValueType::ARRAY, "GGUF key dflash.target_layers must be an array of integers");
  std::set<int64_t> seen;
  for (int64_t l : tl->as_int_array()) {
    check(l >= 0 && l <= (int64_t(1) << 20),
          "GGUF key dflash.target_layers has a bad layer " + std::to_string(l));
    check(seen.insert(l).second, "GGUF key dflash.target_layers lists layer " + std::to_string(l) + " twice");
    info.target_layers.push_back(int32_t(l));
  }
  check(!info.target_layers.empty(), "GGUF key dflash.target_layers is empty");
  const int64_t mask = f.get_int("tokenizer.ggml.mask_token_id", -1);
  check(mask >= 0 && mask < (int64_t(1) << 31),
        "missing GGUF key tokenizer.ggml.mask_token_id (the token a DFlash draft block is filled with)");
  info.mask_token_id = int32_t(mask);
  if (const gguf::TensorInfo* t = f.find_tensor("d2t")) {
    check(t->type == DType::I64 && t->n_dims == 1,
          "tensor d2t must be a 1-D I64 vector (draft id -> target id), got type " +
              std::string(dtype_name(t->type)));
    const uint8_t* data = f.tensor_data(*t);
    std::set<int64_t> ids;
    for (int64_t i = 0; i < t->ne[0]; ++i) {
      int64_t v;
      std::memcpy(&v, data + size_t(i) * 8, 8);
      check(v >= 0 && v < (int64_t(1) << 31),
            "tensor d2t: entry " + std::to_string(i) + " = " + std::to_string(v) + " is not a token id");
      check(ids.insert(v).second, "tensor d2t maps two draft ids to target id " + std::to_string(v));
      info.d2t.push_back(int32_t(v));
    }
  }
  return info;
}

ModelHparams dflash_hparams(const gguf::GgufFile& f) {
  ModelHparams hp = read_decoder_hparams(f, "dflash");
  hp.rope_mode = RopeMode::Neox;
  hp.qk_norm = true;
  const DflashInfo info = read_dflash_info(f);
  hp.n_embd_features = int64_t(info.target_layers.size()) * hp.n_embd;
  // The logits' vocabulary: the draft's own head (or its d2t), else its embedding, else the target's (the
  // loader's fallback), whatever the tokenizer (the target's) says.
  if (const gguf::TensorInfo* o = f.find_tensor("output.weight")) {
    hp.n_vocab = o->ne[1];
  } else if (const gguf::TensorInfo* e = f.find_tensor("token_embd.weight")) {
    hp.n_vocab = e->ne[1];
  } else if (!info.d2t.empty()) {
    hp.n_vocab = int64_t(info.d2t.size());
  } else {
    hp.n_vocab = 0;  // the target's (read_model_hparams' fallback)
  }
  return hp;
}

std::unique_ptr<DecoderModel> load_dflash(const gguf::GgufFile& file, const ModelHparams& hp_in,
                                          const DecoderLoadContext& ctx) {
  check(ctx.shard.mode == SplitMode::None || ctx.shard.n_ranks <= 1,
        "a dflash drafter runs unsplit, on one device (the target may be split)");
  ModelHparams hp = hp_in;
  const DflashInfo info = read_dflash_info(file);
  const int64_t E = hp.n_embd, F = hp.n_embd_features;
  if (ctx.borrow) {
    const int64_t target_embd = ctx.borrow->hparams().n_embd;
    check(target_embd == E,
          "the dflash drafter's hidden size (" + std::to_string(E) + ") differs from its target's (" +
              std::to_string(target_embd) +
              "): the drafter reads the target's hidden states at its own width, so the two "
              "must be equal");
  }
  auto loader =
      std::make_unique<WeightLoader>(file, ctx.device, ctx.rules, ctx.shard, ctx.dims, ctx.row_split);
  WeightLoader& ld = *loader;
  // A lender's file (a split target): its token_embd / output read whole onto this device.
  std::unique_ptr<WeightLoader> lender_ld;
  if (ctx.borrow_file) lender_ld = std::make_unique<WeightLoader>(*ctx.borrow_file, ctx.device, ctx.rules);
  auto from_lender_file = [&](const std::string& name) -> std::optional<Tensor> {
    if (!lender_ld) return std::nullopt;
    std::string src = name;
    if (!lender_ld->has(src) && name == "output.weight") src = "token_embd.weight";  // a tied head
    const gguf::TensorInfo* t = lender_ld->info(src);
    if (!t) return std::nullopt;
    check(t->ne[0] == E, "the dflash drafter's hidden size (" + std::to_string(E) +
                             ") differs from its target's (" + std::to_string(t->ne[0]) +
                             "): the drafter reads the target's hidden states at its own width, so the two "
                             "must be equal");
    return lender_ld->matrix(src, {E, t->ne[1]});
  };
  auto borrowed = [&](const std::string& name) -> std::optional<Tensor> {
    if (ld.has(name)) return std::nullopt;
    if (lender_ld) return from_lender_file(name);
    if (!ctx.borrow) return std::nullopt;
    std::optional<Tensor> t = ctx.borrow->shared_weight(name);
    if (!t) return std::nullopt;
    check(t->ne[0] == E, "the model shared from has " + name + " of width " + std::to_string(t->ne[0]) +
                             ", the dflash drafter's hidden size is " + std::to_string(E));
    check(t->device == ctx.device, "weights can be shared only between models on the same device");
    return t;
  };
  DflashWeights w;
  if (ld.has("token_embd.weight")) {
    const gguf::TensorInfo* te = ld.info("token_embd.weight");
    w.tok_embd = ld.matrix("token_embd.weight", {E, te->ne[1]});
  } else {
    std::optional<Tensor> t = borrowed("token_embd.weight");
    check(t.has_value(),
          "the dflash drafter has no token_embd.weight: load it with its target (ModelParams::"
          "share_weights_from; `--draft` does) to use the target's token embeddings");
    w.tok_embd = *t;
  }
  if (ld.has("output.weight")) {
    w.output = ld.matrix("output.weight", {E, hp.n_vocab});
  } else if (auto t = borrowed("output.weight")) {
    w.output = *t;
  } else {
    check(ld.has("token_embd.weight"),
          "the dflash drafter has no output.weight: load it with its target (share_weights_from)");
    w.output = ld.matrix("token_embd.weight", {E, w.tok_embd.ne[1]}, "output.weight");
  }
  check(w.output.ne[1] == hp.n_vocab || hp.n_vocab == 0,
        "the dflash drafter's head has " + std::to_string(w.output.ne[1]) + " rows, its vocabulary " +
            std::to_string(hp.n_vocab));
  hp.n_vocab = w.output.ne[1];
  if (!info.d2t.empty())
    check(int64_t(info.d2t.size()) == hp.n_vocab, "tensor d2t has " + std::to_string(info.d2t.size()) +
                                                      " entries for a draft vocabulary of " +
                                                      std::to_string(hp.n_vocab));
  if (w.tok_embd.ne[1] != hp.n_vocab) hp.n_vocab_input = w.tok_embd.ne[1];
  check(info.mask_token_id < hp.n_token_ids(),
        "tokenizer.ggml.mask_token_id " + std::to_string(info.mask_token_id) +
            " is not a token of the drafter's input vocabulary (" + std::to_string(hp.n_token_ids()) + ")");
  w.output_norm = ld.vector("output_norm.weight", E);
  w.fc = ld.matrix("fc.weight", {F, E});
  if (const gguf::TensorInfo* s = ld.info("fc.scale")) {
    check(s->nelements() == 1 || s->nelements() == E, "tensor fc.scale must hold 1 or " + std::to_string(E) +
                                                          " values, has " + std::to_string(s->nelements()));
    if (s->nelements() == E) {
      w.fc_scale_vec = ld.vector("fc.scale", E);
    } else {
      check(s->type == DType::F32 || s->type == DType::F16, "tensor fc.scale must be F32 or F16");
      const uint8_t* d = file.tensor_data(*s);
      if (s->type == DType::F32) {
        std::memcpy(&w.fc_scale, d, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, d, 2);
        w.fc_scale = fp16_to_fp32(h);
      }
      (void)ld.vector("fc.scale", 1);  // marks it used
      check(std::isfinite(w.fc_scale), "tensor fc.scale is not finite");
    }
  }
  w.enc_norm = ld.vector("enc.output_norm.weight", E);
  check(int64_t(hp.layers.size()) == hp.n_layer, "the per-layer hparams are not set");
  TransformerVariant qwen3_layers;  // Q/K norms, no biases
  qwen3_layers.qk_norm = true;
  for (int64_t il = 0; il < hp.n_layer; ++il)
    w.layers.push_back(load_transformer_layer(ld, hp.layers[size_t(il)], il, E, qwen3_layers));
  std::string list;
  for (const std::string& name : ld.unused())
    if (name != "d2t") list += (list.empty() ? "" : ", ") + name;
  check(list.empty(), "the dflash model has tensors tandem does not know how to use: " + list +
                          " (markov_w1 and friends: DSpark drafts are not supported)");
  auto model = std::make_unique<Dflash>(hp, std::move(w), std::move(loader), ctx);
  model->keep(std::move(lender_ld));
  return model;
}

}  // namespace tandem
