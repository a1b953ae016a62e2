// Device-side decoding of the GGUF block types (layouts: quant/blocks.h, GGUF-ARCH-FACTS A.7), eight values
// at a time, for get_rows and the dequantize-to-16-bit path. The integer-dot-product decoders used by the
// matrix-vector kernels are in gemv_quant.cu.
#pragma once

#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "core/dtype.h"
#include "quant/blocks.h"

namespace tandem::cuda {

// Values j0 .. j0+7 (j0 a multiple of 8, inside the block) of the block at blk, to out[0..7].
template <DType QT>
__device__ __forceinline__ void dequant8(const uint8_t* blk, int j0, float* out) {
  using namespace tandem::quant;
  if constexpr (QT == DType::Q8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(blk);
    const float d = fp16_bits_to_float(b->d);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = d * float(b->qs[j0 + k]);
  } else if constexpr (QT == DType::Q4_0) {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(blk);
    const float d = fp16_bits_to_float(b->d);
    const int shift = j0 < 16 ? 0 : 4;
    const int base = j0 % 16;
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = d * float(((b->qs[base + k] >> shift) & 0xF) - 8);
  } else if constexpr (QT == DType::Q4_K || QT == DType::Q5_K) {
    const uint8_t* scales;
    const uint8_t* qs;
    const uint8_t* qh = nullptr;
    uint16_t dbits, mbits;
    if constexpr (QT == DType::Q4_K) {
      const auto* b = reinterpret_cast<const BlockQ4_K*>(blk);
      scales = b->scales;
      qs = b->qs;
      dbits = b->d;
      mbits = b->dmin;
    } else {
      const auto* b = reinterpret_cast<const BlockQ5_K*>(blk);
      scales = b->scales;
      qs = b->qs;
      qh = b->qh;
      dbits = b->d;
      mbits = b->dmin;
    }
    const int s = j0 / 32;  // sub-block
    const int c = s / 2, shift = 4 * (s & 1);
    uint8_t sc, m;
    unpack_scale_min_k4(scales, s, sc, m);
    const float a = fp16_bits_to_float(dbits) * float(sc);
    const float bias = fp16_bits_to_float(mbits) * float(m);
    const int l0 = j0 % 32;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      int q = (qs[32 * c + l0 + k] >> shift) & 0xF;
      if constexpr (QT == DType::Q5_K) q |= ((qh[l0 + k] >> s) & 1) << 4;
      out[k] = a * float(q) - bias;
    }
  } else if constexpr (QT == DType::Q6_K) {
    const auto* b = reinterpret_cast<const BlockQ6_K*>(blk);
    const float d = fp16_bits_to_float(b->d);
    const float a = d * float(b->scales[j0 / 16]);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = a * float(q6_k_level(*b, j0 + k) - 32);
  }
}

}  // namespace tandem::cuda
