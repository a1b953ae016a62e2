// Matrix-vector products for decode with F32/F16/BF16 weights: y[o, t] = sum_i W[i, o] x[i, t] for a few
// columns t. Decode is bound by reading W once, so each warp streams R rows of W with 16-byte loads, several
// in flight per lane (U), evict-first so that x stays in L1; x is read with plain loads and
// shared by all rows. Columns are a template parameter (1..8) so that the accumulators stay in registers.
// The same kernel runs fused products (GemvArgs: Q/K/V in one launch, gate/up with SwiGLU, residual add).
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_dense_vec.cuh"
#include "backend/cuda/gemv_units.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/tensor_rows.h"

namespace tandem::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;  // scalar path

// Vector path (W rows and x columns 16-byte aligned, K a multiple of the elements per load), fused over up to
// three matrices (GemvArgs). A warp owns R weight rows: every x value a lane loads serves R rows, so
// at T = 8 the L1 traffic for x is 8 cols x 32 B / R = 64 B per 16 B of weights (it was 256 B with one row
// per warp, which kept T = 8 at 30% of bandwidth). Bytes in flight: R x U x 16 B = 256 B per lane,
// 8 KB per warp; H200 wants >= ~40 KB per SM, i.e. >= 5 warps resident, and ~110 registers at T = 1 allow 16.
// Each (row, column) sum is one fmaf chain over i in a fixed order, whatever NC is: batch invariant.
// Rows per warp R and loads in flight per row U: R = 4, U = 4 by default; R = 2, U = 8 (the same 64 registers
// of weights in flight, twice the warps) for products with few rows and few columns, where R = 4 left ~8
// warps per SM: the {12288 -> 4096} down projection ran at 75% of bandwidth against 99% for {4096 -> 12288}
// (H200, 2026-12-04 15:50). R and U change only which warp computes a row, never the order of its sums.
constexpr int kFusedWarps = 4;

template <GemvEpilogue EPI, int R>
constexpr int rows_per_unit() {
  return gemv_outs_per_unit<EPI, R>();  // SwiGlu: R/2 gate rows + the same up rows
}

// x is read with plain loads, never __ldg / const __restrict__: under programmatic dependent launch the
// previous kernel writes x while this grid is already running, so x is not read-only for the kernel's
// lifetime (the non-coherent path's contract), and an invariant load could be hoisted above pdl_wait.
// NORM: x is rms-normed on the way (GemvArgs::norm): each x value is squared into ss (the warp reads the
// whole column) and multiplied by its norm weight; the kernel scales the sums by 1 / rms at the end.
template <DType WT, int NC, int R, bool NORM>
__device__ __forceinline__ void fused_step(const uint4 (&wv)[R], int64_t e, const float* x, int64_t x_ld,
                                           const float* norm, float (&acc)[R][NC], float (&ss)[NC]) {
  constexpr int kE = Vec16<WT>::kElems;
  float w[R][kE];
#pragma unroll
  for (int r = 0; r < R; ++r) Vec16<WT>::unpack(wv[r], w[r]);
  float nv[kE];
  if constexpr (NORM) {
    const float4* np = reinterpret_cast<const float4*>(norm + e);
#pragma unroll
    for (int k = 0; k < kE / 4; ++k) {
      const float4 f = np[k];
      nv[4 * k] = f.x;
      nv[4 * k + 1] = f.y;
      nv[4 * k + 2] = f.z;
      nv[4 * k + 3] = f.w;
    }
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    float xv[kE];
    const float4* xp = reinterpret_cast<const float4*>(x + c * x_ld + e);
#pragma unroll
    for (int k = 0; k < kE / 4; ++k) {
      const float4 f = xp[k];
      xv[4 * k] = f.x;
      xv[4 * k + 1] = f.y;
      xv[4 * k + 2] = f.z;
      xv[4 * k + 3] = f.w;
    }
    if constexpr (NORM) {
#pragma unroll
      for (int k = 0; k < kE; ++k) {
        ss[c] = fmaf(xv[k], xv[k], ss[c]);
        xv[k] *= nv[k];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int k = 0; k < kE; ++k) acc[r][c] = fmaf(w[r][k], xv[k], acc[r][c]);
  }
}

template <DType WT, int NC, GemvEpilogue EPI, int R, int U, bool NORM>
__global__ void __launch_bounds__(kFusedWarps* kWarpSize) gemv_dense_fused_kernel(const GemvArgs a) {
  constexpr int kE = Vec16<WT>::kElems;
  constexpr int per = rows_per_unit<EPI, R>();
  pdl_trigger();  // pdl.cuh: the next kernel may launch once every block has started
  const int64_t unit = int64_t(blockIdx.x) * kFusedWarps + threadIdx.x / kWarpSize;
  int seg = 0;
  int64_t row0 = 0;
  if (!gemv_find_unit<EPI, per>(a, unit, seg, row0)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t N = gemv_seg(a, seg).N;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const GemvSeg& sg = kIsGlu<EPI> ? gemv_seg(a, r < per ? 0 : 1) : gemv_seg(a, seg);
    const int64_t o = row0 + r % per;
    // A row past N (the last unit of a segment) reads row0 again and is never written.
    wr[r] = reinterpret_cast<const uint4*>(static_cast<const char*>(sg.W) + (o < N ? o : row0) * sg.w_ld);
  }
  const int64_t n_vec = a.K / kE;
  float acc[R][NC], ss[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    ss[c] = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][c] = 0.0f;
  }

  // The first weight loads are issued before pdl_wait (weights are never written during a step); x, y and r
  // are touched only after it.
  bool waited = false;
  int64_t v = lane;
  for (; v + (U - 1) * kWarpSize < n_vec; v += U * kWarpSize) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = __ldcs(wr[r] + v + u * kWarpSize);
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      fused_step<WT, NC, R, NORM>(wv[u], (v + u * kWarpSize) * kE, a.x, a.x_ld, a.norm, acc, ss);
  }
  for (; v < n_vec; v += kWarpSize) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = __ldcs(wr[r] + v);
    if (!waited) {
      pdl_wait();
      waited = true;
    }
    fused_step<WT, NC, R, NORM>(wv, v * kE, a.x, a.x_ld, a.norm, acc, ss);
  }
  if (!waited) pdl_wait();

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = warp_sum(acc[r][c]);
  if constexpr (NORM) {  // rms_norm's 1 / sqrt(mean(x^2) + eps), applied to the sums instead of to x
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float inv = 1.0f / sqrtf(warp_sum(ss[c]) / float(a.K) + a.eps);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][c] *= inv;
    }
  }
  if (lane != 0) return;
  const GemvSeg& out = gemv_seg(a, seg);
#pragma unroll
  for (int r = 0; r < per; ++r) {
    const int64_t o = row0 + r;
    if (o >= N) break;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float val = acc[r][c];
      if constexpr (kIsGlu<EPI>) {
        val = glu_gate<EPI == GemvEpilogue::GeGlu>(val, acc[r + per][c]);  // silu_mul's / gelu_mul's expression
      } else if constexpr (EPI == GemvEpilogue::AddResidual) {
        val = out.r[c * out.r_ld + o] + val;  // add(x, proj)'s order
      }
      out.y[c * out.y_ld + o] = val;
    }
  }
}

// Scalar path for any alignment and K: one warp per (row, column).
template <class Tag>
__global__ void gemv_dense_scalar_kernel(const char* __restrict__ W, size_t w_ld, int64_t K, int64_t N,
                                         const float* __restrict__ x, int64_t x_ld, float* __restrict__ y,
                                         int64_t y_ld) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int64_t c = blockIdx.y;
  if (row >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const auto* wrow = reinterpret_cast<const typename Tag::storage*>(W + row * w_ld);
  const float* xc = x + c * x_ld;
  float acc = 0.0f;
  for (int64_t i = lane; i < K; i += kWarpSize) acc += Tag::load(wrow + i) * xc[i];
  acc = warp_sum(acc);
  if (lane == 0) y[c * y_ld + row] = acc;
}

template <DType WT, GemvEpilogue EPI, int R, int U, bool NORM>
void launch_fused_ru(const GemvArgs& a, cudaStream_t stream) {
  constexpr int per = rows_per_unit<EPI, R>();
  const int64_t units = gemv_units<EPI, per>(a);
  if (units == 0) return;
  const unsigned grid = unsigned((units + kFusedWarps - 1) / kFusedWarps);
  for (int64_t t0 = 0; t0 < a.T; t0 += kGemvMaxCols) {
    const int nc = int(std::min<int64_t>(kGemvMaxCols, a.T - t0));
    const GemvArgs c = gemv_columns(a, t0);
    switch (nc) {
#define TANDEM_GEMV_CASE(n)                                                                                  \
  case n:                                                                                                    \
    launch_pdl(gemv_dense_fused_kernel<WT, n, EPI, R, U, NORM>, dim3(grid), dim3(kFusedWarps* kWarpSize), 0, \
               stream, c);                                                                                   \
    break;
      TANDEM_GEMV_CASE(1)
      TANDEM_GEMV_CASE(2)
      TANDEM_GEMV_CASE(3)
      TANDEM_GEMV_CASE(4)
      TANDEM_GEMV_CASE(5)
      TANDEM_GEMV_CASE(6)
      TANDEM_GEMV_CASE(7)
      TANDEM_GEMV_CASE(8)
#undef TANDEM_GEMV_CASE
    }
    TANDEM_CUDA_CHECK_LAUNCH();
  }
}

// R = 2 when the rows are few (<= 8192 in all: ~16 warps per SM instead of ~8 on 132 SMs) and T <= 4 (x is
// loaded once per R rows: at T = 8, R = 4 keeps the L1 traffic for x below the weights'). Only speed depends
// on it.
template <DType WT, GemvEpilogue EPI>
void launch_fused(const GemvArgs& a, cudaStream_t stream) {
  int64_t rows = 0;
  for (int s = 0; s < a.n_seg; ++s) rows += a.seg[s].N;
  if constexpr (EPI != GemvEpilogue::AddResidual) {  // a norm comes before Q/K/V and gate/up only
    if (a.norm != nullptr) {
      if (rows <= 8192 && a.T <= 4) return launch_fused_ru<WT, EPI, 2, 8, true>(a, stream);
      return launch_fused_ru<WT, EPI, 4, 4, true>(a, stream);
    }
  }
  if (rows <= 8192 && a.T <= 4) return launch_fused_ru<WT, EPI, 2, 8, false>(a, stream);
  launch_fused_ru<WT, EPI, 4, 4, false>(a, stream);
}

template <DType WT>
void launch_fused_type(const GemvArgs& a, cudaStream_t stream) {
  switch (a.epi) {
    case GemvEpilogue::Store:
      return launch_fused<WT, GemvEpilogue::Store>(a, stream);
    case GemvEpilogue::AddResidual:
      return launch_fused<WT, GemvEpilogue::AddResidual>(a, stream);
    case GemvEpilogue::SwiGlu:
      return launch_fused<WT, GemvEpilogue::SwiGlu>(a, stream);
    case GemvEpilogue::GeGlu:
      return launch_fused<WT, GemvEpilogue::GeGlu>(a, stream);
  }
}

template <class Tag>
void launch_scalar(const char* W, size_t w_ld, int64_t K, int64_t N, const float* x, int64_t x_ld, int64_t T,
                   float* y, int64_t y_ld, cudaStream_t stream) {
  const dim3 grid(unsigned((N + kWarpsPerBlock - 1) / kWarpsPerBlock), unsigned(T));
  gemv_dense_scalar_kernel<Tag>
      <<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(W, w_ld, K, N, x, x_ld, y, y_ld);
  TANDEM_CUDA_CHECK_LAUNCH();
}

bool is_dense_type(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

}  // namespace

bool gemv_dense_fusable(const GemvArgs& a) {
  if (!is_dense_type(a.wt) || a.n_seg < 1 || a.n_seg > kGemvMaxSegs) return false;
  const size_t elem = a.wt == DType::F32 ? 4 : 2;
  const int64_t per_vec = int64_t(16 / elem);
  if (a.K % per_vec != 0 || !aligned16(a.x) || (a.T > 1 && (a.x_ld * 4) % 16 != 0)) return false;
  for (int s = 0; s < a.n_seg; ++s)
    if (!aligned16(a.seg[s].W) || a.seg[s].w_ld % 16 != 0) return false;
  if (a.norm != nullptr && (!aligned16(a.norm) || a.epi == GemvEpilogue::AddResidual)) return false;
  return !is_glu(a.epi) || (a.n_seg == 2 && a.seg[0].N == a.seg[1].N);
}

void launch_gemv_dense_fused(const GemvArgs& a, cudaStream_t stream) {
  check(gemv_dense_fusable(a), "launch_gemv_dense_fused: arguments the 16-byte path cannot take");
  if (a.T == 0) return;
  switch (a.wt) {
    case DType::F32:
      return launch_fused_type<DType::F32>(a, stream);
    case DType::F16:
      return launch_fused_type<DType::F16>(a, stream);
    case DType::BF16:
      return launch_fused_type<DType::BF16>(a, stream);
    default:
      break;
  }
}

void launch_gemv_dense(DType wt, const void* W, size_t w_ld, int64_t K, int64_t N, const float* x,
                       int64_t x_ld, int64_t T, float* y, int64_t y_ld, cudaStream_t stream) {
  if (N == 0 || T == 0) return;
  GemvArgs a;
  a.wt = wt;
  a.K = K;
  a.x = x;
  a.x_ld = x_ld;
  a.T = T;
  a.n_seg = 1;
  a.seg[0].W = W;
  a.seg[0].w_ld = w_ld;
  a.seg[0].N = N;
  a.seg[0].y = y;
  a.seg[0].y_ld = y_ld;
  if (is_dense_type(wt) && gemv_dense_fusable(a)) return launch_gemv_dense_fused(a, stream);
  const char* w = static_cast<const char*>(W);
  switch (wt) {
    case DType::F32:
      return launch_scalar<F32Tag>(w, w_ld, K, N, x, x_ld, T, y, y_ld, stream);
    case DType::F16:
      return launch_scalar<F16Tag>(w, w_ld, K, N, x, x_ld, T, y, y_ld, stream);
    case DType::BF16:
      return launch_scalar<BF16Tag>(w, w_ld, K, N, x, x_ld, T, y, y_ld, stream);
    default:
      throw Error(std::string("launch_gemv_dense: not a dense dtype: ") + dtype_name(wt));
  }
}

}  // namespace tandem::cuda
