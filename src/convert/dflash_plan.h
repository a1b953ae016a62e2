// z-lab DFlash checkpoints (config.json architectures ["DFlashDraftModel"]) -> the `dflash` GGUF
// (GGUF-ARCH-FACTS E.1): the Qwen3 keys and per-layer tensors under the `dflash.` prefix, plus
// dflash.block_size, dflash.target_layers (= HF target_layer_ids + 1: tandem taps the *input* of a layer,
// HF hidden_states[id + 1] is the output of layer id), tokenizer.ggml.mask_token_id, fc / fc.scale /
// enc.output_norm. The vocabulary comes from the target model's directory (--target-model-dir): the drafter
// reads and writes the target's token ids.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "convert/hf_config.h"
#include "convert/tensor_plan.h"

namespace tandem::convert {

struct DflashConfig {
  ModelHparams hp;  // the Qwen3 part; hp.arch = "dflash"
  int64_t block_size = 16;
  std::vector<int32_t> target_layers;  // already + 1
  int64_t mask_token_id = -1;
  bool has_embed_tokens = false;  // config "has_embed_tokens" / the checkpoint has embed_tokens
  // Sliding layers (E.1): with use_sliding_window, sliding_window > 0 and layer_types, as llama.cpp's
  // converter writes dflash.attention.sliding_window and .sliding_window_pattern; sliding_window 0 = none.
  int64_t sliding_window = 0;
  std::vector<bool> sliding;  // per layer (empty when sliding_window is 0)
};

bool is_dflash_architecture(std::string_view hf_architecture);

// Parses config.json text (source names it in messages). Throws Error for a missing dflash_config /
// target_layer_ids / mask_token_id, or a bad value.
DflashConfig parse_dflash_config(std::string_view json_text, const std::string& source);

// The tensors in write order. hf_prefix is "model." or "" (z-lab checkpoints name their modules at the top
// level: layers.N..., fc, hidden_norm, norm). token_embd / output are optional.
std::vector<PlannedTensor> plan_dflash_tensors(const DflashConfig& c, const std::string& hf_prefix);

}  // namespace tandem::convert
