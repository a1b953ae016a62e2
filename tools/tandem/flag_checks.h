// Checks of numeric command-line values, shared by the subcommands: every message names the flag, the
// allowed range and what was given ("--threads must be in [0, 1024] (0 = all cores), got -1"), and the
// command exits non-zero (tandem::Error reaches main).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "tandem/session.h"

namespace tandem::cli {

inline void check_int_flag(const char* flag, int64_t value, int64_t lo, int64_t hi,
                           const char* meaning = "") {
  if (value >= lo && value <= hi) return;
  std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  throw Error(std::string(flag) + " must be in " + range +
              (*meaning ? std::string(" (") + meaning + ")" : "") + ", got " + std::to_string(value));
}

inline void check_min_flag(const char* flag, int64_t value, int64_t lo, const char* meaning = "") {
  if (value >= lo) return;
  throw Error(std::string(flag) + " must be at least " + std::to_string(lo) +
              (*meaning ? std::string(" (") + meaning + ")" : "") + ", got " + std::to_string(value));
}

// A finite number >= lo.
inline void check_real_flag(const char* flag, double value, double lo, const char* meaning = "") {
  if (std::isfinite(value) && value >= lo) return;
  throw Error(std::string(flag) + " must be a finite number >= " + std::to_string(lo) +
              (*meaning ? std::string(" (") + meaning + ")" : "") + ", got " + std::to_string(value));
}

// A K/V cache type flag (--kv-type, --diffusion-kv-type): "f32", "f16" or "bf16", and "auto" (nullopt) where
// allow_auto; anything else is an Error naming the flag and the values it takes.
inline std::optional<KvType> parse_kv_type_flag(const std::string& value, const char* flag, bool allow_auto) {
  if (allow_auto && value == "auto") return std::nullopt;
  if (value == "f32") return KvType::F32;
  if (value == "f16") return KvType::F16;
  if (value == "bf16") return KvType::BF16;
  throw Error(std::string(flag) + " must be " + (allow_auto ? "auto, " : "") + "f32, f16 or bf16, got '" + value +
              "'");
}

// --threads of every command: 0 (all cores) up to the thread pool's cap.
inline void check_threads_flag(int64_t value, const char* flag = "--threads") {
  check_int_flag(flag, value, 0, ThreadPool::kMaxThreads, "0 = one per hardware thread");
}

// The sampling flags `generate` and `chat` share, each in its range and named (SamplingParams::validate checks
// the combination again).
inline void check_sampling_flags(int64_t top_k, float temperature, float top_p, float min_p, int64_t seed,
                                 int64_t repeat_last_n, float repeat_penalty) {
  check(top_k >= 0, "--top-k must be >= 0 (0 = off), got " + std::to_string(top_k));
  check(std::isfinite(temperature),
        "--temp must be a finite number (<= 0 = greedy), got " + std::to_string(temperature));
  check(std::isfinite(top_p) && top_p >= 0.0f && top_p <= 1.0f,
        "--top-p must be in [0, 1] (1 = off), got " + std::to_string(top_p));
  check(std::isfinite(min_p) && min_p >= 0.0f && min_p <= 1.0f,
        "--min-p must be in [0, 1] (0 = off), got " + std::to_string(min_p));
  check(seed >= -1, "--seed must be >= 0, or -1 for a random seed, got " + std::to_string(seed));
  check(repeat_last_n >= -1, "--repeat-last-n must be >= -1 (-1 = all), got " + std::to_string(repeat_last_n));
  check(std::isfinite(repeat_penalty) && repeat_penalty > 0.0f,
        "--repeat-penalty must be a positive number (1 = off), got " + std::to_string(repeat_penalty));
}

}  // namespace tandem::cli
