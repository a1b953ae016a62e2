// IEEE binary16 and bfloat16 <-> float conversions (bit exact, round to nearest even), usable on host and device.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem {

inline float fp32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t fp32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// bfloat16 is the upper half of an fp32.
inline float bf16_to_fp32(uint16_t h) { return fp32_from_bits(uint32_t(h) << 16); }
inline uint16_t fp32_to_bf16(float f) {
  uint32_t u = fp32_to_bits(f);
  if ((u & 0x7fffffff) > 0x7f800000) return uint16_t((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
  u += 0x7fff + ((u >> 16) & 1);                                          // round to nearest even
  return uint16_t(u >> 16);
}

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return fp32_from_bits(sign | 0x7f800000 | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return fp32_from_bits(sign);
    // subnormal: value = mant * 2^-24
    const float v = float(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return fp32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t fp32_to_fp16(float f) {
  const uint32_t u = fp32_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000) return uint16_t(sign | 0x7e00);        // nan
  if (abs >= 0x477ff000) return uint16_t(sign | 0x7c00);       // rounds to >= 65520: inf
  if (abs < 0x38800000) {                                      // below the smallest normal 2^-14
    // subnormal: round abs / 2^-24 to nearest even integer
    const float a = fp32_from_bits(abs);
    const float scaled = a * 16777216.0f;  // exact (power of two)
    uint32_t m = uint32_t(scaled);
    const float rem = scaled - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1))) ++m;
    return uint16_t(sign | m);
  }
  // normal: rebias exponent, round mantissa to 10 bits (nearest even); carry may bump the exponent
  uint32_t v = abs - (112u << 23);
  v += 0xfff + ((v >> 13) & 1);
  return uint16_t(sign | (v >> 13));
}

}  // namespace tandem
