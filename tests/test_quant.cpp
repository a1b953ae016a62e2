// Reference quantizers and dequantizers (src/quant): bit layouts from hand-built blocks, error bounds on
// random data, stability, float conversions, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/fit.h"
#include "quant/quant.h"

using namespace tandem;
using namespace tandem::quant;

namespace {

std::vector<float> normal_data(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

std::vector<uint8_t> quantize(DType t, const std::vector<float>& x, const float* importance = nullptr) {
  std::vector<uint8_t> q(dtype_row_bytes(t, int64_t(x.size())));
  quantize_row(t, x.data(), q.data(), int64_t(x.size()), importance);
  return q;
}

std::vector<float> dequantize(DType t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(t, q.data(), y.data(), n);
  return y;
}

double roundtrip_error(DType t, const std::vector<float>& x) {
  const auto y = dequantize(t, quantize(t, x), int64_t(x.size()));
  return relative_rms_error(x.data(), y.data(), int64_t(x.size()));
}

double naive_error(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(dtype_row_bytes(t, int64_t(x.size())));
  quantize_row_naive(t, x.data(), q.data(), int64_t(x.size()));
  const auto y = dequantize(t, q, int64_t(x.size()));
  return relative_rms_error(x.data(), y.data(), int64_t(x.size()));
}

constexpr uint16_t kHalf = 0x3800;     // 0.5 in fp16
constexpr uint16_t kOne = 0x3c00;      // 1.0
constexpr uint16_t kQuarter = 0x3400;  // 0.25

const DType kQuantTypes[] = {DType::Q8_0, DType::Q6_K, DType::Q5_K, DType::Q4_K, DType::Q4_0};

}  // namespace

// ---- bit layouts: blocks built byte by byte, values checked against A.7 of the facts file
// -------------------

TEST(QuantLayout, StructSizesMatchDTypeTraits) {
  EXPECT_EQ(sizeof(BlockQ4_0), dtype_block_bytes(DType::Q4_0));
  EXPECT_EQ(sizeof(BlockQ8_0), dtype_block_bytes(DType::Q8_0));
  EXPECT_EQ(sizeof(BlockQ4_K), dtype_block_bytes(DType::Q4_K));
  EXPECT_EQ(sizeof(BlockQ5_K), dtype_block_bytes(DType::Q5_K));
  EXPECT_EQ(sizeof(BlockQ6_K), dtype_block_bytes(DType::Q6_K));
}

TEST(QuantLayout, Q4_0KnownBlock) {
  uint8_t b[18] = {};
  std::memcpy(b, &kHalf, 2);  // d = 0.5
  b[2 + 0] = 0x1F;            // weight 0: nibble 15, weight 16: nibble 1
  b[2 + 15] = 0x80;           // weight 15: nibble 0, weight 31: nibble 8
  b[2 + 7] = 0x3C;            // weight 7: nibble 12, weight 23: nibble 3
  float y[32];
  dequantize_row(DType::Q4_0, b, y, 32);
  EXPECT_EQ(y[0], 3.5f);    // 0.5 * (15 - 8)
  EXPECT_EQ(y[16], -3.5f);  // 0.5 * (1 - 8)
  EXPECT_EQ(y[15], -4.0f);  // 0.5 * (0 - 8)
  EXPECT_EQ(y[31], 0.0f);   // 0.5 * (8 - 8)
  EXPECT_EQ(y[7], 2.0f);    // 0.5 * (12 - 8)
  EXPECT_EQ(y[23], -2.5f);  // 0.5 * (3 - 8)
  EXPECT_EQ(y[1], -4.0f);   // untouched byte: nibble 0
}

TEST(QuantLayout, Q8_0KnownBlock) {
  uint8_t b[34] = {};
  std::memcpy(b, &kQuarter, 2);  // d = 0.25
  b[2 + 0] = 0x80;               // -128
  b[2 + 31] = 0x7F;              // 127
  b[2 + 5] = 0xFD;               // -3
  float y[32];
  dequantize_row(DType::Q8_0, b, y, 32);
  EXPECT_EQ(y[0], -32.0f);
  EXPECT_EQ(y[31], 31.75f);
  EXPECT_EQ(y[5], -0.75f);
  EXPECT_EQ(y[6], 0.0f);
}

namespace {

// The packed scales of the Q4_K / Q5_K test blocks:
//   sub-block 0: sc 1,  m 2  (low 6 bits of bytes 0 and 4)
//   sub-block 1: sc 7,  m 9  (bytes 1 and 5, whose top bits carry sub-block 5's high bits)
//   sub-block 5: sc 51 = 0b11'0011, m 37 = 0b10'0101: low nibbles in byte 9 (0x53), top 2 bits of sc in byte
//   1
//                (0b11 -> 0xC0), of m in byte 5 (0b10 -> 0x80)
//   sub-block 7: sc 60 = 0b11'1100, m 17 = 0b01'0001: byte 11 = 0x1C, byte 3 top bits 0b11, byte 7 top bits
//   0b01 sub-block 4: sc 0b10'0110 = 38 and m 0 : byte 8 = 0x06, byte 0 top bits 0b10
void fill_k4_scales(uint8_t* s) {
  s[0] = uint8_t(1 | (0b10 << 6));
  s[4] = 2;
  s[1] = uint8_t(7 | (0b11 << 6));
  s[5] = uint8_t(9 | (0b10 << 6));
  s[9] = 0x53;
  s[3] = uint8_t(0b11 << 6);
  s[7] = uint8_t(0b01 << 6);
  s[11] = 0x1C;
  s[8] = 0x06;
}

}  // namespace

TEST(QuantLayout, Q4_KKnownBlock) {
  uint8_t b[144] = {};
  std::memcpy(b + 0, &kOne, 2);   // d = 1
  std::memcpy(b + 2, &kHalf, 2);  // dmin = 0.5
  fill_k4_scales(b + 4);
  uint8_t* qs = b + 16;
  qs[0] = 0x3A;        // weight 0 (sub-block 0): 10; weight 32 (sub-block 1): 3
  qs[64 + 3] = 0xA2;   // weight 131 (sub-block 4): 2; weight 163 (sub-block 5): 10
  qs[96 + 31] = 0xF0;  // weight 223 (sub-block 6): 0; weight 255 (sub-block 7): 15
  float y[256];
  dequantize_row(DType::Q4_K, b, y, 256);
  EXPECT_EQ(y[0], 1 * 1 * 10 - 0.5f * 2);      // 9
  EXPECT_EQ(y[32], 1 * 7 * 3 - 0.5f * 9);      // 16.5
  EXPECT_EQ(y[33], 1 * 7 * 0 - 0.5f * 9);      // -4.5
  EXPECT_EQ(y[131], 1 * 38 * 2 - 0.5f * 0);    // 76
  EXPECT_EQ(y[163], 1 * 51 * 10 - 0.5f * 37);  // 491.5
  EXPECT_EQ(y[160], -0.5f * 37);               // -18.5
  EXPECT_EQ(y[255], 1 * 60 * 15 - 0.5f * 17);  // 891.5
  EXPECT_EQ(y[223], 0.0f);                     // sub-block 6: sc 0, m 0

  uint8_t sc, m;
  unpack_scale_min_k4(b + 4, 5, sc, m);
  EXPECT_EQ(sc, 51);
  EXPECT_EQ(m, 37);
  unpack_scale_min_k4(b + 4, 7, sc, m);
  EXPECT_EQ(sc, 60);
  EXPECT_EQ(m, 17);
}

TEST(QuantLayout, Q5_KKnownBlock) {
  uint8_t b[176] = {};
  std::memcpy(b + 0, &kOne, 2);
  std::memcpy(b + 2, &kHalf, 2);
  fill_k4_scales(b + 4);
  uint8_t* qh = b + 16;
  uint8_t* qs = b + 48;
  qs[0] = 0x3A;
  qs[64 + 3] = 0xA2;
  qs[96 + 31] = 0xF0;
  qh[0] = 0x01;   // high bit of weight 0 (sub-block 0)
  qh[3] = 0x20;   // bit 5: high bit of weight 32 * 5 + 3 = 163
  qh[31] = 0xC0;  // bits 6, 7: weights 223 and 255
  float y[256];
  dequantize_row(DType::Q5_K, b, y, 256);
  EXPECT_EQ(y[0], 1 * 1 * (10 + 16) - 0.5f * 2);      // 25
  EXPECT_EQ(y[32], 1 * 7 * 3 - 0.5f * 9);             // no high bit
  EXPECT_EQ(y[131], 1 * 38 * 2);                      // bit 4 of qh[3] not set
  EXPECT_EQ(y[163], 1 * 51 * (10 + 16) - 0.5f * 37);  // 1307.5
  EXPECT_EQ(y[255], 1 * 60 * (15 + 16) - 0.5f * 17);  // 1851.5
  EXPECT_EQ(y[223], 0.0f);                            // sc 0, m 0: high bit has no effect
  EXPECT_EQ(y[3], 1 * 1 * 0 - 0.5f * 2);              // qh[3] bit 0 clear
}

TEST(QuantLayout, Q6_KKnownBlock) {
  uint8_t b[210] = {};
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  int8_t* scales = reinterpret_cast<int8_t*>(b + 192);
  std::memcpy(b + 208, &kHalf, 2);  // d = 0.5, stored last
  for (int g = 0; g < 16; ++g) scales[g] = int8_t(g + 1);
  scales[15] = -3;
  // First half, weight 0: ql[0] low nibble 7, qh[0] bits 0-1 = 2 -> q = 39.
  ql[0] = 0x07;
  qh[0] = 0x02;
  // Second half (h = 1): weight 128 + 1 (k 0): ql[65] low nibble; weight 128 + 64 + 1 (k 2): ql[65] high
  // nibble; both read qh[33] (bits 0-1 and 4-5).
  ql[65] = 0xF4;           // low 4, high 15
  qh[33] = 0b01'11'00'11;  // k0 -> 3, k1 -> 0, k2 -> 3, k3 -> 1
  // weight 128 + 96 + 20 = 244 (k 3): ql[64 + 32 + 20] high nibble, qh[32 + 20] bits 6-7; scale index 15.
  ql[116] = 0x50;
  qh[52] = 0x80;
  // weight 128 + 32 + 17 = 177 (k 1): ql[64 + 32 + 17] low nibble, qh[49] bits 2-3; scale index 8 + 1 + 2
  // = 11.
  ql[113] = 0x0C;
  qh[49] = 0x04;
  float y[256];
  dequantize_row(DType::Q6_K, b, y, 256);
  EXPECT_EQ(y[0], 0.5f * 1 * (39 - 32));                  // 3.5
  EXPECT_EQ(y[129], 0.5f * 9 * ((4 | (3 << 4)) - 32));    // q 52: 90
  EXPECT_EQ(y[193], 0.5f * 13 * ((15 | (3 << 4)) - 32));  // q 63: 201.5
  EXPECT_EQ(y[161], 0.5f * 11 * (0 - 32));                // k 1 of lane 1: ql[97] = 0, qh bits 2-3 = 0
  EXPECT_EQ(y[225], 0.5f * 15 * ((0 | (1 << 4)) - 32));   // k 3 of lane 1: q 16, scale index 14: -120
  EXPECT_EQ(y[244], 0.5f * -3 * ((5 | (2 << 4)) - 32));   // q 37: -7.5
  EXPECT_EQ(y[177], 0.5f * 12 * ((12 | (1 << 4)) - 32));  // q 28: -24
  EXPECT_EQ(y[1], 0.5f * 1 * (0 - 32));                   // untouched: q 0
}

TEST(QuantLayout, K4ScalePackingRoundTrips) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 1000; ++trial) {
    uint8_t sc[8], m[8], packed[12];
    for (int s = 0; s < 8; ++s) {
      sc[s] = uint8_t(rng() % 64);
      m[s] = uint8_t(rng() % 64);
    }
    pack_scales_mins_k4(sc, m, packed);
    for (int s = 0; s < 8; ++s) {
      uint8_t a, b;
      unpack_scale_min_k4(packed, s, a, b);
      ASSERT_EQ(a, sc[s]);
      ASSERT_EQ(b, m[s]);
    }
  }
}

// The quantizers write the same layout the dequantizer reads: a block quantized from values that are exactly
// representable comes back exactly.
TEST(QuantLayout, ExactlyRepresentableValuesRoundTrip) {
  std::mt19937 rng(3);
  {  // Q8_0: levels in -127..127 times a power of two, with one value at +-127 so the scale is found exactly.
    std::vector<float> x(64);
    for (auto& v : x) v = float(int(rng() % 255) - 127) * 0.125f;
    x[0] = 127 * 0.125f;
    x[32] = -127 * 0.125f;
    EXPECT_EQ(dequantize(DType::Q8_0, quantize(DType::Q8_0, x), 64), x);
  }
  {  // Q4_0: levels -8..7, with -8 present (the largest magnitude).
    std::vector<float> x(32);
    for (auto& v : x) v = float(int(rng() % 16) - 8) * 0.5f;
    x[3] = -8 * 0.5f;
    EXPECT_EQ(dequantize(DType::Q4_0, quantize(DType::Q4_0, x), 32), x);
  }
}

// ---- float types ------------------------------------------------------------------------------------------

TEST(QuantFloat, F32IsACopy) {
  const auto x = normal_data(1000, 1);
  std::vector<uint8_t> q = quantize(DType::F32, x);
  EXPECT_EQ(dequantize(DType::F32, q, 1000), x);
}

TEST(QuantFloat, F16AndBf16AreExactWhereRepresentableAndNearestOtherwise) {
  // Every finite fp16 / bf16 value survives float -> half -> float unchanged.
  std::vector<float> f16_values, bf16_values;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) != 0x1f) f16_values.push_back(fp16_to_fp32(uint16_t(h)));
    if (((h >> 7) & 0xff) != 0xff) bf16_values.push_back(bf16_to_fp32(uint16_t(h)));
  }
  const int64_t nf = int64_t(f16_values.size()), nb = int64_t(bf16_values.size());
  auto yf = dequantize(DType::F16, quantize(DType::F16, f16_values), nf);
  auto yb = dequantize(DType::BF16, quantize(DType::BF16, bf16_values), nb);
  for (int64_t i = 0; i < nf; ++i)
    ASSERT_EQ(fp32_to_bits(yf[size_t(i)]), fp32_to_bits(f16_values[size_t(i)]));
  for (int64_t i = 0; i < nb; ++i)
    ASSERT_EQ(fp32_to_bits(yb[size_t(i)]), fp32_to_bits(bf16_values[size_t(i)]));

  // Random values: relative error at most half an ulp (2^-11 for fp16 normals, 2^-8 for bf16).
  const auto x = normal_data(4096, 2);
  yf = dequantize(DType::F16, quantize(DType::F16, x), 4096);
  yb = dequantize(DType::BF16, quantize(DType::BF16, x), 4096);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) > 1e-4f) {
      EXPECT_LE(std::fabs(yf[i] - x[i]), std::fabs(x[i]) * 0x1p-11f) << x[i];
    }
    EXPECT_LE(std::fabs(yb[i] - x[i]), std::fabs(x[i]) * 0x1p-8f) << x[i];
  }
}

// ---- error bounds on random data --------------------------------------------------------------------------

// Relative RMS error bounds on N(0, 1) data: the measured values (printed by QuantErrorTable, quoted at the
// top of src/quant/quant.cpp) plus about 5% margin.
TEST(QuantError, RoundTripWithinBoundOnNormalData) {
  struct Bound {
    DType type;
    double max_rel_rms;
  };
  const Bound bounds[] = {
      {DType::Q8_0, 0.0052}, {DType::Q6_K, 0.0175}, {DType::Q5_K, 0.0365},
      {DType::Q4_K, 0.0740}, {DType::Q4_0, 0.0850},
  };
  const auto x = normal_data(256 * 64, 11);
  for (const auto& b : bounds) EXPECT_LT(roundtrip_error(b.type, x), b.max_rel_rms) << dtype_name(b.type);
}

TEST(QuantError, BoundHoldsAcrossScales) {
  // The error is relative: data a million times smaller or larger quantizes as well (fp16 scales keep ~3
  // digits over their range).
  for (float sigma : {1e-3f, 30.0f}) {
    const auto x = normal_data(256 * 16, 12, sigma);
    EXPECT_LT(roundtrip_error(DType::Q4_K, x), 0.076) << sigma;
    EXPECT_LT(roundtrip_error(DType::Q6_K, x), 0.018) << sigma;
    EXPECT_LT(roundtrip_error(DType::Q8_0, x), 0.0055) << sigma;
  }
}

TEST(QuantError, OneSidedDataUsesTheOffset) {
  // All-positive data (min clamped at 0 for the K types) and all-negative data (a pure offset would be
  // needed) still quantize with a bounded error.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  std::vector<float> pos(256 * 8), neg(256 * 8);
  for (size_t i = 0; i < pos.size(); ++i) {
    pos[i] = u(rng);
    neg[i] = -u(rng);
  }
  for (DType t : kQuantTypes) {
    // Q4_0 has no offset: its 8 levels of one sign span [0, 2], a step of 0.25 (4.5% relative RMS).
    const double bound = t == DType::Q4_0 ? 0.05 : 0.03;
    EXPECT_LT(roundtrip_error(t, pos), bound) << dtype_name(t);
    EXPECT_LT(roundtrip_error(t, neg), bound) << dtype_name(t);
  }
}

TEST(QuantError, SearchBeatsNaiveMinMax) {
  const auto x = normal_data(256 * 64, 13);
  for (DType t : kQuantTypes) {
    const double s = roundtrip_error(t, x), n = naive_error(t, x);
    EXPECT_LT(s, n * 0.97) << dtype_name(t) << ": search " << s << " naive " << n;
  }
}

TEST(QuantError, ImportanceLowersErrorWhereItIsHigh) {
  const int64_t n = 256 * 32;
  const auto x = normal_data(n, 14);
  std::vector<float> imp(static_cast<size_t>(n), 1.0f);
  for (int64_t i = 0; i < n; i += 4) imp[size_t(i)] = 100.0f;  // every fourth value matters most
  for (DType t : kQuantTypes) {
    const auto y_plain = dequantize(t, quantize(t, x), n);
    const auto y_imp = dequantize(t, quantize(t, x, imp.data()), n);
    double e_plain = 0, e_imp = 0;
    for (int64_t i = 0; i < n; i += 4) {
      e_plain += std::pow(x[size_t(i)] - y_plain[size_t(i)], 2);
      e_imp += std::pow(x[size_t(i)] - y_imp[size_t(i)], 2);
    }
    EXPECT_LT(e_imp, e_plain * 0.95) << dtype_name(t);
  }
}

TEST(QuantError, RequantizingIsStable) {
  // quantize(dequantize(quantize(x))) should reproduce the first dequantized values, or come very close: the
  // second pass sees data that its grid represents exactly.
  const int64_t n = 256 * 32;
  const auto x = normal_data(n, 15);
  for (DType t : kQuantTypes) {
    const auto y1 = dequantize(t, quantize(t, x), n);
    const auto y2 = dequantize(t, quantize(t, y1), n);
    const double first = relative_rms_error(x.data(), y1.data(), n);
    const double drift = relative_rms_error(y1.data(), y2.data(), n);
    EXPECT_LT(drift, 0.1 * first) << dtype_name(t) << ": drift " << drift << " vs first error " << first;
  }
}

TEST(QuantError, ZerosAreExactAndConstantsClose) {
  // A constant is exact up to the fp16 rounding of the block scale (d or dmin times a 6/8-bit code).
  std::vector<float> zeros(256, 0.0f), minus_twos(256, -2.0f), threes(256, 3.0f);
  for (DType t : kQuantTypes) {
    EXPECT_EQ(dequantize(t, quantize(t, zeros), 256), zeros) << dtype_name(t);
    for (const auto* c : {&minus_twos, &threes}) {
      const auto y = dequantize(t, quantize(t, *c), 256);
      EXPECT_LT(relative_rms_error(c->data(), y.data(), 256), 1e-3) << dtype_name(t) << " " << (*c)[0];
    }
  }
}

// Prints the error table quoted in src/quant/quant.cpp (search vs naive min/max on N(0,1) data).
TEST(QuantError, Table) {
  const auto x = normal_data(256 * 1024, 42);
  std::printf("type   bits/weight  search   naive\n");
  for (DType t : kQuantTypes) {
    const double bpw = 8.0 * double(dtype_block_bytes(t)) / double(dtype_block_size(t));
    std::printf("%-6s %6.3f      %.3f%%  %.3f%%\n", dtype_name(t), bpw, 100 * roundtrip_error(t, x),
                100 * naive_error(t, x));
  }
}

// ---- quantize_matrix --------------------------------------------------------------------------------------

TEST(QuantMatrix, EqualsRowByRowForAnyThreadCount) {
  const int64_t rows = 37, cols = 512;
  const auto x = normal_data(rows * cols, 16);
  const auto imp = normal_data(cols, 17);
  std::vector<float> imp_pos(imp.size());
  for (size_t i = 0; i < imp.size(); ++i) imp_pos[i] = std::fabs(imp[i]);
  for (DType t : {DType::Q4_K, DType::Q8_0, DType::F16}) {
    const size_t rb = dtype_row_bytes(t, cols);
    std::vector<uint8_t> expect(rb * rows);
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(t, x.data() + r * cols, expect.data() + size_t(r) * rb, cols, imp_pos.data());
    for (int threads : {1, 3, 8, 0}) {
      std::vector<uint8_t> got(rb * rows, 0xAB);
      quantize_matrix(t, x.data(), got.data(), rows, cols, threads, imp_pos.data());
      EXPECT_EQ(got, expect) << dtype_name(t) << " threads " << threads;
    }
  }
}

// ---- bad input --------------------------------------------------------------------------------------------

TEST(QuantFit, AffineFitOfNoValuesIsEmptyAndTouchesNothing) {
  // fit_affine read x[0] before looking at n; with n = 0 it must not read x nor write L.
  uint8_t L[4] = {7, 7, 7, 7};
  const quant::fit::AffineFit f = quant::fit::fit_affine(nullptr, nullptr, 0, 15, L);
  EXPECT_EQ(f.scale, 0.0f);
  EXPECT_EQ(f.min, 0.0f);
  EXPECT_EQ(f.err, 0.0);
  for (uint8_t l : L) EXPECT_EQ(l, 7);
}

TEST(QuantBadInput, SizesThatAreNotAMultipleOfTheBlockThrow) {
  std::vector<float> x(1024, 1.0f);
  std::vector<uint8_t> q(4096);
  EXPECT_THROW(quantize_row(DType::Q4_K, x.data(), q.data(), 100), Error);
  EXPECT_THROW(quantize_row(DType::Q4_0, x.data(), q.data(), 33), Error);
  EXPECT_THROW(dequantize_row(DType::Q8_0, q.data(), x.data(), 33), Error);
  EXPECT_THROW(dequantize_row(DType::Q6_K, q.data(), x.data(), 128), Error);
  EXPECT_THROW(quantize_row(DType::Q5_K, x.data(), q.data(), -256), Error);
  EXPECT_THROW(quantize_matrix(DType::Q4_K, x.data(), q.data(), 4, 100, 2), Error);
  EXPECT_THROW(quantize_matrix(DType::Q4_K, x.data(), q.data(), -1, 256, 2), Error);
  try {
    quantize_row(DType::Q4_K, x.data(), q.data(), 100);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block size 256"), std::string::npos) << e.what();
  }
}

TEST(QuantBadInput, UnsupportedTypesAndBadValuesThrow) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> q(4096);
  EXPECT_THROW(quantize_row(DType::I32, x.data(), q.data(), 256), Error);
  EXPECT_THROW(dequantize_row(DType::F64, q.data(), x.data(), 256), Error);
  EXPECT_THROW(quantize_row(DType(10), x.data(), q.data(), 256), Error);  // q2_k: not supported
  EXPECT_THROW(quantize_row(DType::Q4_K, nullptr, q.data(), 256), Error);

  for (DType t : kQuantTypes) {
    auto bad = x;
    bad[17] = std::nanf("");
    EXPECT_THROW(quantize_row(t, bad.data(), q.data(), 256), Error) << dtype_name(t);
    bad[17] = INFINITY;
    EXPECT_THROW(quantize_row(t, bad.data(), q.data(), 256), Error) << dtype_name(t);
    bad[17] = 1e30f;  // the block scale would overflow fp16
    EXPECT_THROW(quantize_row(t, bad.data(), q.data(), 256), Error) << dtype_name(t);
  }
  auto big = x;
  big[3] = 1e6f;
  EXPECT_THROW(quantize_row(DType::F16, big.data(), q.data(), 256), Error);
  EXPECT_NO_THROW(quantize_row(DType::BF16, big.data(), q.data(), 256));

  std::vector<float> imp(256, 1.0f);
  imp[9] = -1.0f;
  EXPECT_THROW(quantize_row(DType::Q4_K, x.data(), q.data(), 256, imp.data()), Error);

  // An error inside a worker thread reaches the caller and names the row.
  std::vector<float> m(256 * 64, 0.5f);
  m[256 * 40 + 3] = std::nanf("");
  std::vector<uint8_t> qm(dtype_row_bytes(DType::Q4_K, 256) * 64);
  try {
    quantize_matrix(DType::Q4_K, m.data(), qm.data(), 64, 256, 4);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 40"), std::string::npos) << e.what();
  }
}
