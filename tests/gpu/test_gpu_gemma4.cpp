// gemma4 dense on CUDA: the tiny random gemma4 model of tests/test_gemma4_fixture.h on cuda:0 gives the
// double-precision reference's logits (prompt and greedy steps) and the CPU's greedy tokens; the layer and
// tensor splits over cuda:0,cuda:0 give the single-GPU logits.
#include <gtest/gtest.h>

#include "../test_gemma4_fixture.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

using namespace g4test;

TEST(GpuGemma4, LogitsMatchTheReferenceAndTheCpu) {
  TANDEM_REQUIRE_GPU();
  G4Config c;
  c.softcap = 3.0f;
  const G4Model m = make_g4(c, 7);
  TempFile f("gpu");
  write_g4(m, f.path);
  const std::vector<int32_t> p = prompt_of(c.n_vocab);
  const G4Run gpu = run(load(f.path.string(), "", "cuda:0"), p);
  const G4Run cpu = run(load(f.path.string()), p);
  EXPECT_LE(row_error(gpu.prompt, reference_logits(m, p)), 1e-4);
  std::vector<int32_t> seq = p;
  seq.insert(seq.end(), gpu.tokens.begin(), gpu.tokens.end() - 1);
  const std::vector<Vec> ref_all = reference_logits(m, seq);
  EXPECT_LE(row_error(gpu.steps, std::vector<Vec>(ref_all.end() - 5, ref_all.end())), 1e-4);
  EXPECT_EQ(gpu.tokens, cpu.tokens);
}

TEST(GpuGemma4, LayerAndTensorSplitsGiveTheSingleGpuLogits) {
  TANDEM_REQUIRE_GPU();
  G4Config c;
  c.softcap = 10.0f;
  c.n_kv_global = 2;
  const G4Model m = make_g4(c, 9);
  TempFile f("gpu_split");
  write_g4(m, f.path);
  const std::vector<int32_t> p = prompt_of(c.n_vocab);
  const G4Run single = run(load(f.path.string(), "", "cuda:0"), p);
  for (const char* mode : {"layer", "tensor"}) {
    SCOPED_TRACE(mode);
    const auto model = load(f.path.string(), mode, "cuda:0,cuda:0");
    EXPECT_EQ(model->info().split_mode, mode);
    EXPECT_EQ(model->info().devices.size(), 2u);
    const G4Run split = run(model, p);
    EXPECT_LE(row_error(split.prompt, as_double(single.prompt)), 1e-5);
    EXPECT_LE(row_error(split.steps, as_double(single.steps)), 1e-5);
    EXPECT_EQ(split.tokens, single.tokens);
  }
}

}  // namespace
}  // namespace tandem::gpu_test
