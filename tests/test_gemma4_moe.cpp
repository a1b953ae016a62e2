// gemma4 mixture-of-experts layers (GGUF-ARCH-FACTS C.5) on the CPU: a tiny random MoE file (every layer has
// the dense MLP and the expert branch; fused gate_up experts or separate gate/up; with and without the
// per-expert down scale) run through Session against the double-precision reference of
// tests/test_gemma4_fixture.h (router with an unweighted norm, 1/sqrt(n_embd) and the router scale, softmax,
// top-k, renormalised weights; dense and expert branches normed and combined); the layer, tensor (each
// expert's n_ff cut, F.2) and row splits over cpu:0,cpu:1 give the single-device logits; bad files are clear
// errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "parallel/shard_rules.h"
#include "test_gemma4_fixture.h"

namespace tandem {
namespace {

using namespace g4test;
using gguf::Value;

G4Config moe_config() {
  G4Config c;
  c.n_expert = 6;
  c.n_expert_used = 2;
  c.n_ff_exp = 48;
  c.n_kv_global = 2;  // tensor split over two ranks: a KV head per rank on every layer
  c.softcap = 10.0f;
  return c;
}

void expect_matches_reference(const G4Model& m, const std::string& name) {
  TempFile f(name);
  write_g4(m, f.path);
  const std::vector<int32_t> p = prompt_of(m.c.n_vocab);
  const G4Run r = run(load(f.path.string()), p);
  EXPECT_LE(row_error(r.prompt, reference_logits(m, p)), 1e-4);
  std::vector<int32_t> seq = p;
  seq.insert(seq.end(), r.tokens.begin(), r.tokens.end() - 1);
  const std::vector<Vec> ref_all = reference_logits(m, seq);
  EXPECT_LE(row_error(r.steps, std::vector<Vec>(ref_all.end() - 5, ref_all.end())), 1e-4);
}

TEST(Gemma4Moe, LogitsMatchTheDoubleReference) {
  for (bool fused : {true, false}) {
    for (bool down_scale : {true, false}) {
      SCOPED_TRACE(std::string(fused ? "fused" : "separate") + (down_scale ? " scaled" : ""));
      G4Config c = moe_config();
      c.fused_gate_up = fused;
      c.down_scale = down_scale;
      expect_matches_reference(make_g4(c, 21), "moe");
    }
  }
  G4Config wide = moe_config();  // every expert selected
  wide.n_expert_used = wide.n_expert;
  expect_matches_reference(make_g4(wide, 22), "moe_all");
}

// The reference depends on the expert branch: the same file judged with another top-k, or without the
// expert branch, is far off (so the parity above can fail).
TEST(Gemma4Moe, TheReferenceCanFail) {
  const G4Model m = make_g4(moe_config(), 21);
  TempFile f("moe_fail");
  write_g4(m, f.path);
  const std::vector<int32_t> p = prompt_of(m.c.n_vocab);
  const G4Run r = run(load(f.path.string()), p);
  G4Model other_k = m;
  other_k.c.n_expert_used = 3;
  EXPECT_GT(row_error(r.prompt, reference_logits(other_k, p)), 1e-3);
  G4Model no_scale = m;
  no_scale.c.down_scale = false;
  EXPECT_GT(row_error(r.prompt, reference_logits(no_scale, p)), 1e-3);
}

TEST(Gemma4Moe, LayerTensorAndRowSplitsOverTwoCpuRanksGiveTheSingleDeviceLogits) {
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "separate");
    G4Config c = moe_config();
    c.fused_gate_up = fused;
    const G4Model m = make_g4(c, 23);
    TempFile f("moe_split");
    write_g4(m, f.path);
    expect_cpu_splits_give_single_device_run(f.path.string(), prompt_of(c.n_vocab),
                                             {"layer", "tensor", "row"});
  }
}

// F.2 / F.3: every expert's n_ff is cut at multiples of the down experts' block size (the last rank takes the
// rest); a split that leaves a rank without expert rows is an Error before any weight is read.
TEST(Gemma4Moe, ExpertRowsAreCutAtTheDownExpertsBlockSize) {
  MeshSpec mesh;
  mesh.mode = SplitMode::Tensor;
  mesh.devices = {DeviceId{DeviceKind::CPU, 0}, DeviceId{DeviceKind::CPU, 1}};
  mesh.ratios = {0.5, 0.5};
  ShardDims d;
  d.n_layer = 1;
  d.n_head = d.n_head_kv = 2;
  d.head_dim_k = d.head_dim_v = 32;
  d.n_ff = 64;
  d.n_vocab = 10;
  d.n_ff_exp = 704;
  d.ffn_down_exps_block = 256;  // q4_k down experts
  std::vector<RankShard> s = plan_shards(mesh, d);
  EXPECT_EQ(s[0].ff_exp, (Range{0, 256}));
  EXPECT_EQ(s[1].ff_exp, (Range{256, 704}));
  EXPECT_EQ(s[1].cut_range(CutUnit::ExpertFfRows, d, 0), (Range{256, 704}));
  d.ffn_down_exps_block = 32;  // q8_0
  s = plan_shards(mesh, d);
  EXPECT_EQ(s[0].ff_exp, (Range{0, 352}));
  d.n_ff_exp = 200;
  d.ffn_down_exps_block = 256;
  try {
    plan_shards(mesh, d);
    FAIL() << "a rank without expert rows was planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert feed-forward rows"), std::string::npos) << e.what();
  }
}

void expect_load_error(const G4Model& m, const std::string& what,
                       const std::vector<std::pair<std::string, Value>>& keys = {}) {
  TempFile f("moe_bad");
  write_g4(m, f.path, keys);
  try {
    load(f.path.string());
    FAIL() << "the file loaded; expected an error containing: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(Gemma4Moe, BadFilesAreClearErrors) {
  const G4Model m = make_g4(moe_config(), 21);
  // More experts per token than experts.
  expect_load_error(m, "expert_used_count", {{"gemma4.expert_used_count", Value::u32(7)}});
  {  // A missing expert tensor.
    G4Model bad = m;
    bad.w.erase(bn(1, "ffn_down_exps.weight"));
    bad.ne.erase(bn(1, "ffn_down_exps.weight"));
    expect_load_error(bad, "missing tensor blk.1.ffn_down_exps.weight");
  }
  {  // No gate/up experts at all.
    G4Model bad = m;
    bad.w.erase(bn(2, "ffn_gate_up_exps.weight"));
    bad.ne.erase(bn(2, "ffn_gate_up_exps.weight"));
    expect_load_error(bad, "missing tensor blk.2.ffn_gate_up_exps.weight");
  }
  {  // A shape that does not match expert_feed_forward_length.
    G4Model bad = m;
    bad.ne[bn(0, "ffn_down_exps.weight")] = {32, m.c.n_embd, 9};
    expect_load_error(bad, "tensor blk.0.ffn_down_exps.weight has shape {32, 64, 9}");
  }
  {  // Router tensors without expert_count.
    G4Config c;
    G4Model dense = make_g4(c, 7);
    dense.w[bn(0, "ffn_gate_inp.weight")] = std::vector<float>(size_t(c.n_embd * 4), 0.5f);
    dense.ne[bn(0, "ffn_gate_inp.weight")] = {c.n_embd, 4};
    expect_load_error(dense, "no gemma4.expert_count");
  }
}

}  // namespace
}  // namespace tandem
