// How the direct decode kernel (gemv_quant_direct.cu) takes the bytes of one "piece" of a quantized row apart
// once they sit in registers: a Q8_0 block (32 values) read as the three aligned 16-byte chunks that hold it,
// or a Q4_K / Q5_K sub-block pair (64 values) and its super-block header. Host and device code: the CPU test
// tests/test_quant_pieces.cpp runs these very functions on every offset a lane can meet and compares them with
// the block layouts of quant/blocks.h, so the bit twiddling is checked without a GPU.
//
// Why this file exists: the kernel used to pick words out of the 12 loaded words with a chain of 12 selects per
// word (an indexed register array would go to local memory): about 110 of the ~160 instructions per Q8_0 block
// were selects and compares, so the kernel was bound by instruction issue, not by memory (PTX of the Q8_0
// one-column kernel: 296 selp + 148 setp for 4 blocks). A lane's offset within its chunks takes only four
// word values, so a two-stage shifter (shift by 1 word, then by 2) does the same in 20 selects.
#pragma once

#include <cstdint>

#include "quant/blocks.h"

// `#pragma unroll` in nvcc's device pass; nothing for host compilers (GCC warns about a pragma it does not know,
// also in nvcc's host pass).
#if defined(__CUDA_ARCH__)
#define TANDEM_PIECE_UNROLL _Pragma("unroll")
#else
#define TANDEM_PIECE_UNROLL
#endif

namespace tandem::cuda {

// (hi:lo) >> min(sh, 32), the low 32 bits: __funnelshift_rc on the device.
TANDEM_HOST_DEVICE inline uint32_t funnel_rc(uint32_t lo, uint32_t hi, unsigned sh) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_rc(lo, hi, sh);
#else
  const unsigned s = sh < 32u ? sh : 32u;
  return uint32_t(((uint64_t(hi) << 32) | lo) >> s);
#endif
}

// ---- Q8_0 ---------------------------------------------------------------------------------------------------
// Block p of a row whose start is 16-byte aligned begins at byte 34p: the three 16-byte chunks from byte
// q8_window(p) hold it (34p mod 16 is at most 14, and 14 + 34 <= 48).
TANDEM_HOST_DEVICE constexpr uint32_t q8_window(uint32_t p) {
  return (34u * p) & ~15u;
}
TANDEM_HOST_DEVICE constexpr unsigned q8_offset(uint32_t p) {  // where the block starts in its window: even
  return (34u * p) & 15u;
}

// The block's scale (fp16 bits) and its 32 quants as 8 little-endian words (values 4k .. 4k+3 in word k),
// from the 12 words of its window; off = q8_offset(p).
TANDEM_HOST_DEVICE inline void q8_take(const uint32_t (&w)[12], unsigned off, uint16_t& d_bits,
                                       uint32_t (&q)[8]) {
  // Shift the window left by off / 4 words (0..3) in two stages; then the block starts at byte off % 4 (0 or 2)
  // of word 0. Only the words still needed are kept: 11 after the first stage, 9 after the second.
  const bool s1 = (off & 4u) != 0, s2 = (off & 8u) != 0;
  uint32_t v[11];
TANDEM_PIECE_UNROLL
  for (int k = 0; k < 11; ++k) v[k] = s1 ? w[k + 1] : w[k];
  uint32_t u[9];
TANDEM_PIECE_UNROLL
  for (int k = 0; k < 9; ++k) u[k] = s2 ? v[k + 2] : v[k];
  const bool odd_half = (off & 2u) != 0;  // scale in the high half of word 0, quants word aligned from word 1
  d_bits = uint16_t(odd_half ? u[0] >> 16 : u[0] & 0xffffu);
  const unsigned sh = odd_half ? 32u : 16u;  // 32: the clamped funnel shift gives the next word whole
TANDEM_PIECE_UNROLL
  for (int k = 0; k < 8; ++k) q[k] = funnel_rc(u[k], u[k + 1], sh);
}

// ---- Q4_K / Q5_K --------------------------------------------------------------------------------------------
// The 6-bit scales and mins of sub-blocks 2c and 2c + 1 (c = 0..3, the pair a piece holds) from the three words
// of a super-block's 12 scale bytes, without a byte array (which lived in local memory): quant/blocks.h's
// unpack_scale_min_k4 in registers. Sub-blocks 0..3 keep their 6 bits in bytes j and j + 4; 4..7 split theirs
// between byte j + 4 (low 4 bits) and the top 2 bits of bytes j - 4 and j.
TANDEM_HOST_DEVICE inline void k4_scales_pair(uint32_t s0, uint32_t s1, uint32_t s2, unsigned c, unsigned& sc0,
                                              unsigned& m0, unsigned& sc1, unsigned& m1) {
  const unsigned sh = 16u * (c & 1u);  // sub-block 2c sits at byte (2c) % 4 = 2 (c & 1) of each word
  const uint32_t b0 = s0 >> sh, b1 = s1 >> sh, b2 = s2 >> sh;  // bytes j % 4 (low) and j % 4 + 1 (next)
  const bool high = c >= 2u;                                   // sub-blocks 4..7
  // Low sub-blocks: 6 low bits of bytes j (scale) and j + 4 (min).
  const unsigned lo_sc0 = b0 & 63u, lo_m0 = b1 & 63u;
  const unsigned lo_sc1 = (b0 >> 8) & 63u, lo_m1 = (b1 >> 8) & 63u;
  // High sub-blocks: byte j + 4 gives the low 4 bits of both; bytes j - 4 and j give the top 2 bits.
  const unsigned hi_sc0 = (b2 & 15u) | ((b0 >> 2) & 0x30u), hi_m0 = ((b2 >> 4) & 15u) | ((b1 >> 2) & 0x30u);
  const unsigned hi_sc1 = ((b2 >> 8) & 15u) | ((b0 >> 10) & 0x30u);
  const unsigned hi_m1 = ((b2 >> 12) & 15u) | ((b1 >> 10) & 0x30u);
  sc0 = high ? hi_sc0 : lo_sc0;
  m0 = high ? hi_m0 : lo_m0;
  sc1 = high ? hi_sc1 : lo_sc1;
  m1 = high ? hi_m1 : lo_m1;
}

}  // namespace tandem::cuda
