// Routed matrix-vector products for Ops::matmul_id at decode (MoE experts, few routed rows): routed row
// (slot) s = blockIdx.y reads only its expert's rows, W + ids[s] * w_es, and its input column
// (s / k) * kx + (kx == 1 ? 0 : s % k); its output is column s of y. Kept apart from the fused decode
// products (gemv_dense.cu, gemv_quant.cu): those walk segments of one matrix set with a persistent grid and
// programmatic dependent launch; these index the weights per slot and launch plainly, so a change to one
// cannot break the other. The decoders are shared (gemv_dense_vec.cuh, gemv_quant_decode.cuh).
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/env_switch.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_dense_vec.cuh"
#include "backend/cuda/gemv_quant_decode.cuh"
#include "backend/cuda/gemv_quant_pieces.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/tensor_rows.h"

namespace tandem::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;  // dense: one warp per row
constexpr int kRowsPerBlock = 4;   // quantized: one warp per row, the block's rows staged in shared memory
constexpr int kMaxSmem = 200 * 1024;

// TANDEM_ID_PDL=1: the routed products are launched with programmatic dependent launch (pdl.cuh) like the other
// decode products, so each one's launch overlaps the end of the kernel before it (the router, the activation
// quantization, the previous routed product). Every routed kernel waits (pdl_wait) before its first read of ids,
// x, xq, xds or y, and reads them with plain loads (no __restrict__, no __ldg: an invariant load may be hoisted
// above griddepcontrol.wait); in a plain launch both are no-ops. On since its GPU tests passed (twelfth session,
// H100); =0 launches them plainly.
EnvSwitch g_id_pdl{"TANDEM_ID_PDL", true};

template <class... KArgs, class... Args>
void launch_routed(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  if (g_id_pdl.on()) return launch_pdl(kernel, grid, block, smem, stream, std::forward<Args>(args)...);
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
}

// The routed product's input columns as launch_quantize_q8 left them in scratch: (n_slots / k) * kx columns of
// K int8 values, then their per-32-value scales.
struct QuantColumns {
  const int8_t* xq;
  const float2* xds;
};
QuantColumns quant_columns(const void* scratch, int64_t K, int64_t n_slots, int k, int kx) {
  const int64_t n_x = (n_slots / k) * kx;
  return {static_cast<const int8_t*>(scratch),
          reinterpret_cast<const float2*>(static_cast<const char*>(scratch) + q8_scales_offset(K, n_x))};
}

__device__ __forceinline__ int64_t routed_col(int64_t s, int k, int kx) {
  return (s / k) * kx + (kx == 1 ? 0 : s % k);
}

// Slot s of a quantized routed product: its expert's weights, its 8-bit input column and its output column.
__device__ __forceinline__ void select_quant_slot(int64_t s, int k, int kx, int64_t K, size_t w_es,
                                                  const int32_t* ids,
                                                  const char* __restrict__& W, const int8_t*& xq,
                                                  const float2*& xds, float*& y,
                                                  int64_t y_ld) {
  const int64_t c = routed_col(s, k, kx);
  W += size_t(ids[s]) * w_es;
  xq += c * K;
  xds += c * (K / 32);
  y += s * y_ld;
}

// acc += the dot product of one 16-byte load of weights (wv) with x[e ..]: the one step of both dense routed
// kernels below, so that the GeGLU kernel's gate and up sums equal the plain kernel's bit for bit.
template <DType WT>
__device__ __forceinline__ void dense_step(const uint4& wv, const float* x, int64_t e, float& acc) {
  constexpr int kE = Vec16<WT>::kElems;
  float w[kE];
  Vec16<WT>::unpack(wv, w);
  const float4* xp = reinterpret_cast<const float4*>(x + e);
#pragma unroll
  for (int q = 0; q < kE / 4; ++q) {
    const float4 xv = xp[q];
    acc += w[4 * q] * xv.x + w[4 * q + 1] * xv.y + w[4 * q + 2] * xv.z + w[4 * q + 3] * xv.w;
  }
}

// Dense, 16-byte path: W rows and x columns 16-byte aligned, K a multiple of the elements per load.
template <DType WT>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize)
    gemv_dense_id_vec_kernel(const char* __restrict__ W, size_t w_ld, size_t w_es, int64_t K, int64_t N,
                             const float* x, int64_t x_ld, const int32_t* ids,
                             int k, int kx, float* y, int64_t y_ld) {
  pdl_trigger();  // pdl.cuh (TANDEM_ID_PDL; no-ops in a plain launch)
  pdl_wait();
  constexpr int kE = Vec16<WT>::kElems;
  constexpr int kUnroll = 8;
  const int64_t s = blockIdx.y;
  W += size_t(ids[s]) * w_es;
  x += routed_col(s, k, kx) * x_ld;
  y += s * y_ld;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const uint4* wrow = reinterpret_cast<const uint4*>(W + row * w_ld);
  const int64_t n_vec = K / kE;
  float acc = 0.0f;
  int64_t v = lane;
  for (; v + (kUnroll - 1) * kWarpSize < n_vec; v += kUnroll * kWarpSize) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wrow + v + u * kWarpSize);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dense_step<WT>(wv[u], x, (v + u * kWarpSize) * kE, acc);
  }
  for (; v < n_vec; v += kWarpSize) dense_step<WT>(__ldcs(wrow + v), x, v * kE, acc);
  acc = warp_sum(acc);
  if (lane == 0) y[row] = acc;
}

// Dense, any alignment and K.
template <class Tag>
__global__ void gemv_dense_id_scalar_kernel(const char* __restrict__ W, size_t w_ld, size_t w_es, int64_t K,
                                            int64_t N, const float* x, int64_t x_ld,
                                            const int32_t* ids, int k, int kx,
                                            float* y, int64_t y_ld) {
  pdl_trigger();  // pdl.cuh (TANDEM_ID_PDL; no-ops in a plain launch)
  pdl_wait();
  const int64_t s = blockIdx.y;
  W += size_t(ids[s]) * w_es;
  x += routed_col(s, k, kx) * x_ld;
  y += s * y_ld;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const auto* wrow = reinterpret_cast<const typename Tag::storage*>(W + row * w_ld);
  float acc = 0.0f;
  for (int64_t i = lane; i < K; i += kWarpSize) acc += Tag::load(wrow + i) * x[i];
  acc = warp_sum(acc);
  if (lane == 0) y[row] = acc;
}

// Quantized: the block's rows of the slot's expert are staged in shared memory (16-byte asynchronous copies
// of the aligned interior, head and tail bytes one by one, each row at its global offset mod 16), then one
// warp per row decodes sub-blocks against the slot's 8-bit activation column (launch_quantize_q8).
template <DType QT>
__global__ void __launch_bounds__(kRowsPerBlock* kWarpSize)
    gemv_quant_id_kernel(const char* __restrict__ W, size_t w_ld, size_t w_es, int64_t K, int64_t N,
                         size_t row_bytes, size_t pitch, const int8_t* xq,
                         const float2* xds, const int32_t* ids, int k, int kx,
                         float* y, int64_t y_ld) {
  pdl_trigger();  // pdl.cuh (TANDEM_ID_PDL; no-ops in a plain launch)
  pdl_wait();
  extern __shared__ __align__(16) uint8_t smem[];
  select_quant_slot(blockIdx.y, k, kx, K, w_es, ids, W, xq, xds, y, y_ld);
  const int64_t row0 = int64_t(blockIdx.x) * kRowsPerBlock;
  const int tid = threadIdx.x;
  for (int r = 0; r < kRowsPerBlock && row0 + r < N; ++r) {
    const uint8_t* g = reinterpret_cast<const uint8_t*>(W + (row0 + r) * w_ld);
    const uintptr_t gb = reinterpret_cast<uintptr_t>(g), ge = gb + row_bytes;
    uint8_t* sp = smem + r * pitch + (gb & 15);
    const uintptr_t a0 = (gb + 15) & ~uintptr_t(15), a1 = ge & ~uintptr_t(15);
    if (a0 <= a1) {
      const int64_t n16 = int64_t(a1 - a0) / 16;
      for (int64_t q = tid; q < n16; q += blockDim.x)
        __pipeline_memcpy_async(sp + (a0 - gb) + 16 * q, reinterpret_cast<const void*>(a0 + 16 * q), 16);
      for (int64_t q = tid; q < int64_t(a0 - gb); q += blockDim.x) sp[q] = g[q];
      for (int64_t q = tid; q < int64_t(ge - a1); q += blockDim.x) sp[(a1 - gb) + q] = g[(a1 - gb) + q];
    } else {
      for (int64_t q = tid; q < int64_t(row_bytes); q += blockDim.x) sp[q] = g[q];
    }
  }
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();

  const int warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int64_t row = row0 + warp;
  if (row >= N) return;
  const uint8_t* rowp = smem + warp * pitch + (reinterpret_cast<uintptr_t>(W + row * w_ld) & 15);
  const int64_t n_sub = K / 32;
  float acc = 0.0f;
  for (int64_t i = lane; i < n_sub; i += kWarpSize) {
    const SubBlock sb = decode_sub_block<QT>(rowp, i);
    const int4* xv = reinterpret_cast<const int4*>(xq + 32 * i);
    const int4 x0 = xv[0], x1 = xv[1];
    const int lo = dot4(sb.w[3], x0.w, dot4(sb.w[2], x0.z, dot4(sb.w[1], x0.y, dot4(sb.w[0], x0.x, 0))));
    const int hi = dot4(sb.w[7], x1.w, dot4(sb.w[6], x1.z, dot4(sb.w[5], x1.y, dot4(sb.w[4], x1.x, 0))));
    const float2 ds = xds[i];
    acc += ds.x * (sb.a0 * float(lo) + sb.a1 * float(hi)) + sb.bias * ds.y;
  }
  acc = warp_sum(acc);
  if (lane == 0) y[row] = acc;
}

// Quantized, direct: Q8_0 / Q4_K / Q5_K rows of K % 256 == 0 values, 16-byte aligned (the usual case), read
// straight into registers (gemv_quant_pieces.cuh, the decode products' pieces) instead of staged through
// shared memory: a warp owns kIdRows rows of the slot's expert, kIdInFlight pieces per row in flight per lane.
// The staged kernel above stays for the other types and for unaligned rows.
constexpr int kIdWarps = 4;
constexpr int kIdRows = 2;
constexpr int kIdInFlight = 2;

template <DType QT>
__global__ void __launch_bounds__(kIdWarps* kWarpSize)
    gemv_quant_id_direct_kernel(const char* __restrict__ W, size_t w_ld, size_t w_es, int64_t K, int64_t N,
                                const int8_t* xq, const float2* xds,
                                const int32_t* ids, int k, int kx, float* y,
                                int64_t y_ld) {
  pdl_trigger();  // pdl.cuh (TANDEM_ID_PDL; no-ops in a plain launch)
  pdl_wait();
  select_quant_slot(blockIdx.y, k, kx, K, w_es, ids, W, xq, xds, y, y_ld);
  const int64_t row0 = (int64_t(blockIdx.x) * kIdWarps + threadIdx.x / kWarpSize) * kIdRows;
  if (row0 >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n_pieces = K / Piece<QT>::kValues, n_sub = K / 32;
  const uint8_t* wr[kIdRows];
#pragma unroll
  for (int r = 0; r < kIdRows; ++r)  // a row past N reads row0 again and is never written
    wr[r] = reinterpret_cast<const uint8_t*>(W) + (row0 + r < N ? row0 + r : row0) * w_ld;
  float acc[kIdRows][1];
#pragma unroll
  for (int r = 0; r < kIdRows; ++r) acc[r][0] = 0.0f;
  accumulate_pieces<QT, 1, kIdRows, kIdInFlight>(wr, lane, n_pieces, K, n_sub, xq, xds, acc, [] {});
#pragma unroll
  for (int r = 0; r < kIdRows; ++r) acc[r][0] = warp_sum(acc[r][0]);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kIdRows; ++r)
    if (row0 + r < N) y[row0 + r] = acc[r][0];
}

// ---- GeGLU: the gate and up products of a routed row in one launch (Ops::matmul_id_geglu) ----------------------
// A warp computes gate row o and up row o of its slot's expert over the same input column, then writes
// gelu_tanh(gate) * up: each row's dot product runs the same code in the same order as the plain kernels
// above (for the quantized kernel a row's sum does not depend on the row it is paired with), so the result
// equals matmul_id twice + gelu_mul bit for bit. Off by default (TANDEM_ID_GEGLU, cuda_ops.cpp).

// Dense, 16-byte path: one warp per output row, two rows (gate, up) of loads in flight.
template <DType WT>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize)
    gemv_dense_id_geglu_kernel(const char* __restrict__ Wg, const char* __restrict__ Wu, size_t w_ld, size_t w_es,
                               int64_t K, int64_t N, const float* x, int64_t x_ld,
                               const int32_t* ids, int k, int kx, float* y,
                               int64_t y_ld) {
  pdl_trigger();  // pdl.cuh (TANDEM_ID_PDL; no-ops in a plain launch)
  pdl_wait();
  constexpr int kE = Vec16<WT>::kElems;
  constexpr int kUnroll = 8;
  const int64_t s = blockIdx.y;
  Wg += size_t(ids[s]) * w_es;
  Wu += size_t(ids[s]) * w_es;
  x += routed_col(s, k, kx) * x_ld;
  y += s * y_ld;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const uint4* grow = reinterpret_cast<const uint4*>(Wg + row * w_ld);
  const uint4* urow = reinterpret_cast<const uint4*>(Wu + row * w_ld);
  const int64_t n_vec = K / kE;
  float acc_g = 0.0f, acc_u = 0.0f;
  int64_t v = lane;
  for (; v + (kUnroll - 1) * kWarpSize < n_vec; v += kUnroll * kWarpSize) {
    uint4 gv[kUnroll], uv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      gv[u] = __ldcs(grow + v + u * kWarpSize);
      uv[u] = __ldcs(urow + v + u * kWarpSize);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      dense_step<WT>(gv[u], x, (v + u * kWarpSize) * kE, acc_g);
      dense_step<WT>(uv[u], x, (v + u * kWarpSize) * kE, acc_u);
    }
  }
  for (; v < n_vec; v += kWarpSize) {
    dense_step<WT>(__ldcs(grow + v), x, v * kE, acc_g);
    dense_step<WT>(__ldcs(urow + v), x, v * kE, acc_u);
  }
  acc_g = warp_sum(acc_g);
  acc_u = warp_sum(acc_u);
  if (lane == 0) y[row] = gelu_tanh(acc_g) * acc_u;
}

// Quantized, direct (Q8_0 / Q4_K / Q5_K as gemv_quant_id_direct_kernel): a warp owns one output row, its gate
// row and its up row being the two rows of accumulate_pieces.
template <DType QT>
__global__ void __launch_bounds__(kIdWarps* kWarpSize)
    gemv_quant_id_geglu_kernel(const char* __restrict__ Wg, const char* __restrict__ Wu, size_t w_ld, size_t w_es,
                               int64_t K, int64_t N, const int8_t* xq, const float2* xds,
                               const int32_t* ids, int k, int kx, float* y,
                               int64_t y_ld) {
  pdl_trigger();  // pdl.cuh (TANDEM_ID_PDL; no-ops in a plain launch)
  pdl_wait();
  const char* Wu_slot = Wu + size_t(ids[blockIdx.y]) * w_es;
  select_quant_slot(blockIdx.y, k, kx, K, w_es, ids, Wg, xq, xds, y, y_ld);
  const int64_t row = int64_t(blockIdx.x) * kIdWarps + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n_pieces = K / Piece<QT>::kValues, n_sub = K / 32;
  const uint8_t* wr[2] = {reinterpret_cast<const uint8_t*>(Wg) + row * w_ld,
                          reinterpret_cast<const uint8_t*>(Wu_slot) + row * w_ld};
  float acc[2][1] = {{0.0f}, {0.0f}};
  accumulate_pieces<QT, 1, 2, kIdInFlight>(wr, lane, n_pieces, K, n_sub, xq, xds, acc, [] {});
  acc[0][0] = warp_sum(acc[0][0]);
  acc[1][0] = warp_sum(acc[1][0]);
  if (lane == 0) y[row] = gelu_tanh(acc[0][0]) * acc[1][0];
}

// The routed products take the direct kernel where it applies; TANDEM_ID_DIRECT=0 keeps the staged kernel. On
// by default since the tenth session's GPU run (GpuMoe.DirectRoutedKernelMatchesTheCpu; 26B-A4B shape q4_k_m
// tg128 502 -> 508 t/s on an H100).
EnvSwitch g_id_direct{"TANDEM_ID_DIRECT", true};

bool id_direct_enabled() {
  return g_id_direct.on();
}

bool id_direct_applies(DType wt, const void* W, size_t w_ld, size_t w_es, int64_t K) {
  return (wt == DType::Q8_0 || wt == DType::Q4_K || wt == DType::Q5_K) && K % 256 == 0 && aligned16(W) &&
         w_ld % 16 == 0 && w_es % 16 == 0;
}

template <DType QT>
void launch_quant_id_direct(const char* W, size_t w_ld, size_t w_es, int64_t K, int64_t N, const void* scratch,
                            const int32_t* ids, int64_t n_slots, int k, int kx, float* y, int64_t y_ld,
                            cudaStream_t stream) {
  const QuantColumns x = quant_columns(scratch, K, n_slots, k, kx);
  const int64_t rows_per_block = int64_t(kIdWarps) * kIdRows;
  const dim3 grid(unsigned((N + rows_per_block - 1) / rows_per_block), unsigned(n_slots));
  launch_routed(gemv_quant_id_direct_kernel<QT>, grid, dim3(kIdWarps * kWarpSize), 0, stream, W, w_ld, w_es, K, N,
                x.xq, x.xds, ids, k, kx, y, y_ld);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// Head and tail bytes of a row and the 4 bytes of padding decode_sub_block may read past it.
size_t row_pitch(size_t row_bytes) {
  return (row_bytes + 16 + 16 + 15) & ~size_t(15);
}

template <DType QT>
void launch_quant_id(const char* W, size_t w_ld, size_t w_es, int64_t K, int64_t N, const void* scratch,
                     const int32_t* ids, int64_t n_slots, int k, int kx, float* y, int64_t y_ld,
                     cudaStream_t stream) {
  allow_dynamic_smem(gemv_quant_id_kernel<QT>, kMaxSmem);  // kernel_smem.h: per device
  const size_t row_bytes = dtype_row_bytes(QT, K);
  const size_t pitch = row_pitch(row_bytes);
  const QuantColumns x = quant_columns(scratch, K, n_slots, k, kx);
  const dim3 grid(unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(n_slots));
  launch_routed(gemv_quant_id_kernel<QT>, grid, dim3(kRowsPerBlock * kWarpSize), kRowsPerBlock * pitch, stream, W,
                w_ld, w_es, K, N, row_bytes, pitch, x.xq, x.xds, ids, k, kx, y, y_ld);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void set_gemv_id_direct(std::optional<bool> on) {
  g_id_direct.set(on);
}

bool gemv_id_geglu_supports(DType wt, const void* W_gate, const void* W_up, size_t w_ld, size_t w_es, int64_t K,
                            const float* x, int64_t x_ld) {
  if (wt == DType::F32 || wt == DType::F16 || wt == DType::BF16) {
    const int64_t per_vec = wt == DType::F32 ? 4 : 8;
    return aligned16(W_gate) && aligned16(W_up) && w_ld % 16 == 0 && w_es % 16 == 0 && K % per_vec == 0 &&
           aligned16(x) && (x_ld * 4) % 16 == 0;
  }
  return id_direct_enabled() && id_direct_applies(wt, W_gate, w_ld, w_es, K) && aligned16(W_up);
}

void launch_gemv_id_geglu(DType wt, const void* W_gate, const void* W_up, size_t w_ld, size_t w_es, int64_t K,
                          int64_t N, const float* x, int64_t x_ld, const void* scratch, const int32_t* ids,
                          int64_t n_slots, int k, int kx, float* y, int64_t y_ld, cudaStream_t stream) {
  check(gemv_id_geglu_supports(wt, W_gate, W_up, w_ld, w_es, K, x, x_ld),
        "launch_gemv_id_geglu: unsupported weights or alignment");
  if (N == 0 || n_slots == 0) return;
  const char* wg = static_cast<const char*>(W_gate);
  const char* wu = static_cast<const char*>(W_up);
  switch (wt) {
#define TANDEM_GEGLU_DENSE(T)                                                                                \
  case DType::T: {                                                                                           \
    const dim3 grid(unsigned((N + kWarpsPerBlock - 1) / kWarpsPerBlock), unsigned(n_slots));                  \
    launch_routed(gemv_dense_id_geglu_kernel<DType::T>, grid, dim3(kWarpsPerBlock * kWarpSize), 0, stream, wg, wu, \
                  w_ld, w_es, K, N, x, x_ld, ids, k, kx, y, y_ld);                                             \
    break;                                                                                                   \
  }
    TANDEM_GEGLU_DENSE(F32)
    TANDEM_GEGLU_DENSE(F16)
    TANDEM_GEGLU_DENSE(BF16)
#undef TANDEM_GEGLU_DENSE
#define TANDEM_GEGLU_QUANT(T)                                                                                   \
  case DType::T: {                                                                                              \
    const QuantColumns xc = quant_columns(scratch, K, n_slots, k, kx);                                          \
    const dim3 grid(unsigned((N + kIdWarps - 1) / kIdWarps), unsigned(n_slots));                                \
    launch_routed(gemv_quant_id_geglu_kernel<DType::T>, grid, dim3(kIdWarps * kWarpSize), 0, stream, wg, wu, w_ld, \
                  w_es, K, N, xc.xq, xc.xds, ids, k, kx, y, y_ld);                                              \
    break;                                                                                                      \
  }
    TANDEM_GEGLU_QUANT(Q8_0)
    TANDEM_GEGLU_QUANT(Q4_K)
    TANDEM_GEGLU_QUANT(Q5_K)
#undef TANDEM_GEGLU_QUANT
    default:
      throw Error(std::string("launch_gemv_id_geglu: unsupported dtype ") + dtype_name(wt));
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_gemv_dense_id(DType wt, const void* W, size_t w_ld, size_t w_es, int64_t K, int64_t N,
                          const float* x, int64_t x_ld, const int32_t* ids, int64_t n_slots, int k, int kx,
                          float* y, int64_t y_ld, cudaStream_t stream) {
  if (N == 0 || n_slots == 0) return;
  const char* w = static_cast<const char*>(W);
  const size_t elem = wt == DType::F32 ? 4 : 2;
  const int64_t per_vec = int64_t(16 / elem);
  const bool vec = aligned16(W) && w_ld % 16 == 0 && w_es % 16 == 0 && K % per_vec == 0 && aligned16(x) &&
                   (x_ld * 4) % 16 == 0;
  const dim3 grid(unsigned((N + kWarpsPerBlock - 1) / kWarpsPerBlock), unsigned(n_slots));
  const int threads = kWarpsPerBlock * kWarpSize;
  switch (wt) {
#define TANDEM_GEMV_ID(T, TAG)                                                               \
  case DType::T:                                                                             \
    if (vec)                                                                                 \
      launch_routed(gemv_dense_id_vec_kernel<DType::T>, grid, dim3(threads), 0, stream, w, w_ld, w_es, K, N, x, \
                    x_ld, ids, k, kx, y, y_ld);                                                             \
    else                                                                                                    \
      launch_routed(gemv_dense_id_scalar_kernel<TAG>, grid, dim3(threads), 0, stream, w, w_ld, w_es, K, N, x,   \
                    x_ld, ids, k, kx, y, y_ld);                                                             \
    break;
    TANDEM_GEMV_ID(F32, F32Tag)
    TANDEM_GEMV_ID(F16, F16Tag)
    TANDEM_GEMV_ID(BF16, BF16Tag)
#undef TANDEM_GEMV_ID
    default:
      throw Error(std::string("launch_gemv_dense_id: not a dense dtype: ") + dtype_name(wt));
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_gemv_quant_id(DType wt, const void* W, size_t w_ld, size_t w_es, int64_t K, int64_t N,
                          const void* scratch, const int32_t* ids, int64_t n_slots, int k, int kx, float* y,
                          int64_t y_ld, cudaStream_t stream) {
  check(gemv_quant_supports(wt, K), std::string("CUDA quantized matrix-vector product: ") + dtype_name(wt) +
                                        " rows of " + std::to_string(K) + " values are not supported");
  if (N == 0 || n_slots == 0) return;
  const char* w = static_cast<const char*>(W);
  if (id_direct_enabled() && id_direct_applies(wt, W, w_ld, w_es, K)) {
    switch (wt) {
      case DType::Q8_0:
        return launch_quant_id_direct<DType::Q8_0>(w, w_ld, w_es, K, N, scratch, ids, n_slots, k, kx, y, y_ld,
                                                   stream);
      case DType::Q4_K:
        return launch_quant_id_direct<DType::Q4_K>(w, w_ld, w_es, K, N, scratch, ids, n_slots, k, kx, y, y_ld,
                                                   stream);
      default:
        return launch_quant_id_direct<DType::Q5_K>(w, w_ld, w_es, K, N, scratch, ids, n_slots, k, kx, y, y_ld,
                                                   stream);
    }
  }
  switch (wt) {
    case DType::Q8_0:
      return launch_quant_id<DType::Q8_0>(w, w_ld, w_es, K, N, scratch, ids, n_slots, k, kx, y, y_ld, stream);
    case DType::Q4_0:
      return launch_quant_id<DType::Q4_0>(w, w_ld, w_es, K, N, scratch, ids, n_slots, k, kx, y, y_ld, stream);
    case DType::Q4_K:
      return launch_quant_id<DType::Q4_K>(w, w_ld, w_es, K, N, scratch, ids, n_slots, k, kx, y, y_ld, stream);
    case DType::Q5_K:
      return launch_quant_id<DType::Q5_K>(w, w_ld, w_es, K, N, scratch, ids, n_slots, k, kx, y, y_ld, stream);
    case DType::Q6_K:
      return launch_quant_id<DType::Q6_K>(w, w_ld, w_es, K, N, scratch, ids, n_slots, k, kx, y, y_ld, stream);
    default:
      throw Error(std::string("launch_gemv_quant_id: not a quantized dtype: ") + dtype_name(wt));
  }
}

}  // namespace tandem::cuda
