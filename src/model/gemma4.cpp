// gemma4 (GGUF-ARCH-FACTS C.1-C.7): the layer body is gemma4_base.cpp (shared with diffusion-gemma; dense and
// mixture-of-experts FFN, KV sharing, per-layer inputs); this file is gemma4's forward (sqrt(n_embd)
// embedding scale, the E2B/E4B per-layer inputs from the layer-0 input, layer_output_scale on the whole
// residual stream, tied head, final logit softcap), its hparams reader and its loader.
#include "model/gemma4.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "model/gemma4_base.h"

namespace tandem {

namespace {

class Gemma4Model : public Gemma4Base {
 public:
  using Gemma4Base::Gemma4Base;

  void forward(Stream& st, Ops& ops, const ForwardInputs& in, std::span<const KvLayerView> kv,
               ForwardScratch& scratch_base) const override {
    auto& sc = static_cast<Gemma4Scratch&>(scratch_base);
    const Tensor x = residual(in, kv, sc);
    const BlockRun run = block_run(st, ops, in);
    if (shard_.first) embed_block(run, w_.tok_embd, hp_.embedding_scale, in, x);
    if (w_.ple) {  // from the layer-0 input (a per-layer-input model is not layer-split: every rank is first)
      check(in.tokens != nullptr, "gemma4 per-layer inputs need the batch's token ids");
      gemma4_ple_inputs(run, *w_.ple, sc.ple, *in.tokens, x);
    }
    for (int64_t il = shard_.layers.begin; il < shard_.layers.end; ++il) {
      tap(run, in, int(il), x);
      run_layer(run, il, sc, x, in, kv, w_.layers[size_t(il)].output_scale);
    }
    if (!shard_.last) return;
    tap(run, in, int(hp_.n_layer), x);
    output(run, in, sc, x);
  }
};

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
  // C.7 (E2B/E4B): per-layer inputs and KV sharing reach across layers (the layer-0 input; another layer's
  // cache), so such a model is not split by layer.
  check(ctx.shard.mode != SplitMode::Layer ||
            (file.get_int("gemma4.embedding_length_per_layer_input", 0) == 0 &&
             file.get_int("gemma4.attention.shared_kv_layers", 0) == 0),
        "a gemma4 model with per-layer inputs or KV sharing (E2B/E4B) cannot be split by layer yet; use "
        "--split-mode tensor or one device");
  const float softcap = float(file.get_float("gemma4.final_logit_softcapping", 0.0));
  check(std::isfinite(softcap) && softcap >= 0.0f, "GGUF key gemma4.final_logit_softcapping must be >= 0");

  auto loader =
      std::make_unique<WeightLoader>(file, ctx.device, ctx.rules, ctx.shard, ctx.dims, ctx.row_split);
  Gemma4Weights w = load_gemma4_weights(file, *loader, hp);
  loader->check_all_used("gemma4");
  return std::make_unique<Gemma4Model>(hp, std::move(w), softcap, std::move(loader), ctx);
}

}  // namespace tandem
