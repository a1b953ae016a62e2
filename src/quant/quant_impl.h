// Per-type reference quantizers and dequantizers behind quant.h's dispatch. Internal to src/quant.
#pragma once

#include <cstdint>

#include "quant/blocks.h"
#include "quant/fit.h"

namespace tandem::quant::detail {

// How much each value's squared error counts in a scale search. Values of large magnitude matter most to a
// matmul, so the K types weight them up (AbsPlusRms); an importance vector multiplies any rule.
enum class WeightRule { Uniform, AbsPlusRms, Square };

struct SearchOptions {
  WeightRule weights = WeightRule::AbsPlusRms;
  // Weighted search of d / dmin for the 6/8-bit sub-block scales (else max / 63).
  bool fit_super_scales = true;
  // Try each sub-block's scale and min codes +-1 around the rounded ones, keep the best.
  bool polish_scales = true;
  // Candidate scales of the per-group search.
  fit::Grid grid;
};

// Weights w[0..n) for values x under rule, times importance (may be null).
void make_weights(const float* x, int n, const float* importance, WeightRule rule, float* w);

// fp16 bits of a block scale; throws tandem::Error naming type when |d| exceeds the fp16 range.
uint16_t encode_scale(float d, const char* type);

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o);
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o);
void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o);
void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o);
void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o);

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t nblocks);
void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t nblocks);
void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t nblocks);
void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t nblocks);
void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t nblocks);

// Block encoders given the block's scales: compute every level from the stored (rounded) scales and pack.
// Shared by the searching and the naive quantizers so that both produce the same layout.
void encode_q4_k(const float* x, uint16_t d, uint16_t dmin, const uint8_t* sc, const uint8_t* m,
                 BlockQ4_K& b);
void encode_q5_k(const float* x, uint16_t d, uint16_t dmin, const uint8_t* sc, const uint8_t* m,
                 BlockQ5_K& b);
void encode_q6_k(const float* x, uint16_t d, const int8_t* sc, BlockQ6_K& b);

// Plain min/max quantizers (no search), kept to measure what the searches gain.
void quantize_naive_q4_0(const float* x, BlockQ4_0* y, int64_t nblocks);
void quantize_naive_q8_0(const float* x, BlockQ8_0* y, int64_t nblocks);
void quantize_naive_q4_k(const float* x, BlockQ4_K* y, int64_t nblocks);
void quantize_naive_q5_k(const float* x, BlockQ5_K* y, int64_t nblocks);
void quantize_naive_q6_k(const float* x, BlockQ6_K* y, int64_t nblocks);

}  // namespace tandem::quant::detail
