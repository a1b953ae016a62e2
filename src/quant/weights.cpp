// Error weights of the scale searches (see WeightRule in quant_impl.h).
#include <cmath>

#include "quant/quant_impl.h"

namespace tandem::quant::detail {

void make_weights(const float* x, int n, const float* importance, WeightRule rule, float* w) {
  double sum_sq = 0;
  for (int i = 0; i < n; ++i) sum_sq += double(x[i]) * x[i];
  const float rms = float(std::sqrt(sum_sq / n));
  for (int i = 0; i < n; ++i) {
    switch (rule) {
      case WeightRule::Uniform:
        w[i] = 1.0f;
        break;
      // rms keeps small values from being ignored; |x| makes the largest values (which dominate the dot
      // products a matmul computes) be reproduced more closely.
      case WeightRule::AbsPlusRms:
        w[i] = rms + std::fabs(x[i]);
        break;
      case WeightRule::Square:
        w[i] = x[i] * x[i] + 0.25f * rms * rms;
        break;
    }
    if (!(w[i] > 0)) w[i] = 1.0f;  // all-zero group: any positive weights do
  }
  if (!importance) return;
  // A zero importance must not drop a value from the fit entirely (a group of only zeros would lose its
  // scale), so every weight keeps a small floor relative to the group's mean importance.
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += importance[i];
  mean /= n;
  const float floor = float(1e-3 * mean) + 1e-30f;
  for (int i = 0; i < n; ++i) w[i] *= importance[i] + floor;
}

}  // namespace tandem::quant::detail
