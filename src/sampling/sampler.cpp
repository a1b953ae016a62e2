// The AR sampling chain (semantics in include/tandem/sampling.h).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "tandem/sampling.h"

namespace tandem {

namespace {

// Candidates ordered by logit, largest first, ties by lower id: a total order, so every sort gives one
// result.
bool logit_before(const TokenCandidate& a, const TokenCandidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

bool finite_number(float v) {
  return std::isfinite(v);
}

}  // namespace

const char* sampler_stage_name(SamplerStage s) {
  switch (s) {
    case SamplerStage::Penalties:
      return "penalties";
    case SamplerStage::TopK:
      return "top-k";
    case SamplerStage::TopP:
      return "top-p";
    case SamplerStage::MinP:
      return "min-p";
    case SamplerStage::Temperature:
      return "temperature";
  }
  return "?";
}

void SamplingParams::validate() const {
  check(!std::isnan(temperature), "temperature must be a number");
  check(finite_number(top_p) && top_p >= 0.0f && top_p <= 1.0f,
        "top-p must be in [0, 1] (1 turns it off), got " + std::to_string(top_p));
  check(finite_number(min_p) && min_p >= 0.0f && min_p <= 1.0f,
        "min-p must be in [0, 1] (0 turns it off), got " + std::to_string(min_p));
  check(finite_number(repeat_penalty) && repeat_penalty > 0.0f,
        "repeat penalty must be > 0 (1 turns it off), got " + std::to_string(repeat_penalty));
  check(finite_number(presence_penalty), "presence penalty must be a finite number");
  check(finite_number(frequency_penalty), "frequency penalty must be a finite number");
  check(penalty_last_n >= -1,
        "the penalty window must be -1 (all), 0 (off) or a positive number of tokens, got " +
            std::to_string(penalty_last_n));
  for (size_t i = 0; i < order.size(); ++i)
    for (size_t j = i + 1; j < order.size(); ++j)
      check(order[i] != order[j],
            std::string("sampler stage '") + sampler_stage_name(order[i]) + "' is listed twice in the chain");
}

int32_t argmax(std::span<const float> values) {
  check(!values.empty(), "argmax of an empty row");
  int32_t best = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    // '>' keeps the lowest index on ties; a NaN best is replaced by any number
    if (values[i] > values[best] || (std::isnan(values[best]) && !std::isnan(values[i]))) best = int32_t(i);
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  params_.validate();
  if (params_.penalty_last_n > 0) history_.reserve(size_t(params_.penalty_last_n));
}

void Sampler::reset() {
  history_.clear();
  history_next_ = 0;
  cand_.clear();
  rng_.reseed(params_.seed);
}

void Sampler::accept(int32_t token) {
  const int32_t n = params_.penalty_last_n;
  if (n == 0) return;
  if (n < 0 || history_.size() < size_t(n)) {
    history_.push_back(token);
    return;
  }
  history_[history_next_] = token;  // ring buffer: overwrite the oldest
  history_next_ = (history_next_ + 1) % history_.size();
}

std::vector<int32_t> Sampler::penalty_window() const {
  std::vector<int32_t> out;
  out.reserve(history_.size());
  for (size_t i = 0; i < history_.size(); ++i) out.push_back(history_[(history_next_ + i) % history_.size()]);
  return out;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.greedy()) return sample_with_uniform(logits, 0.0);
  return sample_with_uniform(logits, rng_.uniform());
}

void Sampler::sort_by_logit() {
  if (!sorted_by_logit_) std::sort(cand_.begin(), cand_.end(), logit_before);
  sorted_by_logit_ = true;
}

void Sampler::sort_by_id() {
  if (sorted_by_logit_)
    std::sort(cand_.begin(), cand_.end(),
              [](const TokenCandidate& a, const TokenCandidate& b) { return a.id < b.id; });
  sorted_by_logit_ = false;
}

void Sampler::apply_penalties() {
  const bool active =
      params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (!active || history_.empty()) return;
  // Count each distinct token of the window: sort a copy and walk the runs.
  window_scratch_.assign(history_.begin(), history_.end());
  std::sort(window_scratch_.begin(), window_scratch_.end());
  auto penalise = [&](TokenCandidate& c, int count) {
    float l = c.logit;
    l = l > 0.0f ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    l -= float(count) * params_.frequency_penalty + params_.presence_penalty;
    c.logit = l;
  };
  // Fast path: the full vocabulary in id order, so candidate index == token id.
  const bool direct = !sorted_by_logit_ && !cand_.empty() && cand_.front().id == 0 &&
                      cand_.back().id == int32_t(cand_.size()) - 1;
  for (size_t i = 0; i < window_scratch_.size();) {
    size_t j = i;
    while (j < window_scratch_.size() && window_scratch_[j] == window_scratch_[i]) ++j;
    const int32_t token = window_scratch_[i];
    const int count = int(j - i);
    i = j;
    if (direct) {
      if (token >= 0 && size_t(token) < cand_.size()) penalise(cand_[size_t(token)], count);
    } else {
      for (TokenCandidate& c : cand_)
        if (c.id == token) penalise(c, count);
    }
  }
  // Logits changed, so a logit order is stale: go back to id order (penalties may run after a sorting stage).
  if (!direct) sort_by_id();
}

void Sampler::apply_top_k() {
  const int32_t k = params_.top_k;
  if (k <= 0 || size_t(k) >= cand_.size()) return;
  if (!sorted_by_logit_) std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), logit_before);
  cand_.resize(size_t(k));
  sorted_by_logit_ = true;
}

void Sampler::apply_top_p() {
  const double p = params_.top_p;
  if (p >= 1.0 || cand_.size() <= 1) return;
  float max_logit = cand_.front().logit;
  for (const TokenCandidate& c : cand_) max_logit = std::max(max_logit, c.logit);
  double total = 0.0;
  for (const TokenCandidate& c : cand_) total += std::exp(double(c.logit) - max_logit);
  const double target = p * total;
  // The nucleus is usually small: sort only a head of the candidates first and sort everything only if the
  // head does not reach p.
  auto nucleus_size = [&](size_t n_sorted) -> size_t {
    double cum = 0.0;
    for (size_t i = 0; i < n_sorted; ++i) {
      cum += std::exp(double(cand_[i].logit) - max_logit);
      if (cum >= target) return i + 1;
    }
    return 0;  // not reached within the sorted head
  };
  size_t keep = 0;
  if (!sorted_by_logit_ && cand_.size() > 1024) {
    std::partial_sort(cand_.begin(), cand_.begin() + 1024, cand_.end(), logit_before);
    keep = nucleus_size(1024);
    if (keep == 0) std::sort(cand_.begin() + 1024, cand_.end(), logit_before);
  } else {
    sort_by_logit();
  }
  sorted_by_logit_ = true;
  if (keep == 0) keep = nucleus_size(cand_.size());
  if (keep == 0) keep = cand_.size();  // rounding: p of the whole set fell short of target
  cand_.resize(std::max<size_t>(keep, 1));
}

void Sampler::apply_min_p() {
  if (params_.min_p <= 0.0f || cand_.size() <= 1) return;
  float max_logit = cand_.front().logit;
  for (const TokenCandidate& c : cand_) max_logit = std::max(max_logit, c.logit);
  // p_i >= min_p * p_max  <=>  logit_i - max_logit >= log(min_p); order is preserved
  const double threshold = double(max_logit) + std::log(double(params_.min_p));
  std::erase_if(cand_, [&](const TokenCandidate& c) { return double(c.logit) < threshold; });
}

int32_t Sampler::sample_with_uniform(std::span<const float> logits, double u) {
  check(!logits.empty(), "sampling from an empty row of logits");
  cand_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {int32_t(i), logits[i], 0.0f};
  sorted_by_logit_ = false;

  if (params_.greedy()) {
    for (SamplerStage s : params_.order)
      if (s == SamplerStage::Penalties) apply_penalties();
    size_t best = 0;
    for (size_t i = 1; i < cand_.size(); ++i)
      if (logit_before(cand_[i], cand_[best]) ||
          (std::isnan(cand_[best].logit) && !std::isnan(cand_[i].logit)))
        best = i;
    const int32_t token = cand_[best].id;
    cand_.clear();
    return token;
  }

  for (SamplerStage s : params_.order) {
    switch (s) {
      case SamplerStage::Penalties:
        apply_penalties();
        break;
      case SamplerStage::TopK:
        apply_top_k();
        break;
      case SamplerStage::TopP:
        apply_top_p();
        break;
      case SamplerStage::MinP:
        apply_min_p();
        break;
      case SamplerStage::Temperature:
        for (TokenCandidate& c : cand_) c.logit /= params_.temperature;
        break;
    }
  }

  // dist: softmax over the survivors, walked in increasing token id order (as Ops::sample_rows does: no sort
  // is needed when no truncating stage ran).
  sort_by_id();
  float max_logit = cand_.front().logit;
  for (const TokenCandidate& c : cand_) max_logit = std::max(max_logit, c.logit);
  double total = 0.0;
  for (TokenCandidate& c : cand_) {
    const double e = std::isfinite(max_logit) ? std::exp(double(c.logit) - max_logit) : 1.0;
    c.p = float(e);
    total += c.p;  // the same float values the walk below adds up
  }
  const double threshold = u * total;
  double cum = 0.0;
  int32_t chosen = -1;
  for (const TokenCandidate& c : cand_) {
    cum += c.p;
    if (cum > threshold && c.p > 0.0f) {
      chosen = c.id;
      break;
    }
  }
  if (chosen < 0) {  // rounding left the threshold at or above the sum: the last token with mass
    for (auto it = cand_.rbegin(); it != cand_.rend(); ++it)
      if (it->p > 0.0f) {
        chosen = it->id;
        break;
      }
  }
  if (chosen < 0) chosen = cand_.front().id;
  for (TokenCandidate& c : cand_) c.p = float(c.p / total);
  return chosen;
}

}  // namespace tandem
