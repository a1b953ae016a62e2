// Helpers of the comm tests (tests/test_comm.cpp on CPU ranks, tests/gpu/test_comm_gpu.cpp on GPUs): run one
// host thread per rank with a timeout (a hang fails the test instead of stalling CI), collect each rank's
// Error, and random data that is never zero.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm.h"

namespace tandem::comm_test {

// Runs body(rank) on one thread per rank and returns each rank's Error message ("" when it returned). Ranks
// that have not finished after `timeout` fail the test and are released by aborting the comm.
inline std::vector<std::string> run_ranks(Comm& comm, const std::function<void(int)>& body,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  std::vector<std::future<void>> done;
  for (int r = 0; r < comm.n_ranks(); ++r)
    done.push_back(std::async(std::launch::async, [&body, r] { body(r); }));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto& f : done) {
    if (f.wait_until(deadline) != std::future_status::ready) {
      ADD_FAILURE() << "the ranks did not finish within " << timeout.count() << " ms (a hang); aborting";
      comm.abort();
      break;
    }
  }
  std::vector<std::string> errors;
  for (auto& f : done) {
    try {
      f.get();
      errors.emplace_back();
    } catch (const Error& e) {
      errors.emplace_back(e.what());
      if (errors.back().empty()) errors.back() = "(empty Error message)";
    } catch (const std::exception& e) {
      errors.push_back(std::string("not a tandem::Error: ") + e.what());
    }
  }
  return errors;
}

inline void expect_all_ok(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Every rank threw an Error whose message contains `part`.
inline void expect_all_throw(const std::vector<std::string>& errors, const std::string& part) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find(part), std::string::npos) << "rank " << r << ": '" << errors[r] << "'";
    EXPECT_EQ(errors[r].find("not a tandem::Error"), std::string::npos) << errors[r];
  }
}

// Random values of magnitude in [0.3, 3) times a per-call scale, random sign: never zero, and sums that
// round.
inline std::vector<float> random_nonzero(size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> mag(0.3f, 3.0f);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = (neg(rng) ? -1.0f : 1.0f) * mag(rng) * scale;
  return v;
}

// The all-reduce every comm but nccl must match bit for bit: ((x_0 + x_1) + x_2) + ... in float.
inline std::vector<float> rank_order_sum(const std::vector<std::vector<float>>& inputs) {
  std::vector<float> sum = inputs.at(0);
  for (size_t r = 1; r < inputs.size(); ++r)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += inputs[r][i];
  return sum;
}

}  // namespace tandem::comm_test
