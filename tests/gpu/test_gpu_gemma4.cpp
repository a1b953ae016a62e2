// gemma4 on CUDA: the tiny random gemma4 models of tests/test_gemma4_fixture.h (dense, mixture of experts,
// E2B-style) on cuda:0 give the double-precision reference's logits (prompt and greedy steps) and the CPU's
// greedy tokens; the layer and tensor splits over cuda:0,cuda:0 give the single-GPU logits.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_gemma4_fixture.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

using namespace g4test;

// m on cuda:0: the prompt's and the greedy steps' logits against the double reference, the greedy tokens
// against the CPU's. Returns the single-GPU run.
G4Run check_against_reference(const G4Model& m, const std::filesystem::path& file) {
  const std::vector<int32_t> p = prompt_of(m.c.n_vocab);
  const G4Run gpu = run(load(file.string(), "", "cuda:0"), p);
  const G4Run cpu = run(load(file.string()), p);
  EXPECT_LE(row_error(gpu.prompt, reference_logits(m, p)), 1e-4);
  std::vector<int32_t> seq = p;
  seq.insert(seq.end(), gpu.tokens.begin(), gpu.tokens.end() - 1);
  const std::vector<Vec> ref_all = reference_logits(m, seq);
  EXPECT_LE(row_error(gpu.steps, std::vector<Vec>(ref_all.end() - 5, ref_all.end())), 1e-4);
  EXPECT_EQ(gpu.tokens, cpu.tokens);
  return gpu;
}

// The splits of `modes` over cuda:0,cuda:0 give the single-GPU run's logits and tokens (prompt_of(n_vocab)).
void check_splits(const std::filesystem::path& file, int64_t n_vocab, const G4Run& single,
                  std::initializer_list<const char*> modes) {
  const std::vector<int32_t> p = prompt_of(n_vocab);
  for (const char* mode : modes) {
    SCOPED_TRACE(mode);
    const auto model = load(file.string(), mode, "cuda:0,cuda:0");
    EXPECT_EQ(model->info().split_mode, mode);
    EXPECT_EQ(model->info().devices.size(), 2u);
    const G4Run split = run(model, p);
    EXPECT_LE(row_error(split.prompt, as_double(single.prompt)), 1e-5);
    EXPECT_LE(row_error(split.steps, as_double(single.steps)), 1e-5);
    EXPECT_EQ(split.tokens, single.tokens);
  }
}

TEST(GpuGemma4, LogitsMatchTheReferenceAndTheCpu) {
  TANDEM_REQUIRE_GPU();
  G4Config c;
  c.softcap = 3.0f;
  const G4Model m = make_g4(c, 7);
  TempFile f("gpu");
  write_g4(m, f.path);
  check_against_reference(m, f.path);
}

TEST(GpuGemma4, LayerAndTensorSplitsGiveTheSingleGpuLogits) {
  TANDEM_REQUIRE_GPU();
  G4Config c;
  c.softcap = 10.0f;
  c.n_kv_global = 2;
  const G4Model m = make_g4(c, 9);
  TempFile f("gpu_split");
  write_g4(m, f.path);
  check_splits(f.path, c.n_vocab, run(load(f.path.string(), "", "cuda:0"), prompt_of(c.n_vocab)),
               {"layer", "tensor"});
}

// gemma4 MoE (C.5): the tiny MoE model (fused and separate gate/up experts) on cuda:0 gives the reference's
// logits and the CPU's greedy tokens; the tensor split (each expert's n_ff cut, F.2) and the layer split over
// cuda:0,cuda:0 give the single-GPU logits.
G4Config moe_config(bool fused) {
  G4Config c;
  c.n_expert = 6;
  c.n_expert_used = 2;
  c.n_ff_exp = 64;
  c.n_kv_global = 2;
  c.softcap = 10.0f;
  c.fused_gate_up = fused;
  return c;
}

TEST(GpuGemma4, MoeLogitsMatchTheReferenceAndTheCpu) {
  TANDEM_REQUIRE_GPU();
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "separate");
    const G4Model m = make_g4(moe_config(fused), 21);
    TempFile f("gpu_moe");
    write_g4(m, f.path);
    check_against_reference(m, f.path);
  }
}

TEST(GpuGemma4, MoeLayerAndTensorSplitsGiveTheSingleGpuLogits) {
  TANDEM_REQUIRE_GPU();
  const G4Model m = make_g4(moe_config(true), 23);
  TempFile f("gpu_moe_split");
  write_g4(m, f.path);
  check_splits(f.path, m.c.n_vocab, run(load(f.path.string(), "", "cuda:0"), prompt_of(m.c.n_vocab)),
               {"layer", "tensor"});
}

// E2B/E4B (C.7): per-layer inputs and KV sharing on cuda:0 against the reference, and the tensor split over
// cuda:0,cuda:0 against the single GPU (tandem refuses a layer split of such a model).
TEST(GpuGemma4, PerLayerInputsAndKvSharingMatchTheReference) {
  TANDEM_REQUIRE_GPU();
  G4Config c;
  c.n_embd_pl = 8;
  c.n_shared_kv = 1;
  c.n_kv_global = 2;
  c.softcap = 10.0f;
  const G4Model m = make_g4(c, 31);
  TempFile f("gpu_e2b");
  write_g4(m, f.path);
  check_splits(f.path, c.n_vocab, check_against_reference(m, f.path), {"tensor"});
}

}  // namespace
}  // namespace tandem::gpu_test
