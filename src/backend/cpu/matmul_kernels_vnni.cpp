// The AVX-512 VNNI Q8_0 kernel of matmul_kernels.h: one weight row against a group of sixteen activation rows
// packed side by side (ActQ8Block32x16), for prefill. Compiled per function with a target attribute, handed
// out only when cpu_has_avx512_vnni() (see cpu_features.h).
//
// Why it is faster: the AVX2 kernel computes one weight row x one activation row per 256-bit vector and needs
// a sign, maddubs and madd for every 32 products, then a scale broadcast per row. Here one 512-bit vector
// holds the same four weight values (broadcast from memory, not shuffled) against four values of each of the
// sixteen rows (lane j = row j): one vpdpbusd does 4 products for 16 rows, and the scales of the 16 rows are
// one vector. About 2.4x the AVX2 kernel's speed on a 1-thread 512-row prefill matmul on this project's
// development CPU (AMD Zen 5, full-width AVX-512; a 256-bit version with 8 rows was 1.5x):
// bench/BENCHMARKS.md.
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

void pack_q8x32x16(const ActQ8Block32* const* rows, int n_rows, int64_t n_blocks, ActQ8Block32x16* out) {
  constexpr int R = kPackedRows;
  for (int64_t b = 0; b < n_blocks; ++b) {
    ActQ8Block32x16& o = out[b];
    for (int j = 0; j < R; ++j) {
      const ActQ8Block32* r = j < n_rows ? &rows[j][b] : nullptr;
      o.d[j] = r ? r->d : 0.0f;  // a missing row: scale 0 and zero values, a result of 0 nobody reads
      for (int c = 0; c < 8; ++c) {
        if (r)
          std::memcpy(o.qs + 4 * R * c + 4 * j, r->qs + 4 * c, 4);
        else
          std::memset(o.qs + 4 * R * c + 4 * j, 0, 4);
      }
    }
  }
}

TANDEM_VNNI void dot_q8_0_x16(int64_t n, const void* w, const ActQ8Block32x16* x, float* out) {
  const auto* wb = static_cast<const quant::BlockQ8_0*>(w);
  __m512 acc[8];
  for (int c = 0; c < 8; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b) {
    // d_w d_x of each row, the same f32 product the AVX2 kernel broadcasts
    const __m512 s = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(wb[b].d)), _mm512_loadu_ps(x[b].d));
    for (int c = 0; c < 8; ++c) {
      // weight values 4c..4c+3 in every lane, broadcast straight from the weight block (a load, not a
      // shuffle)
      int32_t w4;
      std::memcpy(&w4, wb[b].qs + 4 * c, 4);
      const __m512i wc = _mm512_set1_epi32(w4);
      const __m512i xq = _mm512_loadu_si512(x[b].qs + 64 * c);
      // |w| * (x negated where w < 0) = w * x, unsigned times signed as vpdpbusd wants (|w| <= 128)
      const __m512i xs = _mm512_mask_sub_epi8(xq, _mm512_movepi8_mask(wc), _mm512_setzero_si512(), xq);
      // (the maskz forms with every lane set: GCC 12 warns that the plain ones read an undefined vector)
      const __m512i p =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_maskz_abs_epi8(~__mmask64(0), wc), xs);
      acc[c] = _mm512_fmadd_ps(s, _mm512_maskz_cvtepi32_ps(~__mmask16(0), p), acc[c]);
    }
  }
  // Row j: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), hsum()'s order in the AVX2 kernel.
  const __m512 lo = _mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6]));
  const __m512 hi = _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7]));
  _mm512_storeu_ps(out, _mm512_add_ps(lo, hi));
}

}  // namespace tandem::cpu::vnni

#else  // not x86: never selected (cpu_has_avx512_vnni() is false)

namespace tandem::cpu::vnni {
void pack_q8x32x16(const ActQ8Block32* const*, int, int64_t, ActQ8Block32x16*) {}
void dot_q8_0_x16(int64_t, const void*, const ActQ8Block32x16*, float*) {}
}  // namespace tandem::cpu::vnni

#endif
