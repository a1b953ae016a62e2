// One model split over two ranks that share the one GPU of the test machine (two Device objects of cuda:0):
// the tensor split's all-reduces go through the copy-and-add comm (NCCL cannot have two ranks on one GPU),
// the layer split hands the hidden state over by a device copy, the row split gathers row slices. Each must
// give the logits of the single-GPU run: prompt (two sequences, several forward passes) then greedy steps fed
// the single run's tokens. Bound: 1e-4 relative (max |a - b| / max |b| per row); the split runs other matmul
// widths, which may take other kernels, so bit equality is not expected. The measured error is printed and
// recorded.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <unistd.h>

#include "../test_model_fixture.h"
#include "backend/cuda/cuda_device.h"
#include "gpu_test_util.h"
#include "model/model_impl.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"

namespace tandem::gpu_test {
namespace {

struct SplitRun {
  std::vector<std::vector<float>> logits;
};

SplitRun run(const std::shared_ptr<Model>& model, std::vector<int32_t>* greedy) {
  SessionParams sp;
  sp.n_ctx = 512;
  sp.n_seq_max = 2;
  sp.kv_type = KvType::F32;
  sp.n_batch = 128;
  Session s(model, sp);
  Rng rng(3);
  const int64_t V = model->info().n_vocab;
  Batch b;
  for (int i = 0; i < 150; ++i) b.add(int32_t(rng.next() % uint64_t(V)), i, 0, true);
  for (int i = 0; i < 40; ++i) b.add(int32_t(rng.next() % uint64_t(V)), i, 1, true);
  s.decode(b);
  SplitRun out;
  for (size_t i = 0; i < b.size(); ++i) out.logits.emplace_back(s.logits(i).begin(), s.logits(i).end());
  const bool record = greedy->empty();
  int32_t n0 = 150, n1 = 40;
  size_t last0 = 149, last1 = 189;  // rows holding each sequence's latest logits
  for (int step = 0; step < 8; ++step) {
    if (record) {
      const auto& l0 = out.logits[last0];
      const auto& l1 = out.logits[last1];
      greedy->push_back(int32_t(std::max_element(l0.begin(), l0.end()) - l0.begin()));
      greedy->push_back(int32_t(std::max_element(l1.begin(), l1.end()) - l1.begin()));
    }
    Batch g;
    g.add((*greedy)[size_t(2 * step)], n0++, 0, true);
    g.add((*greedy)[size_t(2 * step + 1)], n1++, 1, true);
    s.decode(g);
    for (size_t i = 0; i < 2; ++i) out.logits.emplace_back(s.logits(i).begin(), s.logits(i).end());
    last0 = out.logits.size() - 2;
    last1 = out.logits.size() - 1;
  }
  return out;
}

double max_row_error(const SplitRun& a, const SplitRun& b) {
  double worst = 0;
  for (size_t r = 0; r < b.logits.size(); ++r) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.logits[r].size(); ++i) {
      if (!std::isfinite(a.logits[r][i])) return INFINITY;
      num = std::max(num, double(std::abs(a.logits[r][i] - b.logits[r][i])));
      den = std::max(den, double(std::abs(b.logits[r][i])));
    }
    worst = std::max(worst, num / den);
  }
  return worst;
}

// Replays of recorded CUDA graphs on the model's devices so far.
uint64_t graph_replays(const Model& model) {
  uint64_t n = 0;
  for (const auto& d : model.impl().devices)
    if (auto* cd = dynamic_cast<cuda::CudaDevice*>(d.get())) n += cd->graph_replays();
  return n;
}

TEST(GpuSplit, TwoRanksSharingOneGpuMatchTheSingleGpuRun) {
  TANDEM_REQUIRE_GPU();
  testing::TinyConfig c;
  c.arch = "qwen3";
  c.n_vocab = 1001;
  c.n_embd = 256;
  c.n_layer = 4;
  c.n_head = 8;
  c.n_head_kv = 4;
  c.head_dim = 32;
  c.n_ff = 512;
  const auto path =
      std::filesystem::temp_directory_path() / ("tandem_gpu_split_" + std::to_string(::getpid()));
  testing::write_tiny_gguf(testing::make_tiny(c), path);
  ModelParams single;
  single.device = "cuda:0";
  std::vector<int32_t> greedy;
  const SplitRun ref = run(Model::load(path.string(), single), &greedy);
  for (const char* mode : {"tensor", "layer", "row"}) {
    ModelParams mp;
    mp.devices = "cuda:0,cuda:0";
    mp.split_mode = mode;
    auto model = Model::load(path.string(), mp);
    ASSERT_EQ(model->info().split_mode, mode);
    const uint64_t replays_before = graph_replays(*model);
    const SplitRun split = run(model, &greedy);
    const uint64_t replays = graph_replays(*model) - replays_before;
    const double err = max_row_error(split, ref);
    // The 8 greedy steps have one shape: the first records, the others replay (graphs are kept under every
    // split mode: a tensor split records every rank's stream into one graph).
    std::printf("[ split ] %s: %llu graph replays over 8 decode steps\n", mode, (unsigned long long)replays);
    EXPECT_GE(replays, 7u) << mode;
    std::printf("[ split ] %s over cuda:0,cuda:0: max row error %.3g over %zu logits rows\n", mode, err,
                ref.logits.size());
    ::testing::Test::RecordProperty(std::string(mode) + "_max_rel_error", std::to_string(err));
    EXPECT_LE(err, 1e-4) << mode;
  }
  std::filesystem::remove(path);
}

// Two sessions of one tensor-split model, stepped alternately: each has its own comm and rank threads, and
// each session's graphs are its own, so interleaving them changes nothing.
TEST(GpuSplit, TwoSessionsOfOneTensorSplitModelInterleaved) {
  TANDEM_REQUIRE_GPU();
  testing::TinyConfig c;
  c.arch = "qwen3";
  c.n_vocab = 517;
  c.n_embd = 128;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 32;
  c.n_ff = 256;
  const auto path =
      std::filesystem::temp_directory_path() / ("tandem_gpu_split2_" + std::to_string(::getpid()));
  testing::write_tiny_gguf(testing::make_tiny(c), path);
  ModelParams mp;
  mp.devices = "cuda:0,cuda:0";
  mp.split_mode = "tensor";
  auto model = Model::load(path.string(), mp);
  SessionParams sp;
  sp.n_ctx = 128;
  sp.kv_type = KvType::F32;
  auto greedy_step = [&](Session& s, int32_t first, std::vector<int32_t>& out) {
    Batch b;
    b.add(first, int32_t(out.size()), 0, true);
    s.decode(b);
    const auto l = s.logits(0);
    out.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
  };
  std::vector<int32_t> a_alone, b_alone, a_mixed, b_mixed;
  {
    Session a(model, sp);
    for (int i = 0; i < 12; ++i) greedy_step(a, a_alone.empty() ? 5 : a_alone.back(), a_alone);
  }
  {
    Session b(model, sp);
    for (int i = 0; i < 12; ++i) greedy_step(b, b_alone.empty() ? 9 : b_alone.back(), b_alone);
  }
  Session a(model, sp), b(model, sp);
  for (int i = 0; i < 12; ++i) {
    greedy_step(a, a_mixed.empty() ? 5 : a_mixed.back(), a_mixed);
    greedy_step(b, b_mixed.empty() ? 9 : b_mixed.back(), b_mixed);
  }
  EXPECT_EQ(a_mixed, a_alone);
  EXPECT_EQ(b_mixed, b_alone);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tandem::gpu_test
