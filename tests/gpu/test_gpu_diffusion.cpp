// The EB sampler's device path (GGUF-ARCH-FACTS D.8) against the CPU reference: Ops::diffusion_sample_rows on
// random logits built without near-ties (argmax and sample exact, entropy within a relative bound), exact
// ties (first index on both), strided rows; and the whole multi-block loop with its logits on cuda:0 equal to
// the host path.
//
// Near-ties (documented): the CUDA kernel sums exp(z - m) in float in a tree order, the CPU in double in
// vocab order. A sample whose u * Z lies within that rounding (~1e-6 relative) of a token boundary can
// differ, and so can an argmax between two values that differ by less than the rounding of x * inv_temp
// (never for exact ties: both take the first index). The inputs below keep every sample at least 1e-3 of Z
// from a boundary and the argmax a full logit ahead, so equality is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "../test_diffusion_util.h"
#include "diffusion/eb_reduce.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

class GpuDiffusion : public GpuTest {};

struct Case {
  std::vector<float> logits, u;
  std::vector<int32_t> want_sample;
};

// T rows of V logits ~ N(0, scale) with one argmax lead_boost (>= 1) logits ahead; per row, u is the midpoint
// of the interval of a token whose probability is >= 1e-3 (so u * Z is >= 5e-4 Z from every boundary, far
// beyond the float sums' rounding). lead_boost must make at least the argmax that likely.
Case make_case(int64_t V, int64_t T, float scale, float inv_temp, uint32_t seed, float lead_boost = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  Case c;
  c.logits.resize(size_t(V * T));
  for (auto& x : c.logits) x = nd(rng);
  for (int64_t t = 0; t < T; ++t) {
    float* row = c.logits.data() + t * V;
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;
    row[best] += lead_boost;
    const int64_t lead = int64_t(rng() % uint32_t(V));
    std::swap(row[best], row[lead]);
    std::vector<double> e(static_cast<size_t>(V));
    double z = 0;
    const double m = double(row[lead] * inv_temp);
    for (int64_t v = 0; v < V; ++v) z += e[size_t(v)] = std::exp(double(row[v] * inv_temp) - m);
    std::vector<int64_t> candidates;
    for (int64_t v = 0; v < V; ++v)
      if (e[size_t(v)] / z >= 1e-3) candidates.push_back(v);
    check(!candidates.empty(), "make_case: no token with p >= 1e-3; raise lead_boost");
    const int64_t pick = candidates[rng() % candidates.size()];
    double before = 0;
    for (int64_t v = 0; v < pick; ++v) before += e[size_t(v)];
    c.u.push_back(float((before + 0.5 * e[size_t(pick)]) / z));
    c.want_sample.push_back(int32_t(pick));
  }
  return c;
}

TEST_F(GpuDiffusion, SampleRowsEqualTheCpuWithoutNearTies) {
  struct Shape {
    int64_t V, T;
    float scale, inv_temp, boost;
  };
  // The last shape is nearly flat (entropy ~12): only its boosted argmax is a safe sample.
  for (const Shape& sh : {Shape{1000, 16, 2.0f, 1.25f, 1.0f}, Shape{262144, 8, 3.0f, 2.5f, 1.0f},
                          Shape{37, 40, 1.0f, 1.0f, 1.0f}, Shape{262144, 4, 0.3f, 1.0f, 7.0f}}) {
    SCOPED_TRACE("V " + std::to_string(sh.V) + " T " + std::to_string(sh.T));
    const Case c = make_case(sh.V, sh.T, sh.scale, sh.inv_temp, uint32_t(sh.V + sh.T), sh.boost);
    Pair l = make_f32({sh.V, sh.T}, c.logits);
    Pair u = make_f32({sh.T}, c.u);
    Pair am = make_out(DType::I32, {sh.T}), ent = make_out(DType::F32, {sh.T}),
         smp = make_out(DType::I32, {sh.T});
    gops().diffusion_sample_rows(gs(), l.dev, sh.inv_temp, u.dev, am.dev, ent.dev, smp.dev);
    cops().diffusion_sample_rows(cs(), l.cpu, sh.inv_temp, u.cpu, am.cpu, ent.cpu, smp.cpu);
    EXPECT_EQ(download_i32(am), host_i32(am));
    EXPECT_EQ(download_i32(smp), host_i32(smp));
    EXPECT_EQ(host_i32(smp), c.want_sample);  // the construction, checked on the reference
    const auto ge = download_f32(ent), ce = host_f32(ent);
    for (int64_t t = 0; t < sh.T; ++t)
      EXPECT_NEAR(ge[size_t(t)], ce[size_t(t)], 1e-4 * std::fabs(ce[size_t(t)]) + 1e-5) << "row " << t;
  }
}

TEST_F(GpuDiffusion, ExactTiesTakeTheFirstIndexOnBoth) {
  const int64_t V = 5000, T = 3;
  std::vector<float> logits(size_t(V * T), -1.0f);
  logits[size_t(0 * V + 4000)] = logits[size_t(0 * V + 17)] = 3.0f;  // row 0: tie at 17 and 4000
  logits[size_t(1 * V + 1)] = logits[size_t(1 * V + 2)] = logits[size_t(1 * V + 4999)] = 2.0f;
  // row 2: all equal -> index 0
  std::fill(logits.begin() + 2 * V, logits.end(), 0.5f);
  Pair l = make_f32({V, T}, logits);
  Pair u = make_f32({T}, {0.0f, 0.0f, 0.0f});
  Pair am = make_out(DType::I32, {T}), ent = make_out(DType::F32, {T}), smp = make_out(DType::I32, {T});
  gops().diffusion_sample_rows(gs(), l.dev, 1.7f, u.dev, am.dev, ent.dev, smp.dev);
  cops().diffusion_sample_rows(cs(), l.cpu, 1.7f, u.cpu, am.cpu, ent.cpu, smp.cpu);
  const std::vector<int32_t> want = {17, 1, 0};
  EXPECT_EQ(download_i32(am), want);
  EXPECT_EQ(host_i32(am), want);
  EXPECT_EQ(download_i32(smp), host_i32(smp));  // u = 0: the first token either way
  // A uniform row: entropy ln V.
  EXPECT_NEAR(download_f32(ent)[2], std::log(double(V)), 1e-4 * std::log(double(V)));
}

TEST_F(GpuDiffusion, StridedRowsOfALargerBuffer) {
  // The canvas rows as a view into a buffer with more columns per row (as in an output buffer shared with the
  // prompt's last row): nb[1] > V * 4.
  const int64_t V = 3000, T = 6, pitch = 3100;
  const Case c = make_case(V, T, 2.0f, 1.0f, 99);
  std::vector<float> wide(size_t(pitch * T), 1e30f);  // poison outside the rows
  for (int64_t t = 0; t < T; ++t)
    std::copy(c.logits.begin() + t * V, c.logits.begin() + (t + 1) * V, wide.begin() + t * pitch);
  Pair w = make_f32({pitch, T}, wide);
  Tensor dview = w.dev, cview = w.cpu;
  dview.ne[0] = cview.ne[0] = V;
  Pair u = make_f32({T}, c.u);
  Pair am = make_out(DType::I32, {T}), ent = make_out(DType::F32, {T}), smp = make_out(DType::I32, {T});
  gops().diffusion_sample_rows(gs(), dview, 1.0f, u.dev, am.dev, ent.dev, smp.dev);
  cops().diffusion_sample_rows(cs(), cview, 1.0f, u.cpu, am.cpu, ent.cpu, smp.cpu);
  EXPECT_EQ(download_i32(am), host_i32(am));
  EXPECT_EQ(download_i32(smp), c.want_sample);
}

TEST_F(GpuDiffusion, TheLoopWithLogitsOnTheGpuEqualsTheHostPath) {
  const int32_t V = 4096, C = 32;
  auto target = [](std::span<const int32_t> prefix, int32_t i) {
    return int32_t((prefix.size() * 7 + size_t(i) * 131) % 4000) + 50;
  };
  DiffusionParams p;
  p.n_predict = 2 * C;
  p.eb.max_steps = 10;
  p.eb.seed = 5;
  std::vector<std::string> logs;
  p.log = [&logs](const std::string& l) { logs.push_back(l); };
  // Soft logits (lead 3 over a field of width 2): several steps with partial acceptance.
  test::ToyCanvasSource host_src(V, C, 3.0f, target);
  p.gpu_sample_reduce = Toggle::Off;
  const DiffusionResult host = diffuse(host_src, std::vector<int32_t>{1, 2, 3}, p);
  test::ToyCanvasSource dev_src(V, C, 3.0f, target, gpu_.get());
  p.gpu_sample_reduce = Toggle::Auto;
  std::vector<int32_t> accepted_dev;
  const DiffusionResult dev = diffuse(dev_src, std::vector<int32_t>{1, 2, 3}, p, [&](const DiffusionStep& s) {
    EXPECT_TRUE(s.device_reduce);
    accepted_dev.push_back(s.n_accepted);
    return true;
  });
  EXPECT_TRUE(dev.device_reduce);
  EXPECT_FALSE(host.device_reduce);
  EXPECT_TRUE(logs.empty());
  EXPECT_EQ(dev.tokens, host.tokens);
  EXPECT_EQ(dev.total_steps, host.total_steps);
  std::printf("[ info ] device loop: %d steps, accepted per step:", dev.total_steps);
  for (int32_t a : accepted_dev) std::printf(" %d", a);
  std::printf("\n");

  // A source that does not name its logits' device: read after a device-wide synchronize, one log line.
  class Unnamed : public test::ToyCanvasSource {
   public:
    using ToyCanvasSource::ToyCanvasSource;
    Device* logits_device() const override { return nullptr; }
  } unnamed(V, C, 3.0f, target, gpu_.get());
  p.gpu_sample_reduce = Toggle::Auto;
  const DiffusionResult un = diffuse(unnamed, std::vector<int32_t>{1, 2, 3}, p);
  EXPECT_FALSE(un.device_reduce);
  EXPECT_EQ(un.tokens, host.tokens);
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_NE(logs[0].find("names no device"), std::string::npos) << logs[0];

  // Off with device logits: the host path copies them down (same result).
  test::ToyCanvasSource off_src(V, C, 3.0f, target, gpu_.get());
  p.gpu_sample_reduce = Toggle::Off;
  const DiffusionResult off = diffuse(off_src, std::vector<int32_t>{1, 2, 3}, p);
  EXPECT_FALSE(off.device_reduce);
  EXPECT_EQ(off.tokens, host.tokens);
}

}  // namespace
}  // namespace tandem::gpu_test
