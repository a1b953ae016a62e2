// Whole-model parity: the same random qwen3 / llama GGUF (tests/test_model_fixture.h) run on cuda:0 and on the
// CPU through tandem::Session, prompt (prefill, > 64 rows: the tensor-core attention and cuBLASLt paths) then
// token-by-token decoding (matrix-vector and split-K attention paths), one sequence and three in parallel.
// Both sessions are fed the CPU's greedy tokens, so that one near-tie cannot derail the comparison.
//
// Bounds: logits of every step within 1e-2 relative L2 of the CPU's (bf16 weights: the GPU rounds activations
// to bf16 for the tensor-core products of the prompt; f32 weights: 5e-3, as the prompt attention rounds q and p to the f16 cache type). Greedy tokens equal, except where the
// CPU's top two logits are closer than 1e-3 times the logits' spread (allowed, and counted).
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "../test_model_fixture.h"
#include "gpu_test_util.h"
#include "quant/quantize_model.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"

namespace tandem::gpu_test {
namespace {

int argmax(std::span<const float> v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

double rel(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

bool near_tie(std::span<const float> v) {
  std::vector<float> s(v.begin(), v.end());
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  return s[0] - s[1] < 1e-3f * (*mx - *mn);
}

struct ParityCase {
  std::string arch;
  DType wtype;
  double tol;
};

class GpuModel : public ::testing::TestWithParam<ParityCase> {};

TEST_P(GpuModel, CudaMatchesCpu) {
  TANDEM_REQUIRE_GPU();
  const ParityCase pc = GetParam();
  testing::TinyConfig c;
  c.arch = pc.arch;
  c.wtype = pc.wtype;
  c.n_vocab = 500;
  c.n_embd = 256;
  c.n_layer = 3;
  c.n_head = 8;
  c.n_head_kv = 2;
  c.head_dim = 32;
  c.n_ff = 640;
  c.tied = pc.arch == "llama";
  c.rope_freqs = pc.arch == "llama";
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_gpu_model_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / (pc.arch + ".gguf")).string();
  testing::write_tiny_gguf(testing::make_tiny(c), path);

  ModelParams cpu_p, gpu_p;
  gpu_p.device = "cuda:0";
  auto cpu_model = Model::load(path, cpu_p);
  auto gpu_model = Model::load(path, gpu_p);
  EXPECT_NE(gpu_model->info().device.find("cuda:0"), std::string::npos);
  SessionParams sp;
  sp.n_ctx = 1024;
  sp.n_seq_max = 3;
  sp.n_batch = 128;
  Session cs(cpu_model, sp), gs(gpu_model, sp);

  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.n_vocab - 2));
  int compared = 0, ties = 0;
  double worst = 0;
  auto compare_rows = [&](const Batch& b, std::vector<int32_t>& next) {
    cs.decode(b);
    gs.decode(b);
    next.clear();
    for (size_t r = 0; r < b.size(); ++r) {
      if (!b.logits[r]) continue;
      const auto lc = cs.logits(r), lg = gs.logits(r);
      const double e = rel(lg, lc);
      worst = std::max(worst, e);
      EXPECT_LT(e, pc.tol) << "row " << r;
      const int tc = argmax(lc), tg = argmax(lg);
      if (tc != tg) {
        EXPECT_TRUE(near_tie(lc)) << "greedy tokens differ (" << tc << " vs " << tg << ") at row " << r;
        ++ties;
      }
      ++compared;
      next.push_back(tc);
    }
  };

  // Three sequences: prompts of 100, 70 and 5 tokens in one batch (two prefill chunks: n_batch 128).
  Batch b;
  const int lens[3] = {100, 70, 5};
  std::vector<int32_t> next;
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> p(static_cast<size_t>(lens[s]));
    for (auto& t : p) t = tok(rng);
    b.add_sequence(p, 0, s, true);
  }
  compare_rows(b, next);
  // Then 12 decoding steps of all three, greedy on the CPU's logits.
  for (int step = 0; step < 12; ++step) {
    Batch d;
    for (int s = 0; s < 3; ++s) d.add(next[size_t(s)], lens[s] + step, s, true);
    compare_rows(d, next);
  }
  std::printf("[ parity   ] %s %s: %d logit rows, worst relative error %.2e, %d near-tie token flips\n",
              pc.arch.c_str(), dtype_name(pc.wtype), compared, worst, ties);
  EXPECT_LE(ties, 2);
  std::filesystem::remove_all(dir);
}

// The shipped, trained tandem-small (Q8_0, head_dim 64): real weights give peaked logits, so greedy decoding
// is compared free-running (each device feeds back its own tokens) for 24 steps after a 90-token prompt.
// Bound 2e-2 relative on the logits: the prompt (90 rows) runs the dequantize + cuBLASLt path, which rounds the
// Q8_0 weights (d x q, up to 18 significant bits) and the activations to bf16, where the CPU multiplies int8 by
// int8 exactly; measured on an H100: 1.47e-2 (the bf16-weight models above stay under 4e-3).
TEST(GpuShippedModel, TandemSmallQ8GreedyMatchesCpu) {
  TANDEM_REQUIRE_GPU();
  // The repository root is the working directory on the GPU machine; the source tree of the build otherwise.
  std::string path = "models/tandem-small-q8_0.gguf";
  if (!std::filesystem::exists(path)) path = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not present";
  ModelParams gpu_p;
  gpu_p.device = "cuda:0";
  auto cpu_model = Model::load(path, {});
  auto gpu_model = Model::load(path, gpu_p);
  SessionParams sp;
  sp.n_ctx = 512;
  Session cs(cpu_model, sp), gs(gpu_model, sp);
  std::mt19937 rng(5);
  std::vector<int32_t> prompt(90);
  for (auto& t : prompt) t = int32_t(rng() % 8000) + 1;
  Batch b;
  b.add_sequence(prompt, 0, 0, true);
  cs.decode(b);
  gs.decode(b);
  const size_t last = b.size() - 1;  // only the prompt's last row has logits
  double worst = rel(gs.logits(last), cs.logits(last));
  int tc = argmax(cs.logits(last)), tg = argmax(gs.logits(last));
  std::vector<int32_t> out_c{tc}, out_g{tg};
  for (int step = 0; step < 24; ++step) {
    Batch dc, dg;
    dc.add(tc, 90 + step, 0, true);
    dg.add(tg, 90 + step, 0, true);
    cs.decode(dc);
    gs.decode(dg);
    if (tc == tg) worst = std::max(worst, rel(gs.logits(0), cs.logits(0)));
    tc = argmax(cs.logits(0));
    tg = argmax(gs.logits(0));
    out_c.push_back(tc);
    out_g.push_back(tg);
  }
  std::printf("[ parity   ] tandem-small q8_0: worst relative logit error %.2e over the common prefix\n", worst);
  EXPECT_EQ(out_g, out_c);
  EXPECT_LT(worst, 2e-2);
}

// The shipped tandem-small requantized to Q4_K (every matrix but the embeddings' fallbacks: the direct Q4_K
// kernel, its activation quantization with the rms_norm fused in, the Q6_K / staged paths where the plan
// keeps them) against the CPU, teacher-forced: both sessions get the CPU's greedy token, so a near-tie (the
// call-B sanity check saw one at 0.023 of ~10: CPU 849, CUDA 68) cannot derail the rest. Bound 8e-2 relative
// on every step's logits (Q4_K weights are the same on both; the activations are quantized per 32 on CUDA and
// per 256 on the CPU); a wrong kernel gives ~0.3 and more. Greedy flips only where the CPU's top two are
// within 1% of the spread.
TEST(GpuShippedModel, TandemSmallQ4kTeacherForcedMatchesCpu) {
  TANDEM_REQUIRE_GPU();
  std::string src = "models/tandem-small-q8_0.gguf";
  if (!std::filesystem::exists(src)) src = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  if (!std::filesystem::exists(src)) GTEST_SKIP() << src << " not present";
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_gpu_q4k_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "small-q4_k.gguf").string();
  quant::quantize_model(src, path, quant::parse_quant_target("q4_k"));
  ModelParams gpu_p;
  gpu_p.device = "cuda:0";
  auto cpu_model = Model::load(path, {});
  auto gpu_model = Model::load(path, gpu_p);
  SessionParams sp;
  sp.n_ctx = 512;
  Session cs(cpu_model, sp), gs(gpu_model, sp);
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(90);
  for (auto& t : prompt) t = int32_t(rng() % 8000) + 1;
  Batch b;
  b.add_sequence(prompt, 0, 0, true);
  cs.decode(b);
  gs.decode(b);
  double worst = rel(gs.logits(b.size() - 1), cs.logits(b.size() - 1));
  int tc = argmax(cs.logits(b.size() - 1)), flips = 0;
  for (int step = 0; step < 32; ++step) {
    Batch d;
    d.add(tc, 90 + step, 0, true);
    cs.decode(d);
    gs.decode(d);
    const auto lc = cs.logits(0), lg = gs.logits(0);
    const double e = rel(lg, lc);
    worst = std::max(worst, e);
    EXPECT_LT(e, 8e-2) << "step " << step;
    tc = argmax(lc);
    if (argmax(lg) != tc) {
      std::vector<float> s(lc.begin(), lc.end());
      std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
      const auto [mn, mx] = std::minmax_element(lc.begin(), lc.end());
      EXPECT_LT(s[0] - s[1], 1e-2f * (*mx - *mn)) << "greedy tokens differ at step " << step;
      ++flips;
    }
  }
  std::printf(
      "[ parity   ] tandem-small q4_k (teacher-forced): worst relative logit error %.2e, %d greedy flips\n",
      worst, flips);
  EXPECT_LE(flips, 3);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, GpuModel,
                         ::testing::Values(ParityCase{"qwen3", DType::BF16, 1e-2}, ParityCase{"llama", DType::BF16, 1e-2},
                                           ParityCase{"qwen3", DType::F32, 5e-3}),
                         [](const auto& info) { return info.param.arch + "_" + dtype_name(info.param.wtype); });

}  // namespace
}  // namespace tandem::gpu_test
