// The BPE merge loop over token ids: repeatedly merge the adjacent pair with the lowest rank (the leftmost
// one among equal ranks) until no pair has a merge. A linked list of symbols and a heap of candidate pairs
// make it O(n log n) in the number of symbols, so long words cost no quadratic rescans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tandem::tokenizer {

class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  // Keeps the first (lowest) rank when the same pair is added twice.
  void add(int32_t left, int32_t right, int32_t rank, int32_t result) {
    pairs_.try_emplace(key(left, right), Merge{rank, result});
  }
  const Merge* find(int32_t left, int32_t right) const {
    auto it = pairs_.find(key(left, right));
    return it == pairs_.end() ? nullptr : &it->second;
  }
  bool empty() const { return pairs_.empty(); }
  size_t size() const { return pairs_.size(); }
  void reserve(size_t n) { pairs_.reserve(n); }

 private:
  static uint64_t key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  std::unordered_map<uint64_t, Merge> pairs_;
};

// Merges ids in place by rank. Negative ids (symbols with no token) never merge.
void bpe_merge_by_rank(const MergeTable& table, std::vector<int32_t>& ids);

}  // namespace tandem::tokenizer
