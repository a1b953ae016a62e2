// The byte picking of the CUDA direct decode kernel (src/backend/cuda/quant_pieces.h), run on the CPU: the same
// functions the kernel inlines, compared with the block layouts of quant/blocks.h on random bytes, at every
// offset a lane can meet. A GPU is not needed to find a wrong shift or a wrong byte here.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/quant_pieces.h"
#include "quant/blocks.h"

namespace {

using tandem::cuda::funnel_rc;
using tandem::cuda::k4_scales_pair;
using tandem::cuda::q8_offset;
using tandem::cuda::q8_take;
using tandem::cuda::q8_window;

uint32_t le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

TEST(QuantPieces, FunnelShiftClampsAt32) {
  EXPECT_EQ(funnel_rc(0x44332211u, 0x88776655u, 0), 0x44332211u);
  EXPECT_EQ(funnel_rc(0x44332211u, 0x88776655u, 8), 0x55443322u);
  EXPECT_EQ(funnel_rc(0x44332211u, 0x88776655u, 16), 0x66554433u);
  EXPECT_EQ(funnel_rc(0x44332211u, 0x88776655u, 32), 0x88776655u);
  EXPECT_EQ(funnel_rc(0x44332211u, 0x88776655u, 40), 0x88776655u);  // clamped, as __funnelshift_rc
}

// A row of Q8_0 blocks starting 16-byte aligned (as the kernel requires): for every block, the 12 words of its
// window give back the block's scale and quants, whatever its offset in the window (all 8 offsets occur).
TEST(QuantPieces, Q8TakeGivesEveryBlocksScaleAndQuants) {
  std::mt19937 rng(1234);
  for (int n_blocks : {8, 72, 128}) {  // rows of K = 256, 2304 and 4096 values
    const size_t row_bytes = size_t(n_blocks) * sizeof(tandem::quant::BlockQ8_0);
    ASSERT_EQ(row_bytes % 16, 0u);
    alignas(16) std::vector<uint8_t> row(row_bytes);
    for (auto& b : row) b = uint8_t(rng());
    std::vector<int> offsets_seen(16, 0);
    for (uint32_t p = 0; p < uint32_t(n_blocks); ++p) {
      const uint32_t w0 = q8_window(p);
      ASSERT_EQ(w0 % 16, 0u);
      ASSERT_LE(w0 + 48, row_bytes) << "block " << p << ": the window passes the row's end";
      uint32_t w[12];
      for (int k = 0; k < 12; ++k) w[k] = le32(row.data() + w0 + 4 * k);
      const unsigned off = q8_offset(p);
      ++offsets_seen[off];
      uint16_t d_bits = 0;
      uint32_t q[8];
      q8_take(w, off, d_bits, q);

      tandem::quant::BlockQ8_0 blk;
      std::memcpy(&blk, row.data() + 34 * size_t(p), sizeof(blk));
      EXPECT_EQ(d_bits, blk.d) << "block " << p;
      for (int k = 0; k < 8; ++k) {
        uint32_t want = 0;
        for (int e = 0; e < 4; ++e) want |= uint32_t(uint8_t(blk.qs[4 * k + e])) << (8 * e);
        EXPECT_EQ(q[k], want) << "block " << p << " word " << k;
      }
    }
    for (unsigned off = 0; off < 16; off += 2) EXPECT_GT(offsets_seen[off], 0) << "offset " << off;
  }
}

// The 6-bit scales and mins of each sub-block pair, from the three words of random scale bytes, against
// quant/blocks.h's unpack_scale_min_k4.
TEST(QuantPieces, K4ScalesPairMatchesUnpackScaleMinK4) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 20000; ++trial) {
    uint8_t scales[tandem::quant::kKScaleSize];
    for (auto& b : scales) b = uint8_t(rng());
    const uint32_t s0 = le32(scales), s1 = le32(scales + 4), s2 = le32(scales + 8);
    for (unsigned c = 0; c < 4; ++c) {
      unsigned sc0 = 0, m0 = 0, sc1 = 0, m1 = 0;
      k4_scales_pair(s0, s1, s2, c, sc0, m0, sc1, m1);
      uint8_t want_sc0, want_m0, want_sc1, want_m1;
      tandem::quant::unpack_scale_min_k4(scales, int(2 * c), want_sc0, want_m0);
      tandem::quant::unpack_scale_min_k4(scales, int(2 * c + 1), want_sc1, want_m1);
      ASSERT_EQ(sc0, want_sc0) << "pair " << c;
      ASSERT_EQ(m0, want_m0) << "pair " << c;
      ASSERT_EQ(sc1, want_sc1) << "pair " << c;
      ASSERT_EQ(m1, want_m1) << "pair " << c;
    }
  }
}

}  // namespace
