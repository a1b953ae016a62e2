// The server's promise "the same seed gives the same text whatever else runs" rests on this: on the CPU, a
// sequence's logits are bit-identical whether its rows are decoded alone or among other sequences' rows, at
// any offset in the batch and for any thread count (the matmul groups activation rows by four, the attention
// splits heads over tasks by thread count and batch size; neither may change a row's result). The shipped
// model (real Q8_0 weights) is decoded through Session in both ways and the logits compared bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "eval/default_model.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "test_batch_invariance_util.h"

namespace tandem {
namespace {

std::shared_ptr<Model> shipped(int threads) {
  ModelParams mp;
  mp.n_threads = threads;
  return Model::load(eval::default_model_path(TANDEM_SOURCE_DIR), mp);
}

struct Trace {
  std::vector<std::vector<float>> logits;  // per step: the logits of the sequence's last row
};

// Prefills `prompt` then decodes `steps` (fixed tokens) for sequence 0 alone.
Trace alone(const std::shared_ptr<Model>& model, const std::vector<int32_t>& prompt,
            const std::vector<int32_t>& steps) {
  Session s(model, {.n_ctx = 1024, .n_seq_max = 8});
  Trace t;
  Batch b;
  b.add_sequence(prompt, 0, 0, true);
  s.decode(b);
  auto lg = s.logits(b.size() - 1);
  t.logits.emplace_back(lg.begin(), lg.end());
  int32_t pos = int32_t(prompt.size());
  for (int32_t tok : steps) {
    b.clear();
    b.add(tok, pos++, 0, true);
    s.decode(b);
    lg = s.logits(0);
    t.logits.emplace_back(lg.begin(), lg.end());
  }
  return t;
}

// The same sequence (id `seq`) decoded with other sequences' prefill chunks and decode rows around it, at a
// random row offset each step.
Trace busy(const std::shared_ptr<Model>& model, const std::vector<int32_t>& prompt,
           const std::vector<int32_t>& steps, int32_t seq, uint32_t seed) {
  Session s(model, {.n_ctx = 1024, .n_seq_max = 8});
  std::mt19937 rng(seed);
  const int32_t n_vocab = int32_t(model->info().n_vocab);
  std::vector<int32_t> other_len(8, 0);
  Trace t;
  Batch b;
  auto add_others = [&](int n_rows) {
    for (int k = 0; k < n_rows; ++k) {
      int32_t o = int32_t(rng() % 8);
      if (o == seq) o = (o + 1) % 8;
      const int32_t chunk = 1 + int32_t(rng() % 5);
      for (int32_t i = 0; i < chunk; ++i) {
        b.add(int32_t(rng() % uint32_t(n_vocab)), other_len[size_t(o)], o, rng() % 2 == 0);
        ++other_len[size_t(o)];
      }
    }
  };
  auto run = [&](const std::vector<int32_t>& toks, int32_t pos0) {
    b.clear();
    add_others(int(rng() % 4));
    const size_t first = b.size();
    for (size_t i = 0; i < toks.size(); ++i) b.add(toks[i], pos0 + int32_t(i), seq, i + 1 == toks.size());
    const size_t mine = first + toks.size() - 1;
    add_others(int(rng() % 4));
    s.decode(b);
    auto lg = s.logits(mine);
    t.logits.emplace_back(lg.begin(), lg.end());
  };
  run(prompt, 0);
  int32_t pos = int32_t(prompt.size());
  for (int32_t tok : steps) run({tok}, pos++);
  return t;
}

class CpuBatchInvariance : public ::testing::TestWithParam<int> {};

TEST_P(CpuBatchInvariance, ASequencesLogitsDoNotDependOnTheOtherRowsOfItsBatch) {
  const auto model = shipped(GetParam());
  const std::vector<int32_t> prompt = {0, 412, 77, 1903, 5, 260, 3001};
  const std::vector<int32_t> steps = {88, 1200, 6, 4000, 31, 702, 15, 999};
  const Trace ref = alone(model, prompt, steps);
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    const Trace got = busy(model, prompt, steps, int32_t(seed % 8), seed);
    ASSERT_EQ(got.logits.size(), ref.logits.size());
    for (size_t i = 0; i < ref.logits.size(); ++i) {
      ASSERT_EQ(got.logits[i].size(), ref.logits[i].size());
      size_t diff = 0;
      float max_abs = 0;
      for (size_t v = 0; v < ref.logits[i].size(); ++v)
        if (std::memcmp(&got.logits[i][v], &ref.logits[i][v], sizeof(float)) != 0) {
          ++diff;
          max_abs = std::max(max_abs, std::abs(got.logits[i][v] - ref.logits[i][v]));
        }
      EXPECT_EQ(diff, 0u) << "seed " << seed << ", step " << i << ": " << diff
                          << " logits differ from the sequence decoded alone (max |diff| " << max_abs
                          << "), threads " << GetParam();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuBatchInvariance, ::testing::Values(1, 3, 16));

// Rows of one sequence decoded 2..9 at a time (speculative verify), a prompt prefilled in pieces, two
// sequences side by side: the same logits bit for bit as plain decoding (test_batch_invariance_util.h; the
// same check runs on cuda:0 in tests/gpu/test_gpu_batch_invariance.cpp).
TEST(BatchInvariance, RowLogitsDoNotDependOnTheRowsDecodedWithThem) {
  testing::expect_batch_invariant_rows("cpu");
}

}  // namespace
}  // namespace tandem
