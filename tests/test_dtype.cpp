#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

using namespace tandem;

TEST(DType, BlockSizesMatchGguf) {
  EXPECT_EQ(dtype_block_bytes(DType::Q4_0), 18u);
  EXPECT_EQ(dtype_block_bytes(DType::Q8_0), 34u);
  EXPECT_EQ(dtype_block_bytes(DType::Q4_K), 144u);
  EXPECT_EQ(dtype_block_bytes(DType::Q5_K), 176u);
  EXPECT_EQ(dtype_block_bytes(DType::Q6_K), 210u);
  EXPECT_EQ(dtype_block_size(DType::Q4_K), 256);
  EXPECT_EQ(dtype_row_bytes(DType::Q8_0, 64), 68u);
  EXPECT_THROW(dtype_row_bytes(DType::Q8_0, 33), tandem::Error);
  EXPECT_EQ(dtype_from_name("Q4_K"), DType::Q4_K);
  EXPECT_FALSE(dtype_from_name("q3_k").has_value());
  EXPECT_FALSE(dtype_is_supported(10));
}

TEST(Half, Fp16KnownValues) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(5.9604645e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_fp32(0xc040), -3.0f);
}

TEST(Half, Fp16RoundTripIsNearest) {
  // Every fp16 value converts to float and back to itself.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff)) continue;  // nan payloads
    EXPECT_EQ(fp32_to_fp16(fp16_to_fp32(uint16_t(h))), h) << h;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 10.f);
  for (int i = 0; i < 10000; ++i) {
    float x = nd(rng);
    float y = fp16_to_fp32(fp32_to_fp16(x));
    EXPECT_LE(std::fabs(x - y), std::fabs(x) * (1.0f / 2048.0f) + 6e-8f);
  }
}
