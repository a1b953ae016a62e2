// Integer-dot-product decoding of the GGUF block types for the quantized matrix-vector kernels
// (gemv_quant.cu, gemv_id.cu): one 32-value sub-block of a row held in shared memory at a time. Layouts:
// quant/blocks.h, GGUF-ARCH-FACTS A.7.
#pragma once

#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "core/dtype.h"
#include "quant/blocks.h"

namespace tandem::cuda {

// ---- per-type decoding of one 32-value sub-block i of a row held in shared memory -------------------------
// Produces 8 packed int8x4 weights w (values in the order of the 32 activations), and a0, a1, bias such that
// sum_j W_j x_j ~= d_x * (a0 * dot(w[0..3], xq[0..15]) + a1 * dot(w[4..7], xq[16..31])) + bias * (d_x sum
// xq).
struct SubBlock {
  int w[8];
  float a0, a1, bias;
};

// N consecutive unaligned 32-bit values at p of shared memory from N + 1 aligned words (N + 1 shared loads
// and N funnel shifts; load_u32_unaligned reads two words per value). Needs the 4 bytes of padding after the
// buffer that load_u32_unaligned needs too.
template <int N>
__device__ __forceinline__ void load_u32s_unaligned(const uint8_t* p, uint32_t (&out)[N]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  const unsigned sh = unsigned(a & 3) * 8u;
  uint32_t prev = w[0];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const uint32_t next = w[k + 1];
    out[k] = __funnelshift_r(prev, next, sh);
    prev = next;
  }
}

// A16: the row starts 16-byte aligned in shared memory (a Q4_K / Q5_K row whose tensor is aligned: their 144-
// and 176-byte blocks keep every block aligned). Then the 32 quant bytes of a sub-block pair are two 16-byte
// shared loads instead of eight unaligned 32-bit reads of two loads and a funnel shift each.
template <DType QT, bool A16 = false>
__device__ __forceinline__ SubBlock decode_sub_block(const uint8_t* row, int64_t i) {
  SubBlock r;
  if constexpr (A16 && (QT == DType::Q4_K || QT == DType::Q5_K)) {
    constexpr int kBytes = QT == DType::Q4_K ? 144 : 176;
    constexpr int kQs = QT == DType::Q4_K ? 16 : 48;
    const uint8_t* b = row + (i / 8) * kBytes;
    const int s = int(i % 8), c = s / 2, shift = 4 * (s & 1);
    const uint32_t dd = *reinterpret_cast<const uint32_t*>(b);
    const float d = fp16_bits_to_float(uint16_t(dd & 0xffffu));
    const float dmin = fp16_bits_to_float(uint16_t(dd >> 16));
    uint8_t sc, m;
    quant::unpack_scale_min_k4(b + 4, s, sc, m);
    const uint4* qv = reinterpret_cast<const uint4*>(b + kQs + 32 * c);
    const uint4 q0 = qv[0], q1 = qv[1];
    const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    uint32_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if constexpr (QT == DType::Q5_K) {
      const uint4* hv = reinterpret_cast<const uint4*>(b + 16);
      const uint4 h0 = hv[0], h1 = hv[1];
      const uint32_t hh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) h[k] = ((hh[k] >> s) & 0x01010101u) << 4;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) r.w[k] = int(((q[k] >> shift) & 0x0F0F0F0Fu) | h[k]);
    r.a0 = r.a1 = d * float(sc);
    r.bias = -dmin * float(m);
    return r;
  }
  if constexpr (QT == DType::Q8_0) {
    const uint8_t* b = row + i * 34;
    const float d = fp16_bits_to_float(load_u16_unaligned(b));
    uint32_t q[8];
    load_u32s_unaligned<8>(b + 2, q);
#pragma unroll
    for (int k = 0; k < 8; ++k) r.w[k] = int(q[k]);
    r.a0 = r.a1 = d;
    r.bias = 0.0f;
  } else if constexpr (QT == DType::Q4_0) {
    const uint8_t* b = row + i * 18;
    const float d = fp16_bits_to_float(load_u16_unaligned(b));
    uint32_t q4[4];
    load_u32s_unaligned<4>(b + 2, q4);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t q = q4[k];
      r.w[k] = int(q & 0x0F0F0F0Fu);             // values 4k .. 4k+3
      r.w[4 + k] = int((q >> 4) & 0x0F0F0F0Fu);  // values 16 + 4k ..
    }
    r.a0 = r.a1 = d;
    r.bias = -8.0f * d;
  } else if constexpr (QT == DType::Q4_K || QT == DType::Q5_K) {
    constexpr int kBytes = QT == DType::Q4_K ? 144 : 176;
    constexpr int kQs = QT == DType::Q4_K ? 16 : 48;
    const uint8_t* b = row + (i / 8) * kBytes;
    const int s = int(i % 8), c = s / 2, shift = 4 * (s & 1);
    const float d = fp16_bits_to_float(load_u16_unaligned(b));
    const float dmin = fp16_bits_to_float(load_u16_unaligned(b + 2));
    uint8_t sc, m;
    quant::unpack_scale_min_k4(b + 4, s, sc, m);
    uint32_t qw[8], hw[8];
    load_u32s_unaligned<8>(b + kQs + 32 * c, qw);
    if constexpr (QT == DType::Q5_K) load_u32s_unaligned<8>(b + 16, hw);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      uint32_t q = (qw[k] >> shift) & 0x0F0F0F0Fu;
      if constexpr (QT == DType::Q5_K) q |= ((hw[k] >> s) & 0x01010101u) << 4;
      r.w[k] = int(q);
    }
    r.a0 = r.a1 = d * float(sc);
    r.bias = -dmin * float(m);
  } else if constexpr (QT == DType::Q6_K) {
    const uint8_t* b = row + (i / 8) * 210;
    const int s = int(i % 8), h = s / 4, kq = s % 4;
    const float d = fp16_bits_to_float(load_u16_unaligned(b + 208));
    const uint8_t* ql = b + 64 * h + 32 * (kq & 1);
    const uint8_t* qh = b + 128 + 32 * h;
    const int lo_shift = 4 * (kq >> 1), hi_shift = 2 * kq;
    uint32_t lw[8], hw[8];
    load_u32s_unaligned<8>(ql, lw);
    load_u32s_unaligned<8>(qh, hw);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t lo = (lw[k] >> lo_shift) & 0x0F0F0F0Fu;
      const uint32_t hi = ((hw[k] >> hi_shift) & 0x03030303u) << 4;
      r.w[k] = int(__vsubss4(lo | hi, 0x20202020u));  // level - 32, in -32 .. 31
    }
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    r.a0 = d * float(scales[8 * h + 2 * kq]);
    r.a1 = d * float(scales[8 * h + 2 * kq + 1]);
    r.bias = 0.0f;
  }
  return r;
}

}  // namespace tandem::cuda
