// Speculative decoding on the GPU (speculative.h) on cuda:0, with the shipped small model as the target:
//  - the classic draft model: greedy speculative output is token-identical to plain greedy decoding on the
//    same device (the target session is batch-invariant: its verify rows run the one-row kernels), for
//    several sequences at once and several draft lengths; sampled decoding runs with rejections;
//  - a DFlash drafter of the target's width (random weights, built here): the device-feature path (taps into
//    one device buffer read in place by the drafter) gives bit-identical drafter logits and outputs to the
//    host path; greedy DFlash output is token-identical to plain greedy decoding.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "../test_dflash_fixture.h"
#include "../test_spec_util.h"
#include "gpu_test_util.h"
#include "runtime/graph_key.h"
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

// Plain greedy on cuda, batch-invariant like the speculative target sessions below.
std::vector<int32_t> plain_greedy(const std::shared_ptr<Model>& model, const std::vector<int32_t>& prompt,
                                  int n) {
  return testing::plain_greedy(model, prompt, n, true);
}

const std::vector<std::vector<int32_t>>& kPrompts = testing::kSpecPrompts;

TEST(SpecGpu, GreedyDraftModelIsTokenIdenticalOnCuda) {
  TANDEM_REQUIRE_GPU();
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const auto draft = load_cuda("tandem-draft-q8_0.gguf");
  const int n = 48;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : kPrompts) expected.push_back(plain_greedy(target, p, n));
  for (const SpeculativeStats& st :
       testing::expect_greedy_spec_identical(target, draft, testing::draft_model_drafter(), kPrompts,
                                             expected, n, {1, 4, 8}, true, "cuda draft model")) {
    EXPECT_GT(st.accepted, 0) << st.summary();
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

std::shared_ptr<Model> load_drafter(const std::string& path, const std::shared_ptr<Model>& target) {
  ModelParams mp;
  mp.device = "cuda:0";
  mp.share_weights_from = target;
  return Model::load(path, mp);
}

// A DFlash drafter of the shipped model's width on cuda:0: 1 layer, taps of layers 1, 4 and 7, random
// weights.
std::shared_ptr<Model> shipped_shape_drafter(const std::shared_ptr<Model>& target) {
  const auto path = testing::write_shipped_shape_drafter("gpu_dflash");
  const auto dm = load_drafter(path.string(), target);
  std::filesystem::remove(path);
  return dm;
}

// Two DFlash runs that must agree bitwise: the same tokens, the same drafter logits of the extra draft pass
// (draft_max rows), the same acceptance.
void expect_same_dflash_runs(const testing::DflashRun& a, const testing::DflashRun& b, size_t draft_max) {
  EXPECT_EQ(a.out, b.out);
  ASSERT_EQ(a.block_logits.size(), draft_max);
  ASSERT_EQ(b.block_logits.size(), draft_max);
  for (size_t r = 0; r < draft_max; ++r)
    EXPECT_EQ(a.block_logits[r], b.block_logits[r]) << "block row " << r + 1;
  EXPECT_EQ(a.stats.accepted, b.stats.accepted);
  EXPECT_EQ(a.stats.drafted, b.stats.drafted);
}

// The two feature paths on cuda:0: the same tokens, the same acceptance and bit-identical drafter logits of a
// draft pass after the generated text (the target batch-invariant, so its taps do not depend on how the
// verify rows are grouped).
TEST(DflashGpu, DeviceFeaturePathIsBitIdenticalToHostPath) {
  TANDEM_REQUIRE_GPU();
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const auto dm = shipped_shape_drafter(target);
  const testing::DflashRun host = testing::run_dflash(target, dm, kPrompts, 32, 7, 0, true);
  const testing::DflashRun dev = testing::run_dflash(target, dm, kPrompts, 32, 7, 1, true);
  ASSERT_FALSE(host.device_features);
  ASSERT_TRUE(dev.device_features);
  expect_same_dflash_runs(host, dev, 7);
}

// The drafter's steps replayed as recorded graphs (runtime/graph_key.h: draft blocks under a block mask,
// feature rows read in place) against the same steps run directly: the same tokens, bit-identical drafter
// logits of the last draft pass, the same acceptance.
TEST(DflashGpu, RecordedDrafterStepsAreBitIdenticalToDirectOnes) {
  TANDEM_REQUIRE_GPU();
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const auto dm = shipped_shape_drafter(target);
  set_record_other_step_shapes(false);
  const testing::DflashRun direct = testing::run_dflash(target, dm, kPrompts, 32, 7, 1, true);
  set_record_other_step_shapes(true);
  const testing::DflashRun recorded = testing::run_dflash(target, dm, kPrompts, 32, 7, 1, true);
  set_record_other_step_shapes(std::nullopt);
  ASSERT_TRUE(direct.device_features);
  ASSERT_TRUE(recorded.device_features);
  expect_same_dflash_runs(direct, recorded, 7);
}

TEST(DflashGpu, GreedyIsTokenIdenticalOnCuda) {
  TANDEM_REQUIRE_GPU();
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const auto dm = shipped_shape_drafter(target);
  const int n = 40;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : kPrompts) expected.push_back(plain_greedy(target, p, n));
  testing::expect_greedy_spec_identical(target, dm, testing::dflash_drafter(), kPrompts, expected, n,
                                        {1, 4, 7}, true, "cuda dflash");
}

// The shipped trained DFlash drafter (TANDEM_DFLASH_DRAFTER names another file for the same target), when
// present: greedy identity and real acceptance on cuda.
TEST(DflashGpu, ShippedDrafterAcceptsOnCuda) {
  TANDEM_REQUIRE_GPU();
  const char* env = std::getenv("TANDEM_DFLASH_DRAFTER");
  const std::string file = env ? std::string(env) : kModels + "tandem-small-dflash-q8_0.gguf";
  if (!std::filesystem::exists(file)) GTEST_SKIP() << "no " << file;
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const auto dm = load_drafter(file, target);
  const int n = 48;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : kPrompts) expected.push_back(plain_greedy(target, p, n));
  Session ts(target, {.n_ctx = 256, .n_seq_max = 4, .batch_invariant = true});
  Session ds(dm, {.n_ctx = 256, .n_seq_max = 4});
  DflashDrafter drafter(ds, ts);
  SpeculativeDecoder spec(ts, drafter, {.draft_max = 15});
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto out = spec.generate(kPrompts, n, std::span(&greedy, 1));
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], expected[i]) << "prompt " << i;
  EXPECT_GT(spec.stats().mean_accepted_length(), 1.5) << spec.stats().summary();
  std::printf("cuda shipped dflash: %s\n", spec.stats().summary().c_str());
}

// tests/reference/dflash_parity.py: the PyTorch reference writes a drafter, a target (for its embeddings and
// head), fused features and a case (TANDEM_DFLASH_PARITY_DIR); this test injects the features as feature
// rows, runs the block on cuda:0 and on the CPU, and writes the block rows' logits for the script to compare.
TEST(DflashGpu, DumpDrafterLogitsForReference) {
  const char* dir = std::getenv("TANDEM_DFLASH_PARITY_DIR");
  if (!dir) GTEST_SKIP() << "TANDEM_DFLASH_PARITY_DIR not set (run tests/reference/dflash_parity.py)";
  const std::string d(dir);
  std::ifstream cf(d + "/case.txt");
  int64_t P = 0, F = 0;
  int32_t last = 0, n = 0, mask = 0;
  ASSERT_TRUE(bool(cf >> P >> F >> last >> n >> mask)) << "bad case.txt";
  std::vector<float> feats(size_t(P * F));
  std::ifstream ff(d + "/features.f32", std::ios::binary);
  ASSERT_TRUE(bool(ff.read(reinterpret_cast<char*>(feats.data()), std::streamsize(feats.size() * 4))));
  for (const char* dev : {"cuda:0", "cpu"}) {
    if (std::string(dev) != "cpu" && !gpu_test::have_gpu()) continue;
    ModelParams mp;
    mp.device = dev;
    const auto target = Model::load(d + "/target.gguf", mp);
    mp.share_weights_from = target;
    const auto dm = Model::load(d + "/drafter.gguf", mp);
    Session ds(dm, {.n_ctx = int32_t(P + n + 16)});
    Batch fb;
    for (int64_t p = 0; p < P; ++p)
      fb.add_embedding(std::span(feats.data() + p * F, size_t(F)), int32_t(p), 0, false);
    ds.decode(fb);
    Batch block;
    block.mask.kind = AttentionMask::BlockBidirectional;
    block.add(last, int32_t(P), 0, false, false);
    for (int32_t j = 1; j <= n; ++j) block.add(mask, int32_t(P) + j, 0, true, false);
    ds.decode(block);
    std::ofstream out(d + "/logits_" + std::string(dev).substr(0, 4) + ".f32", std::ios::binary);
    for (int32_t j = 1; j <= n; ++j) {
      const auto l = ds.logits(size_t(j));
      out.write(reinterpret_cast<const char*>(l.data()), std::streamsize(l.size() * 4));
    }
    std::printf("dflash parity: wrote %d rows of %d logits (%s)\n", n, ds.n_vocab(), dev);
  }
}

}  // namespace
}  // namespace tandem
