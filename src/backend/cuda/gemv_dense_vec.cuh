// Unpacking of one 16-byte load of dense weights (F32, F16, BF16) to floats, for the dense matrix-vector
// kernels (gemv_dense.cu, gemv_id.cu).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"

namespace tandem::cuda {

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

}  // namespace tandem::cuda
