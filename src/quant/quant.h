// Reference quantize / dequantize of every tensor type tandem stores: the GGUF block formats in code
// (block layouts: ../shared/GGUF-ARCH-FACTS.md A.7; structs in quant/blocks.h). These are the references that
// every fast CPU and CUDA kernel is tested against. The errors the quantizers reach are listed at the top of
// quant.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace tandem::quant {

// True for the types dequantize_row / quantize_row handle: F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K.
bool is_convertible(DType t);

// Dequantize n elements (a multiple of the block size of t) from src (GGUF layout) to f32.
// Throws tandem::Error for an unsupported type or a bad n.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantize n f32 values (a multiple of the block size of t) into dst, in t's GGUF layout. importance (n
// weights, may be null) weights the squared error that the scale search minimises (an importance matrix).
// Throws tandem::Error for a bad n, a NaN/inf value (for every type but f32/bf16), a value outside the fp16
// range (f16, and block scales), or a negative / non-finite importance.
void quantize_row(DType t, const float* src, void* dst, int64_t n, const float* importance = nullptr);

// Quantize a whole matrix of nrows rows of n_per_row values, rows in parallel over n_threads threads
// (<= 0: one per hardware thread). importance, when given, has n_per_row weights shared by every row (one
// per input column, as an importance matrix gives them). The result equals quantize_row on each row.
void quantize_matrix(DType t, const float* src, void* dst, int64_t nrows, int64_t n_per_row,
                     int n_threads = 1, const float* importance = nullptr);

// A plain min/max quantizer without any scale search (max |x| / 7 for q4_0, sub-block min and max for the K
// types). Only for measuring what the searches of quantize_row gain; f32/f16/bf16 convert as quantize_row.
void quantize_row_naive(DType t, const float* src, void* dst, int64_t n);

// sqrt(mean((ref - approx)^2)) / sqrt(mean(ref^2)): the error figure quant.cpp quotes (0 when ref is all 0).
double relative_rms_error(const float* ref, const float* approx, int64_t n);

}  // namespace tandem::quant
