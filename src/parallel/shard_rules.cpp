#include "parallel/shard_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "core/error.h"

namespace tandem {

namespace {

using enum LayerPlacement;
using enum TensorCut;
using enum CutUnit;
using enum RowPlacement;

std::string ratio_list(const MeshSpec& m) {
  std::string s;
  for (double r : m.ratios) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.3g", s.empty() ? "" : ",", r);
    s += buf;
  }
  return s;
}

bool equal_ratios(const MeshSpec& m) {
  for (double r : m.ratios)
    if (std::abs(r - m.ratios[0]) > 1e-9) return false;
  return true;
}

}  // namespace

std::vector<ShardRule> joined_shard_rules(ShardRuleTable base, ShardRuleTable extra) {
  std::vector<ShardRule> r(base.begin(), base.end());
  r.insert(r.end(), extra.begin(), extra.end());
  return r;
}

const ShardRule& shard_rule_named(ShardRuleTable table, const std::string& name) {
  for (const ShardRule& r : table)
    if (name == r.name) return r;
  throw Error("no shard rule for tensor name " + name);
}

const ShardRule* find_shard_rule(ShardRuleTable table, const std::string& name, int64_t* layer) {
  std::string rest = name;
  int64_t il = -1;
  if (name.rfind("blk.", 0) == 0) {
    const size_t dot = name.find('.', 4);
    if (dot == std::string::npos || dot == 4) return nullptr;
    const std::string num = name.substr(4, dot - 4);
    if (num.find_first_not_of("0123456789") != std::string::npos || num.size() > 9) return nullptr;
    il = std::stoll(num);
    rest = name.substr(dot + 1);
  }
  for (const ShardRule& r : table) {
    if (r.per_layer == (il >= 0) && rest == r.name) {
      if (layer) *layer = il;
      return &r;
    }
  }
  return nullptr;
}

bool RankShard::holds(const ShardRule& rule, int64_t layer) const {
  if (mode != SplitMode::Layer) return true;
  switch (rule.layer) {
    case LayerPlacement::Everywhere:
      return true;
    case LayerPlacement::FirstRank:
      return first;
    case LayerPlacement::LastRank:
      return last;
    case LayerPlacement::LayerOwner:
      return layers.contains(layer);
  }
  return true;
}

Range RankShard::cut_range(CutUnit unit, const ShardDims& d, int64_t layer) const {
  auto scaled = [](Range r, int64_t k) { return Range{r.begin * k, r.end * k}; };
  const LayerRanges lr = ranges_of(layer);
  const bool own = layer >= 0 && size_t(layer) < d.layers.size();
  const int64_t hd_k = own ? d.layers[size_t(layer)].head_dim_k : d.head_dim_k;
  const int64_t hd_v = own ? d.layers[size_t(layer)].head_dim_v : d.head_dim_v;
  switch (unit) {
    case CutUnit::None:
      return {};
    case CutUnit::QHeads:
      return scaled(lr.q_heads, hd_k);
    case CutUnit::QHeadsV:
      return scaled(lr.q_heads, hd_v);
    case CutUnit::KvHeadsK:
      return scaled(lr.kv_heads, hd_k);
    case CutUnit::KvHeadsV:
      return scaled(lr.kv_heads, hd_v);
    case CutUnit::FfRows:
      return lr.ff;
    case CutUnit::VocabRows:
      return vocab;
    case CutUnit::ExpertFfRows:
      return ff_exp;
  }
  return {};
}

std::vector<Range> split_range(int64_t n, std::span<const double> ratios, int64_t granularity) {
  check(!ratios.empty() && granularity >= 1, "split_range: no parts or a granularity < 1");
  std::vector<Range> out(ratios.size());
  double cum = 0;
  int64_t begin = 0;
  for (size_t j = 0; j < ratios.size(); ++j) {
    cum += ratios[j];
    int64_t end = n;
    if (j + 1 < ratios.size()) {
      end = int64_t(std::floor(cum * double(n) / double(granularity) + 1e-9)) * granularity;
      end = std::clamp<int64_t>(end, begin, n);
    }
    out[j] = {begin, end};
    begin = end;
  }
  return out;
}

namespace {

// The tensor split of one layer shape over the mesh's ranks: KV heads (whole GQA groups, or copies with
// --replicate-kv), the query heads that read them, and feed-forward rows. Throws Error when it cannot be
// made.
std::vector<RankShard::LayerRanges> plan_tensor_layer(const MeshSpec& mesh, const ShardDims& d,
                                                      const LayerDims& L, const std::string& what) {
  const int n = int(mesh.n_ranks());
  auto name = [&](int r) { return mesh.devices[size_t(r)].to_string(); };
  check(L.n_head_kv >= 1 && L.n_head % L.n_head_kv == 0, what + ": bad head counts");
  std::vector<RankShard::LayerRanges> out(static_cast<size_t>(n));
  const int64_t gqa = L.n_head / L.n_head_kv;
  if (n > L.n_head_kv) {
    check(
        mesh.replicate_kv,
        what + " needs at least " + std::to_string(n) + " KV heads, but the model has " +
            std::to_string(L.n_head_kv) +
            ": pass --replicate-kv to give several ranks a copy of a KV head (more KV-cache memory), use at "
            "most " +
            std::to_string(L.n_head_kv) + " devices, or --split-mode layer");
    check(n % L.n_head_kv == 0, what + " with --replicate-kv needs the rank count to be a multiple of the " +
                                    std::to_string(L.n_head_kv) + " KV heads");
    check(L.n_head % n == 0 && gqa % (n / L.n_head_kv) == 0,
          what + " with --replicate-kv: the " + std::to_string(L.n_head) +
              " query heads cannot be split evenly so that each rank reads one KV head");
    check(!mesh.ratios_given || equal_ratios(mesh),
          what + " with --replicate-kv splits heads evenly; --tensor-split must be equal or left out");
    const int64_t per = L.n_head / n;
    check(per * L.head_dim_v % d.attn_output_block == 0,
          what + ": " + std::to_string(per) + " heads per rank give attn_output slices of " +
              std::to_string(per * L.head_dim_v) + " columns, not a multiple of its block size " +
              std::to_string(d.attn_output_block));
    for (int r = 0; r < n; ++r) {
      RankShard::LayerRanges& s = out[size_t(r)];
      s.q_heads = {r * per, (r + 1) * per};
      s.kv_heads = {s.q_heads.begin / gqa, s.q_heads.begin / gqa + 1};
    }
  } else {
    // Whole KV groups per rank, in units of g_kv KV heads so that attn_output's column cut falls on a block
    // boundary of its dtype.
    int64_t g_kv = 1;
    while ((g_kv * gqa * L.head_dim_v) % d.attn_output_block != 0 && g_kv < L.n_head_kv) ++g_kv;
    check((g_kv * gqa * L.head_dim_v) % d.attn_output_block == 0,
          what + ": attn_output's block size " + std::to_string(d.attn_output_block) +
              " does not divide any whole number of KV groups");
    const std::vector<Range> kv = split_range(L.n_head_kv, mesh.ratios, g_kv);
    for (int r = 0; r < n; ++r) {
      check(kv[size_t(r)].size() > 0,
            what + ": " + name(r) + " gets no KV heads (the model has " + std::to_string(L.n_head_kv) +
                " KV heads, cut in groups of " + std::to_string(g_kv) +
                " to fit the weights' block size; ratios " + ratio_list(mesh) +
                "); use fewer devices, other --tensor-split ratios or --split-mode layer");
      RankShard::LayerRanges& s = out[size_t(r)];
      s.kv_heads = kv[size_t(r)];
      s.q_heads = {s.kv_heads.begin * gqa, s.kv_heads.end * gqa};
    }
  }
  const std::vector<Range> ff = split_range(L.n_ff, mesh.ratios, d.ffn_down_block);
  for (int r = 0; r < n; ++r) {
    check(ff[size_t(r)].size() > 0, what + ": " + name(r) + " gets no feed-forward rows (n_ff " +
                                        std::to_string(L.n_ff) + ", cut in multiples of " +
                                        std::to_string(d.ffn_down_block) +
                                        "); use fewer devices or other ratios");
    out[size_t(r)].ff = ff[size_t(r)];
  }
  return out;
}

}  // namespace

std::vector<RankShard> plan_shards(const MeshSpec& mesh, const ShardDims& d) {
  const int n = int(mesh.n_ranks());
  check(n >= 1 && mesh.ratios.size() == size_t(n), "a mesh needs one ratio per device");
  check(d.n_head_kv >= 1 && d.n_head % d.n_head_kv == 0, "bad head counts");
  RankShard full;
  full.mode = mesh.mode;
  full.n_ranks = n;
  full.layers = {0, d.n_layer};
  full.q_heads = {0, d.n_head};
  full.kv_heads = {0, d.n_head_kv};
  full.ff = {0, d.n_ff};
  full.vocab = {0, d.n_vocab};
  full.ff_exp = {0, d.n_ff_exp};
  std::vector<RankShard> shards(size_t(n), full);
  for (int r = 0; r < n; ++r) shards[size_t(r)].rank = r;
  if (mesh.mode == SplitMode::None || mesh.mode == SplitMode::Row || n == 1) return shards;

  auto name = [&](int r) { return mesh.devices[size_t(r)].to_string(); };

  if (mesh.mode == SplitMode::Layer) {
    const std::vector<Range> layers = split_range(d.n_layer, mesh.ratios);
    for (int r = 0; r < n; ++r) {
      check(layers[size_t(r)].size() > 0, "layer split: " + name(r) + " gets no layers (the model has " +
                                              std::to_string(d.n_layer) + " layers for " + std::to_string(n) +
                                              " devices, ratios " + ratio_list(mesh) +
                                              "); use fewer devices or other --tensor-split ratios");
      RankShard& s = shards[size_t(r)];
      s.layers = layers[size_t(r)];
      s.first = r == 0;
      s.last = r == n - 1;
    }
    return shards;
  }

  // Tensor split: the heads and feed-forward rows of the scalar dims (every layer's when uniform), then of
  // each layer when the layers differ.
  const std::string what = "tensor split over " + std::to_string(n) + " ranks";
  const std::vector<RankShard::LayerRanges> common =
      plan_tensor_layer(mesh, d, LayerDims{d.n_head, d.n_head_kv, d.head_dim_k, d.head_dim_v, d.n_ff}, what);
  for (int r = 0; r < n; ++r) {
    shards[size_t(r)].q_heads = common[size_t(r)].q_heads;
    shards[size_t(r)].kv_heads = common[size_t(r)].kv_heads;
    shards[size_t(r)].ff = common[size_t(r)].ff;
  }
  for (size_t il = 0; il < d.layers.size(); ++il) {
    const std::vector<RankShard::LayerRanges> lr =
        plan_tensor_layer(mesh, d, d.layers[il], what + " (layer " + std::to_string(il) + ")");
    for (int r = 0; r < n; ++r) shards[size_t(r)].per_layer.push_back(lr[size_t(r)]);
  }
  if (d.n_ff_exp > 0) {  // every expert's n_ff, cut alike on every rank (F.2), at the down experts' blocks
    const int64_t g = d.ffn_down_exps_block;
    const std::vector<Range> fe = split_range(d.n_ff_exp, mesh.ratios, g);
    for (int r = 0; r < n; ++r) {
      check(fe[size_t(r)].size() > 0, what + ": " + name(r) + " gets no expert feed-forward rows (n_ff_exp " +
                                          std::to_string(d.n_ff_exp) + ", cut in multiples of " +
                                          std::to_string(g) + "); use fewer devices or other ratios");
      shards[size_t(r)].ff_exp = fe[size_t(r)];
    }
  }
  const std::vector<Range> vocab = split_range(d.n_vocab, mesh.ratios);
  for (int r = 0; r < n; ++r) {
    check(vocab[size_t(r)].size() > 0, what + ": " + name(r) + " gets no vocabulary rows");
    shards[size_t(r)].vocab = vocab[size_t(r)];
  }
  return shards;
}

}  // namespace tandem
