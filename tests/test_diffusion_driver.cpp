// The multi-block driver (tandem::diffuse, GGUF-ARCH-FACTS D.7) and the reduction's device path, on the toy
// canvas source of test_diffusion_util.h: block count, prefixes, the same seed per block, the trims, errors,
// and the device path's soft fallback.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "backend/backend.h"
#include "core/error.h"
#include "diffusion/eb_reduce.h"
#include "test_diffusion_util.h"

namespace tandem {
namespace {

constexpr int32_t kV = 64, kC = 8;

// Targets that depend on the prefix length, so every block differs.
int32_t counting(std::span<const int32_t> prefix, int32_t i) {
  return int32_t((prefix.size() + size_t(i)) % 50) + 10;
}

DiffusionParams quiet_params(int32_t n_predict) {
  DiffusionParams p;
  p.n_predict = n_predict;
  p.eb.max_steps = 12;
  p.log = [](const std::string&) {};
  return p;
}

TEST(Diffuse, RunsCeilNOverCBlocksEachOverThePromptAndTheBlocksBefore) {
  test::ToyCanvasSource src(kV, kC, 40.0f, counting);
  const std::vector<int32_t> prompt = {1, 2, 3};
  const DiffusionResult r = diffuse(src, prompt, quiet_params(20));  // ceil(20 / 8) = 3 blocks
  ASSERT_EQ(r.blocks.size(), 3u);
  ASSERT_EQ(src.prefixes.size(), 3u);
  std::vector<int32_t> want;
  for (int b = 0; b < 3; ++b)
    for (int32_t i = 0; i < kC; ++i) want.push_back(counting(std::vector<int32_t>(3 + size_t(b) * kC), i));
  EXPECT_EQ(r.tokens, want);  // whole blocks: the response is not cut to n_predict
  EXPECT_EQ(src.prefixes[0], prompt);
  std::vector<int32_t> p1 = prompt;
  p1.insert(p1.end(), want.begin(), want.begin() + kC);
  EXPECT_EQ(src.prefixes[1], p1);
  p1.insert(p1.end(), want.begin() + kC, want.begin() + 2 * kC);
  EXPECT_EQ(src.prefixes[2], p1);
  for (const DiffusionBlockStats& b : r.blocks) {
    EXPECT_TRUE(b.converged);
    EXPECT_FALSE(b.trimmed);
    EXPECT_EQ(b.kept, kC);
  }
  EXPECT_EQ(r.total_steps, r.blocks[0].steps + r.blocks[1].steps + r.blocks[2].steps);
}

TEST(Diffuse, EveryBlockStartsFromTheSameSeededCanvas) {
  test::ToyCanvasSource src(kV, kC, 40.0f, counting);
  DiffusionParams p = quiet_params(3 * kC);
  p.eb.seed = 77;
  const DiffusionResult r = diffuse(src, std::vector<int32_t>{5}, p);
  ASSERT_EQ(r.blocks.size(), 3u);
  const size_t first1 = size_t(r.blocks[0].steps), first2 = first1 + size_t(r.blocks[1].steps);
  EXPECT_EQ(src.canvases[0], src.canvases[first1]);
  EXPECT_EQ(src.canvases[0], src.canvases[first2]);
  // ... and the seed matters.
  test::ToyCanvasSource other(kV, kC, 40.0f, counting);
  p.eb.seed = 78;
  diffuse(other, std::vector<int32_t>{5}, p);
  EXPECT_NE(other.canvases[0], src.canvases[0]);
}

TEST(Diffuse, AnEndOfGenerationTokenCutsTheBlockAndEndsTheResponse) {
  // Block 1 (prefix length 1 + 8) has the EOG id 63 at position 5.
  auto target = [](std::span<const int32_t> prefix, int32_t i) {
    return prefix.size() == 9 && i == 5 ? 63 : counting(prefix, i);
  };
  test::ToyCanvasSource src(kV, kC, 40.0f, target);
  DiffusionParams p = quiet_params(4 * kC);
  p.eog_ids = {62, 63};
  const DiffusionResult r = diffuse(src, std::vector<int32_t>{1}, p);
  ASSERT_EQ(r.blocks.size(), 2u);  // stopped at the trimmed block, not 4
  EXPECT_EQ(r.tokens.size(), size_t(kC + 5));
  EXPECT_TRUE(r.blocks[1].trimmed);
  EXPECT_EQ(r.blocks[1].kept, 5);
  EXPECT_EQ(std::count(r.tokens.begin(), r.tokens.end(), 63), 0);
}

TEST(Diffuse, KeepLengthCutsAtEogAndAtLoopsOfOneOrTwoTokens) {
  const std::vector<int32_t> eog = {0};
  auto keep = [&](std::vector<int32_t> c, int32_t run = 6) { return diffusion_keep_length(c, eog, run); };
  EXPECT_EQ(keep({5, 6, 7, 8}), 4u);
  EXPECT_EQ(keep({5, 6, 0, 8, 0}), 2u);
  EXPECT_EQ(keep({0, 6}), 0u);
  // stride 1: six 9s in a row from index 2 -> keep [5, 6, 9]
  EXPECT_EQ(keep({5, 6, 9, 9, 9, 9, 9, 9, 1}), 3u);
  // five in a row is not a loop
  EXPECT_EQ(keep({5, 6, 9, 9, 9, 9, 9, 1}), 8u);
  // stride 2: (3, 4) six times from index 1 -> keep [7, 3, 4]
  EXPECT_EQ(keep({7, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 8}), 3u);
  EXPECT_EQ(keep({7, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4, 8}), 12u);  // five times
  // the EOG cut comes first: a loop after it does not matter
  EXPECT_EQ(keep({5, 0, 9, 9, 9, 9, 9, 9}), 1u);
  // repeat_run 0: no loop cut
  EXPECT_EQ(keep({9, 9, 9, 9, 9, 9, 9}, 0), 7u);
}

TEST(Diffuse, ALoopInTheCanvasEndsTheResponse) {
  test::ToyCanvasSource src(kV, kC, 40.0f,
                            [](std::span<const int32_t>, int32_t i) { return i < 2 ? 20 + i : 30; });
  const DiffusionResult r = diffuse(src, std::vector<int32_t>{1}, quiet_params(3 * kC));
  ASSERT_EQ(r.blocks.size(), 1u);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{20, 21, 30}));
}

TEST(Diffuse, DiffusionBlocksOverridesTheCountAndTheCallbackSeesEveryStep) {
  test::ToyCanvasSource src(kV, kC, 40.0f, counting);
  DiffusionParams p = quiet_params(1);
  p.n_blocks = 2;
  std::vector<int32_t> blocks_seen;
  const DiffusionResult r = diffuse(src, std::vector<int32_t>{1}, p, [&](const DiffusionStep& s) {
    blocks_seen.push_back(s.block);
    return true;
  });
  EXPECT_EQ(r.blocks.size(), 2u);
  EXPECT_EQ(int32_t(blocks_seen.size()), r.total_steps);
  EXPECT_EQ(blocks_seen.front(), 0);
  EXPECT_EQ(blocks_seen.back(), 1);
}

TEST(Diffuse, MaxPrefixRefusesALongPromptAndEndsTheResponseBeforeOverflowing) {
  test::ToyCanvasSource src(kV, kC, 40.0f, counting);
  DiffusionParams p = quiet_params(5 * kC);
  std::vector<std::string> logs;
  p.log = [&logs](const std::string& l) { logs.push_back(l); };
  p.max_prefix = 2 + 2 * kC;  // the prompt (2) and two blocks
  const DiffusionResult r = diffuse(src, std::vector<int32_t>{1, 2}, p);
  EXPECT_EQ(r.blocks.size(), 3u);  // blocks over prefixes of 2, 10 and 18 tokens; the fourth would be 26
  EXPECT_EQ(src.prefixes.back().size(), size_t(2 + 2 * kC));
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_NE(logs[0].find("stopping after 3 blocks"), std::string::npos) << logs[0];
  p.max_prefix = 1;
  try {
    diffuse(src, std::vector<int32_t>{1, 2}, p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt has 2 tokens, more than the 1 positions"),
              std::string::npos)
        << e.what();
  }
}

TEST(Diffuse, BadArgumentsAndBrokenSourcesAreErrors) {
  test::ToyCanvasSource src(kV, kC, 40.0f, counting);
  DiffusionParams p = quiet_params(8);
  EXPECT_THROW(diffuse(src, std::vector<int32_t>{}, p), Error);    // empty prompt
  EXPECT_THROW(diffuse(src, std::vector<int32_t>{kV}, p), Error);  // token outside the vocabulary
  p.n_predict = 0;
  EXPECT_THROW(diffuse(src, std::vector<int32_t>{1}, p), Error);
  p = quiet_params(8);
  p.eb.t_max = p.eb.t_min;
  EXPECT_THROW(diffuse(src, std::vector<int32_t>{1}, p), Error);
  p = quiet_params(8);
  p.n_blocks = -1;
  EXPECT_THROW(diffuse(src, std::vector<int32_t>{1}, p), Error);

  // A source whose logits have the wrong vocabulary: the message names the shapes.
  class WrongShape : public test::ToyCanvasSource {
   public:
    WrongShape() : ToyCanvasSource(kV, kC, 1.0f, counting) {}
    const Tensor& forward(std::span<const int32_t> c, bool sc, float t) override {
      bad_ = ToyCanvasSource::forward(c, sc, t);
      bad_.ne[0] = kV - 1;
      return bad_;
    }
    Tensor bad_;
  } wrong;
  try {
    diffuse(wrong, std::vector<int32_t>{1}, quiet_params(8));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_vocab = 64"), std::string::npos) << e.what();
  }
}

// GPU logits the source names no Device for are read through a handle of the reducer's own (the GPU test
// checks the result); without a GPU that handle cannot be made: an Error, after the one log line.
TEST(EbReducer, GpuLogitsWithoutADeviceAreReadThroughAHandleOfItsOwn) {
  if (device_count(DeviceKind::CUDA) > 0)
    GTEST_SKIP() << "tests/gpu/test_gpu_diffusion.cpp covers it with a GPU";
  std::vector<float> logits(size_t(kV * kC), 0.0f);
  Tensor t = Tensor::contiguous(DType::F32, {kV, kC}, logits.data(), DeviceId{DeviceKind::CUDA, 0});
  std::vector<std::string> logs;
  diffusion::EbReducer r(Toggle::Auto, kV, kC, [&logs](const std::string& l) { logs.push_back(l); });
  std::vector<float> u(kC, 0.5f);
  std::vector<diffusion::EbRowStats> out(kC);
  EXPECT_THROW(r.reduce(t, nullptr, 1.0f, u, out), Error);
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_NE(logs[0].find("names no device"), std::string::npos) << logs[0];
}

// A CPU device whose allocations fail: the device path must fall back to the host with one log line.
class NoMemoryDevice : public Device {
 public:
  explicit NoMemoryDevice(Device& inner) : inner_(inner) {}
  DeviceId id() const override { return inner_.id(); }
  std::string name() const override { return "no-memory " + inner_.name(); }
  size_t total_memory() const override { return 0; }
  size_t free_memory() const override { return 0; }
  // The first allocation (the toy source's logits buffer) succeeds; every later one (the sampler's scratch)
  // fails as a GPU out of memory does.
  Buffer allocate(size_t bytes) override {
    if (allowed_-- > 0) return inner_.allocate(bytes);
    throw Error("out of memory allocating " + std::to_string(bytes));
  }
  Buffer allocate_host(size_t bytes) override { return inner_.allocate_host(bytes); }
  Stream& default_stream() override { return inner_.default_stream(); }
  std::unique_ptr<Stream> create_stream() override { return inner_.create_stream(); }
  std::unique_ptr<Event> create_event() override { return inner_.create_event(); }
  void synchronize() override { inner_.synchronize(); }
  void copy_from_host(Stream& s, void* d, const void* src, size_t n) override {
    inner_.copy_from_host(s, d, src, n);
  }
  void copy_to_host(Stream& s, void* d, const void* src, size_t n) override {
    inner_.copy_to_host(s, d, src, n);
  }
  void copy_device_to_device(Stream& s, void* d, const void* src, size_t n) override {
    inner_.copy_device_to_device(s, d, src, n);
  }
  void copy_2d(Stream& s, void* d, size_t dp, const void* src, size_t sp, size_t w, size_t h,
               CopyKind k) override {
    inner_.copy_2d(s, d, dp, src, sp, w, h, k);
  }
  void copy_to_peer(Stream& s, void* d, Device& dd, const void* src, size_t n) override {
    inner_.copy_to_peer(s, d, dd, src, n);
  }
  Ops& ops() override { return inner_.ops(); }

 private:
  Device& inner_;
  int allowed_ = 1;
};

TEST(EbReducer, TheDevicePathEqualsTheHostPathAndFallsBackWhenItsScratchFails) {
  std::unique_ptr<Device> cpu = create_device(DeviceId{}, {});
  DiffusionParams p = quiet_params(2 * kC);
  p.eb.max_steps = 6;
  auto run = [&](Device* dev, Toggle mode, std::vector<std::string>* logs) {
    test::ToyCanvasSource src(kV, kC, 3.0f, counting, dev);  // soft logits: many steps, partial acceptance
    DiffusionParams q = p;
    q.gpu_sample_reduce = mode;
    q.log = [logs](const std::string& l) { logs->push_back(l); };
    return diffuse(src, std::vector<int32_t>{4, 5}, q);
  };
  std::vector<std::string> host_logs, dev_logs, fail_logs;
  const DiffusionResult host = run(nullptr, Toggle::Off, &host_logs);
  const DiffusionResult dev = run(cpu.get(), Toggle::On, &dev_logs);
  EXPECT_FALSE(host.device_reduce);
  EXPECT_TRUE(dev.device_reduce);
  EXPECT_EQ(dev.tokens, host.tokens);
  EXPECT_EQ(dev.total_steps, host.total_steps);
  EXPECT_TRUE(dev_logs.empty());

  NoMemoryDevice broken(*cpu);
  const DiffusionResult fell = run(&broken, Toggle::On, &fail_logs);
  EXPECT_FALSE(fell.device_reduce);
  EXPECT_EQ(fell.tokens, host.tokens);
  ASSERT_EQ(fail_logs.size(), 1u);  // one line, not one per step
  EXPECT_NE(fail_logs[0].find("could not be allocated"), std::string::npos) << fail_logs[0];

  // On with host logits: one note, the host path.
  std::vector<std::string> on_logs;
  const DiffusionResult on_host = run(nullptr, Toggle::On, &on_logs);
  EXPECT_EQ(on_host.tokens, host.tokens);
  EXPECT_EQ(on_logs.size(), 1u);
  // Auto with logits on a CPU device: the host path, silently.
  std::vector<std::string> auto_logs;
  const DiffusionResult auto_cpu = run(cpu.get(), Toggle::Auto, &auto_logs);
  EXPECT_FALSE(auto_cpu.device_reduce);
  EXPECT_TRUE(auto_logs.empty());
}

}  // namespace
}  // namespace tandem
