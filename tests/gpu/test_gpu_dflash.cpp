// Speculative decoding on the GPU (speculative.h) with the shipped small model and its classic draft model
// on cuda:0: greedy speculative output is token-identical to plain greedy decoding on the same device, for
// several sequences at once and several draft lengths, and sampled decoding runs with rejections. (The
// DFlash drafter and its device-feature path are not built yet: see docs/ARCHITECTURE.md, "Speculative
// decoding".)
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "tandem/speculative.h"

namespace tandem {
namespace {

const std::string kModels = std::string(TANDEM_SOURCE_DIR) + "/models/";

std::shared_ptr<Model> load_cuda(const std::string& file) {
  ModelParams mp;
  mp.device = "cuda:0";
  return Model::load(kModels + file, mp);
}

std::vector<int32_t> plain_greedy(const std::shared_ptr<Model>& model, const std::vector<int32_t>& prompt,
                                  int n) {
  Session session(model, {.n_ctx = 256});
  Batch batch;
  batch.add_sequence(prompt, 0, 0, true);
  std::vector<int32_t> out;
  int32_t pos = int32_t(prompt.size());
  for (int i = 0; i < n; ++i) {
    session.decode(batch);
    const int32_t t = argmax(session.logits(batch.size() - 1));
    out.push_back(t);
    batch.clear();
    batch.add(t, pos++, 0, true);
  }
  return out;
}

const std::vector<std::vector<int32_t>> kPrompts = {
    {0, 417, 1210, 4145}, {0, 306, 258, 1210, 1327}, {0, 893}, {0, 14, 394, 1210, 4145, 306, 258}};

TEST(SpecGpu, GreedyDraftModelIsTokenIdenticalOnCuda) {
  TANDEM_REQUIRE_GPU();
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const auto draft = load_cuda("tandem-draft-q8_0.gguf");
  const int n = 48;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : kPrompts) expected.push_back(plain_greedy(target, p, n));
  for (int32_t draft_max : {1, 4, 8}) {
    Session ts(target, {.n_ctx = 256, .n_seq_max = 4});
    Session ds(draft, {.n_ctx = 256, .n_seq_max = 4});
    DraftModelDrafter drafter(ds, ts.n_vocab());
    SpeculativeDecoder spec(ts, drafter, {.draft_max = draft_max});
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    const auto out = spec.generate(kPrompts, n, std::span(&greedy, 1));
    for (size_t i = 0; i < out.size(); ++i)
      EXPECT_EQ(out[i], expected[i]) << "prompt " << i << ", draft_max " << draft_max;
    EXPECT_GT(spec.stats().accepted, 0);
    std::printf("cuda draft_max %d: %s\n", draft_max, spec.stats().summary().c_str());
  }
}

TEST(SpecGpu, SampledRunsWithRejectionsOnCuda) {
  TANDEM_REQUIRE_GPU();
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const auto draft = load_cuda("tandem-draft-q8_0.gguf");
  Session ts(target, {.n_ctx = 512, .n_seq_max = 8});
  Session ds(draft, {.n_ctx = 512, .n_seq_max = 8});
  DraftModelDrafter drafter(ds, ts.n_vocab());
  SpeculativeDecoder spec(ts, drafter, {.draft_max = 4});
  std::vector<SamplingParams> sp(8);
  for (size_t i = 0; i < sp.size(); ++i) {
    sp[i].temperature = 1.2f;
    sp[i].seed = 100 + i;
  }
  const auto out = spec.generate(std::vector<std::vector<int32_t>>(8, kPrompts[0]), 32, sp);
  for (const auto& o : out) EXPECT_EQ(o.size(), 32u);
  EXPECT_GT(spec.stats().accepted, 0);
  EXPECT_LT(spec.stats().accepted, spec.stats().drafted);
}

}  // namespace
}  // namespace tandem
