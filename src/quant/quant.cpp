// Dispatch of the reference (de)quantizers by type, the plain float conversions, and quantize_matrix.
//
// Measured quantization error: relative RMS error sqrt(mean((x - deq(q(x)))^2)) / sqrt(mean(x^2)) on 2^18
// values drawn from N(0, 1) (test QuantError.Table prints it: tandem_tests --gtest_filter=QuantError.Table).
// "search" is quantize_row with the settings of options_for() below; "naive" is quantize_row_naive (plain
// min/max per block or sub-block, K-type scales as max / 63); "uniform" is the same search minimising the
// plain squared error instead of the rms + |x| weighted one.
//
//   type   bits/weight   search    naive    (search, uniform weights)
//   q8_0     8.500       0.489%    0.536%
//   q6_k     6.5625      1.659%    1.933%   1.650%
//   q5_k     5.500       3.478%    3.827%   3.458%
//   q4_k     4.500       7.049%    7.858%   6.982%
//   q4_0     4.500       8.102%    9.726%
//
// For scale: a uniform quantizer's error is step / sqrt(12) per value, so e.g. q4_k's 16 levels over the
// ~4.1 sigma range of a sub-block of 32 normal values give ~7.9% (the naive figure); the search gains its
// ~10% by clipping rare extremes and refitting scale and min by weighted least squares. Where the gain comes
// from, for q4_k (uniform weights): per-sub-block search 7.07%, + weighted search of d/dmin 7.02%,
// + +-1 polish of the 6-bit codes 6.98%. Speed: ~300-400 ns per value on one core of this machine.
#include "quant/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "quant/quant_impl.h"

namespace tandem::quant {
namespace {

using detail::SearchOptions;
using detail::WeightRule;

// Search settings per type, chosen by measuring (see the table above). Q4_0 / Q8_0 minimise the plain squared
// error; the K types weight values by rms + |x|, which costs ~1% relative RMS on Gaussian data but reproduces
// the large weights (which dominate a matmul) more closely. Wider grids than the ones below gain < 0.3% of
// the error at two to three times the time.
SearchOptions options_for(DType t) {
  SearchOptions o;
  switch (t) {
    case DType::Q8_0:
      o.weights = WeightRule::Uniform;
      o.grid = {-2.0f, 0.2f, 20};
      break;
    case DType::Q4_0:
      o.weights = WeightRule::Uniform;
      o.grid = {-1.0f, 0.2f, 10};
      break;
    case DType::Q6_K:
      o.grid = {-3.0f, 0.2f, 25};
      break;
    default:
      o.grid = {-1.0f, 0.1f, 20};
      break;  // Q4_K, Q5_K
  }
  return o;
}

int64_t checked_blocks(DType t, int64_t n, const void* a, const void* b) {
  check(n >= 0, "negative element count " + std::to_string(n));
  const int64_t bs = dtype_block_size(t);
  check(n % bs == 0, std::string("a row of ") + std::to_string(n) + " elements is not a multiple of " +
                         dtype_name(t) + "'s block size " + std::to_string(bs));
  check(n == 0 || (a != nullptr && b != nullptr), "null buffer passed to a quantizer");
  return n / bs;
}

void check_finite(DType t, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    check(std::isfinite(x[i]), std::string("cannot convert to ") + dtype_name(t) + ": value " +
                                   std::to_string(x[i]) + " at index " + std::to_string(i) +
                                   " is not finite (the source tensor holds NaN or inf)");
}

void check_importance(const float* w, int64_t n) {
  if (!w) return;
  for (int64_t i = 0; i < n; ++i)
    check(std::isfinite(w[i]) && w[i] >= 0, "importance weight " + std::to_string(w[i]) + " at index " +
                                                std::to_string(i) + " is negative or not finite");
}

void to_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    y[i] = fp32_to_fp16(x[i]);
    check((y[i] & 0x7c00) != 0x7c00, "cannot convert to f16: value " + std::to_string(x[i]) + " at index " +
                                         std::to_string(i) +
                                         " is outside the f16 range (|x| <= 65504); use bf16 or f32");
  }
}

}  // namespace

bool is_convertible(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  check(is_convertible(t), std::string("cannot dequantize tensor type ") + ggml_type_name(int32_t(t)));
  const int64_t nb = checked_blocks(t, n, src, dst);
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(static_cast<const uint16_t*>(src)[i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(static_cast<const uint16_t*>(src)[i]);
      break;
    case DType::Q4_0:
      detail::dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
      break;
    case DType::Q8_0:
      detail::dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
      break;
    case DType::Q4_K:
      detail::dequantize_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
      break;
    case DType::Q5_K:
      detail::dequantize_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
      break;
    case DType::Q6_K:
      detail::dequantize_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
      break;
    default:
      break;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n, const float* importance) {
  check(is_convertible(t), std::string("cannot quantize to tensor type ") + ggml_type_name(int32_t(t)));
  const int64_t nb = checked_blocks(t, n, src, dst);
  if (t != DType::F32 && t != DType::BF16) check_finite(t, src, n);
  check_importance(importance, n);
  const SearchOptions o = options_for(t);
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      break;
    case DType::F16:
      to_f16(src, static_cast<uint16_t*>(dst), n);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = fp32_to_bf16(src[i]);
      break;
    case DType::Q4_0:
      detail::quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), nb, importance, o);
      break;
    case DType::Q8_0:
      detail::quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), nb, importance, o);
      break;
    case DType::Q4_K:
      detail::quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), nb, importance, o);
      break;
    case DType::Q5_K:
      detail::quantize_q5_k(src, static_cast<BlockQ5_K*>(dst), nb, importance, o);
      break;
    case DType::Q6_K:
      detail::quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), nb, importance, o);
      break;
    default:
      break;
  }
}

void quantize_row_naive(DType t, const float* src, void* dst, int64_t n) {
  check(is_convertible(t), std::string("cannot quantize to tensor type ") + ggml_type_name(int32_t(t)));
  const int64_t nb = checked_blocks(t, n, src, dst);
  if (t != DType::F32 && t != DType::BF16) check_finite(t, src, n);
  switch (t) {
    case DType::Q4_0:
      detail::quantize_naive_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
      break;
    case DType::Q8_0:
      detail::quantize_naive_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
      break;
    case DType::Q4_K:
      detail::quantize_naive_q4_k(src, static_cast<BlockQ4_K*>(dst), nb);
      break;
    case DType::Q5_K:
      detail::quantize_naive_q5_k(src, static_cast<BlockQ5_K*>(dst), nb);
      break;
    case DType::Q6_K:
      detail::quantize_naive_q6_k(src, static_cast<BlockQ6_K*>(dst), nb);
      break;
    default:
      quantize_row(t, src, dst, n);
      break;
  }
}

void quantize_matrix(DType t, const float* src, void* dst, int64_t nrows, int64_t n_per_row, int n_threads,
                     const float* importance) {
  check(nrows >= 0, "negative row count " + std::to_string(nrows));
  check(is_convertible(t), std::string("cannot quantize to tensor type ") + ggml_type_name(int32_t(t)));
  const size_t row_bytes = dtype_row_bytes(t, n_per_row);  // checks n_per_row against the block size
  if (nrows == 0 || n_per_row == 0) return;
  check(src != nullptr && dst != nullptr, "null buffer passed to quantize_matrix");
  check_importance(importance, n_per_row);
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  // Threads only pay off for a few thousand blocks or more.
  const int64_t min_rows_per_thread = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, n_per_row));
  n_threads = int(std::min<int64_t>(n_threads, (nrows + min_rows_per_thread - 1) / min_rows_per_thread));
  n_threads = std::max(1, n_threads);

  auto run_rows = [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      try {
        quantize_row(t, src + r * n_per_row, static_cast<uint8_t*>(dst) + size_t(r) * row_bytes, n_per_row,
                     importance);
      } catch (const Error& e) {
        throw Error("row " + std::to_string(r) + ": " + e.what());
      }
    }
  };
  if (n_threads == 1) {
    run_rows(0, nrows);
    return;
  }
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n_threads));
  for (int i = 0; i < n_threads; ++i) {
    const int64_t first = nrows * i / n_threads, last = nrows * (i + 1) / n_threads;
    threads.emplace_back([&, i, first, last] {
      try {
        run_rows(first, last);
      } catch (...) {
        errors[size_t(i)] = std::current_exception();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

double relative_rms_error(const float* ref, const float* approx, int64_t n) {
  double se = 0, sr = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(ref[i]) - approx[i];
    se += d * d;
    sr += double(ref[i]) * ref[i];
  }
  return sr > 0 ? std::sqrt(se / sr) : 0.0;
}

}  // namespace tandem::quant
