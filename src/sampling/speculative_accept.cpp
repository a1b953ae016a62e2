// The lossless acceptance test of speculative sampling (speculative.h): keep a draft token d ~ q with
// probability min(1, p(d) / q(d)), otherwise draw from the residual max(0, p - q). Then for every token x,
// P(x) = q(x) min(1, p(x)/q(x)) + P(reject) r(x) = min(q(x), p(x)) + max(0, p(x) - q(x)) = p(x).
#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "tandem/speculative.h"

namespace tandem {
namespace {

double prob_of(std::span<const TokenCandidate> c, int32_t id) {
  for (const TokenCandidate& t : c)
    if (t.id == id) return t.p;
  return 0.0;
}

// Draws from weights w (not normalized) over ids in increasing id order, the same walk as Sampler's dist.
int32_t draw(const std::vector<std::pair<int32_t, double>>& w, double total, double u) {
  double acc = 0.0;
  const double target = u * total;
  for (const auto& [id, weight] : w) {
    acc += weight;
    if (acc > target && weight > 0.0) return id;
  }
  for (auto it = w.rbegin(); it != w.rend(); ++it)  // rounding left u * total unreached: the last positive
    if (it->second > 0.0) return it->first;
  return w.empty() ? -1 : w.back().first;
}

}  // namespace

AcceptOutcome speculative_accept(std::span<const TokenCandidate> p, std::span<const TokenCandidate> q,
                                 int32_t draft, Rng& rng) {
  const double pd = prob_of(p, draft);
  const double qd = prob_of(q, draft);
  const double u = rng.uniform();
  if (qd > 0.0 && u * qd < pd) return {true, draft};

  std::unordered_map<int32_t, double> qmap;
  qmap.reserve(q.size());
  for (const TokenCandidate& t : q) qmap[t.id] = t.p;
  std::vector<std::pair<int32_t, double>> residual, plain;
  residual.reserve(p.size());
  plain.reserve(p.size());
  double total = 0.0, total_p = 0.0;
  for (const TokenCandidate& t : p) {
    const auto it = qmap.find(t.id);
    const double r = std::max(0.0, double(t.p) - (it == qmap.end() ? 0.0 : it->second));
    residual.emplace_back(t.id, r);
    plain.emplace_back(t.id, double(t.p));
    total += r;
    total_p += t.p;
  }
  auto by_id = [](const auto& a, const auto& b) { return a.first < b.first; };
  std::sort(residual.begin(), residual.end(), by_id);
  std::sort(plain.begin(), plain.end(), by_id);
  const double u2 = rng.uniform();
  if (total > 0.0) return {false, draw(residual, total, u2)};
  return {false, draw(plain, total_p, u2)};  // p == q on its support: p itself
}

size_t verify_draft(Session& target, size_t row0, const Draft& d, Sampler& sampler, const VerifyEmit& emit,
                    bool emit_logits) {
  const size_t nd = d.tokens.size();
  const bool greedy = sampler.params().greedy();
  if (greedy && !emit_logits && !sampler.params().penalties_active()) {
    std::vector<size_t> rows(nd + 1);
    for (size_t j = 0; j <= nd; ++j) rows[j] = row0 + j;
    const std::vector<Sampler*> samplers(nd + 1, &sampler);
    const std::vector<int32_t> ids = target.sample(rows, samplers);
    size_t accepted = 0;
    for (size_t j = 0; j <= nd; ++j) {
      const bool ok = j < nd && ids[j] == d.tokens[j];
      if (ok) ++accepted;
      if (emit(ids[j], j, ok, {}) || !ok) break;
    }
    return accepted;
  }
  check(greedy || d.q.size() >= nd,
        "speculative verify: the drafter gave no distribution for a sampled draft");
  std::vector<TokenCandidate> p;
  size_t accepted = 0;
  for (size_t j = 0; j <= nd; ++j) {
    const std::span<const float> logits = target.logits(row0 + j);
    int32_t token;
    bool ok = false;
    if (j == nd) {
      token = sampler.sample(logits);  // the bonus (or, with no draft, the plain step)
    } else if (greedy) {
      token = sampler.sample(logits);
      ok = token == d.tokens[j];
    } else {
      sampler.sample_with_uniform(logits, 0.0);  // the chain's distribution; the uniforms come below
      const auto cand = sampler.last_candidates();
      p.assign(cand.begin(), cand.end());
      const AcceptOutcome r = speculative_accept(p, d.q[j], d.tokens[j], sampler.rng());
      token = r.token;
      ok = r.accepted;
    }
    if (ok) ++accepted;
    if (emit(token, j, ok, logits) || !ok) break;
  }
  return accepted;
}

}  // namespace tandem
