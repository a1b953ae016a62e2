// One model over several CPU "devices" (cpu:0, cpu:1, ... in one process): every split mode (layer, row,
// tensor) over 2, 3 and 4 ranks, for qwen3 and llama random models, must give the logits of the single-device
// run within 1e-5 relative (f32) and the same greedy tokens, with several sequences decoded in parallel;
// uneven
// --tensor-split ratios, quantized weights, --replicate-kv, and the errors a split that cannot be made gives
// before any weight is read.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/mesh.h"
#include "quant/quantize_model.h"
#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/session.h"
#include "test_model_fixture.h"

namespace tandem {
namespace {

using testing::TinyConfig;
using testing::TinyModel;

constexpr double kTol = 1e-5;  // max |split - single| / max |single| per logits row, f32 weights and KV

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("tandem_test_split_" + std::to_string(::getpid()) + "_" + name);
}

// qwen3: 8 query heads over 4 KV heads, 4 layers, so that 4 ranks get a KV head (tensor) and a layer (layer).
TinyConfig qwen3_config() {
  TinyConfig c;
  c.arch = "qwen3";
  c.n_vocab = 101;  // not a multiple of any rank count: uneven vocabulary slices
  c.n_embd = 64;
  c.n_layer = 4;
  c.n_head = 8;
  c.n_head_kv = 4;
  c.head_dim = 16;
  c.n_ff = 128;
  c.seed = 11;
  return c;
}

// llama: tied head, llama3 rope factors, and biases on Q/K/V, attention output and the feed-forward (the
// row-cut biases are sliced, the column-cut ones added after the all-reduce).
TinyConfig llama_config() {
  TinyConfig c = qwen3_config();
  c.arch = "llama";
  c.tied = true;
  c.rope_freqs = true;
  c.seed = 12;
  return c;
}

void add_llama_biases(TinyModel& m) {
  Rng rng(99);
  auto vec = [&](const std::string& name, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = float((rng.uniform() * 2 - 1) * 0.5);
    m.w[name] = v;
    m.ne[name] = {n};
  };
  const TinyConfig& c = m.cfg;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    vec(testing::blk_name(l, "attn_q.bias"), c.n_head * c.head_dim);
    vec(testing::blk_name(l, "attn_k.bias"), c.n_head_kv * c.head_dim);
    vec(testing::blk_name(l, "attn_v.bias"), c.n_head_kv * c.head_dim);
    vec(testing::blk_name(l, "attn_output.bias"), c.n_embd);
    vec(testing::blk_name(l, "ffn_gate.bias"), c.n_ff);
    vec(testing::blk_name(l, "ffn_up.bias"), c.n_ff);
    vec(testing::blk_name(l, "ffn_down.bias"), c.n_embd);
  }
}

// A model file that lives as long as the test.
struct ModelFile {
  std::filesystem::path path;
  explicit ModelFile(const TinyConfig& cfg, const std::string& name) : path(temp_path(name + ".gguf")) {
    TinyModel m = testing::make_tiny(cfg);
    if (cfg.arch == "llama") add_llama_biases(m);
    testing::write_tiny_gguf(m, path);
  }
  ~ModelFile() { std::filesystem::remove(path); }
};

std::string cpu_devices(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? ",cpu:" : "cpu:") + std::to_string(i);
  return s;
}

std::shared_ptr<Model> load(const std::string& path, const std::string& mode = "", int ranks = 1,
                            const std::string& ratios = "", bool replicate_kv = false) {
  ModelParams mp;
  mp.n_threads = 1;
  if (!mode.empty()) {
    mp.devices = cpu_devices(ranks);
    mp.split_mode = mode;
    mp.tensor_split = ratios;
    mp.replicate_kv = replicate_kv;
  }
  return Model::load(path, mp);
}

// What a run produces: the logits of every prompt row of both sequences, then the greedy continuations
// (decoded as one batch of two rows per step) and their logits.
struct RunResult {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

RunResult run(const std::shared_ptr<Model>& model) {
  SessionParams sp;
  sp.n_ctx = 128;
  sp.n_seq_max = 3;
  sp.kv_type = KvType::F32;
  sp.n_batch = 16;  // the 2 x 11 prompt rows take two forward passes
  sp.block_size = 4;
  Session s(model, sp);
  const int64_t V = model->info().n_vocab;
  Rng rng(5);
  std::vector<int32_t> p0, p1;
  for (int i = 0; i < 11; ++i) p0.push_back(int32_t(rng.next() % uint64_t(V)));
  for (int i = 0; i < 9; ++i) p1.push_back(int32_t(rng.next() % uint64_t(V)));
  Batch b;
  for (size_t i = 0; i < p0.size(); ++i) b.add(p0[i], int32_t(i), 0, true);
  for (size_t i = 0; i < p1.size(); ++i) b.add(p1[i], int32_t(i), 1, true);
  s.decode(b);
  RunResult out;
  for (size_t i = 0; i < b.size(); ++i) out.logits.emplace_back(s.logits(i).begin(), s.logits(i).end());
  int32_t t0 = argmax(s.logits(p0.size() - 1)), t1 = argmax(s.logits(b.size() - 1));
  // A fork of sequence 0 at 6 positions continues too (shared KV blocks, copy on write).
  s.seq_fork(0, 2, 6);
  int32_t t2 = p0[6];
  int32_t n0 = int32_t(p0.size()), n1 = int32_t(p1.size()), n2 = 6;
  for (int step = 0; step < 6; ++step) {
    Batch g;
    g.add(t0, n0++, 0, true);
    g.add(t1, n1++, 1, true);
    g.add(t2, n2++, 2, true);
    s.decode(g);
    for (size_t i = 0; i < 3; ++i) out.logits.emplace_back(s.logits(i).begin(), s.logits(i).end());
    t0 = argmax(s.logits(0));
    t1 = argmax(s.logits(1));
    t2 = argmax(s.logits(2));
    out.tokens.insert(out.tokens.end(), {t0, t1, t2});
  }
  return out;
}

double max_row_error(const RunResult& a, const RunResult& b) {
  EXPECT_EQ(a.logits.size(), b.logits.size());
  double worst = 0;
  for (size_t r = 0; r < a.logits.size() && r < b.logits.size(); ++r) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.logits[r].size(); ++i) {
      num = std::max(num, double(std::abs(a.logits[r][i] - b.logits[r][i])));
      den = std::max(den, double(std::abs(b.logits[r][i])));
    }
    worst = std::max(worst, num / den);
  }
  return worst;
}

void expect_split_matches(const std::string& file, const RunResult& single, const std::string& mode,
                          int ranks, const std::string& ratios = "", bool replicate_kv = false) {
  SCOPED_TRACE(mode + " over " + std::to_string(ranks) + " ranks" +
               (ratios.empty() ? "" : " ratios " + ratios));
  auto model = load(file, mode, ranks, ratios, replicate_kv);
  EXPECT_EQ(model->info().split_mode, mode);
  EXPECT_EQ(model->info().devices.size(), size_t(ranks));
  const RunResult split = run(model);
  EXPECT_LE(max_row_error(split, single), kTol);
  EXPECT_EQ(split.tokens, single.tokens);
}

class SplitModes : public ::testing::TestWithParam<std::string> {};

TEST_P(SplitModes, EveryModeAndRankCountGivesTheSingleDeviceLogitsAndTokens) {
  const TinyConfig cfg = GetParam() == "qwen3" ? qwen3_config() : llama_config();
  ModelFile f(cfg, GetParam());
  const RunResult single = run(load(f.path.string()));
  for (const char* mode : {"layer", "row", "tensor"})
    for (int ranks : {2, 3, 4}) expect_split_matches(f.path.string(), single, mode, ranks);
}

TEST_P(SplitModes, UnevenRatiosGiveTheSameResult) {
  const TinyConfig cfg = GetParam() == "qwen3" ? qwen3_config() : llama_config();
  ModelFile f(cfg, GetParam() + "_uneven");
  const RunResult single = run(load(f.path.string()));
  expect_split_matches(f.path.string(), single, "tensor", 2, "3,1");
  expect_split_matches(f.path.string(), single, "layer", 2, "1,3");
  expect_split_matches(f.path.string(), single, "row", 3, "1,2,1");
}

INSTANTIATE_TEST_SUITE_P(Archs, SplitModes, ::testing::Values("qwen3", "llama"));

// Sessions of one split model own their split's machinery (comm, rank threads, row-split buffers): two
// sessions stepped alternately give what each gives alone.
TEST(Split, TwoSessionsOfOneSplitModelSteppedAlternately) {
  ModelFile f(qwen3_config(), "two_sessions");
  for (const char* mode : {"tensor", "row", "layer"}) {
    SCOPED_TRACE(mode);
    auto model = load(f.path.string(), mode, 2);
    SessionParams sp;
    sp.n_ctx = 64;
    sp.kv_type = KvType::F32;
    auto step = [](Session& s, std::vector<int32_t>& out, int32_t first) {
      Batch b;
      b.add(out.empty() ? first : out.back(), int32_t(out.size()), 0, true);
      s.decode(b);
      const auto l = s.logits(0);
      out.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
    };
    std::vector<int32_t> a_alone, b_alone, a_mixed, b_mixed;
    {
      Session a(model, sp);
      for (int i = 0; i < 8; ++i) step(a, a_alone, 3);
      Session b(model, sp);
      for (int i = 0; i < 8; ++i) step(b, b_alone, 7);
    }
    Session a(model, sp), b(model, sp);
    for (int i = 0; i < 8; ++i) {
      step(a, a_mixed, 3);
      step(b, b_mixed, 7);
    }
    EXPECT_EQ(a_mixed, a_alone);
    EXPECT_EQ(b_mixed, b_alone);
  }
}

TEST(Split, QuantizedWeightsAreCutOnBlockBoundaries) {
  // q8_0 (blocks of 32): attention output and down are cut by columns, which must fall on block boundaries;
  // the activations are quantized per block too, so the split run sees the same blocks as the single one.
  ModelFile f(qwen3_config(), "q8");
  const std::string q8 = temp_path("q8_0.gguf").string();
  quant::quantize_model(f.path.string(), q8, quant::parse_quant_target("q8_0"));
  const RunResult single = run(load(q8));
  for (int ranks : {2, 4}) expect_split_matches(q8, single, "tensor", ranks);
  expect_split_matches(q8, single, "row", 3);
  std::filesystem::remove(q8);
}

TEST(Split, ReplicatedKvHeadsServeMoreRanksThanKvHeads) {
  TinyConfig cfg = qwen3_config();
  cfg.n_head_kv =
      2;  // 8 query heads, 2 KV heads, 4 ranks: each rank has 2 query heads and a copy of 1 KV head
  ModelFile f(cfg, "gqa4");
  const RunResult single = run(load(f.path.string()));
  expect_split_matches(f.path.string(), single, "tensor", 4, "", /*replicate_kv=*/true);
  try {
    load(f.path.string(), "tensor", 4);
    FAIL() << "4 tensor ranks over 2 KV heads loaded without --replicate-kv";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs at least 4 KV heads, but the model has 2"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--replicate-kv"), std::string::npos) << e.what();
  }
  // Replication cannot give 3 ranks one KV head each when 3 does not divide into the 2 heads' groups.
  EXPECT_THROW(load(f.path.string(), "tensor", 3, "", true), Error);
}

// The command line builds the mesh once (make_mesh_spec, in split_options.cpp) and hands it to Model::load in
// ModelParams::mesh; load takes it as built and does not parse the flag strings again (one is left bad here).
TEST(Split, AMeshBuiltBeforeLoadIsTakenAsBuilt) {
  ModelFile f(qwen3_config(), "given_mesh");
  const RunResult single = run(load(f.path.string()));
  ModelParams mp;
  mp.n_threads = 1;
  mp.mesh =
      std::make_shared<const MeshSpec>(make_mesh_spec("cpu:0,cpu:1", "tensor", "3,1", 0, false, DeviceId{}));
  mp.split_mode = "not parsed";
  auto model = Model::load(f.path.string(), mp);
  EXPECT_EQ(model->info().split_mode, "tensor");
  EXPECT_EQ(model->info().devices.size(), 2u);
  EXPECT_LE(max_row_error(run(model), single), kTol);
}

TEST(Split, SplitsThatCannotBeMadeFailBeforeAnyWeightIsRead) {
  TinyConfig cfg = qwen3_config();
  cfg.n_layer = 2;
  ModelFile f(cfg, "two_layers");
  auto expect_error = [&](const std::string& mode, int ranks, const std::string& ratios,
                          const std::string& text) {
    try {
      load(f.path.string(), mode, ranks, ratios);
      ADD_FAILURE() << mode << " over " << ranks << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error("layer", 3, "", "gets no layers");
  expect_error("layer", 2, "1,0", "gets no layers");
  expect_error("tensor", 2, "1,0", "gets no KV heads");
  expect_error("tensor", 2, "1,2,3", "tensor-split");  // three ratios for two devices
}

}  // namespace
}  // namespace tandem
