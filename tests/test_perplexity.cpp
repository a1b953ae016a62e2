// Perplexity windows, statistics and per-token NLL (src/eval/perplexity.h), and the default-model lookup.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "eval/default_model.h"
#include "eval/perplexity.h"

namespace tandem::eval {
namespace {

TEST(PerplexityWindows, DefaultModeScoresSecondHalfOfWholeWindows) {
  const auto w = perplexity_windows(1100, 512, 0);
  ASSERT_EQ(w.size(), 2u);  // the trailing 76 tokens are dropped
  EXPECT_EQ(w[0].start, 0);
  EXPECT_EQ(w[0].first_scored, 257);
  EXPECT_EQ(w[0].end, 512);
  EXPECT_EQ(w[1].start, 512);
  EXPECT_EQ(w[1].first_scored, 512 + 257);
  EXPECT_EQ(w[1].end, 1024);
  // llama-perplexity scores ctx - 1 - ctx/2 tokens per window.
  EXPECT_EQ(w[0].end - w[0].first_scored, 512 - 1 - 256);
}

TEST(PerplexityWindows, OddContext) {
  const auto w = perplexity_windows(7, 7, 0);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].first_scored, 4);  // 7/2 + 1
  EXPECT_EQ(w[0].end, 7);
}

// Every target 1 .. n-1 is scored exactly once, each with at most ctx - 1 tokens of context, for any stride.
TEST(PerplexityWindows, StrideCoversEveryTargetOnce) {
  for (int64_t n : {2, 3, 10, 97, 512, 1000}) {
    for (int32_t ctx : {2, 3, 8, 64}) {
      for (int32_t stride = 1; stride <= ctx - 1; ++stride) {
        const auto ws = perplexity_windows(n, ctx, stride);
        std::vector<int> hits(size_t(n), 0);
        for (const auto& w : ws) {
          ASSERT_LT(w.start, w.first_scored);
          ASSERT_LE(w.first_scored, w.end);
          ASSERT_LE(w.end - w.start, ctx);
          for (int64_t t = w.first_scored; t < w.end; ++t) ++hits[size_t(t)];
        }
        EXPECT_EQ(hits[0], 0);
        for (int64_t t = 1; t < n; ++t) ASSERT_EQ(hits[size_t(t)], 1) << n << " " << ctx << " " << stride;
        EXPECT_EQ(ws.back().end, n);
      }
    }
  }
}

TEST(PerplexityWindows, StrideExample) {
  const auto w = perplexity_windows(10, 4, 2);
  // [0,4) scores 1..3; [2,6) scores 4,5; [4,8) 6,7; [6,10) 8,9
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[0].first_scored, 1);
  EXPECT_EQ(w[1].start, 2);
  EXPECT_EQ(w[1].first_scored, 4);
  EXPECT_EQ(w[3].start, 6);
  EXPECT_EQ(w[3].end, 10);
}

TEST(PerplexityWindows, BadInput) {
  EXPECT_THROW(perplexity_windows(100, 1, 0), Error);
  EXPECT_THROW(perplexity_windows(100, 16, -1), Error);
  EXPECT_THROW(perplexity_windows(100, 16, 16), Error);  // would skip a target at each window start
  EXPECT_THROW(perplexity_windows(15, 16, 0), Error);    // not one whole window
  EXPECT_THROW(perplexity_windows(1, 16, 4), Error);
  try {
    perplexity_windows(15, 16, 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one window"), std::string::npos);
  }
}

TEST(NllStats, MatchesTwoPassFormula) {
  std::mt19937 rng(7);
  std::gamma_distribution<double> dist(2.0, 1.5);
  std::vector<double> v(1000);
  NllStats s;
  for (double& x : v) {
    x = dist(rng);
    s.add(x);
  }
  double mean = 0;
  for (double x : v) mean += x;
  mean /= double(v.size());
  double var = 0;  // population variance, as llama-perplexity's mean(x^2) - mean^2
  for (double x : v) var += (x - mean) * (x - mean);
  var /= double(v.size());
  const double ppl = std::exp(mean);
  EXPECT_NEAR(s.mean(), mean, 1e-12 * mean);
  EXPECT_NEAR(s.ppl(), ppl, 1e-10 * ppl);
  const double err = ppl * std::sqrt(var / double(v.size() - 1));
  EXPECT_NEAR(s.ppl_error(), err, 1e-9 * err);
}

TEST(NllStats, DegenerateCases) {
  NllStats s;
  EXPECT_EQ(s.ppl_error(), 0.0);
  s.add(1.0);
  EXPECT_EQ(s.ppl_error(), 0.0);
  s.add(1.0);
  EXPECT_EQ(s.ppl_error(), 0.0);  // no spread
  EXPECT_NEAR(s.ppl(), std::exp(1.0), 1e-12);
}

TEST(TokenNll, MatchesNaiveLogSoftmax) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = dist(rng) + 30.0f;  // a large offset: the max shift must keep it exact
  long double z = 0;
  for (float x : logits) z += std::exp((long double)x - 30.0L);
  for (int32_t t : {0, 17, 999}) {
    const long double ref = (30.0L + std::log(z)) - (long double)logits[size_t(t)];
    EXPECT_NEAR(token_nll(logits, t), double(ref), 1e-9 * std::fabs(double(ref)) + 1e-12);
  }
  EXPECT_THROW(token_nll(logits, 1000), Error);
  EXPECT_THROW(token_nll(logits, -1), Error);
}

TEST(DefaultModel, EnvironmentVariableWinsAndMustExist) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path() / "tandem_default_model_test.gguf";
  { std::ofstream(tmp) << "x"; }
  ::setenv("TANDEM_MODEL", tmp.c_str(), 1);
  EXPECT_EQ(default_model_path("/nonexistent"), tmp.string());
  ::setenv("TANDEM_MODEL", "/nonexistent/model.gguf", 1);
  EXPECT_THROW(default_model_path("/nonexistent"), Error);
  ::unsetenv("TANDEM_MODEL");
  fs::remove(tmp);
}

TEST(DefaultModel, NotFoundListsPlacesTried) {
  ::unsetenv("TANDEM_MODEL");
  const auto c = default_model_candidates("/nonexistent-src");
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0], "/nonexistent-src/models/" + std::string(kDefaultModelFile));
  try {
    // The source dir does not exist; the binary-relative places may, if a model is installed next to the
    // test binary, so only check the message when nothing was found.
    const std::string p = default_model_path("/nonexistent-src");
    EXPECT_TRUE(std::filesystem::is_regular_file(p));
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("/nonexistent-src/models/"), std::string::npos);
    EXPECT_NE(msg.find("-m"), std::string::npos);
  }
}

}  // namespace
}  // namespace tandem::eval
