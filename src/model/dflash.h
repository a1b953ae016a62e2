// The `dflash` architecture (GGUF-ARCH-FACTS E.1, E.3): a block-diffusion speculative drafter. A few
// Qwen3-style layers that read fused hidden states of chosen target layers. Two kinds of forward pass:
//   feature rows (K/V injection): g = RMS(fc . features [* fc.scale]) . enc.output_norm; per layer the row's
//     K = rope(RMS_head(attn_k . g) . attn_k_norm), V = attn_v . g go straight to the cache (no attention, no
//     norm before the projections, no logits);
//   token rows (the draft block [last, mask x n]): Qwen3 layers (pre-norm, Q/K norms, NEOX rope, SwiGLU)
//     attending, with the BlockBidirectional mask, to the injected context and to each other; then
//     output_norm and the head (the draft's own output, or the target's).
// token_embd / output are borrowed from the target (ModelParams::share_weights_from) when the file has none.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/decoder.h"

namespace tandem {

// What a DFlash driver needs besides the forward: read from the file's keys and tensors.
struct DflashInfo {
  int32_t block_size = 16;             // dflash.block_size: tokens per draft block (the last one included)
  std::vector<int32_t> target_layers;  // dflash.target_layers: target tap ids (HF layer ids + 1), file order
  int32_t mask_token_id = -1;          // tokenizer.ggml.mask_token_id
  std::vector<int32_t> d2t;            // d2t: draft vocabulary id -> target token id; empty: the same ids
};

// Reads and checks the keys and d2t (Error naming the key: missing or empty target_layers, a repeated layer,
// a missing mask token, a d2t that is not I64 {n_vocab_draft} of distinct non-negative ids).
DflashInfo read_dflash_info(const gguf::GgufFile& file);

ModelHparams dflash_hparams(const gguf::GgufFile& file);
std::unique_ptr<DecoderModel> load_dflash(const gguf::GgufFile& file, const ModelHparams& hp,
                                          const DecoderLoadContext& ctx);
ShardRuleTable dflash_shard_rules();

}  // namespace tandem
