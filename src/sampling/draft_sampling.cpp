#include "sampling/draft_sampling.h"

#include <algorithm>
#include <cmath>

namespace tandem {

double top_probability(std::span<const float> logits) {
  float mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0.0;
  for (float v : logits) sum += std::exp(double(v) - mx);
  return sum > 0.0 ? 1.0 / sum : 0.0;
}

SamplingParams draft_sampling(const SamplingParams& target, uint64_t stream_salt) {
  SamplingParams p = target;
  p.repeat_penalty = 1.0f;
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.0f;
  p.penalty_last_n = 0;
  p.seed = target.seed ^ stream_salt;
  return p;
}

}  // namespace tandem
