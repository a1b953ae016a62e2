// diffusion-gemma (GGUF-ARCH-FACTS D.1-D.3): the gemma4 layer body (gemma4_base.cpp) with a region-aware
// forward. A row is a prompt row or a canvas row, read from the batch (ForwardInputs::prefix_len and the
// host positions): under an AttentionMask::PrefixRegion mask rows at positions < prefix_len are prompt rows
// and the rest canvas rows; under any other mask (PREFILL: the prompt alone, causal) every row is a prompt
// row. So the three phases of D.4 need no state in the model:
//   UNIFIED  [prompt | canvas], PrefixRegion(P)        prompt rows then canvas rows
//   PREFILL  the prompt, Causal, writing K/V           prompt rows
//   DECODE   the canvas at P.., PrefixRegion(P), no K/V canvas rows
// Prompt rows: x = token_embd[t] * sqrt(n_embd), each layer's output scaled by enc_layer_output_scale.
// Canvas rows: x = RMS_noscale(token_embd[t] * sqrt(n_embd) + added row) (the added row is the
// self-conditioning vector the canvas runner computes, or none), scaled by layer_output_scale. The mask rules
// of D.3 are the step seam's PrefixRegion mask (prompt causal + window, canvas sees every canvas position and
// the prompt from P - window + 1 on sliding layers).
// The FFN slot is gemma4's (gemma4_base.cpp): the dense MLP, plus D.2's mixture-of-experts branch (C.5) when
// the file has diffusion-gemma.expert_count > 0.
#include "model/diffusion_gemma.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/gemma4.h"
#include "model/gemma4_base.h"
#include "model/scratch_views.h"

namespace tandem {

namespace {

constexpr const char* kArch = "diffusion-gemma";

class DiffusionGemmaModel : public Gemma4Base {
 public:
  DiffusionGemmaModel(ModelHparams hp, Gemma4Weights w, std::vector<float> enc_scale,
                      std::optional<SelfCondWeights> self_cond, float softcap,
                      std::unique_ptr<WeightLoader> loader, const DecoderLoadContext& ctx)
      : Gemma4Base(std::move(hp), std::move(w), softcap, std::move(loader), ctx),
        enc_scale_(std::move(enc_scale)),
        self_cond_(std::move(self_cond)) {}

  const SelfCondWeights* self_cond() const { return self_cond_ ? &*self_cond_ : nullptr; }

  void forward(Stream& st, Ops& ops, const ForwardInputs& in, std::span<const KvLayerView> kv,
               ForwardScratch& scratch_base) const override {
    auto& sc = static_cast<Gemma4Scratch&>(scratch_base);
    const Tensor x = residual(in, kv, sc);
    const BlockRun run = block_run(st, ops, in);
    const int64_t T = in.n_rows, n_prompt = prompt_rows(in);
    const Tensor prompt = col_range(x, 0, n_prompt), canvas = col_range(x, n_prompt, T);
    if (shard_.first) {
      embed_block(run, w_.tok_embd, hp_.embedding_scale, in, x);
      if (n_prompt < T) ops.rms_norm(st, canvas, nullptr, hp_.rms_eps, canvas);  // D.3 step 1: no weight
    }
    for (int64_t il = shard_.layers.begin; il < shard_.layers.end; ++il) {
      tap(run, in, int(il), x);
      // D.3 step 2: the encoder scalar on prompt rows, the decoder scalar on canvas rows; a batch of one region
      // (PREFILL: all prompt; DECODE: all canvas) has its scalar applied by the layer's last residual add.
      const float enc = enc_scale_[size_t(il)], dec = w_.layers[size_t(il)].output_scale;
      run_layer(run, il, sc, x, in, kv, n_prompt == T ? enc : n_prompt == 0 ? dec : 1.0f);
      if (n_prompt > 0 && n_prompt < T) {
        ops.scale(st, prompt, enc, prompt);
        ops.scale(st, canvas, dec, canvas);
      }
    }
    if (!shard_.last) return;
    tap(run, in, int(hp_.n_layer), x);
    output(run, in, sc, x);
  }

 private:
  // The number of leading prompt rows; the canvas rows must follow them (one sequence per batch is what the
  // canvas runner sends; rows of other orders are refused rather than misread).
  static int64_t prompt_rows(const ForwardInputs& in) {
    const int64_t T = in.n_rows;
    if (in.prefix_len < 0) return T;
    check(int64_t(in.host_positions.size()) == T, "internal: the forward has no host positions");
    int64_t n = 0;
    while (n < T && in.host_positions[size_t(n)] < in.prefix_len) ++n;
    for (int64_t t = n; t < T; ++t)
      check(in.host_positions[size_t(t)] >= in.prefix_len,
            "diffusion-gemma: a prefix-region batch must give its prompt rows (positions < " +
                std::to_string(in.prefix_len) + ") before its canvas rows");
    return n;
  }

  std::vector<float> enc_scale_;  // per layer: enc_layer_output_scale
  std::optional<SelfCondWeights> self_cond_;
};

// clang-format off
constexpr ShardRule kExtraRules[] = {
  // GGUF name                     per layer  layer split  tensor split  unit   row split
  {"enc_layer_output_scale.weight", true,     LayerPlacement::LayerOwner, TensorCut::Mirrored, CutUnit::None, RowPlacement::MainDevice},
  {"self_cond_pre_norm.weight",     false,    LayerPlacement::FirstRank,  TensorCut::Mirrored, CutUnit::None, RowPlacement::MainDevice},
  {"self_cond_gate.weight",         false,    LayerPlacement::FirstRank,  TensorCut::Mirrored, CutUnit::None, RowPlacement::MainDevice},
  {"self_cond_up.weight",           false,    LayerPlacement::FirstRank,  TensorCut::Mirrored, CutUnit::None, RowPlacement::MainDevice},
  {"self_cond_down.weight",         false,    LayerPlacement::FirstRank,  TensorCut::Mirrored, CutUnit::None, RowPlacement::MainDevice},
};
// clang-format on

}  // namespace

ModelHparams diffusion_gemma_hparams(const gguf::GgufFile& file) {
  ModelHparams hp = read_decoder_hparams(file, kArch);
  hp.rope_mode = RopeMode::Neox;
  hp.qk_norm = true;
  hp.attn_scale = 1.0f;
  hp.embedding_scale = std::sqrt(float(hp.n_embd));
  return hp;
}

ShardRuleTable diffusion_gemma_shard_rules() {
  static const std::vector<ShardRule> rules = joined_shard_rules(gemma4_shard_rules(), kExtraRules);
  return rules;
}

std::unique_ptr<DecoderModel> load_diffusion_gemma(const gguf::GgufFile& file, const ModelHparams& hp,
                                                   const DecoderLoadContext& ctx) {
  check(!ctx.rules.empty(), "internal: the load context has no shard rules");
  check(hp.n_vocab > 0, "n_vocab is not set (read the hparams with read_model_hparams)");
  const std::string a = std::string(kArch) + ".";
  check(file.find("diffusion.canvas_length") != nullptr && file.get_int("diffusion.canvas_length", 0) > 0,
        file.path() + ": a diffusion-gemma file needs diffusion.canvas_length > 0 (GGUF key)");
  // D.2: shipped files have the MoE block in every layer (gemma4_base loads it when expert_count > 0); files
  // without experts (test fixtures, dense checkpoints) are accepted too.
  check(file.get_int(a + "embedding_length_per_layer_input", 0) == 0 &&
            file.get_int(a + "attention.shared_kv_layers", 0) == 0,
        file.path() +
            ": diffusion-gemma with per-layer inputs or KV sharing is not supported (the converter "
            "forces both to 0)");
  const float softcap = float(file.get_float(a + "final_logit_softcapping", 0.0));
  check(std::isfinite(softcap) && softcap >= 0.0f, "GGUF key " + a + "final_logit_softcapping must be >= 0");

  auto loader =
      std::make_unique<WeightLoader>(file, ctx.device, ctx.rules, ctx.shard, ctx.dims, ctx.row_split);
  WeightLoader& ld = *loader;
  Gemma4Weights w = load_gemma4_weights(file, ld, hp);
  std::vector<float> enc(size_t(hp.n_layer), 1.0f);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    // D.2: both scalars are required (gemma4's loader treats layer_output_scale as optional).
    check(ld.has(layer_tensor_name(il, "layer_output_scale.weight")),
          file.path() + ": missing tensor " + layer_tensor_name(il, "layer_output_scale.weight"));
    const std::string enc_name = layer_tensor_name(il, "enc_layer_output_scale.weight");
    check(ld.has(enc_name), file.path() + ": missing tensor " + enc_name);
    (void)ld.optional_vector(enc_name, 1);  // marks it used; applied as a host scalar
    enc[size_t(il)] = read_scalar_tensor(file, enc_name);
  }
  std::optional<SelfCondWeights> sc;
  const char* sc_names[] = {"self_cond_pre_norm.weight", "self_cond_gate.weight", "self_cond_up.weight",
                            "self_cond_down.weight"};
  int n_sc = 0;
  for (const char* n : sc_names) n_sc += ld.has(n) ? 1 : 0;
  check(n_sc == 0 || n_sc == 4, file.path() +
                                    ": the self-conditioning tensors (self_cond_pre_norm, _gate, _up, "
                                    "_down) must all be present or all absent");
  if (n_sc == 4) {
    const gguf::TensorInfo* g = file.find_tensor("self_cond_gate.weight");
    check(g->n_dims == 2, "self_cond_gate.weight must be a matrix");
    const int64_t E = hp.n_embd, F = g->ne[1];
    SelfCondWeights s;
    s.n_ff = F;
    if (auto t = ld.optional_vector("self_cond_pre_norm.weight", E)) s.pre_norm = *t;
    if (auto t = ld.optional_matrix("self_cond_gate.weight", {E, F})) s.gate = *t;
    if (auto t = ld.optional_matrix("self_cond_up.weight", {E, F})) s.up = *t;
    if (auto t = ld.optional_matrix("self_cond_down.weight", {F, E})) s.down = *t;
    // A rank that is not first (layer split) does not hold them; its optional_* give nothing.
    if (s.pre_norm.data && s.gate.data && s.up.data && s.down.data) sc = s;
  }
  ld.check_all_used(kArch);
  return std::make_unique<DiffusionGemmaModel>(hp, std::move(w), std::move(enc), std::move(sc), softcap,
                                               std::move(loader), ctx);
}

const SelfCondWeights* diffusion_gemma_self_cond(const DecoderModel& decoder) {
  const auto* m = dynamic_cast<const DiffusionGemmaModel*>(&decoder);
  return m ? m->self_cond() : nullptr;
}

}  // namespace tandem
