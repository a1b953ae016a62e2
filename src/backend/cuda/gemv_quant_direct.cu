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

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/env_switch.h"
#include "backend/cuda/gemv_quant_pieces.cuh"
#include "backend/cuda/gemv_units.cuh"
#include "quant/blocks.h"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kR = 2;  // rows per warp
constexpr int kU = 2;  // pairs per row in flight per lane

template <GemvEpilogue EPI>
constexpr int outs_per_warp() {
  return gemv_outs_per_unit<EPI, kR>();
}

// The pieces (Piece, load_piece, decode_piece, piece_dot) are in gemv_quant_pieces.cuh, shared with the routed
// (MoE) products of gemv_id.cu.

// The SwiGlu epilogue with the outputs also quantized (GemvArgs::q8_*): the warp's one output (o = row0) is
// stored, announced on its group's counter, and the warp that completes a group of 32 outputs reads them back
// (from L2: they were stored by other warps) and quantizes them with quantize_q8_kernel's arithmetic, so the
// next product reads bit for bit what a quantize_q8 launch would have written; it leaves the counter at zero
// for the next launch (and the next replay of a recorded step). N % 32 == 0 (CudaOps::ffn_swiglu_add).
template <int NC>
__device__ __forceinline__ void swiglu_q8_epilogue(const GemvArgs& a, const GemvSeg& out, int64_t o,
                                                   const float (&acc)[kR][NC], int lane) {
  const int64_t N = out.N;
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float g = acc[0][c];
      out.y[c * out.y_ld + o] = g / (1.0f + expf(-g)) * acc[1][c];  // the CUDA silu_mul's expression
    }
  }
  int prev = 0;
  if (lane == 0) {
    __threadfence();  // the stores above, visible to the warp that completes the group
    prev = atomicAdd(&a.q8_count[o / 32], 1);
  }
  prev = __shfl_sync(0xffffffffu, prev, 0);
  if (prev != 31) return;
  __threadfence();
  const int64_t grp = o / 32, i = grp * 32 + lane;
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    warp_quantize_q8(__ldcg(out.y + c * out.y_ld + i), &a.q8_xq[c * N + i], &a.q8_xds[c * (N / 32) + grp]);
  }
  if (lane == 0) a.q8_count[grp] = 0;
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
  if (!gemv_find_unit<EPI, per>(a, unit, seg, row0)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t N = gemv_seg(a, seg).N, K = a.K, n_pieces = K / Piece<QT>::kValues, n_sub = K / 32;
  const uint8_t* wr[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const GemvSeg& sg = kIsGlu<EPI> ? gemv_seg(a, r < per ? 0 : 1) : gemv_seg(a, seg);
    const int64_t o = row0 + r % per;
    // A row past N (the last unit of a segment) reads row0 again and is never written.
    wr[r] = static_cast<const uint8_t*>(sg.W) + (o < N ? o : row0) * sg.w_ld;
  }
  float acc[kR][NC];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;

  // Weights load before pdl_wait (they do not depend on the previous kernel), activations after it.
  accumulate_pieces<QT, NC, kR, kU>(wr, lane, n_pieces, K, n_sub, xq, xds, acc, [] { pdl_wait(); });

#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = warp_sum(acc[r][c]);  // (every lane has the sums)
  const GemvSeg& out = gemv_seg(a, seg);
  if constexpr (EPI == GemvEpilogue::SwiGlu) {
    if (a.q8_count != nullptr) return swiglu_q8_epilogue<NC>(a, out, row0, acc, lane);
  }
  if (lane != 0) return;
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

template <DType QT, GemvEpilogue EPI>
void launch_epi(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  constexpr int per = outs_per_warp<EPI>();
  const int64_t units = gemv_units<EPI, per>(a);
  if (units == 0) return;
  const unsigned grid = unsigned((units + kWarps - 1) / kWarps);
  const int64_t K = a.K, T = a.T;
  const int8_t* xq = static_cast<const int8_t*>(scratch);
  const float2* xds =
      reinterpret_cast<const float2*>(static_cast<const char*>(scratch) + q8_scales_offset(K, T));
  for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxCols) {
    const int nc = int(std::min<int64_t>(kGemvMaxCols, T - t0));
    const int8_t* xq_c = xq + t0 * K;
    const float2* xds_c = xds + t0 * (K / 32);
    const GemvArgs c = gemv_columns(a, t0);
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
    case GemvEpilogue::GeGlu:
      return launch_epi<QT, GemvEpilogue::GeGlu>(a, scratch, stream);
  }
}

EnvSwitch g_no_direct{"TANDEM_NO_QUANT_DIRECT", false};  // =1: the staged kernel instead, to compare or bisect
bool direct_disabled() {
  return g_no_direct.on();
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
