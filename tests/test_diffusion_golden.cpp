// A fixed-seed run of the EB sampler and driver on the toy canvas source (test_diffusion_util.h), compared
// with a committed record (tests/data/diffusion/eb_toy_golden.txt): every step's acceptance count, stability
// counter and display canvas, and the response. The record was written by this implementation after the
// hand-computed tests of test_diffusion_sampler.cpp passed; it guards the whole loop (draw order, decisions,
// trims, prefixes) against silent changes. TANDEM_UPDATE_GOLDEN=1 rewrites it (then review the diff).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "test_diffusion_util.h"

namespace tandem {
namespace {

std::string golden_run() {
  const int32_t V = 64, C = 24;
  auto target = [](std::span<const int32_t> prefix, int32_t i) {
    return int32_t((prefix.size() * 13 + size_t(i) * 29) % 60) + 2;
  };
  test::ToyCanvasSource src(V, C, 5.0f, target);  // soft: partial acceptance over several steps
  DiffusionParams p;
  p.n_predict = 2 * C;
  p.eb.max_steps = 8;
  p.eb.seed = 20261204;
  p.eb.entropy_bound = 0.5f;
  p.gpu_sample_reduce = Toggle::Off;
  p.log = [](const std::string&) {};
  std::ostringstream out;
  auto list = [&out](std::span<const int32_t> v) {
    for (int32_t t : v) out << ' ' << t;
    out << '\n';
  };
  const DiffusionResult r = diffuse(src, std::vector<int32_t>{1, 2, 3}, p, [&](const DiffusionStep& s) {
    char line[160];
    std::snprintf(line, sizeof line, "block %d step %d t %.4f accepted %d held %d mean_entropy %.4f\n",
                  s.block, s.step, double(s.temperature), s.n_accepted, s.held, s.mean_entropy);
    out << line << "argmax";
    list(s.argmax);
    out << "next";
    list(s.next_canvas);
    return true;
  });
  out << "blocks " << r.blocks.size() << " steps " << r.total_steps << "\nresponse";
  list(r.tokens);
  return out.str();
}

TEST(EbGolden, AFixedSeedRunMatchesTheCommittedRecord) {
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/tests/data/diffusion/eb_toy_golden.txt";
  const std::string got = golden_run();
  if (const char* u = std::getenv("TANDEM_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    std::ofstream(path) << got;
    GTEST_SKIP() << "rewrote " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing " << path;
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_EQ(got, want.str());
  // The run is deterministic within a process too.
  EXPECT_EQ(golden_run(), got);
}

}  // namespace
}  // namespace tandem
