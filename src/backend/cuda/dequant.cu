// Conversions feeding the tensor-core (cuBLASLt) path of matmul: weights of any dtype to dense bf16/f16 rows,
// and F32 activation columns to bf16/f16. One thread writes 8 consecutive values with one 16-byte store.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/quant_device.cuh"

namespace tandem::cuda {
namespace {

template <bool kF16>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (kF16) {
    return uint32_t(float_to_fp16_bits(a)) | (uint32_t(float_to_fp16_bits(b)) << 16);
  } else {
    return uint32_t(float_to_bf16_bits(a)) | (uint32_t(float_to_bf16_bits(b)) << 16);
  }
}

template <bool kF16>
__device__ __forceinline__ void store8(uint16_t* dst, const float* v) {
  uint4 o;
  o.x = pack2<kF16>(v[0], v[1]);
  o.y = pack2<kF16>(v[2], v[3]);
  o.z = pack2<kF16>(v[4], v[5]);
  o.w = pack2<kF16>(v[6], v[7]);
  *reinterpret_cast<uint4*>(dst) = o;
}

// Element loader of a plain type at index j of a row.
template <DType WT>
__device__ __forceinline__ float load_plain(const uint8_t* row, int64_t j) {
  if constexpr (WT == DType::F32) {
    return reinterpret_cast<const float*>(row)[j];
  } else if constexpr (WT == DType::F16) {
    return fp16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[j]);
  } else {
    return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[j]);
  }
}

// out is dense with rows of K values; K is a multiple of 8 (checked by the launcher).
template <DType WT, bool kF16>
__global__ void dequantize_rows_kernel(const char* __restrict__ W, size_t w_ld, int64_t K, int64_t n_rows,
                                       uint16_t* __restrict__ out) {
  const int64_t per_row = K / 8;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= per_row * n_rows) return;
  const int64_t r = idx / per_row, j0 = (idx % per_row) * 8;
  const uint8_t* row = reinterpret_cast<const uint8_t*>(W + r * w_ld);
  float v[8];
  if constexpr (WT == DType::F32 || WT == DType::F16 || WT == DType::BF16) {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = load_plain<WT>(row, j0 + k);
  } else {
    constexpr int kElems = (WT == DType::Q8_0 || WT == DType::Q4_0) ? 32 : 256;
    const size_t block_bytes = WT == DType::Q8_0   ? 34
                               : WT == DType::Q4_0 ? 18
                               : WT == DType::Q4_K ? 144
                               : WT == DType::Q5_K ? 176
                                                   : 210;
    dequant8<WT>(row + (j0 / kElems) * block_bytes, int(j0 % kElems), v);
  }
  store8<kF16>(out + r * K + j0, v);
}

template <bool kF16>
__global__ void f32_to_16_kernel(const float* __restrict__ x, int64_t x_ld, int64_t K, int64_t T,
                                 uint16_t* __restrict__ out) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= K * T) return;
  const int64_t t = idx / K, i = idx % K;
  const float v = x[t * x_ld + i];
  out[idx] = kF16 ? float_to_fp16_bits(v) : float_to_bf16_bits(v);
}

template <DType WT>
void launch_dq(const void* W, size_t w_ld, int64_t K, int64_t n_rows, void* out, bool to_f16,
               cudaStream_t stream) {
  const int64_t total = K / 8 * n_rows;
  constexpr int kThreads = 256;
  const unsigned grid = unsigned((total + kThreads - 1) / kThreads);
  const char* w = static_cast<const char*>(W);
  uint16_t* o = static_cast<uint16_t*>(out);
  if (to_f16) {
    dequantize_rows_kernel<WT, true><<<grid, kThreads, 0, stream>>>(w, w_ld, K, n_rows, o);
  } else {
    dequantize_rows_kernel<WT, false><<<grid, kThreads, 0, stream>>>(w, w_ld, K, n_rows, o);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_dequantize_rows_16(DType wt, const void* W, size_t w_ld, int64_t K, int64_t n_rows, void* out,
                               bool to_f16, cudaStream_t stream) {
  check(K % 8 == 0, "CUDA dequantize: rows must have a multiple of 8 values, got " + std::to_string(K));
  if (n_rows == 0 || K == 0) return;
  switch (wt) {
    case DType::F32:
      return launch_dq<DType::F32>(W, w_ld, K, n_rows, out, to_f16, stream);
    case DType::F16:
      return launch_dq<DType::F16>(W, w_ld, K, n_rows, out, to_f16, stream);
    case DType::BF16:
      return launch_dq<DType::BF16>(W, w_ld, K, n_rows, out, to_f16, stream);
    case DType::Q8_0:
      return launch_dq<DType::Q8_0>(W, w_ld, K, n_rows, out, to_f16, stream);
    case DType::Q4_0:
      return launch_dq<DType::Q4_0>(W, w_ld, K, n_rows, out, to_f16, stream);
    case DType::Q4_K:
      return launch_dq<DType::Q4_K>(W, w_ld, K, n_rows, out, to_f16, stream);
    case DType::Q5_K:
      return launch_dq<DType::Q5_K>(W, w_ld, K, n_rows, out, to_f16, stream);
    case DType::Q6_K:
      return launch_dq<DType::Q6_K>(W, w_ld, K, n_rows, out, to_f16, stream);
    default:
      throw Error(std::string("CUDA dequantize: unsupported dtype ") + dtype_name(wt));
  }
}

void launch_f32_to_16(const float* x, int64_t x_ld, int64_t K, int64_t T, void* out, bool to_f16,
                      cudaStream_t stream) {
  const int64_t total = K * T;
  if (total == 0) return;
  constexpr int kThreads = 256;
  const unsigned grid = unsigned((total + kThreads - 1) / kThreads);
  uint16_t* o = static_cast<uint16_t*>(out);
  if (to_f16) {
    f32_to_16_kernel<true><<<grid, kThreads, 0, stream>>>(x, x_ld, K, T, o);
  } else {
    f32_to_16_kernel<false><<<grid, kThreads, 0, stream>>>(x, x_ld, K, T, o);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
