// llama: the shared decoder block with NORM rope (the converter permuted Q/K rows into the interleaved
// layout, GGUF-ARCH-FACTS B.5), GQA, optional biases, and llama3 rope scaling through rope_freqs.weight
// (B.6).
#include "model/llama.h"

#include "core/error.h"
#include "model/transformer.h"

namespace tandem {

ModelHparams llama_hparams(const gguf::GgufFile& file) {
  ModelHparams hp = read_decoder_hparams(file, "llama");
  hp.rope_mode = RopeMode::Norm;
  check(hp.n_rot == hp.head_dim_k, "llama.rope.dimension_count (" + std::to_string(hp.n_rot) +
                                       ") must equal the head dimension (" + std::to_string(hp.head_dim_k) +
                                       ")");
  return hp;
}

std::unique_ptr<DecoderModel> load_llama(const gguf::GgufFile& file, const ModelHparams& hp,
                                         const DecoderLoadContext& ctx) {
  TransformerVariant variant;
  variant.allow_qkv_bias = true;
  variant.allow_out_ffn_bias = true;
  variant.allow_rope_freqs = true;
  return load_transformer(file, hp, variant, ctx);
}

}  // namespace tandem
