// Portable kernels of matmul_kernels.h. The integer sums are the definition the AVX2 kernels reproduce
// exactly.
#include <cmath>

#include "backend/cpu/matmul_kernels.h"
#include "core/half.h"
#include "quant/blocks.h"

namespace tandem::cpu::scalar {

using quant::BlockQ4_0;
using quant::BlockQ4_K;
using quant::BlockQ5_K;
using quant::BlockQ6_K;
using quant::BlockQ8_0;

namespace {

// Scale and quantized values of one block of n activations: d = max|x| / 127, q = round-half-even(x / d).
float quantize_block(const float* x, int8_t* q, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = int8_t(std::nearbyint(x[i] * id));
  return d;
}

}  // namespace

void quantize_q8x32(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<ActQ8Block32*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    b[i].d = quantize_block(x, b[i].qs, 32);
    int32_t s = 0;
    for (int k = 0; k < 32; ++k) s += b[i].qs[k];
    b[i].sum = s;
  }
}

void quantize_q8x256(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<ActQ8Block256*>(dst);
  for (int64_t i = 0; i < n / 256; ++i, x += 256) {
    b[i].d = quantize_block(x, b[i].qs, 256);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int k = 0; k < 16; ++k) s += b[i].qs[16 * g + k];
      b[i].bsums[g] = int16_t(s);
    }
  }
}

namespace {

template <class ToFloat>
void dot_plain(int64_t n, const void* w, const void* const* x, int nx, float* out, ToFloat to_float) {
  for (int j = 0; j < nx; ++j) {
    const float* xj = static_cast<const float*>(x[j]);
    // Four partial sums: fewer rounding steps in a chain, and the same shape as the vector kernels.
    float s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; ++k) s[k] += to_float(w, i + k) * xj[i + k];
    for (; i < n; ++i) s[0] += to_float(w, i) * xj[i];
    out[j] = (s[0] + s[1]) + (s[2] + s[3]);
  }
}

}  // namespace

void dot_f32(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  dot_plain(n, w, x, nx, out, [](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; });
}

void dot_f16(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  dot_plain(n, w, x, nx, out,
            [](const void* p, int64_t i) { return fp16_to_fp32(static_cast<const uint16_t*>(p)[i]); });
}

void dot_bf16(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  dot_plain(n, w, x, nx, out,
            [](const void* p, int64_t i) { return bf16_to_fp32(static_cast<const uint16_t*>(p)[i]); });
}

void dot_q8_0(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  const auto* wb = static_cast<const BlockQ8_0*>(w);
  for (int j = 0; j < nx; ++j) {
    const auto* xb = static_cast<const ActQ8Block32*>(x[j]);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; ++b) {
      int32_t s = 0;
      for (int k = 0; k < 32; ++k) s += int32_t(wb[b].qs[k]) * xb[b].qs[k];
      acc += fp16_to_fp32(wb[b].d) * xb[b].d * float(s);
    }
    out[j] = acc;
  }
}

void dot_q4_0(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  const auto* wb = static_cast<const BlockQ4_0*>(w);
  for (int j = 0; j < nx; ++j) {
    const auto* xb = static_cast<const ActQ8Block32*>(x[j]);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; ++b) {
      int32_t s = 0;
      for (int k = 0; k < 16; ++k) {
        s += int32_t(wb[b].qs[k] & 0x0F) * xb[b].qs[k];
        s += int32_t(wb[b].qs[k] >> 4) * xb[b].qs[k + 16];
      }
      acc += fp16_to_fp32(wb[b].d) * xb[b].d * float(s - 8 * xb[b].sum);
    }
    out[j] = acc;
  }
}

void dot_q4_k(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  const auto* wb = static_cast<const BlockQ4_K*>(w);
  for (int j = 0; j < nx; ++j) {
    const auto* xb = static_cast<const ActQ8Block256*>(x[j]);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 256; ++b) {
      int32_t sum_q = 0, sum_m = 0;
      for (int sb = 0; sb < 8; ++sb) {
        uint8_t sc, m;
        quant::unpack_scale_min_k4(wb[b].scales, sb, sc, m);
        const uint8_t* q = wb[b].qs + 32 * (sb / 2);
        const int shift = (sb & 1) ? 4 : 0;
        int32_t s = 0;
        for (int l = 0; l < 32; ++l) s += int32_t((q[l] >> shift) & 0x0F) * xb[b].qs[32 * sb + l];
        sum_q += int32_t(sc) * s;
        sum_m += int32_t(m) * (xb[b].bsums[2 * sb] + xb[b].bsums[2 * sb + 1]);
      }
      acc += xb[b].d * (fp16_to_fp32(wb[b].d) * float(sum_q) - fp16_to_fp32(wb[b].dmin) * float(sum_m));
    }
    out[j] = acc;
  }
}

void dot_q5_k(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  const auto* wb = static_cast<const BlockQ5_K*>(w);
  for (int j = 0; j < nx; ++j) {
    const auto* xb = static_cast<const ActQ8Block256*>(x[j]);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 256; ++b) {
      int32_t sum_q = 0, sum_m = 0;
      for (int sb = 0; sb < 8; ++sb) {
        uint8_t sc, m;
        quant::unpack_scale_min_k4(wb[b].scales, sb, sc, m);
        const uint8_t* q = wb[b].qs + 32 * (sb / 2);
        const int shift = (sb & 1) ? 4 : 0;
        int32_t s = 0;
        for (int l = 0; l < 32; ++l) {
          const int level = ((q[l] >> shift) & 0x0F) | (((wb[b].qh[l] >> sb) & 1) << 4);
          s += level * xb[b].qs[32 * sb + l];
        }
        sum_q += int32_t(sc) * s;
        sum_m += int32_t(m) * (xb[b].bsums[2 * sb] + xb[b].bsums[2 * sb + 1]);
      }
      acc += xb[b].d * (fp16_to_fp32(wb[b].d) * float(sum_q) - fp16_to_fp32(wb[b].dmin) * float(sum_m));
    }
    out[j] = acc;
  }
}

void dot_q6_k(int64_t n, const void* w, const void* const* x, int nx, float* out) {
  const auto* wb = static_cast<const BlockQ6_K*>(w);
  for (int j = 0; j < nx; ++j) {
    const auto* xb = static_cast<const ActQ8Block256*>(x[j]);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 256; ++b) {
      int32_t sum_q = 0, sum_off = 0;
      for (int g = 0; g < 16; ++g) {
        int32_t s = 0;
        for (int l = 0; l < 16; ++l) s += quant::q6_k_level(wb[b], 16 * g + l) * xb[b].qs[16 * g + l];
        sum_q += int32_t(wb[b].scales[g]) * s;
        sum_off += int32_t(wb[b].scales[g]) * xb[b].bsums[g];
      }
      acc += xb[b].d * fp16_to_fp32(wb[b].d) * float(sum_q - 32 * sum_off);
    }
    out[j] = acc;
  }
}

}  // namespace tandem::cpu::scalar
