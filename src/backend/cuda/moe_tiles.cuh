// Weight-tile loads shared by the two grouped GEMMs of matmul_id (moe.cu: f32 SIMT, any weight type;
// moe_gemm_tc.cu: tensor cores for 16-bit and block-quantized weights): eight values of one weight row as
// f32, decoded in place from the row's bytes (block types through dequant8; only the tile being multiplied is
// ever decoded, never the whole tensor).
#pragma once

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/quant_device.cuh"
#include "core/dtype.h"

namespace tandem::cuda::moe {

// GGUF block sizes and bytes (quant/blocks.h) as compile-time constants.
constexpr int64_t block_size_of(DType t) {
  return t == DType::Q8_0 || t == DType::Q4_0 ? 32 : 256;
}
constexpr size_t block_bytes_of(DType t) {
  return t == DType::Q8_0   ? 34
         : t == DType::Q4_0 ? 18
         : t == DType::Q4_K ? 144
         : t == DType::Q5_K ? 176
                            : 210;
}

// Values j .. j+7 of weight row `row` (j a multiple of 8) as f32.
template <DType WT>
__device__ __forceinline__ void load8(const char* row, int64_t j, float* v) {
  if constexpr (WT == DType::F32) {
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = reinterpret_cast<const float*>(row)[j + q];
  } else if constexpr (WT == DType::F16) {
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = fp16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[j + q]);
  } else if constexpr (WT == DType::BF16) {
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[j + q]);
  } else {
    constexpr int64_t bs = block_size_of(WT);
    constexpr size_t bb = block_bytes_of(WT);
    dequant8<WT>(reinterpret_cast<const uint8_t*>(row) + size_t(j / bs) * bb, int(j % bs), v);
  }
}

}  // namespace tandem::cuda::moe
