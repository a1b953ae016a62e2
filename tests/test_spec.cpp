// Speculative decoding (speculative.h):
//  - the acceptance test alone: draft tokens drawn from q and passed through speculative_accept are
//    distributed as p (chi-square over many draws), while q's own draws fail the same bound (the test can
//    fail);
//  - the shipped small model with the shipped draft model: greedy speculative output is token-identical to
//    plain greedy decoding, several sequences at once, several draft lengths, unsplit and under layer and
//    tensor split on CPU ranks;
//  - sampled speculative decoding on the shipped models: the first generated token's frequencies over many
//    seeds match the target sampler's distribution;
//  - bad parameters are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "eval/default_model.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "tandem/speculative.h"
#include "test_spec_util.h"

namespace tandem {
namespace {

using testing::chi_square;
using testing::plain_greedy;

const std::string kModelPath = std::string(TANDEM_SOURCE_DIR) + "/models/" + eval::kDefaultModelFile;
const std::string kDraftPath = std::string(TANDEM_SOURCE_DIR) + "/models/" + eval::kDefaultDraftFile;

TEST(SpecAccept, OutputIsDistributedAsTarget) {
  const std::vector<TokenCandidate> p = {
      {3, 0, 0.40f}, {5, 0, 0.25f}, {7, 0, 0.20f}, {9, 0, 0.10f}, {11, 0, 0.05f}};
  // q differs a lot, misses token 11 and has mass on 13, which p lacks.
  const std::vector<TokenCandidate> q = {
      {3, 0, 0.10f}, {5, 0, 0.45f}, {7, 0, 0.05f}, {9, 0, 0.25f}, {13, 0, 0.15f}};
  Rng rng(1234);
  const int64_t n = 200000;
  std::map<int32_t, int64_t> got, drafted;
  int64_t accepted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double u = rng.uniform();
    double acc = 0.0;
    int32_t d = q.back().id;
    for (const TokenCandidate& t : q) {
      acc += t.p;
      if (acc > u) {
        d = t.id;
        break;
      }
    }
    ++drafted[d];
    const AcceptOutcome r = speculative_accept(p, q, d, rng);
    accepted += r.accepted;
    ++got[r.token];
  }
  // 4 degrees of freedom: P(chi2 > 25) < 1e-4.
  const double chi = chi_square(got, p, n);
  EXPECT_LT(chi, 25.0) << "speculative_accept does not reproduce p";
  // Keeping every draft (the wrong scheme) gives q, which the same bound rejects.
  EXPECT_GT(chi_square(drafted, p, n), 25.0);
  // Acceptance rate = sum min(p, q) = 0.10 + 0.25 + 0.05 + 0.10 = 0.50.
  EXPECT_NEAR(double(accepted) / double(n), 0.50, 0.01);
}

TEST(SpecAccept, EqualDistributionsAlwaysAccept) {
  const std::vector<TokenCandidate> p = {{1, 0, 0.5f}, {2, 0, 0.5f}};
  Rng rng(7);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(speculative_accept(p, p, 1 + (i & 1), rng).accepted);
}

TEST(SpecParams, BadValuesNameTheFlag) {
  auto message = [](SpeculativeParams p) {
    try {
      p.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.draft_max = -1}).find("--draft-max"), std::string::npos);
  EXPECT_NE(message({.draft_max = 4, .draft_min = 5}).find("--draft-min"), std::string::npos);
  EXPECT_NE(message({.draft_max = 4, .draft_min = 0, .draft_p_min = 1.5f}).find("--draft-p-min"),
            std::string::npos);
  EXPECT_EQ(message({.draft_max = 4, .draft_min = 2, .draft_p_min = 0.5f}), "");
}

std::shared_ptr<Model> load(const std::string& path, const std::string& mode = "") {
  ModelParams mp;
  mp.n_threads = 2;
  if (!mode.empty()) {
    mp.devices = "cpu:0,cpu:1";
    mp.split_mode = mode;
  }
  return Model::load(path, mp);
}

const std::vector<std::vector<int32_t>>& kPrompts = testing::kSpecPrompts;

void expect_greedy_identical(const std::shared_ptr<Model>& target, const std::shared_ptr<Model>& draft,
                             const std::vector<std::vector<int32_t>>& expected, int n) {
  for (const SpeculativeStats& st :
       testing::expect_greedy_spec_identical(target, draft, testing::draft_model_drafter(), kPrompts,
                                             expected, n, {1, 4, 8}, false, "draft model")) {
    EXPECT_GT(st.accepted, 0) << st.summary();
    EXPECT_GT(st.mean_accepted_length(), 1.0);
  }
}

TEST(SpecShipped, GreedyDraftModelIsTokenIdentical) {
  const auto target = load(kModelPath);
  const auto draft = load(kDraftPath);
  const int n = 40;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : kPrompts) expected.push_back(plain_greedy(target, p, n));
  expect_greedy_identical(target, draft, expected, n);
}

TEST(SpecShipped, GreedyDraftModelIsTokenIdenticalUnderSplits) {
  const auto plain = load(kModelPath);
  const auto draft = load(kDraftPath);
  const int n = 24;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : kPrompts) expected.push_back(plain_greedy(plain, p, n));
  for (const char* mode : {"layer", "tensor"}) {
    SCOPED_TRACE(mode);
    expect_greedy_identical(load(kModelPath, mode), draft, expected, n);
  }
}

TEST(SpecShipped, StopTokenAndDraftVocabularyCheck) {
  const auto target = load(kModelPath);
  const auto draft = load(kDraftPath);
  Session ts(target, {.n_ctx = 256, .n_seq_max = 1});
  Session ds(draft, {.n_ctx = 256, .n_seq_max = 1});
  EXPECT_THROW(DraftModelDrafter(ds, ts.n_vocab() + 1), Error);
  DraftModelDrafter drafter(ds, ts.n_vocab());
  SpeculativeDecoder spec(ts, drafter, {.draft_max = 6});
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto expected = plain_greedy(target, kPrompts[0], 32);
  // Stop at the first occurrence of the 10th token: the output ends there even inside an accepted draft.
  const int32_t stop = expected[9];
  size_t first = 0;
  while (expected[first] != stop) ++first;
  const auto out = spec.generate({kPrompts[0]}, 32, std::span(&greedy, 1), std::span(&stop, 1));
  EXPECT_EQ(out[0], std::vector<int32_t>(expected.begin(), expected.begin() + long(first) + 1));
  EXPECT_THROW(spec.generate({kPrompts[0], kPrompts[1]}, 4, std::span(&greedy, 1)), Error);  // 2 seqs > 1
  EXPECT_THROW(spec.generate({{}}, 4, std::span(&greedy, 1)), Error);
}

TEST(SpecShipped, SampledFirstTokenFollowsTarget) {
  const auto target = load(kModelPath);
  const auto draft = load(kDraftPath);
  const std::vector<int32_t> prompt = kPrompts[1];
  SamplingParams sp;
  sp.temperature = 1.5f;  // a flat distribution over a few tokens: many rejections
  sp.top_k = 6;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  const std::vector<TokenCandidate> p = testing::target_distribution(target, prompt, sp);
  ASSERT_EQ(p.size(), 6u);
  const int32_t n_seq = 16, rounds = 40;
  Session ts(target, {.n_ctx = 512, .n_seq_max = n_seq});
  Session ds(draft, {.n_ctx = 512, .n_seq_max = n_seq});
  DraftModelDrafter drafter(ds, ts.n_vocab());
  SpeculativeDecoder spec(ts, drafter, {.draft_max = 3});
  std::map<int32_t, int64_t> counts;
  int64_t n = 0;
  for (const auto& o : testing::sampled_outputs(spec, prompt, sp, n_seq, rounds, 3)) {
    ASSERT_FALSE(o.empty());
    ++counts[o[0]];
    ++n;
  }
  const double chi = chi_square(counts, p, n);
  std::printf("first token: chi-square %.2f over %lld draws (5 dof); %s\n", chi, (long long)n,
              spec.stats().summary().c_str());
  EXPECT_LT(chi, 20.5);  // 5 degrees of freedom: P(chi2 > 20.5) < 1e-3
  EXPECT_GT(spec.stats().accepted, 0);
  EXPECT_LT(spec.stats().accepted, spec.stats().drafted);  // rejections happened: the residual path ran
}

}  // namespace
}  // namespace tandem
