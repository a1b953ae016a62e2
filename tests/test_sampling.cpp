// The AR sampler chain: exact results on crafted logits, reproducibility, and sampled frequencies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "tandem/rng.h"
#include "tandem/sampling.h"

namespace tandem {
namespace {

// Only the stages a test names are on.
SamplingParams plain(float temperature = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 1234;
  return p;
}

std::vector<float> log_probs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

// The survivors of the last draw, in id order.
std::vector<TokenCandidate> candidates(const Sampler& s) {
  std::vector<TokenCandidate> c(s.last_candidates().begin(), s.last_candidates().end());
  std::sort(c.begin(), c.end(), [](const TokenCandidate& a, const TokenCandidate& b) { return a.id < b.id; });
  return c;
}

std::vector<int32_t> survivors(const Sampler& s) {
  std::vector<int32_t> ids;
  for (const TokenCandidate& c : candidates(s)) ids.push_back(c.id);
  return ids;
}

TEST(Rng, MatchesAnIndependentXoshiro256StarStarWithSplitmixSeeding) {
  // Values from a separate Python implementation of splitmix64 seeding + xoshiro256**.
  Rng r0(0);
  EXPECT_EQ(r0.next(), 0x99ec5f36cb75f2b4ull);
  EXPECT_EQ(r0.next(), 0xbf6e1f784956452aull);
  EXPECT_EQ(r0.next(), 0x1a5f849d4933e6e0ull);
  Rng r42(42);
  EXPECT_EQ(r42.next(), 0x15780b2e0c2ec716ull);
  EXPECT_EQ(r42.next(), 0x6104d9866d113a7eull);
  Rng u(7);
  for (int i = 0; i < 1000; ++i) {
    const double x = u.uniform();
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
  }
}

TEST(Sampling, ArgmaxTakesTheLowestIndexOnTiesAndSkipsNaN) {
  std::vector<float> v = {1.0f, 3.0f, 3.0f, -2.0f};
  EXPECT_EQ(argmax(v), 1);
  std::vector<float> n = {NAN, 0.5f, 2.0f, 2.0f};
  EXPECT_EQ(argmax(n), 2);
}

TEST(Sampling, GreedyPicksTheLargestLogitAndUsesNoRandomness) {
  SamplingParams p = plain(0.0f);
  p.top_k = 3;
  Sampler s(p);
  std::vector<float> logits = {0.1f, 2.5f, -1.0f, 2.5f, 0.3f};
  EXPECT_EQ(s.sample(logits), 1);
  EXPECT_TRUE(s.last_candidates().empty());
  Rng fresh(p.seed);
  EXPECT_EQ(s.rng().next(), fresh.next());  // greedy consumed no random number
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p = plain(1.0f);
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  s.accept(0);
  s.accept(2);
  // logits: token 0 positive (halved), token 2 negative (doubled), token 1 untouched
  std::vector<float> logits = {2.0f, 1.0f, -0.5f};
  s.sample_with_uniform(logits, 0.5);
  const auto c = candidates(s);
  ASSERT_EQ(c.size(), 3u);
  // final logits 1.0, 1.0, -1.0
  const double z = 2 * std::exp(1.0) + std::exp(-1.0);
  EXPECT_NEAR(c[0].p, std::exp(1.0) / z, 1e-6);
  EXPECT_NEAR(c[1].p, std::exp(1.0) / z, 1e-6);
  EXPECT_NEAR(c[2].p, std::exp(-1.0) / z, 1e-6);
  EXPECT_FLOAT_EQ(c[0].logit, 1.0f);
  EXPECT_FLOAT_EQ(c[2].logit, -1.0f);
}

TEST(Sampling, PresenceAndFrequencyPenaltiesCountOccurrencesInTheWindow) {
  SamplingParams p = plain(1.0f);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  for (int32_t t : {1, 1, 1, 3}) s.accept(t);
  std::vector<float> logits = {0.0f, 2.0f, 0.0f, 1.0f};
  s.sample_with_uniform(logits, 0.1);
  const auto c = candidates(s);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_FLOAT_EQ(c[0].logit, 0.0f);
  EXPECT_FLOAT_EQ(c[1].logit, 2.0f - 3 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(c[2].logit, 0.0f);
  EXPECT_FLOAT_EQ(c[3].logit, 1.0f - 0.25f - 0.5f);
}

TEST(Sampling, PenaltyWindowKeepsOnlyTheLastNTokens) {
  SamplingParams p = plain(0.0f);
  p.penalty_last_n = 3;
  p.repeat_penalty = 100.0f;
  Sampler s(p);
  for (int32_t t : {4, 5, 6, 7, 8}) s.accept(t);
  EXPECT_EQ(s.penalty_window(), (std::vector<int32_t>{6, 7, 8}));
  // token 5 left the window, so its large logit is not penalised; 7 is
  std::vector<float> logits = {0, 0, 0, 0, 0, 3.0f, 0, 5.0f, 0};
  EXPECT_EQ(s.sample(logits), 5);

  SamplingParams off = p;
  off.penalty_last_n = 0;
  Sampler s_off(off);
  s_off.accept(7);
  EXPECT_TRUE(s_off.penalty_window().empty());
  EXPECT_EQ(s_off.sample(logits), 7);

  SamplingParams all = p;
  all.penalty_last_n = -1;
  Sampler s_all(all);
  for (int i = 0; i < 500; ++i) s_all.accept(i % 9);
  EXPECT_EQ(s_all.penalty_window().size(), 500u);
}

TEST(Sampling, GreedyStillAppliesPenalties) {
  SamplingParams p = plain(0.0f);
  p.repeat_penalty = 4.0f;
  Sampler s(p);
  s.accept(1);
  std::vector<float> logits = {1.0f, 2.0f, 0.0f};  // 2.0 / 4 = 0.5 < 1.0
  EXPECT_EQ(s.sample(logits), 0);
}

TEST(Sampling, TopKKeepsTheKLargestWithTiesByLowerId) {
  SamplingParams p = plain();
  p.top_k = 3;
  Sampler s(p);
  std::vector<float> logits = {0.5f, 2.0f, 1.0f, 2.0f, 1.0f, -3.0f};
  s.sample_with_uniform(logits, 0.0);
  EXPECT_EQ(survivors(s), (std::vector<int32_t>{1, 2, 3}));  // 1 and 3 (2.0), then 2 beats 4 on the tie
}

TEST(Sampling, TopPKeepsTheSmallestNucleus) {
  // probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (ids shuffled)
  const std::vector<double> probs = {0.0625, 0.25, 0.5, 0.0625, 0.125};
  SamplingParams p = plain();
  p.top_p = 0.7f;
  Sampler s(p);
  s.sample_with_uniform(log_probs(probs), 0.0);
  EXPECT_EQ(survivors(s), (std::vector<int32_t>{1, 2}));  // 0.5 + 0.25 >= 0.7
  // renormalised over the nucleus
  EXPECT_NEAR(candidates(s)[0].p, 1.0 / 3.0, 1e-6);
  EXPECT_NEAR(candidates(s)[1].p, 2.0 / 3.0, 1e-6);

  p.top_p = 0.8f;
  Sampler s2(p);
  s2.sample_with_uniform(log_probs(probs), 0.0);
  EXPECT_EQ(survivors(s2), (std::vector<int32_t>{1, 2, 4}));

  p.top_p = 0.0f;  // keeps at least one token
  Sampler s3(p);
  s3.sample_with_uniform(log_probs(probs), 0.9);
  EXPECT_EQ(survivors(s3), (std::vector<int32_t>{2}));
}

// The head-then-full sort path for large vocabularies against a plain full sort.
TEST(Sampling, TopPOnALargeVocabularyMatchesAFullSort) {
  Rng r(99);
  for (float scale : {8.0f, 0.01f}) {  // peaked (nucleus within the head) and flat (nucleus beyond it)
    std::vector<float> logits(5000);
    for (float& l : logits) l = float(r.uniform() * scale);
    SamplingParams p = plain();
    p.top_p = 0.9f;
    Sampler s(p);
    s.sample_with_uniform(logits, 0.5);

    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const float mx = logits[order[0]];
    double total = 0;
    for (float l : logits) total += std::exp(double(l) - mx);
    double cum = 0;
    std::vector<int32_t> expect;
    for (int32_t id : order) {
      expect.push_back(id);
      cum += std::exp(double(logits[id]) - mx);
      if (cum >= 0.9 * total) break;
    }
    std::sort(expect.begin(), expect.end());
    EXPECT_EQ(survivors(s), expect) << "scale " << scale;
  }
}

TEST(Sampling, MinPKeepsTokensWithinAFactorOfTheBest) {
  const std::vector<double> probs = {0.4, 0.3, 0.15, 0.1, 0.05};
  SamplingParams p = plain();
  p.min_p = 0.3f;  // threshold 0.12
  Sampler s(p);
  s.sample_with_uniform(log_probs(probs), 0.0);
  EXPECT_EQ(survivors(s), (std::vector<int32_t>{0, 1, 2}));
}

TEST(Sampling, TemperatureScalesLogitsBeforeTheDraw) {
  SamplingParams p = plain(0.5f);
  Sampler s(p);
  std::vector<float> logits = {1.0f, 0.0f};
  s.sample_with_uniform(logits, 0.0);
  const double e = std::exp(2.0);
  EXPECT_NEAR(candidates(s)[0].p, e / (e + 1), 1e-6);
}

TEST(Sampling, ChainOrderIsConfigurable) {
  // Temperature 0.25 before top-p sharpens the distribution so the nucleus shrinks to one token.
  const std::vector<double> probs = {0.5, 0.3, 0.2};
  SamplingParams p = plain(0.25f);
  p.top_p = 0.6f;
  Sampler late(p);  // default order: top-p sees temperature 1 -> {0, 1}
  late.sample_with_uniform(log_probs(probs), 0.0);
  EXPECT_EQ(survivors(late), (std::vector<int32_t>{0, 1}));

  p.order = {SamplerStage::Temperature, SamplerStage::TopP};
  Sampler early(p);
  early.sample_with_uniform(log_probs(probs), 0.0);
  EXPECT_EQ(survivors(early), (std::vector<int32_t>{0}));
}

TEST(Sampling, DistWalksSurvivorsInIdOrder) {
  SamplingParams p = plain();
  Sampler s(p);
  std::vector<float> logits = {0, 0, 0, 0};  // 0.25 each
  EXPECT_EQ(s.sample_with_uniform(logits, 0.0), 0);
  EXPECT_EQ(s.sample_with_uniform(logits, 0.3), 1);
  EXPECT_EQ(s.sample_with_uniform(logits, 0.74), 2);
  EXPECT_EQ(s.sample_with_uniform(logits, 0.9999), 3);
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};  // running sums 0.1, 0.3, 0.6, 1.0
  EXPECT_EQ(s.sample_with_uniform(log_probs(probs), 0.05), 0);
  EXPECT_EQ(s.sample_with_uniform(log_probs(probs), 0.25), 1);
  EXPECT_EQ(s.sample_with_uniform(log_probs(probs), 0.55), 2);
  EXPECT_EQ(s.sample_with_uniform(log_probs(probs), 0.65), 3);
  std::vector<float> masked = {0, -INFINITY, 0, -INFINITY};
  EXPECT_EQ(s.sample_with_uniform(masked, 0.6), 2);
  EXPECT_EQ(s.sample_with_uniform(masked, 0.9999999), 2);  // never a zero-probability token
}

TEST(Sampling, SameSeedSameTokensDifferentSeedDifferentTokens) {
  Rng r(5);
  std::vector<float> logits(300);
  for (float& l : logits) l = float(r.uniform() * 3);
  SamplingParams p = plain(1.0f);
  p.top_k = 50;
  p.seed = 77;
  Sampler a(p), b(p);
  p.seed = 78;
  Sampler c(p);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(a.sample(logits));
    tb.push_back(b.sample(logits));
    tc.push_back(c.sample(logits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  // a large vocabulary without truncation takes the head-then-full walk
  std::vector<float> flat(3000);
  for (float& l : flat) l = float(r.uniform() * 0.1);
  SamplingParams pf = plain(1.0f);
  Sampler f1(pf), f2(pf);
  std::vector<int> seen(flat.size(), 0);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = f1.sample(flat);
    ASSERT_EQ(t, f2.sample(flat));
    ASSERT_GE(t, 0);
    ASSERT_LT(t, 3000);
    ++seen[size_t(t)];
  }
  EXPECT_GT(std::count(seen.begin(), seen.end(), 0), 0);
  // against a plain reference walk in id order
  std::vector<int32_t> order(flat.size());
  std::iota(order.begin(), order.end(), 0);
  const float mx = *std::max_element(flat.begin(), flat.end());
  double total = 0;
  for (float l : flat) total += float(std::exp(double(l) - mx));
  for (double u : {0.01, 0.5, 0.97}) {
    double cum = 0;
    int32_t expect = -1;
    for (int32_t id : order) {
      cum += float(std::exp(double(flat[id]) - mx));
      if (cum > u * total) {
        expect = id;
        break;
      }
    }
    EXPECT_EQ(f1.sample_with_uniform(flat, u), expect) << "u " << u;
  }
  a.reset();
  for (int i = 0; i < 64; ++i) ASSERT_EQ(a.sample(logits), ta[size_t(i)]);
}

// Frequencies of 40000 draws against the exact probabilities, within 5 standard deviations.
void expect_frequencies(Sampler& s, const std::vector<float>& logits, const std::vector<double>& expect) {
  const int n = 40000;
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++count[size_t(s.sample(logits))];
  for (size_t t = 0; t < logits.size(); ++t) {
    const double sd = std::sqrt(n * expect[t] * (1 - expect[t]));
    EXPECT_NEAR(count[t], n * expect[t], 5 * sd + 1) << "token " << t;
  }
}

TEST(Sampling, SampledFrequenciesMatchTheDistribution) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  Sampler s(plain(1.0f));
  expect_frequencies(s, log_probs(probs), probs);

  // temperature 0.5 squares the probabilities (then renormalises)
  Sampler t(plain(0.5f));
  std::vector<double> sq;
  double z = 0;
  for (double p : probs) z += p * p;
  for (double p : probs) sq.push_back(p * p / z);
  expect_frequencies(t, log_probs(probs), sq);

  // top-k 2 renormalises over {2, 3}
  SamplingParams k = plain(1.0f);
  k.top_k = 2;
  Sampler sk(k);
  expect_frequencies(sk, log_probs(probs), {0, 0, 3.0 / 7, 4.0 / 7});
}

TEST(Sampling, BadParametersAreRejectedWithTheirName) {
  auto expect_error = [](SamplingParams p, const std::string& word) {
    try {
      Sampler s(p);
      FAIL() << "accepted a bad " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  SamplingParams p = plain();
  p.top_p = 1.5f;
  expect_error(p, "top-p");
  p = plain();
  p.min_p = -0.1f;
  expect_error(p, "min-p");
  p = plain();
  p.repeat_penalty = 0.0f;
  expect_error(p, "repeat penalty");
  p = plain();
  p.penalty_last_n = -2;
  expect_error(p, "penalty window");
  p = plain();
  p.order = {SamplerStage::TopK, SamplerStage::TopK};
  expect_error(p, "top-k");
  Sampler ok(plain());
  EXPECT_THROW(ok.sample(std::span<const float>()), Error);
}

}  // namespace
}  // namespace tandem
