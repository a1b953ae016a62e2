#include "quant/fit.h"

#include <array>
#include <cstring>

namespace tandem::quant::fit {
namespace {

constexpr int kMaxGroup = 256;  // largest group any quantizer fits at once (callers keep n <= this)
constexpr int kMaxRefits = 3;   // re-round / refit rounds per candidate; more rarely changes a level

// Levels of x under x ~ scale * L + offset (offset = -min).
void round_affine(const float* x, int n, float scale, float offset, int nmax, uint8_t* L) {
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i) L[i] = uint8_t(round_clamped((x[i] - offset) * inv, 0, nmax));
}

double affine_error(const float* x, const float* w, int n, float scale, float offset, const uint8_t* L) {
  double e = 0;
  for (int i = 0; i < n; ++i) {
    const double d = double(scale) * L[i] + offset - x[i];
    e += w[i] * d * d;
  }
  return e;
}

// Least-squares (scale, offset) for fixed levels, with offset <= 0 and scale >= 0. False if degenerate.
bool solve_affine(const float* x, const float* w, int n, const uint8_t* L, float& scale, float& offset) {
  double sw = 0, swl = 0, swll = 0, swx = 0, swlx = 0;
  for (int i = 0; i < n; ++i) {
    const double wi = w[i], l = L[i];
    sw += wi;
    swl += wi * l;
    swll += wi * l * l;
    swx += wi * x[i];
    swlx += wi * l * x[i];
  }
  const double det = sw * swll - swl * swl;
  double a, b;
  if (det > 1e-12 * sw * swll) {
    a = (sw * swlx - swl * swx) / det;
    b = (swll * swx - swl * swlx) / det;
  } else {
    a = -1;
    b = 1;
  }
  if (b > 0 || a < 0) {  // the unconstrained optimum is outside the format: pin the offset at 0
    if (swll <= 0) return false;
    b = 0;
    a = swlx / swll;
  }
  if (!(a > 0)) return false;
  scale = float(a);
  offset = float(b);
  return true;
}

}  // namespace

AffineFit fit_affine(const float* x, const float* w, int n, int nmax, uint8_t* L, const Grid& grid) {
  // No values: nothing to fit (x[0] below needs one). Spelled out, GCC 14 also knows the fills below have a
  // positive length (it warned -Wstringop-overflow of a negative n otherwise).
  if (n <= 0) return {};
  float xmin = 0, xmax = x[0];
  for (int i = 0; i < n; ++i) {
    xmin = std::min(xmin, x[i]);
    xmax = std::max(xmax, x[i]);
  }
  AffineFit best;
  if (!(xmax - xmin > 1e-30f)) {  // all values equal and <= 0: the offset alone represents them
    std::fill(L, L + n, uint8_t(0));
    best.scale = 0;
    best.min = -xmin;
    best.err = 0;
    for (int i = 0; i < n; ++i) best.err += w[i] * double(x[i] - xmin) * (x[i] - xmin);
    return best;
  }
  std::array<uint8_t, kMaxGroup> Lc;
  // Baseline: the plain min/max map.
  best.scale = (xmax - xmin) / float(nmax);
  best.min = -xmin;
  round_affine(x, n, best.scale, xmin, nmax, L);
  best.err = affine_error(x, w, n, best.scale, xmin, L);

  for (int k = 0; k <= grid.steps; ++k) {
    const float iscale = (float(nmax) + grid.first + grid.step * float(k)) / (xmax - xmin);
    if (!(iscale > 0)) continue;
    for (int i = 0; i < n; ++i) Lc[size_t(i)] = uint8_t(round_clamped(iscale * (x[i] - xmin), 0, nmax));
    double prev = INFINITY;
    for (int r = 0; r < kMaxRefits; ++r) {
      float scale, offset;
      if (!solve_affine(x, w, n, Lc.data(), scale, offset)) break;
      const double e = affine_error(x, w, n, scale, offset, Lc.data());
      if (e < best.err) {
        best.err = e;
        best.scale = scale;
        best.min = -offset;
        std::copy(Lc.begin(), Lc.begin() + n, L);
      }
      if (!(e < prev)) break;
      prev = e;
      round_affine(x, n, scale, offset, nmax, Lc.data());
    }
  }
  return best;
}

SymmetricFit fit_symmetric(const float* x, const float* w, int n, int lo, int hi, int* L, const Grid& grid) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  }
  SymmetricFit best;
  best.scale = 0;
  best.err = 0;
  for (int i = 0; i < n; ++i) best.err += w[i] * double(x[i]) * x[i];
  if (L && n > 0) std::fill_n(L, size_t(n), 0);  // (n > 0 spelled out: GCC 13 warns of a negative bound)
  if (!(amax > 1e-30f)) return best;

  std::array<int, kMaxGroup> Lc;
  auto try_scale = [&](float iscale) {
    for (int i = 0; i < n; ++i) Lc[size_t(i)] = round_clamped(iscale * x[i], lo, hi);
    double prev = INFINITY;
    for (int r = 0; r < kMaxRefits; ++r) {
      double swlx = 0, swll = 0, swxx = 0;
      for (int i = 0; i < n; ++i) {
        const double l = Lc[size_t(i)];
        swlx += w[i] * l * x[i];
        swll += w[i] * l * l;
        swxx += w[i] * double(x[i]) * x[i];
      }
      if (swll <= 0) return;
      const double scale = swlx / swll;
      // Exact error at the least-squares scale; clamp tiny negative values from cancellation.
      const double e = std::max(0.0, swxx - swlx * swlx / swll);
      if (e < best.err) {
        best.err = e;
        best.scale = float(scale);
        if (L) std::copy(Lc.begin(), Lc.begin() + n, L);
      }
      if (!(e < prev) || scale == 0) return;
      prev = e;
      const float inv = float(1.0 / scale);
      for (int i = 0; i < n; ++i) Lc[size_t(i)] = round_clamped(inv * x[i], lo, hi);
    }
  };
  for (int k = 0; k <= grid.steps; ++k) {
    const float t = grid.first + grid.step * float(k);
    if (lo < 0) try_scale((float(lo) - t) / vmax);  // largest magnitude near the negative end
    if (hi > 0) try_scale((float(hi) + t) / vmax);  // ... or near the positive end
  }
  return best;
}

}  // namespace tandem::quant::fit
