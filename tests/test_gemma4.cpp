// gemma4 dense on the CPU: a tiny random file (sliding and global layers with their own head dims, KV heads,
// rotary dims and rope bases; proportional partial rope on the global layer through rope_freqs; a global
// layer without attn_v (V = raw K); per-layer feed-forward widths; layer_output_scale; tied head; final
// logit softcap) is run through Session and compared with a double-precision reference forward written here
// from GGUF-ARCH-FACTS C.3/C.4/C.6, independent of Ops; the layer and tensor splits over cpu:0,cpu:1 give the
// single-device logits; an E2B-style file is a clear error (not supported yet). The mixture-of-experts layers
// (C.5) are tested the same way in tests/test_gemma4_moe.cpp.
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
  const std::vector<int32_t> p = prompt_of(c.n_vocab);
  const G4Run single = run(load(f.path.string()), p);
  for (const char* mode : {"layer", "tensor", "row"}) {
    SCOPED_TRACE(mode);
    const auto model = load(f.path.string(), mode, "cpu:0,cpu:1");
    EXPECT_EQ(model->info().split_mode, mode);
    EXPECT_EQ(model->info().devices.size(), 2u);
    const G4Run split = run(model, p);
    EXPECT_LE(row_error(split.prompt, as_double(single.prompt)), 1e-5);
    EXPECT_LE(row_error(split.steps, as_double(single.steps)), 1e-5);
    EXPECT_EQ(split.tokens, single.tokens);
  }
}

TEST(Gemma4, PerLayerInputFilesAreClearErrors) {
  G4Config c;
  const G4Model m = make_g4(c, 7);
  {
    TempFile f("e2b");
    write_g4(m, f.path, {{"gemma4.embedding_length_per_layer_input", Value::u32(8)}});
    try {
      load(f.path.string());
      FAIL() << "an E2B-style gemma4 file loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("per-layer inputs"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tandem
