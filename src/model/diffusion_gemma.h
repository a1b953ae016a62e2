// The `diffusion-gemma` architecture (GGUF-ARCH-FACTS D.1-D.3): a gemma4 backbone that denoises a canvas.
// Hyperparameters, loader, shard rules, and the self-conditioning weights the canvas runner reads.
#pragma once

#include <memory>

#include "model/decoder.h"

namespace tandem {

ModelHparams diffusion_gemma_hparams(const gguf::GgufFile& file);
std::unique_ptr<DecoderModel> load_diffusion_gemma(const gguf::GgufFile& file, const ModelHparams& hp,
                                                   const DecoderLoadContext& ctx);
ShardRuleTable diffusion_gemma_shard_rules();

// The self-conditioning MLP (D.5): sc = down(gelu_tanh(gate(n)) * up(n)), n = RMS(soft) * pre_norm. The
// tensors are on the first rank's device (where the embedding reads the SC rows).
struct SelfCondWeights {
  Tensor pre_norm;  // {n_embd}
  Tensor gate, up;  // {n_embd, n_ff}
  Tensor down;      // {n_ff, n_embd}
  int64_t n_ff = 0;
};

// The SC weights of a diffusion-gemma rank; null when the file has none or `decoder` is another
// architecture (or a rank that does not hold them).
const SelfCondWeights* diffusion_gemma_self_cond(const DecoderModel& decoder);

}  // namespace tandem
