// Matrix-vector products for decode with block-quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K).
//
// The kernel also runs the fused products (GemvArgs, cuda_kernels.h): Q/K/V as one launch, gate/up with
// SwiGLU in the epilogue, the residual add in the epilogue.
//
// x is first quantized to 8 bits per 32 values (launch_quantize_q8: int8 q, scale d and d * sum q per 32), so
// that every 32 weights become eight 4-byte integer dot products (dp4a). GGUF blocks are 18, 34, 144, 176 or
// 210 bytes, so most blocks are not 16-byte aligned; instead of narrow loads from global memory, each block
// of 4 warps copies the bytes of its 4 rows into shared memory with 16-byte asynchronous copies (the aligned
// interior of each row; a few head and tail bytes one by one) and then decodes from shared memory, one warp
// per row. Shared memory keeps the global reads wide and in flight whatever the block size.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_quant_decode.cuh"
#include "backend/cuda/gemv_units.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/env_switch.h"
#include "quant/blocks.h"

namespace tandem::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // one warp per row
constexpr int kMaxSmem = 200 * 1024;

size_t align256(size_t n) {
  return (n + 255) & ~size_t(255);
}

// ---- activation quantization: one warp per 32 values ------------------------------------------------------
// (x, xq, xds: plain loads, no __restrict__ / __ldg: the previous kernel writes them while a PDL grid runs.)
__global__ void quantize_q8_kernel(const float* x, int64_t x_ld, int64_t K, int64_t n_blocks_total,
                                   int8_t* __restrict__ xq, float2* __restrict__ xds) {
  pdl_trigger();  // pdl.cuh
  pdl_wait();     // x is the previous kernel's output
  const int64_t bi = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (bi >= n_blocks_total) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t per_col = K / 32;
  const int64_t t = bi / per_col, b = bi % per_col;
  warp_quantize_q8(x[t * x_ld + b * 32 + lane], &xq[t * K + b * 32 + lane], &xds[bi]);
}

// rms_norm of column t = blockIdx.y (x * inv * norm, rms_norm_kernel's expression), then quantized per 32
// values as quantize_q8_kernel does: the norm before the Q/K/V and gate/up products and their activation
// quantization in one launch. The sum of squares is a block reduction over the whole column.
//
// Wide (the default): gridDim.x blocks per column, each computing the column's sum of squares (the same loop
// and reduction, so the same value in every block) and quantizing its own 8 groups of 32 values, a warp a
// group. One block per column (TANDEM_NORM_QUANT_WIDE=0, as before) walked the column's 128 groups (n_embd
// 4096) 8 at a time: 16 dependent rounds of loads on one SM, twice a layer on the critical path of a decode
// step. Both give bitwise the same values.
constexpr int kNormQuantThreads = 256;
EnvSwitch g_norm_quant_wide{"TANDEM_NORM_QUANT_WIDE", true};
__global__ void __launch_bounds__(kNormQuantThreads)
    quantize_q8_norm_kernel(const float* x, int64_t x_ld, int64_t K, const float* norm, float eps,
                            int8_t* __restrict__ xq, float2* __restrict__ xds) {
  __shared__ float red[32];
  pdl_trigger();  // pdl.cuh
  pdl_wait();     // x is the previous kernel's output
  const int64_t t = blockIdx.y;
  const float* xc = x + t * x_ld;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < K; i += blockDim.x) ss += xc[i] * xc[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(K) + eps);
  const int warps = blockDim.x / kWarpSize;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t per_col = K / 32;
  for (int64_t b = int64_t(blockIdx.x) * warps + warp; b < per_col; b += int64_t(gridDim.x) * warps) {
    const int64_t i = b * 32 + lane;
    warp_quantize_q8(xc[i] * inv * norm[i], &xq[t * K + i], &xds[t * per_col + b]);
  }
}

// Rows of W a block owns: kRowsPerBlock rows of one segment, or for SwiGlu kRowsPerBlock/2 gate rows (warps
// 0, 1) and the same up rows (warps 2, 3), combined through shared memory at the end.
template <GemvEpilogue EPI>
constexpr int outs_per_block() {
  return gemv_outs_per_unit<EPI, kRowsPerBlock>();
}

// One row's dot products with the NC activation columns: lane takes sub-blocks lane, lane + 32, ... (the same
// order for every NC and both decodings, so results are batch invariant).
template <DType QT, int NC, bool A16>
__device__ __forceinline__ void row_dot(const uint8_t* rowp, int64_t n_sub, int64_t K, int lane,
                                        const int8_t* xq, const float2* xds, float (&acc)[NC]) {
  for (int64_t i = lane; i < n_sub; i += kWarpSize) {
    const SubBlock sb = decode_sub_block<QT, A16>(rowp, i);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int4* xv = reinterpret_cast<const int4*>(xq + c * K + 32 * i);
      const int4 x0 = xv[0], x1 = xv[1];
      const int lo = dot4(sb.w[3], x0.w, dot4(sb.w[2], x0.z, dot4(sb.w[1], x0.y, dot4(sb.w[0], x0.x, 0))));
      const int hi = dot4(sb.w[7], x1.w, dot4(sb.w[6], x1.z, dot4(sb.w[5], x1.y, dot4(sb.w[4], x1.x, 0))));
      const float2 ds = xds[c * n_sub + i];
      acc[c] += ds.x * (sb.a0 * float(lo) + sb.a1 * float(hi)) + sb.bias * ds.y;
    }
  }
}

// Global address of row r (0..kRowsPerBlock-1) of a unit, or null for a row past N.
template <GemvEpilogue EPI>
__device__ __forceinline__ const uint8_t* unit_row(const GemvArgs& a, int seg, int64_t row0, int r) {
  constexpr int per = outs_per_block<EPI>();
  const GemvSeg& sg = kIsGlu<EPI> ? gemv_seg(a, r < per ? 0 : 1) : gemv_seg(a, seg);
  const int64_t o = row0 + r % per;
  return o < gemv_seg(a, seg).N ? static_cast<const uint8_t*>(sg.W) + o * sg.w_ld : nullptr;
}

// Copies the rows of a unit into one shared-memory buffer, each at the same offset mod 16 as in global
// memory: 16-byte asynchronous copies for the aligned interior, a few head and tail bytes one by one.
template <GemvEpilogue EPI>
__device__ __forceinline__ void stage_unit(const GemvArgs& a, int seg, int64_t row0, size_t row_bytes,
                                           size_t pitch, uint8_t* buf) {
  const int tid = threadIdx.x;
  for (int r = 0; r < kRowsPerBlock; ++r) {
    const uint8_t* g = unit_row<EPI>(a, seg, row0, r);
    if (g == nullptr) continue;
    const uintptr_t gb = reinterpret_cast<uintptr_t>(g), ge = gb + row_bytes;
    uint8_t* s = buf + r * pitch + (gb & 15);
    const uintptr_t a0 = (gb + 15) & ~uintptr_t(15), a1 = ge & ~uintptr_t(15);
    if (a0 <= a1) {
      const int64_t n16 = int64_t(a1 - a0) / 16;
      for (int64_t k = tid; k < n16; k += blockDim.x)
        __pipeline_memcpy_async(s + (a0 - gb) + 16 * k, reinterpret_cast<const void*>(a0 + 16 * k), 16);
      for (int64_t k = tid; k < int64_t(a0 - gb); k += blockDim.x) s[k] = g[k];
      for (int64_t k = tid; k < int64_t(ge - a1); k += blockDim.x) s[(a1 - gb) + k] = g[(a1 - gb) + k];
    } else {
      for (int64_t k = tid; k < int64_t(row_bytes); k += blockDim.x) s[k] = g[k];
    }
  }
}

// A persistent grid (about as many blocks as fit on the device at once) walks the units; while the warps
// decode unit i from one shared-memory buffer, the copy engine fills the other with unit i + gridDim.x. The
// old kernel staged one unit, waited, decoded and exited: loads and decoding never overlapped within a block
// and a wave of blocks all waited, then all computed (35-58% of bandwidth, BENCHMARKS run 1).
template <DType QT, int NC, GemvEpilogue EPI>
__global__ void __launch_bounds__(kRowsPerBlock* kWarpSize)
    gemv_quant_kernel(const GemvArgs a, int64_t n_units, size_t row_bytes, size_t pitch, int n_buf,
                      const int8_t* xq, const float2* xds) {
  extern __shared__ __align__(16) uint8_t smem[];  // [n_buf][kRowsPerBlock][pitch]
  __shared__ float up_part[kRowsPerBlock / 2][NC];
  constexpr int per = outs_per_block<EPI>();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t K = a.K, n_sub = K / 32;
  const size_t buf_bytes = size_t(kRowsPerBlock) * pitch;

  int64_t u = blockIdx.x;
  int seg = 0, next_seg = 0;
  int64_t row0 = 0, next_row0 = 0;
  pdl_trigger();                                                 // pdl.cuh
  if (u >= n_units || !gemv_find_unit<EPI, per>(a, u, seg, row0)) return;  // whole block
  stage_unit<EPI>(a, seg, row0, row_bytes, pitch, smem);
  __pipeline_commit();
  pdl_wait();  // the first rows of weights are on their way; xq, xds, y and r belong to earlier kernels
  for (int it = 0; u < n_units; u += gridDim.x, ++it) {
    const int64_t nu = u + gridDim.x;
    const bool has_next = nu < n_units && gemv_find_unit<EPI, per>(a, nu, next_seg, next_row0);
    if (has_next && n_buf == 2)
      stage_unit<EPI>(a, next_seg, next_row0, row_bytes, pitch, smem + ((it + 1) & 1) * buf_bytes);
    __pipeline_commit();  // every thread commits every iteration: wait_prior(1) then means "unit u landed"
    __pipeline_wait_prior(1);
    __syncthreads();

    const uint8_t* g = unit_row<EPI>(a, seg, row0, warp);
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    if (g != nullptr) {
      const uint8_t* rowp = smem + (n_buf == 2 ? (it & 1) : 0) * buf_bytes + warp * pitch +
                            (reinterpret_cast<uintptr_t>(g) & 15);
      constexpr bool kHasA16 = QT == DType::Q4_K || QT == DType::Q5_K;
      if (kHasA16 && (reinterpret_cast<uintptr_t>(rowp) & 15) == 0)
        row_dot<QT, NC, true>(rowp, n_sub, K, lane, xq, xds, acc);  // same integers, fewer shared loads
      else
        row_dot<QT, NC, false>(rowp, n_sub, K, lane, xq, xds, acc);
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = warp_sum(acc[c]);
    if constexpr (kIsGlu<EPI>) {
      if (warp >= per && lane == 0)
#pragma unroll
        for (int c = 0; c < NC; ++c) up_part[warp - per][c] = acc[c];
      __syncthreads();
    }
    const GemvSeg& out = gemv_seg(a, seg);
    const int64_t o = row0 + warp;
    if (lane == 0 && warp < per && o < out.N) {
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        float val = acc[c];
        if constexpr (kIsGlu<EPI>) {
          val = glu_gate<EPI == GemvEpilogue::GeGlu>(val, up_part[warp][c]);  // silu_mul's / gelu_mul's expression
        } else if constexpr (EPI == GemvEpilogue::AddResidual) {
          val = out.r[c * out.r_ld + o] + val;  // add(x, proj)'s order
        }
        out.y[c * out.y_ld + o] = val;
      }
    }
    __syncthreads();               // this buffer (and up_part) are refilled next iteration
    if (has_next && n_buf == 1) {  // rows too long for two buffers: stage after decoding, no overlap
      stage_unit<EPI>(a, next_seg, next_row0, row_bytes, pitch, smem);
      __pipeline_commit();  // its own group: the next iteration's (empty) commit keeps wait_prior(1) exact
    }
    seg = next_seg;
    row0 = next_row0;
  }
}

size_t row_pitch(size_t row_bytes) {
  return (row_bytes + 16 + 16 + 15) & ~size_t(15);
}

template <DType QT, int NC, GemvEpilogue EPI>
void launch_one(const GemvArgs& a, size_t row_bytes, const int8_t* xq, const float2* xds,
                cudaStream_t stream) {
  allow_dynamic_smem(gemv_quant_kernel<QT, NC, EPI>, kMaxSmem);  // kernel_smem.h: per device
  constexpr int per = outs_per_block<EPI>();
  const int64_t units = gemv_units<EPI, per>(a);
  if (units == 0) return;
  const size_t pitch = row_pitch(row_bytes);
  const int n_buf = 2 * kRowsPerBlock * pitch <= size_t(kMaxSmem) ? 2 : 1;
  const size_t smem = size_t(n_buf) * kRowsPerBlock * pitch;
  // As many blocks as are resident at once (occupancy for this smem size), at most one per unit.
  int dev = 0, n_sm = 0, per_sm = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
  TANDEM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_quant_kernel<QT, NC, EPI>,
                                                                  kRowsPerBlock * kWarpSize, smem));
  const int64_t grid = std::min<int64_t>(units, int64_t(std::max(per_sm, 1)) * n_sm);
  launch_pdl(gemv_quant_kernel<QT, NC, EPI>, dim3(unsigned(grid)), dim3(kRowsPerBlock * kWarpSize), smem,
             stream, a, units, row_bytes, pitch, n_buf, xq, xds);
  TANDEM_CUDA_CHECK_LAUNCH();
}

template <DType QT, GemvEpilogue EPI>
void launch_type(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  const int64_t K = a.K, T = a.T;
  const size_t row_bytes = dtype_row_bytes(QT, K);
  const int8_t* xq = static_cast<const int8_t*>(scratch);
  const float2* xds =
      reinterpret_cast<const float2*>(static_cast<const char*>(scratch) + q8_scales_offset(K, T));
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
#define TANDEM_GEMVQ_CASE(n)                                   \
  case n:                                                      \
    launch_one<QT, n, EPI>(c, row_bytes, xq_c, xds_c, stream); \
    break;
      TANDEM_GEMVQ_CASE(1)
      TANDEM_GEMVQ_CASE(2)
      TANDEM_GEMVQ_CASE(3)
      TANDEM_GEMVQ_CASE(4)
      TANDEM_GEMVQ_CASE(5)
      TANDEM_GEMVQ_CASE(6)
      TANDEM_GEMVQ_CASE(7)
      TANDEM_GEMVQ_CASE(8)
#undef TANDEM_GEMVQ_CASE
    }
  }
}

template <DType QT>
void launch_epi(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  switch (a.epi) {
    case GemvEpilogue::Store:
      return launch_type<QT, GemvEpilogue::Store>(a, scratch, stream);
    case GemvEpilogue::AddResidual:
      return launch_type<QT, GemvEpilogue::AddResidual>(a, scratch, stream);
    case GemvEpilogue::SwiGlu:
      return launch_type<QT, GemvEpilogue::SwiGlu>(a, scratch, stream);
    case GemvEpilogue::GeGlu:
      return launch_type<QT, GemvEpilogue::GeGlu>(a, scratch, stream);
  }
}

}  // namespace

size_t q8_activation_bytes(int64_t K, int64_t T) {
  return q8_scales_offset(K, T) + align256(size_t(K / 32 * T) * sizeof(float2));
}

void launch_quantize_q8(const float* x, int64_t x_ld, int64_t K, int64_t T, void* scratch,
                        cudaStream_t stream) {
  const int64_t n_blocks = K / 32 * T;
  if (n_blocks == 0) return;
  int8_t* xq = static_cast<int8_t*>(scratch);
  float2* xds = reinterpret_cast<float2*>(static_cast<char*>(scratch) + q8_scales_offset(K, T));
  constexpr int kWarps = 8;
  launch_pdl(quantize_q8_kernel, dim3(unsigned((n_blocks + kWarps - 1) / kWarps)), dim3(kWarps * kWarpSize),
             0, stream, x, x_ld, K, n_blocks, xq, xds);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_quantize_q8_norm(const float* x, int64_t x_ld, int64_t K, int64_t T, const float* norm, float eps,
                             void* scratch, cudaStream_t stream) {
  if (T == 0 || K == 0) return;
  int8_t* xq = static_cast<int8_t*>(scratch);
  float2* xds = reinterpret_cast<float2*>(static_cast<char*>(scratch) + q8_scales_offset(K, T));
  check(T <= 65535, "launch_quantize_q8_norm: at most 65535 columns a launch");
  const int64_t groups = K / 32, per_block = kNormQuantThreads / kWarpSize;
  const unsigned wide = g_norm_quant_wide.on() ? unsigned((groups + per_block - 1) / per_block) : 1u;
  launch_pdl(quantize_q8_norm_kernel, dim3(std::max(wide, 1u), unsigned(T)), dim3(kNormQuantThreads), 0, stream,
             x, x_ld, K, norm, eps, xq, xds);
  TANDEM_CUDA_CHECK_LAUNCH();
}

bool gemv_quant_supports(DType wt, int64_t K) {
  switch (wt) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      break;
    default:
      return false;
  }
  if (K % dtype_block_size(wt) != 0) return false;
  return kRowsPerBlock * row_pitch(dtype_row_bytes(wt, K)) <= size_t(kMaxSmem);  // one buffer at least
}

void launch_gemv_quant_fused(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  check(gemv_quant_supports(a.wt, a.K), std::string("CUDA quantized matrix-vector product: ") +
                                            dtype_name(a.wt) + " rows of " + std::to_string(a.K) +
                                            " values are not supported");
  check(a.n_seg >= 1 && a.n_seg <= kGemvMaxSegs &&
            (!is_glu(a.epi) || (a.n_seg == 2 && a.seg[0].N == a.seg[1].N)),
        "launch_gemv_quant_fused: bad segments");
  check(a.q8_count == nullptr || (a.epi == GemvEpilogue::SwiGlu && gemv_quant_direct_supports(a) && a.seg[0].N % 32 == 0),
        "launch_gemv_quant_fused: quantized outputs need the direct kernel's SwiGlu and N % 32 == 0");
  if (a.T == 0) return;
  if (gemv_q8_mma_applies(a)) return launch_gemv_q8_mma(a, scratch, stream);  // (the direct kernel's bits)
  if (gemv_quant_direct_supports(a)) return launch_gemv_quant_direct(a, scratch, stream);
  switch (a.wt) {
    case DType::Q8_0:
      return launch_epi<DType::Q8_0>(a, scratch, stream);
    case DType::Q4_0:
      return launch_epi<DType::Q4_0>(a, scratch, stream);
    case DType::Q4_K:
      return launch_epi<DType::Q4_K>(a, scratch, stream);
    case DType::Q5_K:
      return launch_epi<DType::Q5_K>(a, scratch, stream);
    case DType::Q6_K:
      return launch_epi<DType::Q6_K>(a, scratch, stream);
    default:
      break;
  }
}

void launch_gemv_quant(DType wt, const void* W, size_t w_ld, int64_t K, int64_t N, const void* scratch,
                       int64_t T, float* y, int64_t y_ld, cudaStream_t stream) {
  if (N == 0 || T == 0) return;
  GemvArgs a;
  a.wt = wt;
  a.K = K;
  a.T = T;
  a.n_seg = 1;
  a.seg[0].W = W;
  a.seg[0].w_ld = w_ld;
  a.seg[0].N = N;
  a.seg[0].y = y;
  a.seg[0].y_ld = y_ld;
  launch_gemv_quant_fused(a, scratch, stream);
}

}  // namespace tandem::cuda
