// The pre-norm decoder block shared by llama and qwen3 (GGUF-ARCH-FACTS B.3): RMS norm, Q/K/V projections
// (+ optional biases), optional per-head Q/K RMS norm, rope, paged attention with GQA, output projection,
// residual; RMS norm, SwiGLU feed-forward, residual. The architecture files (llama.cpp, qwen3.cpp) only
// decide hparams, rope mode and which optional tensors exist; gemma4 and dflash will be their own
// DecoderModels reusing the helpers here where they fit.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "model/decoder.h"
#include "model/weight_loader.h"

namespace tandem {

struct TransformerLayerWeights {
  Tensor attn_norm;
  Tensor wq, wk, wv, wo;
  std::optional<Tensor> bq, bk, bv, bo;
  std::optional<Tensor> q_norm, k_norm;  // {head_dim_k}, qwen3
  Tensor ffn_norm;
  Tensor gate, up, down;
  std::optional<Tensor> b_gate, b_up, b_down;
};

struct TransformerWeights {
  Tensor tok_embd;     // {n_embd, n_vocab}
  Tensor output_norm;  // {n_embd}
  Tensor output;       // {n_embd, n_vocab}; token_embd itself when the head is tied
  bool tied_output = false;
  std::optional<Tensor> rope_freqs;  // {n_rot / 2}: llama3 rope scaling factors (theta is divided by them)
  std::vector<TransformerLayerWeights> layers;
};

// What an architecture allows beyond the common tensor set.
struct TransformerVariant {
  bool qk_norm = false;             // requires attn_q_norm / attn_k_norm (qwen3)
  bool allow_qkv_bias = false;      // optional attn_{q,k,v}.bias
  bool allow_out_ffn_bias = false;  // optional attn_output.bias, ffn_{gate,up,down}.bias (llama)
  bool allow_rope_freqs = false;    // optional rope_freqs.weight (llama3 scaling)
};

// One rank's transformer (the whole model when unsplit; DecoderModel explains the splits). Under a layer
// split the weights of other ranks' layers are empty (data == nullptr) and never touched.
class Transformer : public DecoderModel {
 public:
  Transformer(ModelHparams hp, TransformerWeights weights, std::unique_ptr<WeightLoader> loader,
              const DecoderLoadContext& ctx);

  const ModelHparams& hparams() const override { return hp_; }
  const RankShard& shard() const override { return shard_; }
  const TransformerWeights& weights() const { return w_; }
  std::vector<KvLayerShape> kv_layer_shapes() const override;
  Tensor hidden_state(ForwardScratch& scratch, int64_t n_rows) const override;
  std::unique_ptr<ForwardScratch> plan_scratch(Device& device, int64_t max_rows, int64_t max_out,
                                               WorkspacePlan& plan) const override;
  void forward(Stream& stream, Ops& ops, const ForwardInputs& in, std::span<const KvLayerView> kv,
               ForwardScratch& scratch) const override;

 private:
  ModelHparams hp_;
  TransformerWeights w_;
  std::unique_ptr<WeightLoader> loader_;  // owns converted vectors the weights may point to
  // One layer's shape on this rank (its heads / ff rows under a tensor split) and its rope.
  struct LocalLayer {
    int64_t n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0, n_ff = 0;
    int32_t sliding_window = 0;
    float attn_scale = 1.0f;
    RopeParams rope;
  };
  int64_t max_local(int64_t (*width)(const LocalLayer&)) const;

  std::vector<LocalLayer> local_;  // every layer of the model
  RankShard shard_;
  Comm* comm_ = nullptr;  // tensor split: completes the row-parallel products (attention output, down)
  // This rank's widths: query / KV heads, feed-forward rows, logit rows (the whole model when unsplit).
  int64_t n_head_ = 0, n_head_kv_ = 0, n_ff_ = 0, n_vocab_ = 0;
};

// Loads this rank's part of the tensors of GGUF-ARCH-FACTS B.2 for hp (whose rope mode, qk_norm and n_vocab
// the caller has set; see read_model_hparams). Throws Error for a missing or mis-shaped tensor, and
// for any tensor the variant does not use (an unsupported variant would otherwise give silently wrong
// output).
// The shard rules of this decoder's tensors (transformer_rules.cpp): llama and qwen3 use them.
ShardRuleTable transformer_shard_rules();

std::unique_ptr<Transformer> load_transformer(const gguf::GgufFile& file, const ModelHparams& hp,
                                              const TransformerVariant& variant,
                                              const DecoderLoadContext& ctx);

}  // namespace tandem
