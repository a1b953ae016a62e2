// tandem's pseudo-random generator: xoshiro256** seeded through splitmix64.
//
// Sampling must give the same tokens for the same seed on every platform and standard library, so tandem
// never uses std::*_distribution (their algorithms are implementation-defined). The seed rule is:
//   state[i] = splitmix64 output i (i = 0..3) starting from x = seed,
// where splitmix64 adds 0x9E3779B97F4A7C15 to x and mixes (Steele, Lea, Flood 2014); the generator is
// xoshiro256** (Blackman, Vigna 2018). A uniform double in [0, 1) is (next() >> 11) * 2^-53.
#pragma once

#include <cstdint>

namespace tandem {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }

  void reseed(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& s : s_) s = splitmix64(x);
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

  // Advances x and returns the next splitmix64 output (also used to derive seeds).
  static uint64_t splitmix64(uint64_t& x) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  static uint64_t rotl(uint64_t v, int k) { return (v << k) | (v >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace tandem
