// Checks of numeric command-line values, shared by the subcommands: every message names the flag, the
// allowed range and what was given ("--threads must be in [0, 1024] (0 = all cores), got -1"), and the
// command exits non-zero (tandem::Error reaches main).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"

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

// --threads of every command: 0 (all cores) up to the thread pool's cap.
inline void check_threads_flag(int64_t value, const char* flag = "--threads") {
  check_int_flag(flag, value, 0, ThreadPool::kMaxThreads, "0 = one per hardware thread");
}

}  // namespace tandem::cli
