// Inner kernels of the CPU matmul: activation quantization and dot products of one weight row with up to
// kMaxDotRows activation rows (the decoded weights are reused across those rows).
//
// Quantized weight types take activations quantized to 8 bits, as ggml does, so the inner product is an
// integer one: Q8_0 and Q4_0 use ActQ8Block32 (one f32 scale per 32 values), the K types use ActQ8Block256
// (one scale per 256 values plus sums of every 16 quants, for the weight minima / offsets). Activation value
// = d * qs[i] with d = max|x| / 127 and qs[i] = x[i] / d rounded to nearest even, so |x - d qs| <= d / 2.
// F32, F16 and BF16 weights take f32 activations and accumulate in f32.
//
// Each kernel has a scalar version and an AVX2/FMA/F16C version; the integer sums of the two are identical,
// only the order of the f32 accumulation differs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace tandem::cpu {

constexpr int kMaxDotRows = 4;

struct ActQ8Block32 {
  float d;
  int32_t sum;  // sum of qs (Q4_0 subtracts 8 * sum for its offset)
  int8_t qs[32];
};

struct ActQ8Block256 {
  float d;
  int16_t bsums[16];  // bsums[g] = sum of qs[16 g .. 16 g + 15]
  int8_t qs[256];
};

// Sixteen activation rows side by side, for the VNNI Q8_0 kernel (prefill): d[j] is row j's scale, and the
// 64 bytes of chunk c (qs[64 c .. 64 c + 63]) hold values 4c..4c+3 of rows 0..15 (row j at bytes 4j..4j+3).
constexpr int kPackedRows = 16;
struct ActQ8Block32x16 {
  float d[kPackedRows];
  int8_t qs[32 * kPackedRows];
};

// The activation format a weight type multiplies with.
enum class ActFormat { F32, Q8x32, Q8x256 };
ActFormat act_format(DType weight_type);
// Bytes of one activation row of n values in that format.
size_t act_row_bytes(ActFormat f, int64_t n);

// Converts one f32 row of n values into the activation format (no-op copy is never needed for F32).
using QuantizeActFn = void (*)(const float* x, void* dst, int64_t n);
// out[j] = dot(weight row w, activation row x[j]) for j < nx (1 <= nx <= kMaxDotRows); n values per row.
using DotFn = void (*)(int64_t n, const void* w, const void* const* x, int nx, float* out);

struct MatmulKernels {
  ActFormat act;
  QuantizeActFn quantize;  // null for ActFormat::F32
  DotFn dot;
};

// Kernels for a weight type, AVX2 ones when simd_enabled(). Throws Error for a type matmul does not support.
MatmulKernels matmul_kernels(DType weight_type);

namespace scalar {
void quantize_q8x32(const float* x, void* dst, int64_t n);
void quantize_q8x256(const float* x, void* dst, int64_t n);
void dot_f32(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_f16(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_bf16(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q8_0(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q4_0(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q4_k(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q5_k(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q6_k(int64_t n, const void* w, const void* const* x, int nx, float* out);
}  // namespace scalar

namespace avx2 {
void quantize_q8x32(const float* x, void* dst, int64_t n);
void quantize_q8x256(const float* x, void* dst, int64_t n);
void dot_f32(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_f16(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_bf16(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q8_0(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q4_0(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q4_k(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q5_k(int64_t n, const void* w, const void* const* x, int nx, float* out);
void dot_q6_k(int64_t n, const void* w, const void* const* x, int nx, float* out);
}  // namespace avx2

// AVX-512 VNNI: only when cpu_has_avx512_vnni(); bit-identical to avx2::dot_q8_0.
namespace vnni {
// Packs n_rows (<= kPackedRows) rows of n_blocks ActQ8Block32 each into out[n_blocks]; missing rows are zeros.
void pack_q8x32x16(const ActQ8Block32* const* rows, int n_rows, int64_t n_blocks, ActQ8Block32x16* out);
// out[j] = dot(Q8_0 weight row w, row j of the packed group x), j < kPackedRows; n values per row.
void dot_q8_0_x16(int64_t n, const void* w, const ActQ8Block32x16* x, float* out);
}  // namespace vnni

}  // namespace tandem::cpu
