// Which part of each weight a rank holds, for every split mode: the rule types (each architecture declares
// its table of rules next to its tensors, e.g. src/model/transformer_rules.cpp), and the planner that turns a
// mesh and a model's dimensions into each rank's ranges (layers, heads, feed-forward rows, vocabulary rows).
// Model code never decides a split: it asks the weight loader for a tensor by name, and the loader applies
// the architecture's rule for that name.
//
// Tensor split (Megatron; GGUF-ARCH-FACTS F.2). A weight {in, out} is split by
//   output rows    Q, K, V, gate, up, the output head (and the biases of these): each rank computes a
//                  slice of the features, no communication;
//   input columns  attention output and down: each rank multiplies its slice of the features and holds a
//                  partial sum, which an all-reduce completes;
//   mirrored       embeddings, norms, rope factors, and the biases of attention output and down (added once,
//                  after the reduce).
// Q and K/V rows go by whole KV-head groups, so attention is local to a rank: rank r holds KV heads
// [kv.begin, kv.end) and the Q heads that read them, [kv.begin * gqa, kv.end * gqa). With --replicate-kv and
// more ranks than KV heads, Q heads are split evenly and each rank holds a copy of the one KV head its Q
// heads read.
//
// Layer split: a layer's tensors live on the rank that owns the layer; token_embd on the first rank,
// output_norm and output on the last, rope_freqs everywhere.
//
// Row split (the older mode): every weight matrix but the token embedding (Q, K, V, attention output, gate,
// up, down, the output head) is split by output rows over all devices (results gathered on the main device);
// everything else lives on the main device.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "parallel/mesh.h"

namespace tandem {

// Layer split: which ranks hold the tensor.
enum class LayerPlacement { Everywhere, FirstRank, LastRank, LayerOwner };
// Tensor split: how the tensor is cut (in ggml order, rows = ne[1] = output features, columns = ne[0]).
enum class TensorCut { Mirrored, OutputRows, InputColumns };
// Tensor split: which of the rank's ranges the cut follows, in units of that range (heads of Q / K / V width,
// feed-forward rows, vocabulary rows). For a vector the cut is along its only dim.
// ExpertFfRows: each expert's feed-forward rows (n_ff_exp) of a 3-D expert tensor {in, out, n_expert} (every
// expert cut alike, GGUF-ARCH-FACTS F.2); a fused gate_up tensor (out = 2 n_ff_exp) is cut in both halves and
// comes back as a 4-D view {in, rows, 2, n_expert} (gate = [:, :, 0, :], up = [:, :, 1, :]).
enum class CutUnit { None, QHeads, KvHeadsK, KvHeadsV, QHeadsV, FfRows, VocabRows, ExpertFfRows };
// Row split: split every matrix by rows over all devices, or keep the tensor on the main device.
enum class RowPlacement { MainDevice, SplitRows };

// One tensor's rule. Architectures declare their tables next to their tensors (src/model/); the planner and
// the loader here only read the fields.
struct ShardRule {
  const char* name;  // GGUF name; for per-layer tensors the part after "blk.N."
  bool per_layer;
  LayerPlacement layer;
  TensorCut cut;
  CutUnit unit;
  RowPlacement row;
};

// An architecture's table of rules, one entry per tensor name.
using ShardRuleTable = std::span<const ShardRule>;
// The rule of a GGUF tensor name ("blk.3.attn_q.weight" -> the "attn_q.weight" rule with *layer = 3;
// "output.weight" with *layer = -1), or null for a name the table does not know.
const ShardRule* find_shard_rule(ShardRuleTable table, const std::string& name, int64_t* layer);
// base's rules followed by extra's: an architecture that adds tensors to another one's table.
std::vector<ShardRule> joined_shard_rules(ShardRuleTable base, ShardRuleTable extra);
// The rule of a name the table must have (Error otherwise).
const ShardRule& shard_rule_named(ShardRuleTable table, const std::string& name);

// A half-open range [begin, end).
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return i >= begin && i < end; }
  bool operator==(const Range&) const = default;
};

// One layer's dimensions, when the layers differ (gemma4-style sliding and global layers).
struct LayerDims {
  int64_t n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0, n_ff = 0;
};

// The dimensions the planner needs. The scalars are every layer's when `layers` is empty; otherwise `layers`
// has one entry per layer and the scalars are layer 0's.
struct ShardDims {
  int64_t n_layer = 0, n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0, n_ff = 0, n_vocab = 0;
  std::vector<LayerDims> layers;
  // Block sizes (elements) of the dtypes of the matrices cut by input columns, by unit: the cuts align to
  // them.
  int64_t attn_output_block = 1;    // cut in CutUnit::QHeadsV (attention output)
  int64_t ffn_down_block = 1;       // cut in CutUnit::FfRows (down)
  int64_t n_ff_exp = 0;             // mixture of experts: each expert's n_ff (0 = no experts)
  int64_t ffn_down_exps_block = 1;  // cut in CutUnit::ExpertFfRows (down experts)
};

// What one rank holds. For SplitMode::None and Row, and for a mesh of one rank, every range is the whole
// dimension.
struct RankShard {
  SplitMode mode = SplitMode::None;
  int rank = 0;
  int n_ranks = 1;
  Range layers;                    // layer split: this rank's layers; otherwise all
  bool first = true, last = true;  // layer split: embeds the tokens / computes the logits
  Range q_heads, kv_heads;  // tensor split: attention heads of this rank (kv_heads may overlap between ranks
                            // with --replicate-kv)
  Range ff;                 // tensor split: feed-forward rows (n_ff)
  Range ff_exp;             // tensor split: each expert's feed-forward rows (n_ff_exp)
  Range vocab;              // tensor split: rows of the output head = logits of this rank
  // Tensor split of layers that differ (ShardDims::layers): the heads and rows of each layer; empty when the
  // layers are uniform (then q_heads / kv_heads / ff hold for every layer).
  struct LayerRanges {
    Range q_heads, kv_heads, ff;
  };
  std::vector<LayerRanges> per_layer;
  LayerRanges ranges_of(int64_t layer) const {
    if (layer >= 0 && size_t(layer) < per_layer.size()) return per_layer[size_t(layer)];
    return {q_heads, kv_heads, ff};
  }

  // Whether this rank holds (part of) the tensor of `rule` in `layer` (-1 for global tensors).
  bool holds(const ShardRule& rule, int64_t layer) const;
  // The element range a tensor of `layer` (-1: a global tensor) cut by `unit` covers on this rank (heads
  // times that layer's head_dim, rows, ...).
  Range cut_range(CutUnit unit, const ShardDims& d, int64_t layer = -1) const;
};

// Splits n units over ratios.size() parts: part j ends at floor(cumulative ratio * n / granularity) *
// granularity (the last part ends at n), so every boundary is a multiple of granularity. Parts may be empty.
std::vector<Range> split_range(int64_t n, std::span<const double> ratios, int64_t granularity = 1);

// Every rank's shard for a mesh and a model. Throws Error, before any weight is read, when the split cannot
// be made: more tensor ranks than KV heads without --replicate-kv, a rank left without heads / rows / layers
// by the ratios, head or feed-forward widths that cannot be cut at the weights' block size.
std::vector<RankShard> plan_shards(const MeshSpec& mesh, const ShardDims& dims);

}  // namespace tandem
