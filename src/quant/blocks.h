// The GGUF block types, bit for bit (../shared/GGUF-ARCH-FACTS.md A.7). Every CPU and CUDA kernel that reads
// quantized weights uses these structs and helpers; src/quant/quant.cpp holds the reference (de)quantizers.
//
// d and dmin are IEEE fp16 bit patterns (core/half.h converts them). All multi-byte fields are little-endian,
// which is what every platform tandem runs on uses; the static_asserts pin sizes and offsets to the format.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem::quant {

constexpr int kQK4_0 = 32;       // weights per Q4_0 block
constexpr int kQK8_0 = 32;       // weights per Q8_0 block
constexpr int kQK_K = 256;       // weights per K-quant super-block
constexpr int kKScaleSize = 12;  // bytes of packed 6-bit scales and mins in Q4_K / Q5_K

// Q4_0: value = d * (nibble - 8). qs[j] low nibble = weight j, high nibble = weight j + 16.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];
};

// Q8_0: value = d * qs[j].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};

// Q4_K: 8 sub-blocks of 32; value = d * sc_s * q - dmin * m_s with 6-bit sc_s, m_s packed in scales[12]
// (see unpack_scale_min_k4). qs[32c + l]: low nibble = weight 64c + l, high nibble = weight 64c + 32 + l.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qs[kQK_K / 2];
};

// Q5_K: as Q4_K plus a fifth bit per weight: bit s of qh[l] is the high bit of weight 32s + l.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};

// Q6_K: 16 groups of 16; value = d * scales[o / 16] * (q - 32), q 6 bits split into ql (low 4) and qh (high
// 2). Note that d comes last. See q6_k_level for the bit positions.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18 && offsetof(BlockQ4_0, qs) == 2, "Q4_0 block layout");
static_assert(sizeof(BlockQ8_0) == 34 && offsetof(BlockQ8_0, qs) == 2, "Q8_0 block layout");
static_assert(sizeof(BlockQ4_K) == 144 && offsetof(BlockQ4_K, dmin) == 2 &&
                  offsetof(BlockQ4_K, scales) == 4 && offsetof(BlockQ4_K, qs) == 16,
              "Q4_K block layout");
static_assert(sizeof(BlockQ5_K) == 176 && offsetof(BlockQ5_K, scales) == 4 && offsetof(BlockQ5_K, qh) == 16 &&
                  offsetof(BlockQ5_K, qs) == 48,
              "Q5_K block layout");
static_assert(sizeof(BlockQ6_K) == 210 && offsetof(BlockQ6_K, qh) == 128 &&
                  offsetof(BlockQ6_K, scales) == 192 && offsetof(BlockQ6_K, d) == 208,
              "Q6_K block layout");

// 6-bit scale sc and min m of sub-block s (0..7) from the 12 packed bytes of Q4_K / Q5_K.
// Sub-blocks 0..3 keep their 6 bits in the low bits of bytes s and s + 4; sub-blocks 4..7 keep their low
// 4 bits in the nibbles of byte s + 4 and their top 2 bits in the top bits of bytes s - 4 (scale) and s
// (min).
TANDEM_HOST_DEVICE inline void unpack_scale_min_k4(const uint8_t* scales, int s, uint8_t& sc, uint8_t& m) {
  if (s < 4) {
    sc = scales[s] & 63;
    m = scales[s + 4] & 63;
  } else {
    sc = uint8_t((scales[s + 4] & 0x0F) | ((scales[s - 4] >> 6) << 4));
    m = uint8_t((scales[s + 4] >> 4) | ((scales[s] >> 6) << 4));
  }
}

// Inverse of unpack_scale_min_k4 for all 8 sub-blocks at once; sc[s], m[s] must be < 64.
TANDEM_HOST_DEVICE inline void pack_scales_mins_k4(const uint8_t* sc, const uint8_t* m, uint8_t* scales) {
  for (int s = 0; s < 4; ++s) {
    scales[s] = uint8_t((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
    scales[s + 4] = uint8_t((m[s] & 63) | ((m[s + 4] >> 4) << 6));
    scales[s + 8] = uint8_t((sc[s + 4] & 0x0F) | ((m[s + 4] & 0x0F) << 4));
  }
}

// 6-bit level (0..63) of weight o (0..255) of a Q6_K block. Half h = o / 128 uses ql[64h..], qh[32h..];
// within it, quarter k = (o % 128) / 32 and lane l = o % 32 read the low nibble (k even) or high nibble (k
// odd) of ql[64h + l + 32 (k & 1)] and bits 2k, 2k+1 of qh[32h + l].
TANDEM_HOST_DEVICE inline int q6_k_level(const BlockQ6_K& b, int o) {
  const int h = o / 128, k = (o % 128) / 32, l = o % 32;
  const uint8_t lo_byte = b.ql[64 * h + l + 32 * (k & 1)];
  const int lo = (k < 2) ? (lo_byte & 0x0F) : (lo_byte >> 4);
  const int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
  return lo | (hi << 4);
}

}  // namespace tandem::quant
