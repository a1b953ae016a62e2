// Classic draft-model speculation (speculative.h): a small model with the target's vocabulary drafts token
// by token, every sequence in one batch per step. Its cache follows the histories it is given: a tail that
// is no longer in the history (rejected drafts) is removed, what is missing is decoded with the first step.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "sampling/draft_sampling.h"
#include "tandem/speculative.h"

namespace tandem {
namespace {

constexpr uint64_t kDraftModelStream = 0x5DEECE66DULL;  // the drafter's random stream: the target's seed ^ this

}  // namespace

DraftModelDrafter::DraftModelDrafter(Session& session, int64_t n_vocab_target) : session_(session) {
  check(n_vocab_target <= 0 || n_vocab_target == session.n_vocab(),
        "draft model " + session.model().info().path + " has " + std::to_string(session.n_vocab()) +
            " tokens in its vocabulary, the target " + std::to_string(n_vocab_target) +
            ": a draft model must share the target's vocabulary");
}

void DraftModelDrafter::reset(int32_t seq) {
  if (size_t(seq) < cached_.size()) cached_[size_t(seq)].clear();
  if (size_t(seq) < samplers_.size()) samplers_[size_t(seq)].reset();
  session_.seq_clear(seq);
}

void DraftModelDrafter::fork(int32_t src, int32_t dst, int32_t n) {
  reset(dst);
  if (size_t(src) >= cached_.size() || n <= 0) return;
  if (cached_.size() <= size_t(dst)) cached_.resize(size_t(dst) + 1);  // before taking a reference into it
  // The cached prefix of src that dst's history shares: forked, not decoded again.
  const std::vector<int32_t>& c = cached_[size_t(src)];
  const size_t k = std::min(size_t(n), c.size());
  if (k == 0) return;
  session_.seq_fork(src, dst, int32_t(k));
  cached_[size_t(dst)].assign(c.begin(), c.begin() + ptrdiff_t(k));
}

void DraftModelDrafter::draft(std::span<const int32_t> seqs,
                              std::span<const std::vector<int32_t>* const> history,
                              std::span<const int32_t> n_max, std::span<const SamplingParams> sampling,
                              float p_min, std::vector<Draft>& out) {
  out.assign(seqs.size(), {});
  Batch batch;
  std::vector<size_t> row(seqs.size(), 0);
  std::vector<uint8_t> active(seqs.size(), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (n_max[i] <= 0 || history[i]->empty()) continue;
    const size_t seq = size_t(seqs[i]);
    if (cached_.size() <= seq) cached_.resize(seq + 1);
    if (samplers_.size() <= seq) samplers_.resize(seq + 1);
    if (!sampling[i].greedy() && !samplers_[seq])
      samplers_[seq] = std::make_unique<Sampler>(draft_sampling(sampling[i], kDraftModelStream));
    const std::vector<int32_t>& h = *history[i];
    std::vector<int32_t>& c = cached_[seq];
    size_t keep = 0;  // the cache keeps the common prefix of what it holds and h minus its last token
    while (keep < c.size() && keep + 1 < h.size() && c[keep] == h[keep]) ++keep;
    if (keep < c.size()) {
      session_.seq_remove(seqs[i], int32_t(keep));
      c.resize(keep);
    }
    for (size_t j = keep; j < h.size(); ++j) {
      batch.add(h[j], int32_t(j), seqs[i], j + 1 == h.size());
      c.push_back(h[j]);
    }
    row[i] = batch.size() - 1;
    active[i] = 1;
  }
  while (!batch.empty()) {
    session_.decode(batch);
    Batch next;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (!active[i]) continue;
      const std::span<const float> logits = session_.logits(row[i]);
      int32_t token;
      double prob = 1.0;
      Draft& d = out[i];
      if (sampling[i].greedy()) {
        token = argmax(logits);
        if (p_min > 0.0f) prob = top_probability(logits);
      } else {
        Sampler& s = *samplers_[size_t(seqs[i])];
        token = s.sample(logits);
        const auto cand = s.last_candidates();
        prob = 0.0;
        for (const TokenCandidate& t : cand)
          if (t.id == token) prob = t.p;
        if (prob >= p_min) d.q.emplace_back(cand.begin(), cand.end());
      }
      if (prob < p_min) {
        active[i] = 0;
        continue;
      }
      d.tokens.push_back(token);
      if (int32_t(d.tokens.size()) >= n_max[i]) {
        active[i] = 0;
        continue;
      }
      std::vector<int32_t>& c = cached_[size_t(seqs[i])];
      next.add(token, int32_t(c.size()), seqs[i], true);
      c.push_back(token);
      row[i] = next.size() - 1;
    }
    batch = std::move(next);
  }
}

}  // namespace tandem
