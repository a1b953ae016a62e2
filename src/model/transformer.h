// The pre-norm decoder shared by llama and qwen3 (GGUF-ARCH-FACTS B.3), assembled from the blocks of
// blocks.h: embedding, then per layer attention_block and dense_ffn_block, then output_head. The
// architecture files (llama.cpp, qwen3.cpp) only decide hparams, rope mode and which optional tensors exist;
// gemma4 and dflash are their own DecoderModels assembling the same blocks.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "model/blocks.h"
#include "model/decoder.h"
#include "model/weight_loader.h"

namespace tandem {

struct TransformerLayerWeights {
  AttentionWeights attn;
  DenseFfnWeights ffn;
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
  // token_embd.weight and output.weight (the tied head is token_embd), when this rank holds them whole.
  std::optional<Tensor> shared_weight(const std::string& name) const override;

 private:
  ModelHparams hp_;
  TransformerWeights w_;
  std::unique_ptr<WeightLoader> loader_;  // owns converted vectors the weights may point to

  std::vector<LayerShape> local_;  // every layer of the model, at this rank's widths
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

// Layer il's attention and SwiGLU tensors (GGUF-ARCH-FACTS B.2) at hparams P, with the optional ones
// `variant` allows (dflash's Qwen3 layers load through it too).
TransformerLayerWeights load_transformer_layer(WeightLoader& ld, const LayerHparams& P, int64_t il, int64_t E,
                                               const TransformerVariant& variant);

std::unique_ptr<Transformer> load_transformer(const gguf::GgufFile& file, const ModelHparams& hp,
                                              const TransformerVariant& variant,
                                              const DecoderLoadContext& ctx);

}  // namespace tandem
