// qwen3: the shared decoder block with per-head RMS norm of Q and K before rope, NEOX rope, no biases
// (GGUF-ARCH-FACTS B.1-B.4). Head count times head_dim need not equal n_embd.
#include "model/qwen3.h"

#include "model/transformer.h"

namespace tandem {

ModelHparams qwen3_hparams(const gguf::GgufFile& file) {
  ModelHparams hp = read_decoder_hparams(file, "qwen3");
  hp.rope_mode = RopeMode::Neox;
  hp.qk_norm = true;
  return hp;
}

std::unique_ptr<DecoderModel> load_qwen3(const gguf::GgufFile& file, const ModelHparams& hp,
                                         const DecoderLoadContext& ctx) {
  TransformerVariant variant;
  variant.qk_norm = true;
  return load_transformer(file, hp, variant, ctx);
}

}  // namespace tandem
