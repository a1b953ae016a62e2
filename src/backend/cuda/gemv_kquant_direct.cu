// Decode products with Q4_K / Q5_K weights whose rows are 16-byte aligned (the usual case: 144- and 176-byte
// super-blocks are multiples of 16, so every super-block of an aligned row is aligned), read straight from
// global memory into registers with 16-byte loads; no shared-memory staging.
//
// Why: the staged kernel (gemv_quant.cu) copies rows into shared memory and decodes them from there; at
// decode its shared-memory reads (unaligned 32-bit values: two loads and a funnel shift each) took as long as
// the global reads, and Q4_K ran at 34% of bandwidth (BENCHMARKS run 1). Here a lane takes one 64-value half
// of a super-block's sub-block pair at a time: the 16-byte header (d, dmin, the 12 scale bytes), the 32 bytes
// of nibbles of the pair (and for Q5_K the 32 bytes of fifth bits), all 16-byte loads, decoded in registers.
// A warp owns R = 2 rows (SwiGlu: one gate row and the same up row), U = 2 pairs per row in flight per lane:
// 192 bytes per lane in flight (Q4_K), as the dense kernels.
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

// The loads of one pair: header, nibbles (and Q5_K's fifth bits).
template <DType QT>
struct PairLoad {
  uint4 hd, q0, q1, h0, h1;
};

template <DType QT>
__device__ __forceinline__ void load_pair(const uint8_t* row, int64_t p, PairLoad<QT>& l) {
  constexpr int kBytes = QT == DType::Q4_K ? 144 : 176;
  constexpr int kQs = QT == DType::Q4_K ? 16 : 48;
  const uint8_t* b = row + (p / 4) * kBytes;
  const int c = int(p % 4);
  l.hd = __ldcs(reinterpret_cast<const uint4*>(b));
  const uint4* q = reinterpret_cast<const uint4*>(b + kQs + 32 * c);
  l.q0 = __ldcs(q);
  l.q1 = __ldcs(q + 1);
  if constexpr (QT == DType::Q5_K) {
    const uint4* h = reinterpret_cast<const uint4*>(b + 16);
    l.h0 = __ldcs(h);
    l.h1 = __ldcs(h + 1);
  }
}

// Adds pair p of one row (sub-blocks 2c and 2c + 1 of super-block p / 4, values 64p .. 64p + 63) times the NC
// quantized activation columns to acc. Per sub-block: d * sc * (d_x * sum q_w q_x) - dmin * m * (d_x sum
// q_x), the staged kernel's arithmetic (a0 = a1 = d * sc, bias = -dmin * m).
template <DType QT, int NC>
__device__ __forceinline__ void pair_dot(const PairLoad<QT>& l, int64_t p, int64_t K, int64_t n_sub,
                                         const int8_t* xq, const float2* xds, float (&acc)[NC]) {
  const int c = int(p % 4), s0 = 2 * c, s1 = 2 * c + 1;
  const float d = fp16_bits_to_float(uint16_t(l.hd.x & 0xffffu));
  const float dmin = fp16_bits_to_float(uint16_t(l.hd.x >> 16));
  const uint32_t sw[3] = {l.hd.y, l.hd.z, l.hd.w};
  const uint8_t* scales = reinterpret_cast<const uint8_t*>(sw);
  uint8_t sc0, m0, sc1, m1;
  quant::unpack_scale_min_k4(scales, s0, sc0, m0);
  quant::unpack_scale_min_k4(scales, s1, sc1, m1);
  const uint32_t q[8] = {l.q0.x, l.q0.y, l.q0.z, l.q0.w, l.q1.x, l.q1.y, l.q1.z, l.q1.w};
  int w0[8], w1[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    uint32_t lo = q[k] & 0x0F0F0F0Fu, hi = (q[k] >> 4) & 0x0F0F0F0Fu;
    if constexpr (QT == DType::Q5_K) {
      const uint32_t h[8] = {l.h0.x, l.h0.y, l.h0.z, l.h0.w, l.h1.x, l.h1.y, l.h1.z, l.h1.w};
      lo |= ((h[k] >> s0) & 0x01010101u) << 4;
      hi |= ((h[k] >> s1) & 0x01010101u) << 4;
    }
    w0[k] = int(lo);
    w1[k] = int(hi);
  }
  const float a0 = d * float(sc0), b0 = -dmin * float(m0);
  const float a1 = d * float(sc1), b1 = -dmin * float(m1);
#pragma unroll
  for (int col = 0; col < NC; ++col) {
    const int4* xv = reinterpret_cast<const int4*>(xq + col * K + 64 * p);
    const int4 x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
    const int lo0 = dot4(w0[3], x0.w, dot4(w0[2], x0.z, dot4(w0[1], x0.y, dot4(w0[0], x0.x, 0))));
    const int hi0 = dot4(w0[7], x1.w, dot4(w0[6], x1.z, dot4(w0[5], x1.y, dot4(w0[4], x1.x, 0))));
    const int lo1 = dot4(w1[3], x2.w, dot4(w1[2], x2.z, dot4(w1[1], x2.y, dot4(w1[0], x2.x, 0))));
    const int hi1 = dot4(w1[7], x3.w, dot4(w1[6], x3.z, dot4(w1[5], x3.y, dot4(w1[4], x3.x, 0))));
    const float4 ds = *reinterpret_cast<const float4*>(xds + col * n_sub + 2 * p);  // (d, d sum) of 2p, 2p+1
    acc[col] += ds.x * (a0 * float(lo0) + a0 * float(hi0)) + b0 * ds.y;
    acc[col] += ds.z * (a1 * float(lo1) + a1 * float(hi1)) + b1 * ds.w;
  }
}

// xq / xds / y / r: plain loads and stores after pdl_wait (pdl.cuh); weights before it.
template <DType QT, int NC, GemvEpilogue EPI>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    gemv_kquant_direct_kernel(const GemvArgs a, const int8_t* xq, const float2* xds) {
  constexpr int per = outs_per_warp<EPI>();
  pdl_trigger();
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  int seg = 0;
  int64_t row0 = 0;
  if (!find_unit<EPI>(a, unit, seg, row0)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t N = seg_at(a, seg).N, K = a.K, n_pairs = K / 64, n_sub = K / 32;
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
  for (int64_t p0 = lane; p0 < n_pairs; p0 += kU * kWarpSize) {
    PairLoad<QT> ld[kU][kR];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t p = p0 + u * kWarpSize;
      if (p < n_pairs)
#pragma unroll
        for (int r = 0; r < kR; ++r) load_pair<QT>(wr[r], p, ld[u][r]);
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t p = p0 + u * kWarpSize;
      if (p < n_pairs)
#pragma unroll
        for (int r = 0; r < kR; ++r) pair_dot<QT, NC>(ld[u][r], p, K, n_sub, xq, xds, acc[r]);
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
#define TANDEM_KQD_CASE(n)                                                                               \
  case n:                                                                                                \
    launch_pdl(gemv_kquant_direct_kernel<QT, n, EPI>, dim3(grid), dim3(kWarps* kWarpSize), 0, stream, c, \
               xq_c, xds_c);                                                                             \
    break;
      TANDEM_KQD_CASE(1)
      TANDEM_KQD_CASE(2)
      TANDEM_KQD_CASE(3)
      TANDEM_KQD_CASE(4)
      TANDEM_KQD_CASE(5)
      TANDEM_KQD_CASE(6)
      TANDEM_KQD_CASE(7)
      TANDEM_KQD_CASE(8)
#undef TANDEM_KQD_CASE
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

bool direct_disabled() {  // TANDEM_NO_KQUANT_DIRECT=1: the staged kernel instead, to compare or to bisect
  static const bool off = [] {
    const char* e = std::getenv("TANDEM_NO_KQUANT_DIRECT");
    return e && *e && *e != '0';
  }();
  return off;
}

}  // namespace

bool gemv_kquant_direct_supports(const GemvArgs& a) {
  if ((a.wt != DType::Q4_K && a.wt != DType::Q5_K) || a.K % 256 != 0 || direct_disabled()) return false;
  for (int s = 0; s < a.n_seg; ++s)
    if ((reinterpret_cast<uintptr_t>(a.seg[s].W) & 15) != 0 || a.seg[s].w_ld % 16 != 0) return false;
  return true;
}

void launch_gemv_kquant_direct(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  check(gemv_kquant_direct_supports(a), "launch_gemv_kquant_direct: arguments the direct path cannot take");
  if (a.T == 0) return;
  if (a.wt == DType::Q4_K) return launch_type<DType::Q4_K>(a, scratch, stream);
  launch_type<DType::Q5_K>(a, scratch, stream);
}

}  // namespace tandem::cuda
