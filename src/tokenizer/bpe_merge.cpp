#include "tokenizer/bpe_merge.h"

#include <algorithm>
#include <queue>

namespace tandem::tokenizer {
namespace {

struct Candidate {
  int32_t rank;
  int32_t left;   // symbol index; the merged symbol keeps it, so index order is text order
  int32_t right;  // symbol index of the right neighbour when the candidate was made
  int32_t left_id;
  int32_t right_id;
  // Heap order: lowest rank first, then leftmost.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};

}  // namespace

void bpe_merge_by_rank(const MergeTable& table, std::vector<int32_t>& ids) {
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  if (n == 2) {  // the common short case, without allocations
    if (ids[0] >= 0 && ids[1] >= 0) {
      if (const auto* m = table.find(ids[0], ids[1])) ids = {m->result};
    }
    return;
  }
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<Candidate> heap;
  auto push = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0 || ids[l] < 0 || ids[r] < 0) return;
    if (const auto* m = table.find(ids[l], ids[r])) heap.push({m->rank, l, r, ids[l], ids[r]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale when either symbol was merged away or changed since the candidate was made.
    if (ids[c.left] != c.left_id || next[c.left] != c.right || ids[c.right] != c.right_id) continue;
    const auto* m = table.find(c.left_id, c.right_id);
    ids[c.left] = m->result;
    ids[c.right] = -2;  // dead
    const int32_t nn = next[c.right];
    next[c.left] = nn;
    if (nn >= 0) prev[nn] = c.left;
    next[c.right] = -1;
    push(prev[c.left], c.left);
    push(c.left, nn);
  }
  int32_t w = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) ids[w++] = ids[i];
  ids.resize(w);
}

}  // namespace tandem::tokenizer
