// AVX2/FMA/F16C kernels of matmul_kernels.h. Compiled per function with a target attribute so the rest of the
// build stays baseline x86-64; matmul_kernels() only hands them out when cpu_has_avx2() and simd_enabled().
// Integer sums equal the scalar kernels' exactly (maddubs cannot saturate here: |weight level| <= 128 for
// Q8_0 (sign trick) or <= 63 for the others, |activation| <= 127, so a pair sum is at most 32512).
#include "backend/cpu/matmul_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "quant/blocks.h"

#define TANDEM_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tandem::cpu::avx2 {

using quant::BlockQ4_0;
using quant::BlockQ4_K;
using quant::BlockQ5_K;
using quant::BlockQ6_K;
using quant::BlockQ8_0;

namespace {

TANDEM_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

TANDEM_AVX2 inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

TANDEM_AVX2 inline float half_to_float(uint16_t h) {
  return _cvtsh_ss(h);
}

// Quantizes 8k floats (k = n / 8 vectors) with one scale; writes n int8 and returns d. int32 lanes of the
// quants go to lanes[] when not null (for the block sums).
TANDEM_AVX2 inline float quantize_block(const float* x, int8_t* q, int n, __m256i* lanes) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float amax = _mm_cvtss_f32(m);
  const float d = amax / 127.0f;
  const __m256 id = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int i = 0; i < n; i += 32) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), id);
      v[k] = _mm256_cvtps_epi32(_mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      if (lanes) lanes[i / 8 + k] = v[k];
    }
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permutevar8x32_epi32(p, order));
  }
  return d;
}

}  // namespace

TANDEM_AVX2 void quantize_q8x32(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<ActQ8Block32*>(dst);
  __m256i lanes[4];
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    b[i].d = quantize_block(x, b[i].qs, 32, lanes);
    b[i].sum = hsum_i32(
        _mm256_add_epi32(_mm256_add_epi32(lanes[0], lanes[1]), _mm256_add_epi32(lanes[2], lanes[3])));
  }
}

TANDEM_AVX2 void quantize_q8x256(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<ActQ8Block256*>(dst);
  __m256i lanes[32];
  for (int64_t i = 0; i < n / 256; ++i, x += 256) {
    b[i].d = quantize_block(x, b[i].qs, 256, lanes);
    for (int g = 0; g < 16; ++g)
      b[i].bsums[g] = int16_t(hsum_i32(_mm256_add_epi32(lanes[2 * g], lanes[2 * g + 1])));
  }
}

// ---- f32 / f16 / bf16 weights -----------------------------------------------------------------------------

namespace {

struct LoadF32 {
  TANDEM_AVX2 static __m256 load(const void* w, int64_t i) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  }
  static float scalar(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
};
struct LoadF16 {
  TANDEM_AVX2 static __m256 load(const void* w, int64_t i) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
  }
  TANDEM_AVX2 static float scalar(const void* w, int64_t i) {
    return _cvtsh_ss(static_cast<const uint16_t*>(w)[i]);
  }
};
struct LoadBF16 {
  TANDEM_AVX2 static __m256 load(const void* w, int64_t i) {
    const __m256i h = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
  static float scalar(const void* w, int64_t i) {
    const uint32_t u = uint32_t(static_cast<const uint16_t*>(w)[i]) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
};

template <class L, int NX>
TANDEM_AVX2 void dot_plain(int64_t n, const void* w, const void* const* xv, float* out) {
  const float* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = static_cast<const float*>(xv[j]);
  __m256 acc0[NX], acc1[NX];
  for (int j = 0; j < NX; ++j) acc0[j] = acc1[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = L::load(w, i), w1 = L::load(w, i + 8);
    for (int j = 0; j < NX; ++j) {
      acc0[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[j] + i), acc0[j]);
      acc1[j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[j] + i + 8), acc1[j]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 w0 = L::load(w, i);
    for (int j = 0; j < NX; ++j) acc0[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[j] + i), acc0[j]);
  }
  for (int j = 0; j < NX; ++j) {
    float s = hsum(_mm256_add_ps(acc0[j], acc1[j]));
    for (int64_t k = i; k < n; ++k) s += L::scalar(w, k) * x[j][k];
    out[j] = s;
  }
}

}  // namespace

// Dispatches the runtime row count nx to a kernel templated on it (unrolled accumulators).
#define TANDEM_DISPATCH_NX(KERNEL, ...)    \
  switch (nx) {                            \
    case 1:                                \
      KERNEL<__VA_ARGS__ 1>(n, w, x, out); \
      break;                               \
    case 2:                                \
      KERNEL<__VA_ARGS__ 2>(n, w, x, out); \
      break;                               \
    case 3:                                \
      KERNEL<__VA_ARGS__ 3>(n, w, x, out); \
      break;                               \
    default:                               \
      KERNEL<__VA_ARGS__ 4>(n, w, x, out); \
      break;                               \
  }

TANDEM_AVX2 void dot_f32(int64_t n, const void* w, const void* const* x, int nx,
                         float* out){TANDEM_DISPATCH_NX(dot_plain, LoadF32, )} TANDEM_AVX2
    void dot_f16(int64_t n, const void* w, const void* const* x, int nx,
                 float* out){TANDEM_DISPATCH_NX(dot_plain, LoadF16, )} TANDEM_AVX2
    void dot_bf16(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  TANDEM_DISPATCH_NX(dot_plain, LoadBF16, )
}

// ---- Q8_0 / Q4_0 weights x ActQ8Block32 -------------------------------------------------------------------

namespace {

template <int NX>
TANDEM_AVX2 void dot_q8_0_t(int64_t n, const void* w, const void* const* xv, float* out) {
  const auto* wb = static_cast<const BlockQ8_0*>(w);
  const ActQ8Block32* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = static_cast<const ActQ8Block32*>(xv[j]);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NX];
  for (int j = 0; j < NX; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs));
    const __m256i wabs = _mm256_sign_epi8(wq, wq);
    const float dw = half_to_float(wb[b].d);
    for (int j = 0; j < NX; ++j) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[j][b].qs));
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xq, wq)), ones);
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x[j][b].d), _mm256_cvtepi32_ps(p), acc[j]);
    }
  }
  for (int j = 0; j < NX; ++j) out[j] = hsum(acc[j]);
}

template <int NX>
TANDEM_AVX2 void dot_q4_0_t(int64_t n, const void* w, const void* const* xv, float* out) {
  const auto* wb = static_cast<const BlockQ4_0*>(w);
  const ActQ8Block32* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = static_cast<const ActQ8Block32*>(xv[j]);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m128i m4 = _mm_set1_epi8(0x0F);
  __m256 acc[NX];
  for (int j = 0; j < NX; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[b].qs));
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    const float dw = half_to_float(wb[b].d);
    for (int j = 0; j < NX; ++j) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[j][b].qs));
      __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(nib, xq), ones);
      // the -8 offset of every level, folded into lane 0 so the block's integer sum stays exact
      p = _mm256_add_epi32(p, _mm256_set_m128i(_mm_setzero_si128(), _mm_cvtsi32_si128(-8 * x[j][b].sum)));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x[j][b].d), _mm256_cvtepi32_ps(p), acc[j]);
    }
  }
  for (int j = 0; j < NX; ++j) out[j] = hsum(acc[j]);
}

}  // namespace

TANDEM_AVX2 void dot_q8_0(int64_t n, const void* w, const void* const* x, int nx,
                          float* out){TANDEM_DISPATCH_NX(dot_q8_0_t, )} TANDEM_AVX2
    void dot_q4_0(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  TANDEM_DISPATCH_NX(dot_q4_0_t, )
}

// ---- K types x ActQ8Block256 ------------------------------------------------------------------------------

namespace {

// Q4_K (with_high_bit = false) and Q5_K (true): levels 0..15 (0..31), scale sc and min m per 32.
template <bool kQ5, int NX>
TANDEM_AVX2 void dot_q45_k_t(int64_t n, const void* w, const void* const* xv, float* out) {
  const ActQ8Block256* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = static_cast<const ActQ8Block256*>(xv[j]);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i sixteen = _mm256_set1_epi8(16);
  __m256 acc[NX];
  float corr[NX];
  for (int j = 0; j < NX; ++j) {
    acc[j] = _mm256_setzero_ps();
    corr[j] = 0.0f;
  }
  const size_t block_bytes = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  for (int64_t b = 0; b < n / 256; ++b) {
    const uint8_t* blk = static_cast<const uint8_t*>(w) + size_t(b) * block_bytes;
    const uint8_t* scales;
    const uint8_t* qs;
    const uint8_t* qh = nullptr;
    uint16_t d16, dmin16;
    if constexpr (kQ5) {
      const auto* q5 = reinterpret_cast<const BlockQ5_K*>(blk);
      scales = q5->scales, qs = q5->qs, qh = q5->qh, d16 = q5->d, dmin16 = q5->dmin;
    } else {
      const auto* q4 = reinterpret_cast<const BlockQ4_K*>(blk);
      scales = q4->scales, qs = q4->qs, d16 = q4->d, dmin16 = q4->dmin;
    }
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; ++s) quant::unpack_scale_min_k4(scales, s, sc[s], mn[s]);
    __m256i qhv = _mm256_setzero_si256();
    if constexpr (kQ5) qhv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    __m256i sumi[NX];
    for (int j = 0; j < NX; ++j) sumi[j] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m256i lo = _mm256_and_si256(q, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kQ5) {
        const __m256i bit_lo = _mm256_set1_epi8(char(1 << (2 * c)));
        const __m256i bit_hi = _mm256_set1_epi8(char(1 << (2 * c + 1)));
        lo = _mm256_or_si256(
            lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qhv, bit_lo), bit_lo), sixteen));
        hi = _mm256_or_si256(
            hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qhv, bit_hi), bit_hi), sixteen));
      }
      const __m256i s_lo = _mm256_set1_epi16(sc[2 * c]);
      const __m256i s_hi = _mm256_set1_epi16(sc[2 * c + 1]);
      for (int j = 0; j < NX; ++j) {
        const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[j][b].qs + 64 * c));
        const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[j][b].qs + 64 * c + 32));
        const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), s_lo);
        const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), s_hi);
        sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(pl, ph));
      }
    }
    const float d = half_to_float(d16), dmin = half_to_float(dmin16);
    for (int j = 0; j < NX; ++j) {
      int32_t sum_m = 0;
      for (int s = 0; s < 8; ++s) sum_m += int32_t(mn[s]) * (x[j][b].bsums[2 * s] + x[j][b].bsums[2 * s + 1]);
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[j][b].d), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
      corr[j] += dmin * x[j][b].d * float(sum_m);
    }
  }
  for (int j = 0; j < NX; ++j) out[j] = hsum(acc[j]) - corr[j];
}

template <int NX>
TANDEM_AVX2 void dot_q6_k_t(int64_t n, const void* w, const void* const* xv, float* out) {
  const auto* wb = static_cast<const BlockQ6_K*>(w);
  const ActQ8Block256* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = static_cast<const ActQ8Block256*>(xv[j]);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m2 = _mm256_set1_epi8(0x03);
  __m256 acc[NX];
  for (int j = 0; j < NX; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 256; ++b) {
    const int8_t* sc = wb[b].scales;
    __m256i sumi[NX];
    for (int j = 0; j < NX; ++j) sumi[j] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql_a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].ql + 64 * h));
      const __m256i ql_b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].ql + 64 * h + 32));
      const __m256i qhv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qh + 32 * h));
      for (int k = 0; k < 4; ++k) {
        const __m256i src = (k & 1) ? ql_b : ql_a;
        const __m256i lo =
            (k < 2) ? _mm256_and_si256(src, m4) : _mm256_and_si256(_mm256_srli_epi16(src, 4), m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qhv, 2 * k), m2);
        const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        const int g = 8 * h + 2 * k;  // 16-groups g (bytes 0..15) and g + 1 (bytes 16..31)
        const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
        for (int j = 0; j < NX; ++j) {
          const __m256i xq =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[j][b].qs + 128 * h + 32 * k));
          sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), scv));
        }
      }
    }
    const float d = half_to_float(wb[b].d);
    for (int j = 0; j < NX; ++j) {
      int32_t sum_off = 0;
      for (int g = 0; g < 16; ++g) sum_off += int32_t(sc[g]) * x[j][b].bsums[g];
      // the -32 offset of every level, folded into lane 0 so the block's integer sum stays exact
      const __m256i p =
          _mm256_add_epi32(sumi[j], _mm256_set_m128i(_mm_setzero_si128(), _mm_cvtsi32_si128(-32 * sum_off)));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[j][b].d), _mm256_cvtepi32_ps(p), acc[j]);
    }
  }
  for (int j = 0; j < NX; ++j) out[j] = hsum(acc[j]);
}

}  // namespace

TANDEM_AVX2 void dot_q4_k(int64_t n, const void* w, const void* const* x, int nx,
                          float* out){TANDEM_DISPATCH_NX(dot_q45_k_t, false, )} TANDEM_AVX2
    void dot_q5_k(int64_t n, const void* w, const void* const* x, int nx,
                  float* out){TANDEM_DISPATCH_NX(dot_q45_k_t, true, )} TANDEM_AVX2
    void dot_q6_k(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  TANDEM_DISPATCH_NX(dot_q6_k_t, )
}

}  // namespace tandem::cpu::avx2

#else  // not x86: never selected (cpu_has_avx2() is false); forward to the scalar kernels so the build links

namespace tandem::cpu::avx2 {
void quantize_q8x32(const float* x, void* dst, int64_t n) {
  scalar::quantize_q8x32(x, dst, n);
}
void quantize_q8x256(const float* x, void* dst, int64_t n) {
  scalar::quantize_q8x256(x, dst, n);
}
#define TANDEM_FORWARD(NAME)                                                      \
  void NAME(int64_t n, const void* w, const void* const* x, int nx, float* out) { \
    scalar::NAME(n, w, x, nx, out);                                               \
  }
TANDEM_FORWARD(dot_f32)
TANDEM_FORWARD(dot_f16)
TANDEM_FORWARD(dot_bf16)
TANDEM_FORWARD(dot_q8_0)
TANDEM_FORWARD(dot_q4_0)
TANDEM_FORWARD(dot_q4_k)
TANDEM_FORWARD(dot_q5_k)
TANDEM_FORWARD(dot_q6_k)
}  // namespace tandem::cpu::avx2

#endif
