// The shard rules of the llama / qwen3 decoder's tensors (GGUF-ARCH-FACTS B.2, F.2): for each GGUF name,
// where a layer split puts it, how a tensor split cuts it, and whether a row split slices it. The llama-style
// rows (embedding, head, attention and MLP projections, their norms) are shared with gemma4
// (gemma4_rules.cpp); llama / qwen3 add the projection biases.
#include "model/transformer.h"

namespace tandem {

namespace {

using enum LayerPlacement;
using enum TensorCut;
using enum CutUnit;
using enum RowPlacement;

// clang-format off
constexpr ShardRule kLlamaStyleRules[] = {
  // GGUF name             per layer  layer split  tensor split             row split
  {"token_embd.weight",     false,     FirstRank,   Mirrored,     None,      MainDevice},
  {"output_norm.weight",    false,     LastRank,    Mirrored,     None,      MainDevice},
  {"output.weight",         false,     LastRank,    OutputRows,   VocabRows, SplitRows},
  {"rope_freqs.weight",     false,     Everywhere,  Mirrored,     None,      MainDevice},
  {"attn_norm.weight",      true,      LayerOwner,  Mirrored,     None,      MainDevice},
  {"attn_q.weight",         true,      LayerOwner,  OutputRows,   QHeads,    SplitRows},
  {"attn_k.weight",         true,      LayerOwner,  OutputRows,   KvHeadsK,  SplitRows},
  {"attn_v.weight",         true,      LayerOwner,  OutputRows,   KvHeadsV,  SplitRows},
  {"attn_output.weight",    true,      LayerOwner,  InputColumns, QHeadsV,   SplitRows},
  {"attn_q_norm.weight",    true,      LayerOwner,  Mirrored,     None,      MainDevice},
  {"attn_k_norm.weight",    true,      LayerOwner,  Mirrored,     None,      MainDevice},
  {"ffn_norm.weight",       true,      LayerOwner,  Mirrored,     None,      MainDevice},
  {"ffn_gate.weight",       true,      LayerOwner,  OutputRows,   FfRows,    SplitRows},
  {"ffn_up.weight",         true,      LayerOwner,  OutputRows,   FfRows,    SplitRows},
  {"ffn_down.weight",       true,      LayerOwner,  InputColumns, FfRows,    SplitRows},
};

// llama / qwen3: the projection biases (qwen2-style checkpoints).
constexpr ShardRule kBiasRules[] = {
  {"attn_q.bias",           true,      LayerOwner,  OutputRows,   QHeads,    MainDevice},
  {"attn_k.bias",           true,      LayerOwner,  OutputRows,   KvHeadsK,  MainDevice},
  {"attn_v.bias",           true,      LayerOwner,  OutputRows,   KvHeadsV,  MainDevice},
  {"attn_output.bias",      true,      LayerOwner,  Mirrored,     None,      MainDevice},
  {"ffn_gate.bias",         true,      LayerOwner,  OutputRows,   FfRows,    MainDevice},
  {"ffn_up.bias",           true,      LayerOwner,  OutputRows,   FfRows,    MainDevice},
  {"ffn_down.bias",         true,      LayerOwner,  Mirrored,     None,      MainDevice},
};
// clang-format on

}  // namespace

ShardRuleTable llama_style_shard_rules() {
  return kLlamaStyleRules;
}

ShardRuleTable transformer_shard_rules() {
  static const std::vector<ShardRule> rules = joined_shard_rules(kLlamaStyleRules, kBiasRules);
  return rules;
}

}  // namespace tandem
