// rms_norm and softmax_rows. Sums of squares and exponentials accumulate in double (as ggml's rms_norm does),
// so the result is within a few f32 ulps of the exact value whatever the row length.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_ops_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_HAVE_X86 1
#endif

namespace tandem::cpu {
namespace {

double sum_squares_scalar(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

void scale_row_scalar(const float* x, const float* w, float scale, float* out, int64_t n) {
  if (w) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

#if TANDEM_HAVE_X86
__attribute__((target("avx2,fma"))) double sum_squares_avx2(const float* x, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    const __m256d hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  a0 = _mm256_add_pd(a0, a1);
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a0), _mm256_extractf128_pd(a0, 1));
  double r = _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
  for (; i < n; ++i) r += double(x[i]) * double(x[i]);
  return r;
}

__attribute__((target("avx2,fma"))) void scale_row_avx2(const float* x, const float* w, float scale,
                                                        float* out, int64_t n) {
  const __m256 vs = _mm256_set1_ps(scale);
  int64_t i = 0;
  if (w) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i,
                       _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
    for (; i < n; ++i) out[i] = x[i] * scale * w[i];
  } else {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < n; ++i) out[i] = x[i] * scale;
  }
}
#endif

}  // namespace

void rms_norm(ThreadPool& pool, const Tensor& x, const Tensor* weight, float eps, const Tensor& out) {
  const char* op = "rms_norm";
  check_f32(op, "x", x);
  check_f32(op, "out", out);
  check_same_shape(op, "x", x, "out", out);
  TANDEM_CPU_CHECK(eps >= 0.0f && std::isfinite(eps), "rms_norm: eps must be a finite value >= 0");
  const float* w = nullptr;
  if (weight) {
    check_f32(op, "weight", *weight);
    TANDEM_CPU_CHECK(
        weight->ne[0] == x.ne[0] && weight->nrows() == 1,
        "rms_norm: weight must be {" + std::to_string(x.ne[0]) + "}, got " + weight->shape_string());
    w = weight->ptr<float>();
  }
  const int64_t n = x.ne[0], rows = x.nrows();
  if (n == 0 || rows == 0) return;
  bool simd = false;
#if TANDEM_HAVE_X86
  simd = simd_enabled();
#endif
  const int64_t per = items_per_task(rows, pool.n_threads(), std::max<int64_t>(1, 16384 / n));
  pool.parallel_for((rows + per - 1) / per, [&](int64_t task, int) {
    for (int64_t r = task * per; r < std::min(rows, (task + 1) * per); ++r) {
      const float* xr = reinterpret_cast<const float*>(row_ptr(x, r));
      float* orow = reinterpret_cast<float*>(row_ptr(out, r));
#if TANDEM_HAVE_X86
      if (simd) {
        const float mean = float(sum_squares_avx2(xr, n) / double(n));
        scale_row_avx2(xr, w, 1.0f / std::sqrt(mean + eps), orow, n);
        continue;
      }
#endif
      const float mean = float(sum_squares_scalar(xr, n) / double(n));
      scale_row_scalar(xr, w, 1.0f / std::sqrt(mean + eps), orow, n);
    }
  });
}

void softmax_rows(ThreadPool& pool, const Tensor& x, const Tensor& out) {
  const char* op = "softmax_rows";
  check_f32(op, "x", x);
  check_f32(op, "out", out);
  check_same_shape(op, "x", x, "out", out);
  const int64_t n = x.ne[0], rows = x.nrows();
  if (n == 0 || rows == 0) return;
  const int64_t per = items_per_task(rows, pool.n_threads(), std::max<int64_t>(1, 8192 / n));
  pool.parallel_for((rows + per - 1) / per, [&](int64_t task, int) {
    for (int64_t r = task * per; r < std::min(rows, (task + 1) * per); ++r) {
      const float* xr = reinterpret_cast<const float*>(row_ptr(x, r));
      float* orow = reinterpret_cast<float*>(row_ptr(out, r));
      float m = -INFINITY;
      for (int64_t i = 0; i < n; ++i) m = std::max(m, xr[i]);
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const float e = std::exp(xr[i] - m);
        orow[i] = e;
        sum += e;
      }
      const float inv = float(1.0 / sum);
      for (int64_t i = 0; i < n; ++i) orow[i] *= inv;
    }
  });
}

}  // namespace tandem::cpu
