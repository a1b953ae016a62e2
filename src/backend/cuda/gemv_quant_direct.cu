// Decode products with Q8_0 / Q4_K / Q5_K weights whose rows are 16-byte aligned (the usual case: rows of
// K % 256 == 0 values are multiples of 16 bytes in all three), read straight from global memory into
// registers with 16-byte loads; no shared-memory staging.
//
// Why: the staged kernel (gemv_quant.cu) copies rows into shared memory and decodes them from there; at
// decode its shared-memory reads (unaligned 32-bit values: two loads and a funnel shift each) took about as
// long as the global reads: Q4_K ran at 34% and Q8_0 at 55% of bandwidth (BENCHMARKS run 1). Here a lane
// takes one "piece" at a time (Piece below: a Q4_K / Q5_K sub-block pair, a Q8_0 block) with 16-byte loads
// and decodes it in registers. A warp owns R = 2 rows (SwiGlu: one gate row and the same up row), U = 2
// pieces per row in flight per lane (~200 bytes per lane in flight, as the dense kernels).
//
// Same fused forms as the other decode products (GemvArgs: segments, Store / AddResidual / SwiGlu), and the
// same batch invariance: a (row, column) sum is accumulated in the same order whatever the number of columns.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/quant_pieces.h"
#include "quant/blocks.h"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kR = 2;  // rows per warp
constexpr int kU = 2;  // pairs per row in flight per lane

template <GemvEpilogue EPI>
constexpr int outs_per_warp() {
  return EPI == GemvEpilogue::SwiGlu ? kR / 2 : kR;
}

__device__ __forceinline__ const GemvSeg& seg_at(const GemvArgs& a, int s) {
  return s == 0 ? a.seg[0] : s == 1 ? a.seg[1] : a.seg[2];
}

template <GemvEpilogue EPI>
__device__ __forceinline__ bool find_unit(const GemvArgs& a, int64_t u, int& seg, int64_t& row0) {
  constexpr int per = outs_per_warp<EPI>();
  const int n = EPI == GemvEpilogue::SwiGlu ? 1 : a.n_seg;
  for (int s = 0; s < n; ++s) {
    const int64_t nu = (seg_at(a, s).N + per - 1) / per;
    if (u < nu) {
      seg = s;
      row0 = u * per;
      return true;
    }
    u -= nu;
  }
  return false;
}

// What one lane decodes per step ("piece") and its loads. Q4_K / Q5_K: a 64-value sub-block pair of a
// super-block (16-byte header: d, dmin, the 12 scale bytes; 32 bytes of nibbles; Q5_K: the super-block's 32
// bytes of fifth bits). Q8_0: one 34-byte block, read as the three aligned 16-byte chunks that hold it (a row
// of K % 256 == 0 values is a multiple of 16 bytes, so the chunks never pass the row's end), the block's
// bytes shifted out of them in registers (quant_pieces.h: q8_take, k4_scales_pair).
template <DType QT>
struct Piece {
  static constexpr int kValues = QT == DType::Q8_0 ? 32 : 64;
  static constexpr int kLoads = QT == DType::Q5_K ? 5 : 3;
  uint4 v[kLoads];
};

template <DType QT>
__device__ __forceinline__ void load_piece(const uint8_t* row, int64_t p, Piece<QT>& l) {
  if constexpr (QT == DType::Q8_0) {
    const uint4* c = reinterpret_cast<const uint4*>(row + q8_window(uint32_t(p)));  // quant_pieces.h
#pragma unroll
    for (int k = 0; k < 3; ++k) l.v[k] = __ldcs(c + k);
  } else {
    constexpr int kBytes = QT == DType::Q4_K ? 144 : 176;
    constexpr int kQs = QT == DType::Q4_K ? 16 : 48;
    const uint8_t* b = row + (p / 4) * kBytes;
    l.v[0] = __ldcs(reinterpret_cast<const uint4*>(b));
    const uint4* q = reinterpret_cast<const uint4*>(b + kQs + 32 * (p % 4));
    l.v[1] = __ldcs(q);
    l.v[2] = __ldcs(q + 1);
    if constexpr (QT == DType::Q5_K) {
      const uint4* h = reinterpret_cast<const uint4*>(b + 16);
      l.v[3] = __ldcs(h);
      l.v[4] = __ldcs(h + 1);
    }
  }
}

// 32 integer products of 4 packed weights with 4 packed activations, 8 words each, in a fixed order.
__device__ __forceinline__ int dot32(const int (&w)[8], const int4& x0, const int4& x1, int& hi) {
  hi = dot4(w[7], x1.w, dot4(w[6], x1.z, dot4(w[5], x1.y, dot4(w[4], x1.x, 0))));
  return dot4(w[3], x0.w, dot4(w[2], x0.z, dot4(w[1], x0.y, dot4(w[0], x0.x, 0))));
}

// Piece p of the kR rows of a warp, decoded to integer words in registers, with the float factors of its 32-value
// groups: Q8_0 one group (a = d, bias 0), Q4_K / Q5_K two (a = d * sc, bias = -dmin * m).
template <DType QT>
struct Decoded {
  static constexpr int kGroups = QT == DType::Q8_0 ? 1 : 2;
  int w[kGroups][8];
  float a[kGroups], bias[kGroups];
};

template <DType QT>
__device__ __forceinline__ void decode_piece(const Piece<QT>& l, int64_t p, Decoded<QT>& o) {
  if constexpr (QT == DType::Q8_0) {
    const uint32_t w12[12] = {l.v[0].x, l.v[0].y, l.v[0].z, l.v[0].w, l.v[1].x, l.v[1].y,
                              l.v[1].z, l.v[1].w, l.v[2].x, l.v[2].y, l.v[2].z, l.v[2].w};
    uint16_t d_bits;
    uint32_t qw[8];
    q8_take(w12, q8_offset(uint32_t(p)), d_bits, qw);  // quant_pieces.h
    o.a[0] = fp16_bits_to_float(d_bits);
    o.bias[0] = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) o.w[0][k] = int(qw[k]);
  } else {
    const int c = int(p % 4), s0 = 2 * c, s1 = 2 * c + 1;
    const float d = fp16_bits_to_float(uint16_t(l.v[0].x & 0xffffu));
    const float dmin = fp16_bits_to_float(uint16_t(l.v[0].x >> 16));
    unsigned sc0, m0, sc1, m1;  // sub-blocks s0 and s1, in registers (quant_pieces.h)
    k4_scales_pair(l.v[0].y, l.v[0].z, l.v[0].w, unsigned(c), sc0, m0, sc1, m1);
    const uint32_t q[8] = {l.v[1].x, l.v[1].y, l.v[1].z, l.v[1].w, l.v[2].x, l.v[2].y, l.v[2].z, l.v[2].w};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      uint32_t lo = q[k] & 0x0F0F0F0Fu, hi = (q[k] >> 4) & 0x0F0F0F0Fu;
      if constexpr (QT == DType::Q5_K) {
        const uint32_t h[8] = {l.v[3].x, l.v[3].y, l.v[3].z, l.v[3].w,
                               l.v[4].x, l.v[4].y, l.v[4].z, l.v[4].w};
        lo |= ((h[k] >> s0) & 0x01010101u) << 4;
        hi |= ((h[k] >> s1) & 0x01010101u) << 4;
      }
      o.w[0][k] = int(lo);
      o.w[1][k] = int(hi);
    }
    o.a[0] = d * float(sc0);
    o.bias[0] = -dmin * float(m0);
    o.a[1] = d * float(sc1);
    o.bias[1] = -dmin * float(m1);
  }
}

// Adds piece p of the warp's kR rows times the NC quantized activation columns to acc, with the staged kernel's
// arithmetic per 32 values: d_x * (a * lo + a * hi) + bias * (d_x sum q_x) (Q8_0: no bias term, as before).
// The activations of a column are loaded once for all kR rows (they are the same bytes); each (row, column)
// sum still takes its pieces in the same order, so the results do not depend on NC.
template <DType QT, int NC>
__device__ __forceinline__ void piece_dot(const Decoded<QT> (&dw)[kR], int64_t p, int64_t K, int64_t n_sub,
                                          const int8_t* xq, const float2* xds, float (&acc)[kR][NC]) {
  constexpr int G = Decoded<QT>::kGroups;
#pragma unroll
  for (int col = 0; col < NC; ++col) {
    const int8_t* xv = xq + col * K + 32 * G * p;
    int4 x[G][2];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      x[g][0] = load_int4_global(xv + 32 * g);
      x[g][1] = load_int4_global(xv + 32 * g + 16);
    }
    float2 ds[G];
    if constexpr (G == 1) {
      ds[0] = xds[col * n_sub + p];
    } else {
      const float4 d4 = *reinterpret_cast<const float4*>(xds + col * n_sub + 2 * p);  // sub-blocks 2p, 2p+1
      ds[0] = make_float2(d4.x, d4.y);
      ds[1] = make_float2(d4.z, d4.w);
    }
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
      for (int g = 0; g < G; ++g) {
        int hi;
        const int lo = dot32(dw[r].w[g], x[g][0], x[g][1], hi);
        const float a = dw[r].a[g];
        if constexpr (QT == DType::Q8_0)
          acc[r][col] += ds[g].x * (a * float(lo) + a * float(hi));
        else
          acc[r][col] += ds[g].x * (a * float(lo) + a * float(hi)) + dw[r].bias[g] * ds[g].y;
      }
  }
}

// xq / xds / y / r: plain loads and stores after pdl_wait (pdl.cuh); weights before it.
template <DType QT, int NC, GemvEpilogue EPI>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    gemv_quant_direct_kernel(const GemvArgs a, const int8_t* xq, const float2* xds) {
  constexpr int per = outs_per_warp<EPI>();
  pdl_trigger();
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  int seg = 0;
  int64_t row0 = 0;
  if (!find_unit<EPI>(a, unit, seg, row0)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t N = seg_at(a, seg).N, K = a.K, n_pieces = K / Piece<QT>::kValues, n_sub = K / 32;
  const uint8_t* wr[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const GemvSeg& sg = EPI == GemvEpilogue::SwiGlu ? seg_at(a, r < per ? 0 : 1) : seg_at(a, seg);
    const int64_t o = row0 + r % per;
    // A row past N (the last unit of a segment) reads row0 again and is never written.
    wr[r] = static_cast<const uint8_t*>(sg.W) + (o < N ? o : row0) * sg.w_ld;
  }
  float acc[kR][NC];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;

  bool waited = false;
  for (int64_t p0 = lane; p0 < n_pieces; p0 += kU * kWarpSize) {
    Piece<QT> ld[kU][kR];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t p = p0 + u * kWarpSize;
      if (p < n_pieces)
#pragma unroll
        for (int r = 0; r < kR; ++r) load_piece<QT>(wr[r], p, ld[u][r]);
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t p = p0 + u * kWarpSize;
      if (p < n_pieces) {
        Decoded<QT> dw[kR];
#pragma unroll
        for (int r = 0; r < kR; ++r) decode_piece<QT>(ld[u][r], p, dw[r]);
        piece_dot<QT, NC>(dw, p, K, n_sub, xq, xds, acc);
      }
    }
  }
  if (!waited) pdl_wait();

#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = warp_sum(acc[r][c]);
  if (lane != 0) return;
  const GemvSeg& out = seg_at(a, seg);
#pragma unroll
  for (int r = 0; r < per; ++r) {
    const int64_t o = row0 + r;
    if (o >= N) break;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float val = acc[r][c];
      if constexpr (EPI == GemvEpilogue::SwiGlu) {
        val = val / (1.0f + expf(-val)) * acc[r + per][c];  // the CUDA silu_mul's expression
      } else if constexpr (EPI == GemvEpilogue::AddResidual) {
        val = out.r[c * out.r_ld + o] + val;  // add(x, proj)'s order
      }
      out.y[c * out.y_ld + o] = val;
    }
  }
}

size_t align256(size_t n) {
  return (n + 255) & ~size_t(255);
}

template <DType QT, GemvEpilogue EPI>
void launch_epi(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  constexpr int per = outs_per_warp<EPI>();
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
#define TANDEM_QD_CASE(n)                                                                               \
  case n:                                                                                               \
    launch_pdl(gemv_quant_direct_kernel<QT, n, EPI>, dim3(grid), dim3(kWarps* kWarpSize), 0, stream, c, \
               xq_c, xds_c);                                                                            \
    break;
      TANDEM_QD_CASE(1)
      TANDEM_QD_CASE(2)
      TANDEM_QD_CASE(3)
      TANDEM_QD_CASE(4)
      TANDEM_QD_CASE(5)
      TANDEM_QD_CASE(6)
      TANDEM_QD_CASE(7)
      TANDEM_QD_CASE(8)
#undef TANDEM_QD_CASE
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

bool direct_disabled() {  // TANDEM_NO_QUANT_DIRECT=1: the staged kernel instead, to compare or to bisect
  static const bool off = [] {
    const char* e = std::getenv("TANDEM_NO_QUANT_DIRECT");
    return e && *e && *e != '0';
  }();
  return off;
}

}  // namespace

bool gemv_quant_direct_supports(const GemvArgs& a) {
  if ((a.wt != DType::Q4_K && a.wt != DType::Q5_K && a.wt != DType::Q8_0) || a.K % 256 != 0 ||
      direct_disabled())
    return false;
  for (int s = 0; s < a.n_seg; ++s)
    if ((reinterpret_cast<uintptr_t>(a.seg[s].W) & 15) != 0 || a.seg[s].w_ld % 16 != 0) return false;
  return true;
}

void launch_gemv_quant_direct(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  check(gemv_quant_direct_supports(a), "launch_gemv_quant_direct: arguments the direct path cannot take");
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
