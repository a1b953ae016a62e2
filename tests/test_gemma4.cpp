// gemma4 dense on the CPU: a tiny random file (sliding and global layers with their own head dims, KV heads,
// rotary dims and rope bases; proportional partial rope on the global layer through rope_freqs; a global
// layer without attn_v (V = raw K); per-layer feed-forward widths; layer_output_scale; tied head; final
// logit softcap) is run through Session and compared with a double-precision reference forward written here
// from GGUF-ARCH-FACTS C.3/C.4/C.6, independent of Ops; the layer and tensor splits over cpu:0,cpu:1 give the
// single-device logits. E2B/E4B per-layer inputs and KV sharing (C.7) are tested the same way below, the
// mixture-of-experts layers (C.5) in tests/test_gemma4_moe.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/diffusion_gemma.h"
#include "model/gemma4.h"
#include "model/transformer.h"
#include "tandem/model.h"
#include "tandem/rng.h"
#include "tandem/session.h"
#include "test_gemma4_fixture.h"

namespace tandem {
namespace {

using namespace g4test;
using gguf::Value;

TEST(Gemma4, PromptLogitsMatchTheDoubleReference) {
  for (float softcap : {0.0f, 3.0f}) {
    SCOPED_TRACE("softcap " + std::to_string(softcap));
    G4Config c;
    c.softcap = softcap;
    const G4Model m = make_g4(c, 7);
    TempFile f("ref");
    write_g4(m, f.path);
    const std::vector<int32_t> p = prompt_of(c.n_vocab);
    const G4Run r = run(load(f.path.string()), p);
    const std::vector<Vec> ref = reference_logits(m, p);
    EXPECT_LE(row_error(r.prompt, ref), 1e-4);
    // The decode steps see the same cache: continuing the reference sequence gives their logits too.
    std::vector<int32_t> seq = p;
    seq.insert(seq.end(), r.tokens.begin(), r.tokens.end() - 1);
    const std::vector<Vec> ref_all = reference_logits(m, seq);
    EXPECT_LE(row_error(r.steps, std::vector<Vec>(ref_all.end() - 5, ref_all.end())), 1e-4);
    if (softcap > 0) {  // c * tanh(z / c) is strictly inside (-c, c)
      for (const auto& row : r.prompt)
        for (float v : row) ASSERT_LT(std::abs(v), softcap);
    }
  }
}

// The reference is sensitive to each gemma4 rule: a file whose global layer has an attn_v (so V is not K)
// gives different logits, and so does a sliding window wider than the prompt (every layer global-masked).
TEST(Gemma4, TheReferenceCanFail) {
  G4Config c;
  const G4Model m = make_g4(c, 7);
  const std::vector<int32_t> p = prompt_of(c.n_vocab);
  const std::vector<Vec> ref = reference_logits(m, p);
  {
    G4Model wide = m;
    wide.c.window = 64;
    TempFile f("wide");
    write_g4(wide, f.path);
    EXPECT_GT(row_error(run(load(f.path.string()), p).prompt, ref), 1e-3);
  }
  {
    G4Model with_v = m;
    Rng rng(3);
    std::vector<float> v(static_cast<size_t>(c.n_embd * c.n_kv_global * c.hd_global));
    for (float& x : v) x = float((rng.uniform() * 2 - 1) * 0.2);
    with_v.w[bn(2, "attn_v.weight")] = v;
    with_v.ne[bn(2, "attn_v.weight")] = {c.n_embd, c.n_kv_global * c.hd_global};
    TempFile f("withv");
    write_g4(with_v, f.path);
    EXPECT_GT(row_error(run(load(f.path.string()), p).prompt, ref), 1e-3);
  }
}

TEST(Gemma4, LayerTensorAndRowSplitsOverTwoCpuRanksGiveTheSingleDeviceLogits) {
  G4Config c;
  c.softcap = 10.0f;
  c.n_kv_global = 2;  // a tensor split over two ranks needs a KV head per rank on every layer
  const G4Model m = make_g4(c, 9);
  TempFile f("split");
  write_g4(m, f.path);
  expect_cpu_splits_give_single_device_run(f.path.string(), prompt_of(c.n_vocab), {"layer", "tensor", "row"});
}

// E2B/E4B (C.7): per-layer inputs (a per-layer token embedding mixed with a projection of the layer-0 input,
// added by every layer through its gate and projection) and KV sharing (the last layer reads layer 1's cache
// and has no K/V weights) against the double reference; the tensor and row splits give the single-device
// logits; a layer split and a sharing layer whose source is of another kind are clear errors.
G4Config e2b_config() {
  G4Config c;
  c.n_embd_pl = 8;
  c.n_shared_kv = 1;  // layer 3 (sliding) reads layer 1 (sliding)
  c.n_kv_global = 2;
  c.softcap = 10.0f;
  return c;
}

TEST(Gemma4, PerLayerInputsAndKvSharingMatchTheDoubleReference) {
  for (int variant = 0; variant < 3; ++variant) {
    G4Config c = e2b_config();
    if (variant == 1) c.n_shared_kv = 0;  // per-layer inputs only
    if (variant == 2) c.n_embd_pl = 0;    // KV sharing only
    SCOPED_TRACE("variant " + std::to_string(variant));
    const G4Model m = make_g4(c, 31);
    TempFile f("e2b");
    write_g4(m, f.path);
    const std::vector<int32_t> p = prompt_of(c.n_vocab);
    const G4Run r = run(load(f.path.string()), p);
    EXPECT_LE(row_error(r.prompt, reference_logits(m, p)), 1e-4);
    std::vector<int32_t> seq = p;
    seq.insert(seq.end(), r.tokens.begin(), r.tokens.end() - 1);
    const std::vector<Vec> ref_all = reference_logits(m, seq);
    EXPECT_LE(row_error(r.steps, std::vector<Vec>(ref_all.end() - 5, ref_all.end())), 1e-4);
    // The reference depends on both features.
    G4Model other = m;
    if (c.n_embd_pl > 0) {
      other.w.at("per_layer_proj_norm.weight")[0] += 1.0f;
    } else {
      other.c.n_shared_kv = 0;  // layer 3 would need its own K/V: give it layer 1's weights
      for (const char* n : {"attn_k.weight", "attn_v.weight", "attn_k_norm.weight"}) {
        other.w[bn(3, n)] = m.w.at(bn(1, n));
        other.ne[bn(3, n)] = m.ne.at(bn(1, n));
      }
      for (float& v : other.w[bn(3, "attn_k.weight")]) v *= -1.0f;
    }
    EXPECT_GT(row_error(r.prompt, reference_logits(other, p)), 1e-3);
  }
}

TEST(Gemma4, PerLayerInputsAndKvSharingSplitByTensorAndRow) {
  const G4Model m = make_g4(e2b_config(), 33);
  TempFile f("e2b_split");
  write_g4(m, f.path);
  expect_cpu_splits_give_single_device_run(f.path.string(), prompt_of(m.c.n_vocab), {"tensor", "row"});
  try {
    load(f.path.string(), "layer", "cpu:0,cpu:1");
    FAIL() << "a per-layer-input model was split by layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be split by layer"), std::string::npos) << e.what();
  }
}

TEST(Gemma4, KvSharingWithASourceOfAnotherKindIsAnError) {
  G4Config c;
  const G4Model m = make_g4(c, 7);
  TempFile f("e2b_bad");
  // Two shared layers: layer 2 (global) would read layer 1 (sliding).
  write_g4(m, f.path, {{"gemma4.attention.shared_kv_layers", Value::u32(2)}});
  try {
    load(f.path.string());
    FAIL() << "a KV-sharing layer read a cache of another kind";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shares the K/V of layer 1"), std::string::npos) << e.what();
  }
  TempFile g("e2b_missing");
  write_g4(m, g.path, {{"gemma4.embedding_length_per_layer_input", Value::u32(8)}});
  try {
    load(g.path.string());
    FAIL() << "a per-layer-input model without its tensors loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor per_layer_token_embd.weight"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// The rule tables built from llama_style_shard_rules: every name once, and the shared rows the same in the
// llama / qwen3, gemma4 and diffusion-gemma tables (one definition of how a projection is cut).
TEST(Gemma4, ShardRuleTablesShareTheLlamaStyleRows) {
  const ShardRuleTable shared = llama_style_shard_rules();
  for (const ShardRuleTable table :
       {transformer_shard_rules(), gemma4_shard_rules(), diffusion_gemma_shard_rules()}) {
    std::map<std::string, int> seen;
    for (const ShardRule& r : table) EXPECT_EQ(++seen[r.name], 1) << r.name << " listed twice";
    for (const ShardRule& s : shared) {
      const ShardRule r = shard_rule_named(table, s.name);  // a copy: GCC 13 -Wdangling-reference
      EXPECT_EQ(r.per_layer, s.per_layer) << s.name;
      EXPECT_EQ(r.layer, s.layer) << s.name;
      EXPECT_EQ(r.cut, s.cut) << s.name;
      EXPECT_EQ(r.unit, s.unit) << s.name;
      EXPECT_EQ(r.row, s.row) << s.name;
    }
  }
  EXPECT_EQ(shard_rule_named(gemma4_shard_rules(), "ffn_down_exps.weight").unit, CutUnit::ExpertFfRows);
  EXPECT_EQ(shard_rule_named(transformer_shard_rules(), "attn_q.bias").cut, TensorCut::OutputRows);
  EXPECT_THROW(shard_rule_named(transformer_shard_rules(), "ffn_gate_up_exps.weight"), Error);
}

}  // namespace
}  // namespace tandem
