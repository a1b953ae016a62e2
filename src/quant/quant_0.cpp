// Q4_0 and Q8_0: one fp16 scale per block of 32, symmetric levels (value = d * level).
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "quant/fit.h"
#include "quant/quant_impl.h"

namespace tandem::quant::detail {

uint16_t encode_scale(float d, const char* type) {
  check(std::fabs(d) <= 65504.0f, std::string("a block of values is too large for ") + type +
                                      "'s fp16 scale (scale " + std::to_string(d) +
                                      " > 65504); quantize this tensor to f32, f16 or bf16 instead");
  return fp32_to_fp16(d);
}

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o) {
  float w[kQK4_0];
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK4_0) {
    make_weights(x, kQK4_0, importance ? importance + ib * kQK4_0 : nullptr, o.weights, w);
    // The value of largest magnitude usually maps to -8 (the sign trick uses the extra negative level); the
    // search also tries scales around it and the positive end.
    const fit::SymmetricFit f = fit::fit_symmetric(x, w, kQK4_0, -8, 7, nullptr, o.grid);
    y[ib].d = encode_scale(f.scale, "q4_0");
    const float d = fp16_to_fp32(y[ib].d);
    const float inv = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int lo = fit::round_clamped(x[j] * inv, -8, 7) + 8;
      const int hi = fit::round_clamped(x[j + kQK4_0 / 2] * inv, -8, 7) + 8;
      y[ib].qs[j] = uint8_t(lo | (hi << 4));
    }
  }
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o) {
  float w[kQK8_0];
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK8_0) {
    make_weights(x, kQK8_0, importance ? importance + ib * kQK8_0 : nullptr, o.weights, w);
    // Levels stay in -127..127: some int8 dot-product kernels (sign tricks on |q|) break on -128.
    const fit::SymmetricFit f = fit::fit_symmetric(x, w, kQK8_0, -127, 127, nullptr, o.grid);
    y[ib].d = encode_scale(f.scale, "q8_0");
    const float d = fp16_to_fp32(y[ib].d);
    const float inv = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK8_0; ++j) y[ib].qs[j] = int8_t(fit::round_clamped(x[j] * inv, -127, 127));
  }
}

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t nblocks) {
  for (int64_t ib = 0; ib < nblocks; ++ib, y += kQK4_0) {
    const float d = fp16_to_fp32(x[ib].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = d * float((x[ib].qs[j] & 0x0F) - 8);
      y[j + kQK4_0 / 2] = d * float((x[ib].qs[j] >> 4) - 8);
    }
  }
}

void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t nblocks) {
  for (int64_t ib = 0; ib < nblocks; ++ib, y += kQK8_0) {
    const float d = fp16_to_fp32(x[ib].d);
    for (int j = 0; j < kQK8_0; ++j) y[j] = d * float(x[ib].qs[j]);
  }
}

void quantize_naive_q4_0(const float* x, BlockQ4_0* y, int64_t nblocks) {
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK4_0) {
    float amax = 0;
    for (int j = 0; j < kQK4_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    y[ib].d = encode_scale(amax / 7.0f, "q4_0");
    const float d = fp16_to_fp32(y[ib].d);
    const float inv = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int lo = fit::round_clamped(x[j] * inv, -8, 7) + 8;
      const int hi = fit::round_clamped(x[j + kQK4_0 / 2] * inv, -8, 7) + 8;
      y[ib].qs[j] = uint8_t(lo | (hi << 4));
    }
  }
}

void quantize_naive_q8_0(const float* x, BlockQ8_0* y, int64_t nblocks) {
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK8_0) {
    float amax = 0;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    y[ib].d = encode_scale(amax / 127.0f, "q8_0");
    const float d = fp16_to_fp32(y[ib].d);
    const float inv = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK8_0; ++j) y[ib].qs[j] = int8_t(fit::round_clamped(x[j] * inv, -127, 127));
  }
}

}  // namespace tandem::quant::detail
