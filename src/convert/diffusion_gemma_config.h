// Hugging Face DiffusionGemmaForBlockDiffusion / DiffusionGemma4ModelForBlockDiffusion checkpoints
// (../shared/GGUF-ARCH-FACTS.md D.1): the gemma4 text hyperparameters (forced: num_kv_shared_layers = 0,
// hidden_size_per_layer_input = 0), where the decoder and encoder tensors are, the canvas length, the mask
// token, and the diffusion.* keys from generation_config.json; the control-token retyping of the tokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "convert/gemma4_config.h"
#include "convert/tensor_plan.h"
#include "gguf/gguf.h"

namespace tandem::convert {

bool is_diffusion_gemma_architecture(std::string_view hf_architecture);

struct DiffusionGemmaConfig {
  Gemma4Hparams text;               // tensor_prefix: the decoder's ("model.decoder.")
  std::string encoder_prefix;       // "model.encoder.language_model." (transformers 5.17)
  int64_t canvas_length = 0;        // required > 0
  std::optional<int64_t> mask_token_id;  // from config.json / generation_config.json, when given there
  std::vector<std::pair<std::string, gguf::Value>> diffusion_keys;  // diffusion.eb_*, diffusion.shift_logits
};

// config.json text (+ generation_config.json text, may be empty). Throws Error naming the file and key.
DiffusionGemmaConfig parse_diffusion_gemma_config(std::string_view config_json, const std::string& config_source,
                                                  std::string_view generation_json,
                                                  const std::string& generation_source);

// The decoder's gemma4 tensors renamed from `text.tensor_prefix`, with both layer scalars required
// (layer_output_scale from the decoder, enc_layer_output_scale from the encoder) and the self_cond_*
// tensors (optional: the loader runs without self-conditioning when they are absent).
std::vector<PlannedTensor> plan_diffusion_gemma_tensors(const DiffusionGemmaConfig& c, int64_t n_vocab_gguf);

// Tokens of type NORMAL (1) or USER_DEFINED (4) that look like control tokens (<s>, </s>, <|...>, <...|>)
// become CONTROL (3); returns how many changed. The mask token id: `given`, else a token named <mask>,
// <|mask|> or [MASK]; Error when there is none.
int64_t retype_control_tokens(gguf::GgufWriter& tok);
int64_t find_mask_token(const gguf::GgufWriter& tok, std::optional<int64_t> given, const std::string& where);

}  // namespace tandem::convert
