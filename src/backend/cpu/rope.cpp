// Rotary position embedding (GGUF-ARCH-FACTS B.4), in place on {head_dim, n_head, T}.
//
// theta is computed in float the way ggml does (so tandem and llama.cpp agree to the last bit of theta):
// theta_scale = powf(base, -2 / n_rot); theta_0 = p; theta_{i+1} = theta_i * theta_scale; the angle of pair i
// is theta_i / ff_i * freq_scale, and cos/sin (cosf/sinf) are multiplied by attn_factor.
//
// cos/sin of a row go into per-thread scratch, laid out for simple vector code:
// - NORM: c[2i] = c[2i+1] = cos_i, s[2i] = -sin_i, s[2i+1] = sin_i, rotated as out = x * c + swap_pairs(x) *
// s;
// - NEOX: c[i] = cos_i, s[i] = sin_i for i < n_rot / 2.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_ops_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_HAVE_X86 1
#endif

namespace tandem::cpu {

size_t rope_scratch_floats(int64_t head_dim) {
  return size_t(2 * head_dim);
}

namespace {

void rotate_norm_scalar(float* x, const float* c, const float* s, int n_rot) {
  for (int i = 0; i < n_rot; i += 2) {
    const float x0 = x[i], x1 = x[i + 1];
    x[i] = x0 * c[i] + x1 * s[i];  // s[i] = -sin
    x[i + 1] = x1 * c[i + 1] + x0 * s[i + 1];
  }
}

void rotate_neox_scalar(float* x, const float* c, const float* s, int n_rot) {
  const int half = n_rot / 2;
  for (int i = 0; i < half; ++i) {
    const float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c[i] - x1 * s[i];
    x[i + half] = x0 * s[i] + x1 * c[i];
  }
}

#if TANDEM_HAVE_X86
__attribute__((target("avx2,fma"))) void rotate_norm_avx2(float* x, const float* c, const float* s,
                                                          int n_rot) {
  int i = 0;
  for (; i + 8 <= n_rot; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 swapped = _mm256_permute_ps(v, 0xB1);  // (x1, x0) of every pair
    _mm256_storeu_ps(
        x + i, _mm256_fmadd_ps(v, _mm256_loadu_ps(c + i), _mm256_mul_ps(swapped, _mm256_loadu_ps(s + i))));
  }
  rotate_norm_scalar(x + i, c + i, s + i, n_rot - i);
}

__attribute__((target("avx2,fma"))) void rotate_neox_avx2(float* x, const float* c, const float* s,
                                                          int n_rot) {
  const int half = n_rot / 2;
  int i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + half);
    const __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_loadu_ps(s + i);
    _mm256_storeu_ps(x + i, _mm256_fmsub_ps(x0, vc, _mm256_mul_ps(x1, vs)));
    _mm256_storeu_ps(x + i + half, _mm256_fmadd_ps(x0, vs, _mm256_mul_ps(x1, vc)));
  }
  for (; i < half; ++i) {
    const float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c[i] - x1 * s[i];
    x[i + half] = x0 * s[i] + x1 * c[i];
  }
}
#endif

}  // namespace

void rope(ThreadPool& pool, Workspace& ws, const Tensor& x, const Tensor& positions, const RopeParams& p) {
  const char* op = "rope";
  check_f32(op, "x", x);
  TANDEM_CPU_CHECK(x.ne[3] == 1, "rope: x must be {head_dim, n_head, T}, got " + x.shape_string());
  const int64_t head_dim = x.ne[0], n_head = x.ne[1], T = x.ne[2];
  check_i32_vector(op, "positions", positions, T);
  TANDEM_CPU_CHECK(p.n_rot >= 2 && p.n_rot % 2 == 0 && p.n_rot <= head_dim,
                   "rope: n_rot must be even and in [2, head_dim = " + std::to_string(head_dim) + "], got " +
                       std::to_string(p.n_rot));
  TANDEM_CPU_CHECK(p.freq_base > 0.0f && std::isfinite(p.freq_base), "rope: freq_base must be > 0");
  const float* ff = nullptr;
  if (p.freq_factors) {
    check_f32(op, "freq_factors", *p.freq_factors);
    TANDEM_CPU_CHECK(p.freq_factors->ne[0] == p.n_rot / 2 && p.freq_factors->nrows() == 1,
                     "rope: freq_factors must be {n_rot/2 = " + std::to_string(p.n_rot / 2) + "}, got " +
                         p.freq_factors->shape_string());
    ff = p.freq_factors->ptr<float>();
  }
  if (T == 0 || n_head == 0) return;
  const int32_t* pos = positions.ptr<int32_t>();
  const int n_rot = p.n_rot;
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(n_rot));
  const bool neox = p.mode == RopeMode::Neox;
  bool simd = false;
#if TANDEM_HAVE_X86
  simd = simd_enabled();
#endif
  size_t stride = 0;
  float* scratch = ws.per_thread(rope_scratch_floats(n_rot), pool.n_threads(), &stride);

  pool.parallel_for(T, [&](int64_t t, int tid) {
    float* c = scratch + size_t(tid) * stride;
    float* s = c + n_rot;
    float theta = float(pos[t]);
    for (int i = 0; i < n_rot / 2; ++i, theta *= theta_scale) {
      const float angle = (ff ? theta / ff[i] : theta) * p.freq_scale;
      const float cv = std::cos(angle) * p.attn_factor, sv = std::sin(angle) * p.attn_factor;
      if (neox) {
        c[i] = cv;
        s[i] = sv;
      } else {
        c[2 * i] = c[2 * i + 1] = cv;
        s[2 * i] = -sv;
        s[2 * i + 1] = sv;
      }
    }
    for (int64_t h = 0; h < n_head; ++h) {
      float* xr = reinterpret_cast<float*>(static_cast<char*>(x.data) + h * x.nb[1] + t * x.nb[2]);
#if TANDEM_HAVE_X86
      if (simd) {
        neox ? rotate_neox_avx2(xr, c, s, n_rot) : rotate_norm_avx2(xr, c, s, n_rot);
        continue;
      }
#endif
      neox ? rotate_neox_scalar(xr, c, s, n_rot) : rotate_norm_scalar(xr, c, s, n_rot);
    }
  });
}

}  // namespace tandem::cpu
