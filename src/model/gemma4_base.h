// The gemma4 decoder body shared by `gemma4` and `diffusion-gemma` (GGUF-ARCH-FACTS C.3-C.6, D.2): per-layer
// weights and shapes, scratch planning, and one layer's attention and feed-forward as calls into Ops. Each
// architecture derives from Gemma4Base and writes only its own forward: gemma4 embeds, runs the layers and
// scales by layer_output_scale; diffusion-gemma embeds and scales by region (prompt / canvas).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/blocks.h"
#include "model/decoder.h"
#include "model/gemma4_moe.h"
#include "model/gemma4_ple.h"
#include "model/weight_loader.h"

namespace tandem {

struct Gemma4Layer {
  Tensor attn_norm, wq, wk, wo, q_norm, k_norm, post_attn_norm;
  std::optional<Tensor> wv;  // absent: V is the raw K projection
  int64_t kv_source = -1;  // C.7 KV sharing: the layer whose cache this one reads (it stores no K/V); -1: own
  // The FFN slot: the dense GELU-tanh MLP, plus in MoE models the expert branch (C.5, gemma4_moe.h).
  Tensor ffn_norm, gate, up, down, post_ffw_norm;
  std::optional<Gemma4MoeWeights> moe;
  float output_scale = 1.0f;  // layer_output_scale (1 when absent)
};

struct Gemma4Weights {
  Tensor tok_embd, output_norm, output;
  bool tied_output = false;
  std::optional<Tensor> rope_freqs;
  std::vector<Gemma4Layer> layers;
  std::optional<Gemma4PleWeights> ple;  // C.7 per-layer inputs (gemma4 E2B/E4B)
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

class Gemma4Base : public DecoderModel {
 public:
  Gemma4Base(ModelHparams hp, Gemma4Weights w, float softcap, std::unique_ptr<WeightLoader> loader,
             const DecoderLoadContext& ctx);

  const ModelHparams& hparams() const override { return hp_; }
  const RankShard& shard() const override { return shard_; }
  std::vector<KvLayerShape> kv_layer_shapes() const override;
  Tensor hidden_state(ForwardScratch& scratch, int64_t n_rows) const override;
  std::unique_ptr<ForwardScratch> plan_scratch(Device& device, int64_t max_rows, int64_t max_out,
                                               WorkspacePlan& plan) const override;
  std::optional<Tensor> shared_weight(const std::string& name) const override;

 protected:
  BlockRun block_run(Stream& st, Ops& ops, const ForwardInputs& in) const {
    return BlockRun{st, ops, hp_.rms_eps, in.comm ? in.comm : comm_, shard_.rank};
  }
  // Checks the batch against the scratch and the KV views; returns the residual stream {n_embd, T}.
  Tensor residual(const ForwardInputs& in, std::span<const KvLayerView> kv, Gemma4Scratch& sc) const;
  // Layer il (a layer this rank holds) on x: attention (over the source layer's cache for a KV-sharing
  // layer), the FFN slot (dense, plus the expert branch in MoE layers), the per-layer input (C.7), then the
  // whole residual stream times out_scale (1: none; the FFN's residual add applies it in the same launch).
  void run_layer(const BlockRun& run, int64_t il, Gemma4Scratch& sc, const Tensor& x, const ForwardInputs& in,
                 std::span<const KvLayerView> kv, float out_scale) const;
  // Writes the taps of `layer` (its input) for every row.
  void tap(const BlockRun& run, const ForwardInputs& in, int layer, const Tensor& x) const;
  // Output norm, head (tied or not) and the final softcap over the rows that want logits.
  void output(const BlockRun& run, const ForwardInputs& in, Gemma4Scratch& sc, const Tensor& x) const;

  ModelHparams hp_;
  Gemma4Weights w_;
  float softcap_ = 0.0f;
  std::unique_ptr<WeightLoader> loader_;
  RankShard shard_;
  Comm* comm_ = nullptr;
  std::vector<LayerShape> local_;

 private:
  static void attention(const BlockRun& run, const Gemma4Layer& w, const LayerShape& d,
                        const BlockScratch& sc, const Tensor& x, const Tensor& positions,
                        const KvLayerView& kv, const KvGroupInputs& group);
  void ffn(const BlockRun& run, const Gemma4Layer& w, int64_t n_ff, const Gemma4Scratch& sc, const Tensor& x,
           float out_scale) const;
  // Each expert's feed-forward rows on this rank (a tensor split cuts them, F.2).
  int64_t n_ff_exp_local() const {
    return shard_.mode == SplitMode::Tensor ? shard_.ff_exp.size() : hp_.n_ff_exp;
  }
};

// A {1} F32 scalar tensor's value, read from the file (layer_output_scale and friends).
float read_scalar_tensor(const gguf::GgufFile& file, const std::string& name);

// The weights every gemma4-family file has (C.2): embeddings, output norm and head (tied when output.weight
// is absent), rope_freqs, and per layer attention, dense FFN and the optional layer_output_scale; the MoE
// tensors when hp.n_expert > 0 (C.5); KV sharing and per-layer inputs when the file's <arch>.
// attention.shared_kv_layers / embedding_length_per_layer_input say so (C.7).
Gemma4Weights load_gemma4_weights(const gguf::GgufFile& file, WeightLoader& ld, const ModelHparams& hp);

}  // namespace tandem
