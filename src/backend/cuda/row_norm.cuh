// How a row's RMS norm is reduced on CUDA, shared by every kernel that norms a row (rms_norm's two kernels in
// elementwise.cu, the fused post-norm residual kernel in post_norm.cu), so that a fused kernel's values equal
// the unfused ops' bit for bit: the same threads sum the same elements in the same order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_utils.cuh"

namespace tandem::cuda {

// Rows of at least kBlockNormMin values (the hidden state) are normed by a block of kBlockNormThreads threads;
// shorter rows (heads) by one warp. Chosen by the row length only, so a row's result does not depend on how
// many rows come with it.
constexpr int64_t kBlockNormMin = 1024;
constexpr int kBlockNormThreads = 256;

// sum_i x[i]^2 over a row of n values, every participating thread getting the result. kBlock: the block's
// threads stride over the row (blockDim.x threads, all of them must call: block_sum synchronizes); otherwise the
// 32 lanes of the calling warp.
template <bool kBlock>
__device__ __forceinline__ float row_sum_squares(const float* xr, int64_t n, float* red) {
  float ss = 0.0f;
  if constexpr (kBlock) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    return block_sum(ss, red);
  } else {
    for (int64_t i = threadIdx.x % kWarpSize; i < n; i += kWarpSize) ss += xr[i] * xr[i];
    return warp_sum(ss);
  }
}

// A row held in registers (the kernels whose loops would otherwise store as they go, one memory latency an
// element: post_norm.cu, attn_inputs.cu): a thread's values first, first + kStride, ... (kPer of them, 0 past
// n), every load issued at once, and their sum of squares in that order: the thread's part of
// row_sum_squares (kStride = the block's threads or the warp's 32), for block_sum / warp_sum to finish.
// Index: the type of the element indices (the callers' own, so that their address arithmetic stays as it
// was).
template <int kPer, int kStride, class Index>
__device__ __forceinline__ void load_row_strided(const float* p, Index n, int first, float (&v)[kPer]) {
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const Index i = first + Index(e) * kStride;
    v[e] = i < n ? p[i] : 0.0f;
  }
}

template <int kPer, int kStride, class Index>
__device__ __forceinline__ float strided_sum_squares(const float (&v)[kPer], Index n, int first) {
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < kPer; ++e)
    if (first + Index(e) * kStride < n) ss += v[e] * v[e];
  return ss;
}

// 1 / rms: the factor every value of the row is multiplied by (then by its weight, if any).
__device__ __forceinline__ float rms_inverse(float ss, int64_t n, float eps) {
  return 1.0f / sqrtf(ss / float(n) + eps);
}

}  // namespace tandem::cuda
