// The K-quants Q4_K, Q5_K (super-blocks of 256 = 8 sub-blocks of 32, value = d * sc * q - dmin * m with 6-bit
// sc, m) and Q6_K (16 groups of 16, value = d * sc * (q - 32) with int8 sc).
//
// Quantizing a super-block takes three steps:
//  1. every sub-block gets its own scale (and min) from a weighted least-squares search (fit.h);
//  2. those scales (and mins) are themselves quantized to 6 (Q6_K: 8) bits against one fp16 d (and dmin),
//     found by a weighted search too: a scale error in sub-block j costs about (sum w L^2) times its square;
//  3. the levels are recomputed from the stored, rounded scales, after trying each sub-block's scale and min
//     codes +-1 around the rounded ones and keeping the pair with the lowest error ("polish").
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/fit.h"
#include "quant/quant_impl.h"

namespace tandem::quant::detail {
namespace {

constexpr int kSub = 32;             // Q4_K / Q5_K sub-block
constexpr int kNSub = kQK_K / kSub;  // 8
constexpr int kGroup6 = 16;          // Q6_K group
constexpr int kNGroup6 = kQK_K / kGroup6;

inline int affine_level(float x, float S, float M, int nmax) {
  return S > 0 ? fit::round_clamped((x + M) / S, 0, nmax) : 0;
}

double affine_group_error(const float* x, const float* w, int n, float S, float M, int nmax) {
  double e = 0;
  for (int i = 0; i < n; ++i) {
    const double r = double(S) * affine_level(x[i], S, M, nmax) - M - x[i];
    e += w[i] * r * r;
  }
  return e;
}

inline int symmetric_level(float x, float S) {
  return S != 0 ? fit::round_clamped(x / S, -32, 31) : 0;
}

double symmetric_group_error(const float* x, const float* w, int n, float S) {
  double e = 0;
  for (int i = 0; i < n; ++i) {
    const double r = double(S) * symmetric_level(x[i], S) - x[i];
    e += w[i] * r * r;
  }
  return e;
}

// fp16 super-scale for values v[0..n) quantized to codes lo..hi, either from the weighted search or max / hi.
float super_scale(const float* v, const float* wv, int n, int lo, int hi, const SearchOptions& o) {
  float vmax = 0;
  for (int j = 0; j < n; ++j)
    if (std::fabs(v[j]) > std::fabs(vmax)) vmax = v[j];
  const float plain = lo < 0 ? vmax / float(lo) : vmax / float(hi);
  if (!o.fit_super_scales) return plain;
  const fit::SymmetricFit f = fit::fit_symmetric(v, wv, n, lo, hi);
  return f.scale != 0 ? f.scale : plain;
}

// Steps 1-3 for Q4_K (nmax 15) and Q5_K (nmax 31): the stored d, dmin and 6-bit sc, m of one super-block.
void fit_k_affine(const float* x, const float* w, int nmax, const SearchOptions& o, const char* type,
                  uint16_t& d16, uint16_t& dmin16, uint8_t* sc, uint8_t* m) {
  float scales[kNSub], mins[kNSub], w_scale[kNSub], w_min[kNSub];
  uint8_t L[kSub];
  for (int j = 0; j < kNSub; ++j) {
    const fit::AffineFit f = fit::fit_affine(x + kSub * j, w + kSub * j, kSub, nmax, L, o.grid);
    scales[j] = f.scale;
    mins[j] = f.min;
    double sl = 0, s1 = 0;
    for (int i = 0; i < kSub; ++i) {
      sl += double(w[kSub * j + i]) * L[i] * L[i];
      s1 += w[kSub * j + i];
    }
    w_scale[j] = float(sl) + 1e-30f;
    w_min[j] = float(s1) + 1e-30f;
  }
  d16 = encode_scale(super_scale(scales, w_scale, kNSub, 0, 63, o), type);
  dmin16 = encode_scale(super_scale(mins, w_min, kNSub, 0, 63, o), type);
  const float d = fp16_to_fp32(d16), dmin = fp16_to_fp32(dmin16);
  for (int j = 0; j < kNSub; ++j) {
    sc[j] = uint8_t(d > 0 ? fit::round_clamped(scales[j] / d, 0, 63) : 0);
    m[j] = uint8_t(dmin > 0 ? fit::round_clamped(mins[j] / dmin, 0, 63) : 0);
    if (!o.polish_scales) continue;
    const float* xs = x + kSub * j;
    const float* ws = w + kSub * j;
    double best = affine_group_error(xs, ws, kSub, d * sc[j], dmin * m[j], nmax);
    const int sc0 = sc[j], m0 = m[j];
    for (int ds = -1; ds <= 1; ++ds) {
      for (int dm = -1; dm <= 1; ++dm) {
        const int s = sc0 + ds, mm = m0 + dm;
        if ((ds == 0 && dm == 0) || s < 0 || s > 63 || mm < 0 || mm > 63) continue;
        const double e = affine_group_error(xs, ws, kSub, d * float(s), dmin * float(mm), nmax);
        if (e < best) {
          best = e;
          sc[j] = uint8_t(s);
          m[j] = uint8_t(mm);
        }
      }
    }
  }
}

}  // namespace

void encode_q4_k(const float* x, uint16_t d16, uint16_t dmin16, const uint8_t* sc, const uint8_t* m,
                 BlockQ4_K& b) {
  const float d = fp16_to_fp32(d16), dmin = fp16_to_fp32(dmin16);
  uint8_t L[kQK_K];
  for (int j = 0; j < kNSub; ++j)
    for (int i = 0; i < kSub; ++i)
      L[kSub * j + i] = uint8_t(affine_level(x[kSub * j + i], d * sc[j], dmin * m[j], 15));
  b.d = d16;
  b.dmin = dmin16;
  pack_scales_mins_k4(sc, m, b.scales);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) b.qs[32 * c + l] = uint8_t(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
}

void encode_q5_k(const float* x, uint16_t d16, uint16_t dmin16, const uint8_t* sc, const uint8_t* m,
                 BlockQ5_K& b) {
  const float d = fp16_to_fp32(d16), dmin = fp16_to_fp32(dmin16);
  uint8_t L[kQK_K];
  for (int j = 0; j < kNSub; ++j)
    for (int i = 0; i < kSub; ++i)
      L[kSub * j + i] = uint8_t(affine_level(x[kSub * j + i], d * sc[j], dmin * m[j], 31));
  b.d = d16;
  b.dmin = dmin16;
  pack_scales_mins_k4(sc, m, b.scales);
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
      b.qs[32 * c + l] = uint8_t((lo & 0x0F) | ((hi & 0x0F) << 4));
      b.qh[l] = uint8_t(b.qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
}

void encode_q6_k(const float* x, uint16_t d16, const int8_t* sc, BlockQ6_K& b) {
  const float d = fp16_to_fp32(d16);
  std::memset(b.ql, 0, sizeof(b.ql));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int o = 0; o < kQK_K; ++o) {
    const int q = symmetric_level(x[o], d * sc[o / kGroup6]) + 32;
    const int h = o / 128, k = (o % 128) / 32, l = o % 32;
    uint8_t& lo_byte = b.ql[64 * h + l + 32 * (k & 1)];
    lo_byte = uint8_t(lo_byte | ((q & 0x0F) << (k < 2 ? 0 : 4)));
    b.qh[32 * h + l] = uint8_t(b.qh[32 * h + l] | ((q >> 4) << (2 * k)));
  }
  std::memcpy(b.scales, sc, sizeof(b.scales));
  b.d = d16;
}

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o) {
  float w[kQK_K];
  uint8_t sc[kNSub], m[kNSub];
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK_K) {
    make_weights(x, kQK_K, importance ? importance + ib * kQK_K : nullptr, o.weights, w);
    uint16_t d, dmin;
    fit_k_affine(x, w, 15, o, "q4_k", d, dmin, sc, m);
    encode_q4_k(x, d, dmin, sc, m, y[ib]);
  }
}

void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o) {
  float w[kQK_K];
  uint8_t sc[kNSub], m[kNSub];
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK_K) {
    make_weights(x, kQK_K, importance ? importance + ib * kQK_K : nullptr, o.weights, w);
    uint16_t d, dmin;
    fit_k_affine(x, w, 31, o, "q5_k", d, dmin, sc, m);
    encode_q5_k(x, d, dmin, sc, m, y[ib]);
  }
}

void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t nblocks, const float* importance,
                   const SearchOptions& o) {
  float w[kQK_K], scales[kNGroup6], w_scale[kNGroup6];
  int L[kGroup6];
  int8_t sc[kNGroup6];
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK_K) {
    make_weights(x, kQK_K, importance ? importance + ib * kQK_K : nullptr, o.weights, w);
    for (int g = 0; g < kNGroup6; ++g) {
      scales[g] = fit::fit_symmetric(x + kGroup6 * g, w + kGroup6 * g, kGroup6, -32, 31, L, o.grid).scale;
      double sl = 0;
      for (int i = 0; i < kGroup6; ++i) sl += double(w[kGroup6 * g + i]) * L[i] * L[i];
      w_scale[g] = float(sl) + 1e-30f;
    }
    const uint16_t d16 = encode_scale(super_scale(scales, w_scale, kNGroup6, -128, 127, o), "q6_k");
    const float d = fp16_to_fp32(d16);
    for (int g = 0; g < kNGroup6; ++g) {
      sc[g] = int8_t(d != 0 ? fit::round_clamped(scales[g] / d, -128, 127) : 0);
      if (!o.polish_scales) continue;
      const float* xs = x + kGroup6 * g;
      const float* ws = w + kGroup6 * g;
      double best = symmetric_group_error(xs, ws, kGroup6, d * sc[g]);
      const int s0 = sc[g];
      for (int s = std::max(-128, s0 - 1); s <= std::min(127, s0 + 1); ++s) {
        if (s == s0) continue;
        const double e = symmetric_group_error(xs, ws, kGroup6, d * float(s));
        if (e < best) {
          best = e;
          sc[g] = int8_t(s);
        }
      }
    }
    encode_q6_k(x, d16, sc, y[ib]);
  }
}

void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t nblocks) {
  for (int64_t ib = 0; ib < nblocks; ++ib, y += kQK_K) {
    const BlockQ4_K& b = x[ib];
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(b.scales, 2 * c, sc0, m0);
      unpack_scale_min_k4(b.scales, 2 * c + 1, sc1, m1);
      for (int l = 0; l < 32; ++l) {
        y[64 * c + l] = d * sc0 * float(b.qs[32 * c + l] & 0x0F) - dmin * m0;
        y[64 * c + 32 + l] = d * sc1 * float(b.qs[32 * c + l] >> 4) - dmin * m1;
      }
    }
  }
}

void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t nblocks) {
  for (int64_t ib = 0; ib < nblocks; ++ib, y += kQK_K) {
    const BlockQ5_K& b = x[ib];
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(b.scales, 2 * c, sc0, m0);
      unpack_scale_min_k4(b.scales, 2 * c + 1, sc1, m1);
      for (int l = 0; l < 32; ++l) {
        const int q0 = (b.qs[32 * c + l] & 0x0F) | (((b.qh[l] >> (2 * c)) & 1) << 4);
        const int q1 = (b.qs[32 * c + l] >> 4) | (((b.qh[l] >> (2 * c + 1)) & 1) << 4);
        y[64 * c + l] = d * sc0 * float(q0) - dmin * m0;
        y[64 * c + 32 + l] = d * sc1 * float(q1) - dmin * m1;
      }
    }
  }
}

void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t nblocks) {
  for (int64_t ib = 0; ib < nblocks; ++ib, y += kQK_K) {
    const BlockQ6_K& b = x[ib];
    const float d = fp16_to_fp32(b.d);
    for (int o = 0; o < kQK_K; ++o) y[o] = d * float(b.scales[o / kGroup6]) * float(q6_k_level(b, o) - 32);
  }
}

// ---- naive min/max quantizers, for comparison ------------------------------------------------------------

namespace {

void naive_k_affine(const float* x, int nmax, const char* type, uint16_t& d16, uint16_t& dmin16, uint8_t* sc,
                    uint8_t* m) {
  float scales[kNSub], mins[kNSub], smax = 0, mmax = 0;
  for (int j = 0; j < kNSub; ++j) {
    float lo = 0, hi = x[kSub * j];
    for (int i = 0; i < kSub; ++i) {
      lo = std::min(lo, x[kSub * j + i]);
      hi = std::max(hi, x[kSub * j + i]);
    }
    scales[j] = (hi - lo) / float(nmax);
    mins[j] = -lo;
    smax = std::max(smax, scales[j]);
    mmax = std::max(mmax, mins[j]);
  }
  d16 = encode_scale(smax / 63.0f, type);
  dmin16 = encode_scale(mmax / 63.0f, type);
  const float d = fp16_to_fp32(d16), dmin = fp16_to_fp32(dmin16);
  for (int j = 0; j < kNSub; ++j) {
    sc[j] = uint8_t(d > 0 ? fit::round_clamped(scales[j] / d, 0, 63) : 0);
    m[j] = uint8_t(dmin > 0 ? fit::round_clamped(mins[j] / dmin, 0, 63) : 0);
  }
}

}  // namespace

void quantize_naive_q4_k(const float* x, BlockQ4_K* y, int64_t nblocks) {
  uint8_t sc[kNSub], m[kNSub];
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK_K) {
    uint16_t d, dmin;
    naive_k_affine(x, 15, "q4_k", d, dmin, sc, m);
    encode_q4_k(x, d, dmin, sc, m, y[ib]);
  }
}

void quantize_naive_q5_k(const float* x, BlockQ5_K* y, int64_t nblocks) {
  uint8_t sc[kNSub], m[kNSub];
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK_K) {
    uint16_t d, dmin;
    naive_k_affine(x, 31, "q5_k", d, dmin, sc, m);
    encode_q5_k(x, d, dmin, sc, m, y[ib]);
  }
}

void quantize_naive_q6_k(const float* x, BlockQ6_K* y, int64_t nblocks) {
  float scales[kNGroup6], smax = 0;
  int8_t sc[kNGroup6];
  for (int64_t ib = 0; ib < nblocks; ++ib, x += kQK_K) {
    smax = 0;
    for (int g = 0; g < kNGroup6; ++g) {
      float amax = 0;
      for (int i = 0; i < kGroup6; ++i) amax = std::max(amax, std::fabs(x[kGroup6 * g + i]));
      scales[g] = amax / 31.0f;
      smax = std::max(smax, scales[g]);
    }
    const uint16_t d16 = encode_scale(smax / 127.0f, "q6_k");
    const float d = fp16_to_fp32(d16);
    for (int g = 0; g < kNGroup6; ++g) sc[g] = int8_t(d > 0 ? fit::round_clamped(scales[g] / d, 0, 127) : 0);
    encode_q6_k(x, d16, sc, y[ib]);
  }
}

}  // namespace tandem::quant::detail
