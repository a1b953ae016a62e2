// Decode products with Q8_0, Q4_K and Q5_K weights (rows of K % 256 == 0 values, 16-byte aligned) read in
// "wide pieces" of 256 values: a Q4_K / Q5_K super-block (144 / 176 bytes: 9 / 11 aligned 16-byte chunks), or
// for Q8_0 an "octet" of 8 consecutive blocks (8 x 34 = 272 bytes: exactly 17 aligned chunks). Within a piece
// every scale, minimum and quant sits at a place known when the kernel is compiled: a lane loads a whole
// piece with 16-byte loads and finds each value in a register by a constant index (Q8_0: one byte permute per
// word for the blocks whose quants start on a half word).
//
// Why: gemv_quant_direct.cu takes a smaller piece per lane (one Q8_0 block, a Q4_K / Q5_K sub-block pair).
// Q8_0: a block's offset in its 16-byte chunks is known only at run time, so it reads the three chunks that
// hold it (48 bytes for 34) and picks each word out of the 12 by a chain of selects (about 120 instructions a
// block). Q4_K / Q5_K: the 16-byte header (scales) is read and unpacked once per pair, 4 times per
// super-block. Those products ran at 37-44% of the bandwidth (BENCHMARKS, issue 19 call B). Here every byte
// is loaded once and decoded with constant indices.
//
// Layout of the work: a warp owns a unit of 2 weight rows (SwiGlu: a gate row and the same up row), one per
// half-warp; lane l of a half takes pieces l, l + 16, ... of its row (Qwen3-8B: K = 4096 is 16 pieces, one
// per lane; K = 12288 is 48, three per lane). A row's sum is taken in the same order wherever the row sits
// and whatever the number of activation columns (batch invariance, as the other decode products).
// TANDEM_NO_QUANT_WIDE=1 returns these types to gemv_quant_direct.cu's paths (to compare or bisect).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_units.cuh"
#include "backend/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kHalf = kWarpSize / 2;  // lanes per weight row
constexpr int kPieceValues = 256;

// Bytes and 16-byte chunks of a piece.
template <DType QT>
constexpr int piece_bytes() {
  return QT == DType::Q8_0 ? 272 : QT == DType::Q4_K ? 144 : 176;
}
template <DType QT>
constexpr int piece_chunks() {
  return piece_bytes<QT>() / 16;
}

template <GemvEpilogue EPI>
constexpr int outs_per_unit() {
  return EPI == GemvEpilogue::SwiGlu ? 1 : 2;  // SwiGlu: one gate row (half 0) and its up row (half 1)
}

// Word i of a piece; i is a constant once the callers' loops are unrolled, so this is a register.
template <int NCH>
__device__ __forceinline__ uint32_t piece_word(const uint4 (&c)[NCH], int i) {
  const uint4& q = c[i >> 2];
  switch (i & 3) {
    case 0:
      return q.x;
    case 1:
      return q.y;
    case 2:
      return q.z;
    default:
      return q.w;
  }
}

// Byte b (0..11) of a K-quant's packed 6-bit scales and minima: bytes 4..15 of the piece, words 1..3.
template <int NCH>
__device__ __forceinline__ uint32_t scale_byte(const uint4 (&c)[NCH], int b) {
  return (piece_word(c, 1 + (b >> 2)) >> (8 * (b & 3))) & 0xffu;
}

// unpack_scale_min_k4 (quant/blocks.h) on the scale bytes in registers: sub-block s's 6-bit scale and
// minimum.
template <int NCH>
__device__ __forceinline__ void scale_min_k4(const uint4 (&c)[NCH], int s, float& sc, float& m) {
  if (s < 4) {
    sc = float(scale_byte(c, s) & 63u);
    m = float(scale_byte(c, s + 4) & 63u);
  } else {
    sc = float((scale_byte(c, s + 4) & 0x0Fu) | ((scale_byte(c, s - 4) >> 6) << 4));
    m = float((scale_byte(c, s + 4) >> 4) | ((scale_byte(c, s) >> 6) << 4));
  }
}

// The integer dot products of 32 packed weights (8 words) with the 32 activations at x: lo and hi over the
// two 16-value halves, in the fixed order of the other decode products.
__device__ __forceinline__ void dot32(const int (&w)[8], const int8_t* x, int& lo, int& hi) {
  const int4* xv = reinterpret_cast<const int4*>(x);
  const int4 x0 = xv[0], x1 = xv[1];
  lo = dot4(w[3], x0.w, dot4(w[2], x0.z, dot4(w[1], x0.y, dot4(w[0], x0.x, 0))));
  hi = dot4(w[7], x1.w, dot4(w[6], x1.z, dot4(w[5], x1.y, dot4(w[4], x1.x, 0))));
}

// Adds piece p of one row times the NC quantized activation columns to acc, per 32 values the arithmetic of
// the other decode products: d_x * (a * lo + a * hi) + bias * (d_x sum q_x), a = d (Q8_0) or d * sc
// (K-quants), bias = 0 (Q8_0) or -dmin * m.
template <DType QT, int NC>
__device__ __forceinline__ void piece_dot(const uint4 (&c)[piece_chunks<QT>()], int64_t p, int64_t K,
                                          int64_t n_sub, const int8_t* xq, const float2* xds,
                                          float (&acc)[NC]) {
  if constexpr (QT == DType::Q8_0) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int o = 34 * j;  // the block's first byte in the octet: its f16 scale, then 32 quants
      const uint32_t dw = piece_word(c, o >> 2);
      const float d = fp16_bits_to_float(uint16_t((o & 2) ? dw >> 16 : dw & 0xffffu));
      const int q0 = (o + 2) >> 2;
      int w[8];
#pragma unroll
      for (int k = 0; k < 8; ++k)  // quants on a word boundary (odd j), or starting half-way into word q0
        w[k] = int((o & 2) ? piece_word(c, q0 + k)
                           : __byte_perm(piece_word(c, q0 + k), piece_word(c, q0 + k + 1), 0x5432));
#pragma unroll
      for (int col = 0; col < NC; ++col) {
        int lo, hi;
        dot32(w, xq + col * K + kPieceValues * p + 32 * j, lo, hi);
        const float2 ds = xds[col * n_sub + 8 * p + j];
        acc[col] += ds.x * (d * float(lo) + d * float(hi));
      }
    }
  } else {
    const uint32_t h0 = piece_word(c, 0);
    const float d = fp16_bits_to_float(uint16_t(h0 & 0xffffu));
    const float dmin = fp16_bits_to_float(uint16_t(h0 >> 16));
    constexpr int qs = QT == DType::Q4_K ? 4 : 12;  // first word of the nibbles (Q5_K: after 32 bytes of qh)
#pragma unroll
    for (int pr = 0; pr < 4; ++pr) {  // sub-block pair pr: sub-blocks 2pr (low nibbles) and 2pr + 1 (high)
      int w0[8], w1[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t q = piece_word(c, qs + 8 * pr + k);
        uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
        if constexpr (QT == DType::Q5_K) {  // bit s of qh[l] is the fifth bit of weight 32s + l
          const uint32_t h = piece_word(c, 4 + k);
          lo |= ((h >> (2 * pr)) & 0x01010101u) << 4;
          hi |= ((h >> (2 * pr + 1)) & 0x01010101u) << 4;
        }
        w0[k] = int(lo);
        w1[k] = int(hi);
      }
      float sc0, m0, sc1, m1;
      scale_min_k4(c, 2 * pr, sc0, m0);
      scale_min_k4(c, 2 * pr + 1, sc1, m1);
      const float a0 = d * sc0, b0 = -dmin * m0, a1 = d * sc1, b1 = -dmin * m1;
#pragma unroll
      for (int col = 0; col < NC; ++col) {
        int lo0, hi0, lo1, hi1;
        dot32(w0, xq + col * K + kPieceValues * p + 64 * pr, lo0, hi0);
        dot32(w1, xq + col * K + kPieceValues * p + 64 * pr + 32, lo1, hi1);
        const float4 ds = *reinterpret_cast<const float4*>(xds + col * n_sub + 8 * p + 2 * pr);
        acc[col] += ds.x * (a0 * float(lo0) + a0 * float(hi0)) + b0 * ds.y;
        acc[col] += ds.z * (a1 * float(lo1) + a1 * float(hi1)) + b1 * ds.w;
      }
    }
  }
}

// Weights are loaded before pdl_wait (pdl.cuh), activations, y and r after it, with plain loads.
template <DType QT, int NC, GemvEpilogue EPI>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    gemv_quant_wide_kernel(const GemvArgs a, const int8_t* xq, const float2* xds) {
  constexpr int per = outs_per_unit<EPI>();
  pdl_trigger();
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  int seg = 0;
  int64_t row0 = 0;
  if (!gemv_find_unit<per>(a, EPI == GemvEpilogue::SwiGlu, unit, seg, row0)) return;  // the whole warp
  const int lane = threadIdx.x % kWarpSize, half = lane / kHalf, hl = lane % kHalf;
  const GemvSeg& out = gemv_seg_at(a, seg);
  const int64_t N = out.N, K = a.K, n_pieces = K / kPieceValues, n_sub = K / 32;
  // This half's row; a row past N (the last unit of a segment) reads row0 again and is never written.
  const GemvSeg& src = EPI == GemvEpilogue::SwiGlu ? gemv_seg_at(a, half) : out;
  const int64_t o = EPI == GemvEpilogue::SwiGlu ? row0 : row0 + half;
  const uint8_t* row = static_cast<const uint8_t*>(src.W) + (o < N ? o : row0) * src.w_ld;

  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
  bool waited = false;
  for (int64_t p = hl; p < n_pieces; p += kHalf) {  // both halves take the same number of turns
    uint4 ch[piece_chunks<QT>()];
    const uint4* src4 = reinterpret_cast<const uint4*>(row + p * piece_bytes<QT>());
#pragma unroll
    for (int k = 0; k < piece_chunks<QT>(); ++k) ch[k] = __ldcs(src4 + k);
    if (!waited) {
      pdl_wait();
      waited = true;
    }
    piece_dot<QT, NC>(ch, p, K, n_sub, xq, xds, acc);
  }
  if (!waited) pdl_wait();

    // Sum over the half-warp (xor offsets below 16 stay inside a half): lane 0 holds row o's sums, lane 16
    // row o + 1's (SwiGlu: the up row's).
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int off = kHalf / 2; off > 0; off /= 2) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], off);
  if constexpr (EPI == GemvEpilogue::SwiGlu) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float up = __shfl_down_sync(0xffffffffu, acc[c], kHalf);
      if (lane == 0 && o < N) {
        const float g = acc[c];
        out.y[c * out.y_ld + o] = g / (1.0f + expf(-g)) * up;  // the CUDA silu_mul's expression
      }
    }
  } else {
    if (hl != 0 || o >= N) return;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float val = acc[c];
      if constexpr (EPI == GemvEpilogue::AddResidual)
        val = out.r[c * out.r_ld + o] + val;  // add(x, proj)'s order
      out.y[c * out.y_ld + o] = val;
    }
  }
}

size_t align256(size_t n) {
  return (n + 255) & ~size_t(255);
}

template <DType QT, GemvEpilogue EPI>
void launch_epi(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  constexpr int per = outs_per_unit<EPI>();
  int64_t units = 0;
  const int n = EPI == GemvEpilogue::SwiGlu ? 1 : a.n_seg;
  for (int s = 0; s < n; ++s) units += (a.seg[s].N + per - 1) / per;
  if (units == 0) return;
  const unsigned grid = unsigned((units + kWarps - 1) / kWarps);
  const int64_t K = a.K, T = a.T;
  const int8_t* xq = static_cast<const int8_t*>(scratch);
  const float2* xds =
      reinterpret_cast<const float2*>(static_cast<const char*>(scratch) + align256(size_t(K * T)));
  for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxCols) {
    const int nc = int(std::min<int64_t>(kGemvMaxCols, T - t0));
    const int8_t* xq_c = xq + t0 * K;
    const float2* xds_c = xds + t0 * (K / 32);
    GemvArgs c = a;  // columns t0 .. t0 + nc of y and r
    for (int s = 0; s < a.n_seg; ++s) {
      c.seg[s].y = a.seg[s].y ? a.seg[s].y + t0 * a.seg[s].y_ld : nullptr;
      c.seg[s].r = a.seg[s].r ? a.seg[s].r + t0 * a.seg[s].r_ld : nullptr;
    }
    switch (nc) {
#define TANDEM_QW_CASE(n)                                                                                   \
  case n:                                                                                                   \
    launch_pdl(gemv_quant_wide_kernel<QT, n, EPI>, dim3(grid), dim3(kWarps* kWarpSize), 0, stream, c, xq_c, \
               xds_c);                                                                                      \
    break;
      TANDEM_QW_CASE(1)
      TANDEM_QW_CASE(2)
      TANDEM_QW_CASE(3)
      TANDEM_QW_CASE(4)
      TANDEM_QW_CASE(5)
      TANDEM_QW_CASE(6)
      TANDEM_QW_CASE(7)
      TANDEM_QW_CASE(8)
#undef TANDEM_QW_CASE
    }
    TANDEM_CUDA_CHECK_LAUNCH();
  }
}

template <DType QT>
void launch_type(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  switch (a.epi) {
    case GemvEpilogue::Store:
      return launch_epi<QT, GemvEpilogue::Store>(a, scratch, stream);
    case GemvEpilogue::AddResidual:
      return launch_epi<QT, GemvEpilogue::AddResidual>(a, scratch, stream);
    case GemvEpilogue::SwiGlu:
      return launch_epi<QT, GemvEpilogue::SwiGlu>(a, scratch, stream);
  }
}

}  // namespace

bool gemv_quant_wide_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("TANDEM_NO_QUANT_WIDE");
    return !(e && *e && *e != '0');
  }();
  return on;
}

void launch_gemv_quant_wide(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  // The caller (launch_gemv_quant_direct) has checked: Q8_0 / Q4_K / Q5_K, K % 256 == 0, 16-byte aligned
  // rows.
  if (a.T == 0) return;
  switch (a.wt) {
    case DType::Q4_K:
      return launch_type<DType::Q4_K>(a, scratch, stream);
    case DType::Q5_K:
      return launch_type<DType::Q5_K>(a, scratch, stream);
    default:
      return launch_type<DType::Q8_0>(a, scratch, stream);
  }
}

}  // namespace tandem::cuda
