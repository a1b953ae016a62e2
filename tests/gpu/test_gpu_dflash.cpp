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

#include "gpu_test_util.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "tandem/speculative.h"
#include "../test_dflash_fixture.h"

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
  Session session(model, {.n_ctx = 256, .batch_invariant = true});
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
    Session ts(target, {.n_ctx = 256, .n_seq_max = 4, .batch_invariant = true});
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

// A DFlash drafter of the shipped model's width: 1 layer, taps of layers 1, 4 and 7, random weights.
std::string write_shipped_shape_drafter() {
  testing::TinyDflashConfig dc;
  dc.n_embd = 512;
  dc.n_head = 8;
  dc.n_head_kv = 4;
  dc.head_dim = 64;
  dc.n_ff = 256;
  dc.target_layers = {1, 4, 7};
  dc.block_size = 8;
  dc.mask_token_id = 1;
  const auto path = std::filesystem::temp_directory_path() /
                    ("tandem_gpu_dflash_" + std::to_string(::getpid()) + ".gguf");
  testing::write_tiny_dflash(testing::make_tiny_dflash(dc), path);
  return path.string();
}

std::shared_ptr<Model> load_drafter(const std::string& path, const std::shared_ptr<Model>& target) {
  ModelParams mp;
  mp.device = "cuda:0";
  mp.share_weights_from = target;
  return Model::load(path, mp);
}

TEST(DflashGpu, DeviceFeaturePathIsBitIdenticalToHostPath) {
  TANDEM_REQUIRE_GPU();
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const std::string path = write_shipped_shape_drafter();
  const auto dm = load_drafter(path, target);
  std::filesystem::remove(path);
  std::vector<std::vector<int32_t>> outs[2];
  std::vector<std::vector<float>> logits[2];
  SpeculativeStats stats[2];
  for (int device : {0, 1}) {
    Session ts(target, {.n_ctx = 256, .n_seq_max = 4, .batch_invariant = true});
    Session ds(dm, {.n_ctx = 256, .n_seq_max = 4});
    DflashDrafter drafter(ds, ts, {.device_features = device});
    ASSERT_EQ(drafter.device_features(), device == 1);
    SpeculativeDecoder spec(ts, drafter, {.draft_max = 7});
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    outs[device] = spec.generate(kPrompts, 32, std::span(&greedy, 1));
    for (size_t r = 1; r <= 7; ++r) {  // the last draft pass, first sequence's block rows
      const auto l = ds.logits(r);
      logits[device].emplace_back(l.begin(), l.end());
    }
    stats[device] = spec.stats();
  }
  EXPECT_EQ(outs[0], outs[1]);
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t r = 0; r < logits[0].size(); ++r) EXPECT_EQ(logits[0][r], logits[1][r]) << "block row " << r + 1;
  EXPECT_EQ(stats[0].accepted, stats[1].accepted);
}

TEST(DflashGpu, GreedyIsTokenIdenticalOnCuda) {
  TANDEM_REQUIRE_GPU();
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const std::string path = write_shipped_shape_drafter();
  const auto dm = load_drafter(path, target);
  std::filesystem::remove(path);
  const int n = 40;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : kPrompts) expected.push_back(plain_greedy(target, p, n));
  for (int32_t draft_max : {1, 4, 7}) {
    Session ts(target, {.n_ctx = 256, .n_seq_max = 4, .batch_invariant = true});
    Session ds(dm, {.n_ctx = 256, .n_seq_max = 4});
    DflashDrafter drafter(ds, ts);
    SpeculativeDecoder spec(ts, drafter, {.draft_max = draft_max});
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    const auto out = spec.generate(kPrompts, n, std::span(&greedy, 1));
    for (size_t i = 0; i < out.size(); ++i)
      EXPECT_EQ(out[i], expected[i]) << "prompt " << i << ", draft_max " << draft_max;
    std::printf("cuda dflash draft_max %d: %s\n", draft_max, spec.stats().summary().c_str());
  }
}

// The shipped trained DFlash drafter, when present: greedy identity and real acceptance on cuda.
TEST(DflashGpu, ShippedDrafterAcceptsOnCuda) {
  TANDEM_REQUIRE_GPU();
  if (!std::filesystem::exists(kModels + "tandem-small-dflash-q8_0.gguf"))
    GTEST_SKIP() << "no models/tandem-small-dflash-q8_0.gguf";
  const auto target = load_cuda("tandem-small-q8_0.gguf");
  const auto dm = load_drafter(kModels + "tandem-small-dflash-q8_0.gguf", target);
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
  EXPECT_GT(spec.stats().mean_accepted_length(), 1.2) << spec.stats().summary();
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
