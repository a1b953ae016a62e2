// The entropy-bound sampler (src/diffusion/eb_sampler.h, GGUF-ARCH-FACTS D.6): the temperature schedule, the
// draw order, the per-step decision on hand-computed inputs, the per-row reduction on a hand-computed row,
// and the loop's stop rule and self-conditioning arguments on a toy source.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "diffusion/eb_reduce.h"
#include "diffusion/eb_sampler.h"
#include "test_diffusion_util.h"

namespace tandem {
namespace {

using diffusion::eb_decide;
using diffusion::EbDecision;
using diffusion::EbRowStats;

TEST(EbSampler, TemperatureScheduleStartsAtTMaxAndEndsAboveTMin) {
  EbParams p;
  p.max_steps = 4;
  p.t_min = 0.4f;
  p.t_max = 0.8f;
  EXPECT_FLOAT_EQ(diffusion::eb_temperature(p, 4), 0.8f);  // the first step (cur_step = S)
  EXPECT_FLOAT_EQ(diffusion::eb_temperature(p, 2), 0.6f);
  EXPECT_FLOAT_EQ(diffusion::eb_temperature(p, 1), 0.5f);  // the last: t_min + (t_max - t_min) / S, not t_min
}

TEST(EbSampler, DrawOrderIsCanvasFirstThenUThenRenoisePerPosition) {
  diffusion::EbRandom r(1234, 100);
  const std::vector<int32_t> canvas = r.initial_canvas(3);
  std::vector<float> u(3);
  std::vector<int32_t> renoise(3);
  r.draw_step(u, renoise);

  std::mt19937 g(1234);
  std::uniform_int_distribution<int32_t> tok(0, 99);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(canvas[size_t(i)], tok(g));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(u[size_t(i)], unit(g));
    EXPECT_EQ(renoise[size_t(i)], tok(g));
  }
}

// The mapping from mt19937 to values is libstdc++'s (D.6): these values pin it, so a standard library with a
// different mapping (which would change every seeded output) fails here first.
TEST(EbSampler, SeededDrawsArePinned) {
  diffusion::EbRandom r(0, 262144);
  const std::vector<int32_t> canvas = r.initial_canvas(4);
  std::vector<float> u(2);
  std::vector<int32_t> renoise(2);
  r.draw_step(u, renoise);
  std::mt19937 g(0);
  EXPECT_EQ(g(), 2357136044u);  // the generator itself (std::mt19937 is fully specified)
  const std::vector<int32_t> want_canvas = {143868, 155410, 187482, 221319};
  EXPECT_EQ(canvas, want_canvas);
  EXPECT_EQ(u[0], 0.602763355f);
  EXPECT_EQ(renoise[0], 224905);
  EXPECT_EQ(u[1], 0.544883192f);
  EXPECT_EQ(renoise[1], 222101);
}

EbParams params(float bound, int32_t stability = 1, float confidence = 0.005f) {
  EbParams p;
  p.entropy_bound = bound;
  p.stability_threshold = stability;
  p.confidence_threshold = confidence;
  return p;
}

TEST(EbSampler, AcceptsTheLowestEntropiesWhileTheSumBeforeIsWithinTheBound) {
  // entropies 0.05, 0.02, 0.5, 0.04: sorted 1 (sum before 0), 3 (0.02), 0 (0.06), 2 (0.11 > 0.1).
  const std::vector<EbRowStats> rows = {{7, 0.05f, 70}, {8, 0.02f, 80}, {9, 0.5f, 90}, {6, 0.04f, 60}};
  const std::vector<int32_t> renoise = {1, 2, 3, 4}, prev = {-1, -1, -1, -1};
  const EbDecision d = eb_decide(rows, renoise, prev, 0, params(0.1f));
  EXPECT_EQ(d.accepted, (std::vector<uint8_t>{1, 1, 0, 1}));
  EXPECT_EQ(d.n_accepted, 3);
  EXPECT_EQ(d.next_canvas, (std::vector<int32_t>{70, 80, 3, 60}));  // accepted: sample; else: renoise
  EXPECT_EQ(d.argmax, (std::vector<int32_t>{7, 8, 9, 6}));          // display: argmax everywhere
  EXPECT_NEAR(d.mean_entropy, (0.05 + 0.02 + 0.5 + 0.04) / 4, 1e-7);
  EXPECT_FALSE(d.stable);  // the previous canvas was all -1
  EXPECT_FALSE(d.stop);
}

TEST(EbSampler, TheBoundIsInclusiveAndTheLowestIsAlwaysAccepted) {
  // Exactly representable: 0.25 + 0.25 = 0.5 <= 0.5 accepts the third; the fourth sees 1.5.
  const std::vector<EbRowStats> rows = {{0, 1.0f, 10}, {0, 0.25f, 11}, {0, 0.25f, 12}, {0, 2.0f, 13}};
  const std::vector<int32_t> renoise = {5, 5, 5, 5}, prev = {0, 0, 0, 0};
  EbDecision d = eb_decide(rows, renoise, prev, 0, params(0.5f));
  EXPECT_EQ(d.accepted, (std::vector<uint8_t>{1, 1, 1, 0}));
  // Every entropy far above the bound: only the lowest is accepted.
  const std::vector<EbRowStats> high = {{0, 3.0f, 10}, {0, 2.0f, 11}, {0, 4.0f, 12}, {0, 2.5f, 13}};
  d = eb_decide(high, renoise, prev, 0, params(0.1f));
  EXPECT_EQ(d.accepted, (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(d.next_canvas, (std::vector<int32_t>{5, 11, 5, 5}));
}

TEST(EbSampler, EqualEntropiesAreTakenInPositionOrder) {
  // Three equal entropies of 0.1 with a bound of 0.15: the first two positions in the order are accepted
  // (sums before: 0, 0.1), the third sees 0.2. Ties go to the lower position.
  const std::vector<EbRowStats> rows = {{0, 0.1f, 1}, {0, 0.1f, 2}, {0, 0.1f, 3}};
  const std::vector<int32_t> renoise = {9, 9, 9}, prev = {0, 0, 0};
  const EbDecision d = eb_decide(rows, renoise, prev, 0, params(0.15f));
  EXPECT_EQ(d.accepted, (std::vector<uint8_t>{1, 1, 0}));
}

TEST(EbSampler, StopNeedsAStableArgmaxForThresholdStepsAndALowMeanEntropy) {
  const std::vector<EbRowStats> rows = {{3, 0.001f, 3}, {4, 0.002f, 4}};
  const std::vector<int32_t> renoise = {0, 0};
  const std::vector<int32_t> same = {3, 4}, other = {3, 5};
  // Stable once (held 0 -> 1 >= 1) and confident (mean 0.0015 < 0.005): stop.
  EbDecision d = eb_decide(rows, renoise, same, 0, params(0.1f, 1));
  EXPECT_EQ(d.held, 1);
  EXPECT_TRUE(d.stable && d.confident && d.stop);
  // A changed position resets the counter.
  d = eb_decide(rows, renoise, other, 5, params(0.1f, 1));
  EXPECT_EQ(d.held, 0);
  EXPECT_FALSE(d.stop);
  // Threshold 2 needs two equal transitions.
  d = eb_decide(rows, renoise, same, 0, params(0.1f, 2));
  EXPECT_FALSE(d.stop);
  d = eb_decide(rows, renoise, same, 1, params(0.1f, 2));
  EXPECT_TRUE(d.stop);
  // Threshold 0: always stable, even against the initial -1 canvas.
  d = eb_decide(rows, renoise, std::vector<int32_t>{-1, -1}, 0, params(0.1f, 0));
  EXPECT_TRUE(d.stable);
  EXPECT_TRUE(d.stop);
  // Stable but not confident (mean entropy 0.0015 is not < 0.001).
  d = eb_decide(rows, renoise, same, 3, params(0.1f, 1, 0.001f));
  EXPECT_TRUE(d.stable);
  EXPECT_FALSE(d.confident);
  EXPECT_FALSE(d.stop);
}

TEST(EbSampler, MismatchedInputsAreErrors) {
  const std::vector<EbRowStats> rows = {{0, 0.1f, 1}, {0, 0.1f, 2}};
  const std::vector<int32_t> one = {0}, two = {0, 0};
  EXPECT_THROW(eb_decide(rows, one, two, 0, params(0.1f)), Error);
  EXPECT_THROW(eb_decide(rows, two, one, 0, params(0.1f)), Error);
  EXPECT_THROW(eb_decide({}, {}, {}, 0, params(0.1f)), Error);
}

TEST(EbSampler, BadParametersNameTheField) {
  auto msg = [](EbParams p) {
    try {
      check_eb_params(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EbParams p;
  EXPECT_EQ(msg(p), "");
  p.max_steps = 0;
  EXPECT_NE(msg(p).find("max_steps"), std::string::npos);
  p = {};
  p.t_min = 0.9f;
  EXPECT_NE(msg(p).find("t_min < t_max"), std::string::npos);
  p = {};
  p.entropy_bound = 0;
  EXPECT_NE(msg(p).find("entropy_bound"), std::string::npos);
  p = {};
  p.stability_threshold = -1;
  EXPECT_NE(msg(p).find("stability_threshold"), std::string::npos);
  p = {};
  p.confidence_threshold = NAN;
  EXPECT_NE(msg(p).find("confidence_threshold"), std::string::npos);
}

// The host reduction on a row computed by hand: x = {0, ln 3} at 1/t = 1 gives p = {1/4, 3/4}.
TEST(EbSampler, HostReductionOfAHandComputedRow) {
  const float l3 = std::log(3.0f);
  std::vector<float> logits = {0.0f, l3, 0.0f, l3};  // two rows, V = 2
  diffusion::EbReducer r(Toggle::Off, 2, 2, [](const std::string&) {});
  std::vector<EbRowStats> out(2);
  // Z = 1/3 + 1 after the max is subtracted; u * Z = 0.2 * 4/3 = 0.267 <= 1/3: token 0; 0.3 * 4/3 = 0.4: 1.
  const std::vector<float> u = {0.2f, 0.3f};
  r.reduce(Tensor::contiguous(DType::F32, {2, 2}, logits.data()), nullptr, 1.0f, u, out);
  const double h = -(0.25 * std::log(0.25) + 0.75 * std::log(0.75));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out[size_t(i)].argmax, 1);
    EXPECT_NEAR(out[size_t(i)].entropy, h, 1e-6);
  }
  EXPECT_EQ(out[0].sampled, 0);
  EXPECT_EQ(out[1].sampled, 1);
  EXPECT_FALSE(r.last_on_device());
}

TEST(EbSampler, LoopStopsOnceStableAndConfidentAndPassesSelfConditioningArguments) {
  // A very sharp toy model: the argmax canvas is the target from the first step, so step 1 (the second) is
  // the first that can be stable, and it is confident.
  test::ToyCanvasSource src(50, 6, 40.0f, [](std::span<const int32_t>, int32_t i) { return 3 * i + 1; });
  diffusion::EbReducer reducer(Toggle::Auto, 50, 6, [](const std::string&) {});
  EbParams p;
  p.max_steps = 10;
  src.begin_block(std::vector<int32_t>{1, 2});
  std::vector<int32_t> steps_seen;
  const diffusion::EbBlockRun run = diffusion::run_eb_block(src, reducer, p, 0, [&](const DiffusionStep& s) {
    steps_seen.push_back(s.step);
    EXPECT_EQ(s.max_steps, 10);
    EXPECT_EQ(s.n_accepted, 6);  // every entropy ~0
    return true;
  });
  EXPECT_EQ(run.steps, 2);
  EXPECT_TRUE(run.converged);
  EXPECT_EQ(run.canvas, (std::vector<int32_t>{1, 4, 7, 10, 13, 16}));
  EXPECT_EQ(steps_seen, (std::vector<int32_t>{0, 1}));
  // Step 0: no self-conditioning, 1/t = 1; step 1: SC at step 0's 1/t = 1 / t_max.
  ASSERT_EQ(src.use_sc_calls.size(), 2u);
  EXPECT_FALSE(src.use_sc_calls[0]);
  EXPECT_TRUE(src.use_sc_calls[1]);
  EXPECT_EQ(src.sc_temp_inv_calls[0], 1.0f);
  EXPECT_EQ(src.sc_temp_inv_calls[1], 1.0f / diffusion::eb_temperature(p, 10));
  // Every position was accepted at step 0, so step 1's input is step 0's samples (= the targets here).
  EXPECT_EQ(src.canvases[1], run.canvas);
  // The first input is the seeded random canvas.
  diffusion::EbRandom rng(p.seed, 50);
  EXPECT_EQ(src.canvases[0], rng.initial_canvas(6));
}

TEST(EbSampler, TheCallbackCanStopTheLoopAndMaxStepsBoundsIt) {
  // A flat model never converges: max_steps bounds the loop.
  test::ToyCanvasSource flat(40, 5, 0.0f, [](std::span<const int32_t>, int32_t) { return 0; });
  diffusion::EbReducer reducer(Toggle::Auto, 40, 5, [](const std::string&) {});
  EbParams p;
  p.max_steps = 7;
  flat.begin_block(std::vector<int32_t>{1});
  diffusion::EbBlockRun run = diffusion::run_eb_block(flat, reducer, p, 0, {});
  EXPECT_EQ(run.steps, 7);
  EXPECT_FALSE(run.converged);
  int calls = 0;
  run = diffusion::run_eb_block(flat, reducer, p, 0, [&](const DiffusionStep&) { return ++calls < 3; });
  EXPECT_EQ(run.steps, 3);
  EXPECT_FALSE(run.converged);
}

}  // namespace
}  // namespace tandem
