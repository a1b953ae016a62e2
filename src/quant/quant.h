// Reference quantize / dequantize of every tensor type tandem stores: the GGUF block formats in code
// (block layouts: ../shared/GGUF-ARCH-FACTS.md A.7; structs in quant/blocks.h). These are the references that
// every fast CPU and CUDA kernel is tested against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace tandem::quant {

// Dequantize n elements (a multiple of the block size of t) from src (GGUF layout) to f32.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantize n f32 values (a multiple of the block size of t) into src's GGUF layout. importance (n weights,
// may be null) weights the squared error that the scale search minimises (an importance matrix).
void quantize_row(DType t, const float* src, void* dst, int64_t n, const float* importance = nullptr);

// Quantize a whole matrix of nrows rows of n_per_row values, rows in parallel over n_threads threads.
void quantize_matrix(DType t, const float* src, void* dst, int64_t nrows, int64_t n_per_row, int n_threads = 1,
                     const float* importance = nullptr);

}  // namespace tandem::quant
