// The AVX-512 VNNI Q8_0 kernel of matmul_kernels.h: one weight row against a group of eight activation rows
// packed side by side (ActQ8Block32x8), for prefill. Compiled per function with a target attribute, handed
// out only when cpu_has_avx512_vnni() (see cpu_features.h).
//
// Why it is faster: the AVX2 kernel computes one weight row x one activation row per vector and needs a sign,
// maddubs and madd for every 32 products, then a scale broadcast per row. Here one vector holds the same four
// weight values (broadcast from memory, not shuffled) against four values of each of the eight rows (lane j =
// row j): one vpdpbusd does 4 products for 8 rows, and the scales of the 8 rows are one vector. About 1.5x
// the AVX2 kernel's speed on a 1-thread 512-row prefill matmul (bench/BENCHMARKS.md).
//
// Why it gives the same bits as avx2::dot_q8_0: lane k of the AVX2 kernel's integer vector is the exact sum
// of products 4k..4k+3 of the block; its f32 lane k accumulates fma(d_w d_x, that sum) over the blocks, and
// the eight lanes are added in hsum()'s order at the end. Chunk c here is exactly that lane k = c for every
// row, accumulated by the same fma in the same block order, and the final sum uses the same tree. So a row's
// result does not depend on whether it was computed here (prefill, 8 rows or more) or by the AVX2 kernel
// (decode): the batch invariance of tests/test_batch_invariance.cpp holds across the two.
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "quant/blocks.h"

#define TANDEM_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

namespace tandem::cpu::vnni {

void pack_q8x32x8(const ActQ8Block32* const* rows, int n_rows, int64_t n_blocks, ActQ8Block32x8* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    ActQ8Block32x8& o = out[b];
    for (int j = 0; j < 8; ++j) {
      const ActQ8Block32* r = j < n_rows ? &rows[j][b] : nullptr;
      o.d[j] = r ? r->d : 0.0f;  // a missing row: scale 0 and zero values, a result of 0 nobody reads
      for (int c = 0; c < 8; ++c) {
        if (r)
          std::memcpy(o.qs + 32 * c + 4 * j, r->qs + 4 * c, 4);
        else
          std::memset(o.qs + 32 * c + 4 * j, 0, 4);
      }
    }
  }
}

TANDEM_VNNI void dot_q8_0_x8(int64_t n, const void* w, const ActQ8Block32x8* x, float* out) {
  const auto* wb = static_cast<const quant::BlockQ8_0*>(w);
  __m256 acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b) {
    // d_w d_x of each row, the same f32 product the AVX2 kernel broadcasts
    const __m256 s = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(wb[b].d)), _mm256_loadu_ps(x[b].d));
    for (int c = 0; c < 8; ++c) {
      // weight values 4c..4c+3 in every lane, broadcast straight from the weight block (a load, not a
      // shuffle)
      int32_t w4;
      std::memcpy(&w4, wb[b].qs + 4 * c, 4);
      const __m256i wc = _mm256_set1_epi32(w4);
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * c));
      // |w| * sign(x, w) = w * x, unsigned times signed as vpdpbusd wants (|w| <= 128, |x| <= 127)
      const __m256i p =
          _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(wc, wc), _mm256_sign_epi8(xq, wc));
      acc[c] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[c]);
    }
  }
  // Row j: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), hsum()'s order in the AVX2 kernel.
  const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
  const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
  _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
}

}  // namespace tandem::cpu::vnni

#else  // not x86: never selected (cpu_has_avx512_vnni() is false)

namespace tandem::cpu::vnni {
void pack_q8x32x8(const ActQ8Block32* const*, int, int64_t, ActQ8Block32x8*) {}
void dot_q8_0_x8(int64_t, const void*, const ActQ8Block32x8*, float*) {}
}  // namespace tandem::cpu::vnni

#endif
