// The shard rules of gemma4's tensors (GGUF-ARCH-FACTS C.2, F.2): the llama-style projections are cut like
// qwen3's; every extra norm and scalar (post-attention / pre- and post-FFN norms, layer_output_scale) is
// mirrored, and rope_freqs is on every rank; the mixture-of-experts tensors follow F.2 (below).
#include <vector>

#include "model/gemma4.h"

namespace tandem {

namespace {

using enum LayerPlacement;
using enum TensorCut;
using enum CutUnit;
using enum RowPlacement;

// clang-format off
// Beside the llama-style rows (llama_style_shard_rules, transformer_rules.cpp).
constexpr ShardRule kGemma4Rules[] = {
  // GGUF name                  per layer  layer split  tensor split             row split
  {"post_attention_norm.weight", true,      LayerOwner,  Mirrored,     None,      MainDevice},
  {"post_ffw_norm.weight",       true,      LayerOwner,  Mirrored,     None,      MainDevice},
  {"layer_output_scale.weight",  true,      LayerOwner,  Mirrored,     None,      MainDevice},
  // Mixture of experts (C.5, F.2): the router, its scale and the per-expert down scale are mirrored (every
  // rank routes the same rows to the same experts); every expert's n_ff is cut alike: gate/up experts by
  // their output rows (the fused gate_up in both halves), down experts by their input columns, completed by
  // one all-reduce after the weighted sum over the selected experts. Row split keeps them on the main device.
  {"ffn_gate_inp.weight",        true,      LayerOwner,  Mirrored,     None,         MainDevice},
  {"ffn_gate_inp.scale",         true,      LayerOwner,  Mirrored,     None,         MainDevice},
  {"pre_ffw_norm_2.weight",      true,      LayerOwner,  Mirrored,     None,         MainDevice},
  {"post_ffw_norm_1.weight",     true,      LayerOwner,  Mirrored,     None,         MainDevice},
  {"post_ffw_norm_2.weight",     true,      LayerOwner,  Mirrored,     None,         MainDevice},
  {"ffn_gate_up_exps.weight",    true,      LayerOwner,  OutputRows,   ExpertFfRows, MainDevice},
  {"ffn_gate_exps.weight",       true,      LayerOwner,  OutputRows,   ExpertFfRows, MainDevice},
  {"ffn_up_exps.weight",         true,      LayerOwner,  OutputRows,   ExpertFfRows, MainDevice},
  {"ffn_down_exps.weight",       true,      LayerOwner,  InputColumns, ExpertFfRows, MainDevice},
  {"ffn_down_exps.scale",        true,      LayerOwner,  Mirrored,     None,         MainDevice},
  // E2B/E4B per-layer inputs (C.7): small, mirrored (such models are not split by layer).
  {"per_layer_token_embd.weight", false,    Everywhere,  Mirrored,     None,         MainDevice},
  {"per_layer_model_proj.weight", false,    Everywhere,  Mirrored,     None,         MainDevice},
  {"per_layer_proj_norm.weight",  false,    Everywhere,  Mirrored,     None,         MainDevice},
  {"inp_gate.weight",            true,      LayerOwner,  Mirrored,     None,         MainDevice},
  {"proj.weight",                true,      LayerOwner,  Mirrored,     None,         MainDevice},
  {"post_norm.weight",           true,      LayerOwner,  Mirrored,     None,         MainDevice},
};
// clang-format on

}  // namespace

ShardRuleTable gemma4_shard_rules() {
  static const std::vector<ShardRule> rules = joined_shard_rules(llama_style_shard_rules(), kGemma4Rules);
  return rules;
}

}  // namespace tandem
