// Scale searches shared by the quantizers: fit a group of values with a few integer levels times a scale
// (and an offset), minimising a weighted squared error. These are the part of a quantizer that decides its
// error; the block packing around them is mechanical.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tandem::quant::fit {

// Nearest integer of v clamped to [lo, hi]; clamping in float first keeps the conversion defined for any v.
inline int round_clamped(float v, int lo, int hi) {
  v = std::clamp(v, float(lo), float(hi));
  return int(std::lrintf(v));
}

// Candidate inverse scales tried by a search: (n_levels_end + offset) / range for offset = first, first +
// step,
// ..., first + steps * step. Wider and finer grids cost time and gain little beyond about 20 candidates.
struct Grid {
  float first = -1.0f;
  float step = 0.1f;
  int steps = 20;
};

// Result of fit_affine: x ~ scale * L - min with L in [0, nmax].
struct AffineFit {
  float scale = 0;
  float min = 0;   // >= 0: the K formats store the offset unsigned, so the fitted range always reaches 0
  double err = 0;  // sum of w * (x - (scale * L - min))^2 at the fitted scale and min
};

// Weighted least-squares fit of n values x (weights w > 0) to scale * L - min, L integer in [0, nmax], min >=
// 0. For every candidate inverse scale of the grid: round to levels, solve the 2x2 weighted least squares for
// (scale, min) given those levels, re-round with the solution and solve again while the error drops; keep the
// best. The plain min/max fit is always a candidate, so the result is never worse than it. Levels go to L.
AffineFit fit_affine(const float* x, const float* w, int n, int nmax, uint8_t* L, const Grid& grid = {});

// Result of fit_symmetric: x ~ scale * L with L in [lo, hi].
struct SymmetricFit {
  float scale = 0;  // may be negative: the value of largest magnitude may map to the negative end lo
  double err = 0;
};

// Weighted least-squares fit of n values x to scale * L, L integer in [lo, hi] (lo <= 0 < hi). Candidates map
// the value of largest magnitude to near lo (the "sign trick": the negative end has one more level) and to
// near hi; each is rounded, the scale refit by least squares (sum w L x / sum w L^2), re-rounded and refit
// while the error drops. Levels (lo..hi) go to L when not null.
SymmetricFit fit_symmetric(const float* x, const float* w, int n, int lo, int hi, int* L = nullptr,
                           const Grid& grid = {});

}  // namespace tandem::quant::fit
