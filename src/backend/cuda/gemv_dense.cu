// Matrix-vector products for decode with F32/F16/BF16 weights: y[o, t] = sum_i W[i, o] x[i, t] for a few
// columns t. Decode is bound by reading W once, so each warp streams one row of W with 16-byte loads, several
// in flight per lane (kUnroll), evict-first so that x stays in L1; x is read through the read-only cache and
// shared by all rows. Columns are a template parameter (1..8) so that the accumulators stay in registers.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Eight (16-bit types) or four (F32) weights of one 16-byte load, as floats.
template <DType WT>
struct Vec16 {
  static constexpr int kElems = WT == DType::F32 ? 4 : 8;
  static __device__ __forceinline__ void unpack(const uint4& v, float* w) {
    if constexpr (WT == DType::F32) {
      w[0] = __uint_as_float(v.x);
      w[1] = __uint_as_float(v.y);
      w[2] = __uint_as_float(v.z);
      w[3] = __uint_as_float(v.w);
    } else {
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (WT == DType::BF16) {
          w[2 * k] = __uint_as_float(u[k] << 16);
          w[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
        } else {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[k]));
          w[2 * k] = f.x;
          w[2 * k + 1] = f.y;
        }
      }
    }
  }
};

template <DType WT, int NC>
__device__ __forceinline__ void accumulate(const uint4& wv, int64_t e, const float* __restrict__ x,
                                           int64_t x_ld, float* acc) {
  constexpr int kE = Vec16<WT>::kElems;
  float w[kE];
  Vec16<WT>::unpack(wv, w);
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const float4* xp = reinterpret_cast<const float4*>(x + c * x_ld + e);
#pragma unroll
    for (int k = 0; k < kE / 4; ++k) {
      const float4 xv = __ldg(xp + k);
      acc[c] += w[4 * k] * xv.x + w[4 * k + 1] * xv.y + w[4 * k + 2] * xv.z + w[4 * k + 3] * xv.w;
    }
  }
}

// Vector path: W rows and x columns 16-byte aligned, K a multiple of the elements per load.
template <DType WT, int NC>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize)
    gemv_dense_vec_kernel(const char* __restrict__ W, size_t w_ld, int64_t K, int64_t N,
                          const float* __restrict__ x, int64_t x_ld, float* __restrict__ y, int64_t y_ld,
                          const int32_t* __restrict__ ids = nullptr, size_t w_es = 0, int k = 1, int kx = 1) {
  constexpr int kE = Vec16<WT>::kElems;
  if (ids) {  // matmul_id: routed row s = blockIdx.y reads its expert's rows and its input column (NC == 1)
    const int64_t s = blockIdx.y;
    W += size_t(ids[s]) * w_es;
    x += ((s / k) * kx + (kx == 1 ? 0 : s % k)) * x_ld;
    y += s * y_ld;
  }
  constexpr int kUnroll = NC <= 2 ? 8 : 4;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const uint4* wrow = reinterpret_cast<const uint4*>(W + row * w_ld);
  const int64_t n_vec = K / kE;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.0f;

  int64_t v = lane;
  for (; v + (kUnroll - 1) * kWarpSize < n_vec; v += kUnroll * kWarpSize) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wrow + v + u * kWarpSize);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) accumulate<WT, NC>(wv[u], (v + u * kWarpSize) * kE, x, x_ld, acc);
  }
  for (; v < n_vec; v += kWarpSize) accumulate<WT, NC>(__ldcs(wrow + v), v * kE, x, x_ld, acc);

#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const float s = warp_sum(acc[c]);
    if (lane == 0) y[c * y_ld + row] = s;
  }
}

// Scalar path for any alignment and K: one warp per (row, column).
template <class Tag>
__global__ void gemv_dense_scalar_kernel(const char* __restrict__ W, size_t w_ld, int64_t K, int64_t N,
                                         const float* __restrict__ x, int64_t x_ld, float* __restrict__ y,
                                         int64_t y_ld, const int32_t* __restrict__ ids = nullptr,
                                         size_t w_es = 0, int k = 1, int kx = 1) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  int64_t c = blockIdx.y;
  if (ids) {  // matmul_id: routed row s = blockIdx.y
    const int64_t s = blockIdx.y;
    W += size_t(ids[s]) * w_es;
    x += ((s / k) * kx + (kx == 1 ? 0 : s % k)) * x_ld;
    y += s * y_ld;
    c = 0;
  }
  if (row >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const auto* wrow = reinterpret_cast<const typename Tag::storage*>(W + row * w_ld);
  const float* xc = x + c * x_ld;
  float acc = 0.0f;
  for (int64_t i = lane; i < K; i += kWarpSize) acc += Tag::load(wrow + i) * xc[i];
  acc = warp_sum(acc);
  if (lane == 0) y[c * y_ld + row] = acc;
}

template <DType WT>
void launch_vec(const char* W, size_t w_ld, int64_t K, int64_t N, const float* x, int64_t x_ld, int64_t T,
                float* y, int64_t y_ld, cudaStream_t stream) {
  const unsigned grid = unsigned((N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int threads = kWarpsPerBlock * kWarpSize;
  for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxCols) {
    const int nc = int(std::min<int64_t>(kGemvMaxCols, T - t0));
    const float* xs = x + t0 * x_ld;
    float* ys = y + t0 * y_ld;
    switch (nc) {
#define TANDEM_GEMV_CASE(n)                                                                        \
  case n:                                                                                          \
    gemv_dense_vec_kernel<WT, n><<<grid, threads, 0, stream>>>(W, w_ld, K, N, xs, x_ld, ys, y_ld); \
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

template <class Tag>
void launch_scalar(const char* W, size_t w_ld, int64_t K, int64_t N, const float* x, int64_t x_ld, int64_t T,
                   float* y, int64_t y_ld, cudaStream_t stream) {
  const dim3 grid(unsigned((N + kWarpsPerBlock - 1) / kWarpsPerBlock), unsigned(T));
  gemv_dense_scalar_kernel<Tag>
      <<<grid, kWarpsPerBlock * kWarpSize, 0, stream>>>(W, w_ld, K, N, x, x_ld, y, y_ld);
  TANDEM_CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

void launch_gemv_dense(DType wt, const void* W, size_t w_ld, int64_t K, int64_t N, const float* x,
                       int64_t x_ld, int64_t T, float* y, int64_t y_ld, cudaStream_t stream) {
  if (N == 0 || T == 0) return;
  const char* w = static_cast<const char*>(W);
  const size_t elem = wt == DType::F32 ? 4 : 2;
  const int64_t per_vec = int64_t(16 / elem);
  const bool vec =
      aligned16(W) && w_ld % 16 == 0 && K % per_vec == 0 && aligned16(x) && (T == 1 || (x_ld * 4) % 16 == 0);
  switch (wt) {
    case DType::F32:
      return vec ? launch_vec<DType::F32>(w, w_ld, K, N, x, x_ld, T, y, y_ld, stream)
                 : launch_scalar<F32Tag>(w, w_ld, K, N, x, x_ld, T, y, y_ld, stream);
    case DType::F16:
      return vec ? launch_vec<DType::F16>(w, w_ld, K, N, x, x_ld, T, y, y_ld, stream)
                 : launch_scalar<F16Tag>(w, w_ld, K, N, x, x_ld, T, y, y_ld, stream);
    case DType::BF16:
      return vec ? launch_vec<DType::BF16>(w, w_ld, K, N, x, x_ld, T, y, y_ld, stream)
                 : launch_scalar<BF16Tag>(w, w_ld, K, N, x, x_ld, T, y, y_ld, stream);
    default:
      throw Error(std::string("launch_gemv_dense: not a dense dtype: ") + dtype_name(wt));
  }
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
      gemv_dense_vec_kernel<DType::T, 1>                                                     \
          <<<grid, threads, 0, stream>>>(w, w_ld, K, N, x, x_ld, y, y_ld, ids, w_es, k, kx); \
    else                                                                                     \
      gemv_dense_scalar_kernel<TAG>                                                          \
          <<<grid, threads, 0, stream>>>(w, w_ld, K, N, x, x_ld, y, y_ld, ids, w_es, k, kx); \
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

}  // namespace tandem::cuda
