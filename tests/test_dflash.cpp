// The dflash architecture and the DFlash drafter (model/dflash.h, speculative.h):
//  - the drafter's forward (K/V injected from fused target features, one non-causal block) against a plain
//    double-precision reference written from GGUF-ARCH-FACTS E.3, given the reference target's features;
//    through the session alone (host feature rows) and through DflashDrafter (the target's taps);
//  - the device-feature path and the host path give bit-identical drafter logits and outputs;
//  - greedy speculative output is token-identical to plain greedy decoding: tiny models, and the shipped
//    small model with a random drafter of its shape, unsplit and under layer and tensor split on CPU ranks;
//  - sampled speculative decoding keeps the target's distribution (chi-square of the first token);
//  - bad input: a hidden-size mismatch, a batch mixing feature and token rows, non-ascending target layers
//    (the host path runs; set_taps refuses them), missing keys, a bad d2t.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "eval/default_model.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "tandem/speculative.h"
#include "test_cli_util.h"
#include "test_dflash_fixture.h"
#include "test_spec_util.h"

namespace tandem {
namespace {

using testing::chi_square;
using testing::make_tiny;
using testing::make_tiny_dflash;
using testing::plain_greedy;
using testing::TinyConfig;
using testing::TinyDflash;
using testing::TinyDflashConfig;
using testing::TinyModel;

std::filesystem::path tmp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("tandem_dflash_" + std::to_string(::getpid()) + "_" + name + ".gguf");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TinyConfig tiny_target_config(int64_t n_vocab = 48) {
  TinyConfig c;
  c.arch = "qwen3";
  c.n_vocab = n_vocab;
  c.n_embd = 64;
  c.n_layer = 3;
  c.seed = 11;
  return c;
}

struct TinyPair {
  TinyModel target;
  TinyDflash drafter;
  std::shared_ptr<Model> tm, dm;
};

TinyPair load_pair(const std::string& name, const TinyConfig& tc, const TinyDflashConfig& dc,
                   const std::string& split = "") {
  TinyPair p{make_tiny(tc), make_tiny_dflash(dc), nullptr, nullptr};
  const auto tpath = tmp_path(name + "_target"), dpath = tmp_path(name + "_drafter");
  testing::write_tiny_gguf(p.target, tpath);
  testing::write_tiny_dflash(p.drafter, dpath);
  ModelParams mp;
  mp.n_threads = 2;
  if (!split.empty()) {
    mp.devices = "cpu:0,cpu:1";
    mp.split_mode = split;
  }
  p.tm = Model::load(tpath.string(), mp);
  ModelParams dp;
  dp.n_threads = 2;
  dp.share_weights_from = p.tm;
  p.dm = Model::load(dpath.string(), dp);
  std::filesystem::remove(tpath);
  std::filesystem::remove(dpath);
  return p;
}

TEST(Dflash, ForwardMatchesReferenceGivenFeatures) {
  TinyDflashConfig dc;
  dc.n_layer = 2;
  dc.fc_scale = 0.75f;
  const TinyPair p = load_pair("fwd", tiny_target_config(), dc);
  EXPECT_EQ(p.dm->info().arch, "dflash");
  const std::vector<int32_t> ctx = {3, 17, 9, 30, 2, 41};
  const auto ref_t = testing::reference_forward(p.target, ctx);
  const int64_t P = int64_t(ctx.size()), E = dc.n_embd;
  const int32_t last = 12, n = 5;
  const auto ref = testing::reference_dflash_block(p.drafter, p.target, ref_t.hidden, P, last, n);

  Session ds(p.dm, {.n_ctx = 64, .kv_type = KvType::F32});  // F16 K/V alone would cost ~1e-4
  Batch fb;  // feature rows from the reference target's hidden states, host memory
  for (int64_t q = 0; q < P; ++q) {
    std::vector<float> row;
    for (int32_t l : dc.target_layers)
      for (double v : ref_t.hidden[size_t(l)][size_t(q)]) row.push_back(float(v));
    ASSERT_EQ(int64_t(row.size()), E * int64_t(dc.target_layers.size()));
    fb.add_embedding(row, int32_t(q), 0, false);
  }
  ds.decode(fb);
  EXPECT_EQ(ds.seq_len(0), P);
  Batch block;
  block.mask.kind = AttentionMask::BlockBidirectional;
  block.add(last, int32_t(P), 0, false, false);
  for (int32_t j = 1; j <= n; ++j) block.add(dc.mask_token_id, int32_t(P) + j, 0, true, false);
  ds.decode(block);
  for (int32_t j = 1; j <= n; ++j) {
    const double err = testing::row_rel_error(ds.logits(size_t(j)), ref[size_t(j - 1)]);
    EXPECT_LT(err, 1e-4) << "block row " << j;
  }
  EXPECT_EQ(ds.seq_len(0), P);  // the block wrote no K/V

  // Through the drafter: the target's taps give the features; the same logits (the target's own rounding).
  for (int device : {0, 1}) {
    Session ts(p.tm, {.n_ctx = 64, .kv_type = KvType::F32}), ds2(p.dm, {.n_ctx = 64, .kv_type = KvType::F32});
    DflashDrafter drafter(ds2, ts, {.device_features = device, .log = false});
    EXPECT_EQ(drafter.device_features(), device == 1);
    Batch tb;
    tb.add_sequence(ctx, 0, 0, false);
    ts.decode(tb);
    drafter.target_decoded(tb);
    std::vector<int32_t> hist = ctx;
    hist.push_back(last);
    const std::vector<int32_t>* h = &hist;
    const int32_t seq = 0, n_max = n;
    SamplingParams greedy;
    greedy.temperature = 0;
    std::vector<Draft> out;
    drafter.draft(std::span(&seq, 1), std::span(&h, 1), std::span(&n_max, 1), std::span(&greedy, 1), 0.0f,
                  out);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(out[0].tokens.size(), size_t(n));
    for (int32_t j = 1; j <= n; ++j) {
      // Features from tandem's own target (f32) instead of the double reference's: a looser bound.
      EXPECT_LT(testing::row_rel_error(ds2.logits(size_t(j)), ref[size_t(j - 1)]), 1e-3)
          << "drafter row " << j;
    }
  }
}

TEST(Dflash, DeviceAndHostFeaturePathsAreBitIdentical) {
  const TinyPair p = load_pair("paths", tiny_target_config(), {});
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {7, 8}, {9}};
  const testing::DflashRun host = testing::run_dflash(p.tm, p.dm, prompts, 20, 5, 0);
  const testing::DflashRun dev = testing::run_dflash(p.tm, p.dm, prompts, 20, 5, 1);
  EXPECT_FALSE(host.device_features);
  EXPECT_TRUE(dev.device_features);
  EXPECT_EQ(host.out, dev.out);
  ASSERT_EQ(host.block_logits.size(), 5u);
  for (size_t r = 0; r < host.block_logits.size(); ++r)
    EXPECT_EQ(host.block_logits[r], dev.block_logits[r]) << "row " << r + 1;
}

// Both feature paths, draft_max 1, 4 and 7, a batch-invariant target.
void expect_dflash_greedy_identical(const std::shared_ptr<Model>& target,
                                    const std::shared_ptr<Model>& drafter_model,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    const std::vector<std::vector<int32_t>>& expected, int n,
                                    bool expect_acceptance) {
  for (int device : {0, 1}) {
    const auto stats = testing::expect_greedy_spec_identical(
        target, drafter_model, testing::dflash_drafter(device), prompts, expected, n, {1, 4, 7}, true,
        "dflash device " + std::to_string(device));
    if (!expect_acceptance) continue;
    for (const SpeculativeStats& st : stats) {
      EXPECT_GT(st.accepted, 0) << st.summary();
    }
  }
}

TEST(Dflash, GreedyIsTokenIdenticalTiny) {
  // A vocabulary of 12: a random drafter still guesses right now and then, so accepted drafts (and the
  // rollback of the rejected rest in both caches) happen.
  const TinyPair p = load_pair("greedy", tiny_target_config(12), {.mask_token_id = 11});
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4}, {5, 6}, {7}, {8, 9, 10, 1, 2, 3, 4}};
  std::vector<std::vector<int32_t>> expected;
  for (const auto& pr : prompts) expected.push_back(plain_greedy(p.tm, pr, 30));
  expect_dflash_greedy_identical(p.tm, p.dm, prompts, expected, 30, true);
}

// The shipped trained drafter: models/tandem-small-dflash-q8_0.gguf, or the file TANDEM_DFLASH_DRAFTER names
// (a drafter trained on the GPU machine, before it ships).
std::string shipped_drafter_file() {
  const char* env = std::getenv("TANDEM_DFLASH_DRAFTER");
  return env ? std::string(env) : std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-dflash-q8_0.gguf";
}

// The shipped small model (unsplit, or split over two CPU ranks).
std::shared_ptr<Model> shipped_target(const std::string& split = "") {
  ModelParams mp;
  mp.n_threads = 2;
  if (!split.empty()) {
    mp.devices = "cpu:0,cpu:1";
    mp.split_mode = split;
  }
  return Model::load(std::string(TANDEM_SOURCE_DIR) + "/models/" + eval::kDefaultModelFile, mp);
}

// A drafter file loaded with the target it borrows token_embd / output from.
std::shared_ptr<Model> load_drafter(const std::string& file, const std::shared_ptr<Model>& target) {
  ModelParams dp;
  dp.n_threads = 2;
  dp.share_weights_from = target;
  return Model::load(file, dp);
}

TEST(Dflash, GreedyIsTokenIdenticalOnShippedModelUnderSplits) {
  const auto path = testing::write_shipped_shape_drafter("dflash");
  const std::vector<std::vector<int32_t>> prompts = {
      {0, 417, 1210, 4145}, {0, 306, 258, 1210, 1327}, {0, 893}};
  const int n = 16;
  std::vector<std::vector<int32_t>> expected;
  {
    const auto plain = shipped_target();
    for (const auto& pr : prompts) expected.push_back(plain_greedy(plain, pr, n));
  }
  for (const char* mode : {"", "layer", "tensor"}) {
    SCOPED_TRACE(std::string("split ") + mode);
    const auto target = shipped_target(mode);
    expect_dflash_greedy_identical(target, load_drafter(path.string(), target), prompts, expected, n, false);
  }
  std::filesystem::remove(path);
}

// Sampled speculative decoding: the first emitted token (decided at draft position 1) and the second given
// the most frequent first (position 2) follow the target sampler's distribution (chi-square, 5 dof).
void expect_sampled_follows_target(const std::shared_ptr<Model>& tm, const std::shared_ptr<Model>& dm,
                                   const std::vector<int32_t>& prompt) {
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 6;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  // The target's distributions of the first token and of the second given the first.
  const auto p1 = testing::target_distribution(tm, prompt, sp);
  ASSERT_EQ(p1.size(), 6u);
  const int32_t n_seq = 16, rounds = 40;
  Session ts(tm, {.n_ctx = 512, .n_seq_max = n_seq}), ds(dm, {.n_ctx = 512, .n_seq_max = n_seq});
  DflashDrafter drafter(ds, ts, {.log = false});
  SpeculativeDecoder spec(ts, drafter, {.draft_max = 4});
  std::map<int32_t, int64_t> first;
  std::map<int32_t, std::map<int32_t, int64_t>> second;  // by first token
  int64_t n = 0;
  for (const auto& o : testing::sampled_outputs(spec, prompt, sp, n_seq, rounds, 3)) {
    ASSERT_GE(o.size(), 2u);
    ++first[o[0]];
    ++second[o[0]][o[1]];
    ++n;
  }
  const double chi = chi_square(first, p1, n);
  std::printf("dflash first token: chi-square %.2f over %lld draws (5 dof); %s\n", chi, (long long)n,
              spec.stats().summary().c_str());
  EXPECT_LT(chi, 20.5);  // 5 degrees of freedom: P(chi2 > 20.5) < 1e-3
  // The second token (drawn at a later draft position) given the most frequent first token.
  int32_t top = first.begin()->first;
  for (const auto& [t, c] : first)
    if (c > first[top]) top = t;
  std::vector<int32_t> ctx2 = prompt;
  ctx2.push_back(top);
  const auto p2 = testing::target_distribution(tm, ctx2, sp);
  int64_t n2 = 0;
  for (const auto& [t, c] : second[top]) n2 += c;
  const double chi2 = chi_square(second[top], p2, n2);
  std::printf("dflash second token after %d: chi-square %.2f over %lld draws\n", top, chi2, (long long)n2);
  EXPECT_LT(chi2, 20.5);
  EXPECT_GT(spec.stats().drafted, 0);
  EXPECT_LT(spec.stats().accepted, spec.stats().drafted);  // rejections happened: the residual path ran
}

TEST(Dflash, SampledOutputFollowsTargetTiny) {
  const TinyPair p = load_pair("sampled", tiny_target_config(12), {.mask_token_id = 11});
  expect_sampled_follows_target(p.tm, p.dm, {1, 2, 3, 4, 5});
}

// The small model with its trained drafter (a random one would reject every draft and test nothing more).
TEST(Dflash, SampledOutputFollowsTargetOnShippedModel) {
  if (!std::filesystem::exists(shipped_drafter_file())) GTEST_SKIP() << "no trained drafter shipped yet";
  const auto target = shipped_target();
  const auto dm = load_drafter(shipped_drafter_file(), target);
  expect_sampled_follows_target(target, dm, {0, 306, 258, 1210, 1327});
}

TEST(DflashErrors, HiddenSizeMismatch) {
  const TinyModel target = make_tiny(tiny_target_config());
  TinyDflashConfig dc;
  dc.n_embd = 32;
  const auto tpath = tmp_path("mismatch_t"), dpath = tmp_path("mismatch_d");
  testing::write_tiny_gguf(target, tpath);
  testing::write_tiny_dflash(make_tiny_dflash(dc), dpath);
  ModelParams mp;
  mp.n_threads = 1;
  const auto tm = Model::load(tpath.string(), mp);
  mp.share_weights_from = tm;
  const std::string msg = error_of([&] { Model::load(dpath.string(), mp); });
  EXPECT_NE(msg.find("hidden size (32) differs from its target's (64)"), std::string::npos) << msg;
  std::filesystem::remove(tpath);
  std::filesystem::remove(dpath);
}

TEST(DflashErrors, FeatureAndTokenRowsDoNotMix) {
  const TinyPair p = load_pair("mix", tiny_target_config(), {});
  Session ds(p.dm, {.n_ctx = 64});
  Batch b;
  std::vector<float> feat(size_t(2 * 64), 0.5f);
  b.add_embedding(feat, 0, 0, false);
  b.add(3, 1, 0, false);
  const std::string msg = error_of([&] { ds.decode(b); });
  EXPECT_NE(msg.find("mixes 1 feature rows with 1 token rows"), std::string::npos) << msg;
  EXPECT_EQ(ds.seq_len(0), 0);  // nothing changed
  Batch c;
  c.add_embedding(feat, 0, 0, true);
  EXPECT_NE(error_of([&] { ds.decode(c); }).find("computes no logits"), std::string::npos);
  // Feature rows must be n_taps * n_embd wide.
  Batch d;
  d.add_embedding(std::vector<float>(64, 0.5f), 0, 0, false);
  EXPECT_NE(error_of([&] { ds.decode(d); }), "");
}

TEST(DflashErrors, NonAscendingLayersTakeTheHostPath) {
  const TinyPair asc =
      load_pair("asc", tiny_target_config(12), {.target_layers = {1, 3}, .mask_token_id = 11});
  const TinyPair desc =
      load_pair("desc", tiny_target_config(12), {.target_layers = {3, 1}, .mask_token_id = 11});
  {  // set_taps itself takes ascending layers only
    Session ts(asc.tm, {.n_ctx = 64});
    std::vector<float> buf(64 * 2 * 512);
    EXPECT_NE(error_of([&] {
                ts.set_taps({3, 1}, TapDestination{.data = buf.data()});
              }).find("ascending"),
              std::string::npos);
  }
  Session ts(desc.tm, {.n_ctx = 128}), ds(desc.dm, {.n_ctx = 128});
  DflashDrafter drafter(ds, ts, {.device_features = 1, .log = false});
  EXPECT_FALSE(drafter.device_features());  // asked for, but the layers are not ascending
  SpeculativeDecoder spec(ts, drafter, {.draft_max = 4});
  SamplingParams greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_EQ(spec.generate({prompt}, 20, std::span(&greedy, 1))[0], plain_greedy(desc.tm, prompt, 20));
  // The features are fused in the file's order: the reference with layers {3, 1} matches.
  const auto ref_t = testing::reference_forward(desc.target, prompt);
  const auto ref = testing::reference_dflash_block(desc.drafter, desc.target, ref_t.hidden, 3, 4, 3);
  Session ts2(desc.tm, {.n_ctx = 64, .kv_type = KvType::F32}),
      ds2(desc.dm, {.n_ctx = 64, .kv_type = KvType::F32});
  DflashDrafter d2(ds2, ts2, {.log = false});
  Batch tb;
  tb.add_sequence(prompt, 0, 0, false);
  ts2.decode(tb);
  d2.target_decoded(tb);
  std::vector<int32_t> hist = {1, 2, 3, 4};
  const std::vector<int32_t>* h = &hist;
  const int32_t seq = 0, n_max = 3;
  std::vector<Draft> out;
  d2.draft(std::span(&seq, 1), std::span(&h, 1), std::span(&n_max, 1), std::span(&greedy, 1), 0.0f, out);
  for (int32_t j = 1; j <= 3; ++j)  // features from tandem's f32 target: the looser bound
    EXPECT_LT(testing::row_rel_error(ds2.logits(size_t(j)), ref[size_t(j - 1)]), 1e-3);
}

TEST(DflashErrors, BadFiles) {
  const TinyModel target = make_tiny(tiny_target_config());
  const auto tpath = tmp_path("bad_t");
  testing::write_tiny_gguf(target, tpath);
  ModelParams mp;
  mp.n_threads = 1;
  const auto tm = Model::load(tpath.string(), mp);
  mp.share_weights_from = tm;
  const TinyDflash d = make_tiny_dflash({});
  auto load_with = [&](const testing::WriteOptions& o, const std::string& name) {
    const auto path = tmp_path(name);
    testing::write_tiny_dflash(d, path, o);
    const std::string msg = error_of([&] { Model::load(path.string(), mp); });
    std::filesystem::remove(path);
    return msg;
  };
  {
    testing::WriteOptions o;
    o.skip_keys = {"dflash.target_layers"};
    EXPECT_NE(load_with(o, "nolayers").find("dflash.target_layers"), std::string::npos);
  }
  {
    testing::WriteOptions o;
    o.skip_keys = {"tokenizer.ggml.mask_token_id"};
    EXPECT_NE(load_with(o, "nomask").find("mask_token_id"), std::string::npos);
  }
  {
    testing::WriteOptions o;
    o.skip_tensors = {"fc.weight"};
    EXPECT_NE(load_with(o, "nofc").find("fc.weight"), std::string::npos);
  }
  {
    testing::WriteOptions o;
    o.extra_keys.emplace("dflash.target_layers", gguf::Value::i32_array({1, 1}));
    EXPECT_NE(load_with(o, "twice").find("twice"), std::string::npos);
  }
  {
    testing::WriteOptions o;
    o.extra_tensors.push_back({"d2t", {16}});  // F32, not I64
    EXPECT_NE(load_with(o, "d2t").find("d2t"), std::string::npos);
  }
  {  // a target layer beyond the target
    TinyDflashConfig dc;
    dc.target_layers = {1, 9};
    const auto path = tmp_path("far");
    testing::write_tiny_dflash(make_tiny_dflash(dc), path);
    const auto dm = Model::load(path.string(), mp);
    Session ts(tm, {.n_ctx = 32}), ds(dm, {.n_ctx = 32});
    EXPECT_NE(error_of([&] { DflashDrafter x(ds, ts, {.log = false}); }).find("target layer 9"),
              std::string::npos);
    std::filesystem::remove(path);
  }
  std::filesystem::remove(tpath);
}

// The CLI with a DFlash drafter: kind auto-detected, greedy ids equal plain generate's, stats printed, a kind
// that contradicts the file is an error; bench reports speedup and acceptance.
TEST(DflashCli, GenerateAndBench) {
  const auto path = testing::write_shipped_shape_drafter("dflash");
  const std::string target =
      "-m '" + std::string(TANDEM_SOURCE_DIR) + "/models/" + eval::kDefaultModelFile + "' -t 2 ";
  const std::string common = target + "--prompt-ids '0,417,1210,4145;0,893' -n 20 --temp 0 --ids ";
  const std::string draft = "--draft '" + path.string() + "' ";
  const auto plain = test::run_tandem("generate " + common, test::Stderr::Discard);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const auto spec = test::run_tandem("generate " + common + draft + "--draft-max 5");
  ASSERT_EQ(spec.exit_code, 0) << spec.out;
  EXPECT_NE(spec.out.find(plain.out.substr(0, plain.out.size() - 1)), std::string::npos) << spec.out;
  EXPECT_NE(spec.out.find("dflash: target features of layers [1,4,7]"), std::string::npos) << spec.out;
  EXPECT_NE(spec.out.find("mean accepted length"), std::string::npos) << spec.out;
  const auto wrong = test::run_tandem("generate " + common + draft + "--spec draft");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.out.find("is a dflash model"), std::string::npos) << wrong.out;
  const auto bench =
      test::run_tandem("bench " + target + draft + "--draft-max 3 -p 0 -n 12 -b 1 -r 1 --device cpu");
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  EXPECT_NE(bench.out.find("speedup over AR:"), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("per cycle: draft pass"), std::string::npos) << bench.out;
  std::filesystem::remove(path);
}

// The shipped trained drafter (models/tandem-small-dflash-q8_0.gguf; TANDEM_DFLASH_DRAFTER names another
// file of that target), when present: greedy identity with real acceptance on the CPU, out of the box; and
// its teacher-forced acceptance (train_dflash.py's figure, here with tandem's own target features), which
// tells a drafter that was trained wrong (both low) from a loop that loses what the drafter knows (the
// loop's far below the teacher-forced).
TEST(DflashShipped, TrainedDrafterAccepts) {
  if (!std::filesystem::exists(shipped_drafter_file())) GTEST_SKIP() << "no trained drafter shipped yet";
  const auto target = shipped_target();
  const auto dm = load_drafter(shipped_drafter_file(), target);
  const std::vector<std::vector<int32_t>> prompts = {{0, 417, 1210, 4145}, {0, 306, 258, 1210, 1327}};
  std::vector<std::vector<int32_t>> expected;
  for (const auto& pr : prompts) expected.push_back(plain_greedy(target, pr, 32));
  Session ts(target, {.n_ctx = 256, .n_seq_max = 2}), ds(dm, {.n_ctx = 256, .n_seq_max = 2});
  DflashDrafter drafter(ds, ts, {.log = false});
  SpeculativeDecoder spec(ts, drafter, {.draft_max = 7});
  const SamplingParams greedy = testing::greedy_sampling();
  EXPECT_EQ(spec.generate(prompts, 32, std::span(&greedy, 1)), expected);
  std::printf("shipped dflash: %s\n", spec.stats().summary().c_str());
  for (const auto& pr : prompts) {
    const testing::TeacherForced tf = testing::teacher_forced(target, dm, pr, 48, 7);
    std::printf("teacher-forced: %lld blocks, mean accepted length %.3f, P(slots 1..j right):",
                (long long)tf.blocks, tf.mean_accepted_length);
    for (double v : tf.per_slot) std::printf(" %.2f", v);
    std::printf("\n");
    EXPECT_GT(tf.mean_accepted_length, 1.5);
  }
  EXPECT_GT(spec.stats().mean_accepted_length(), 1.5) << spec.stats().summary();
}

// Drafter::fork (the server's prefix sharing): a sequence forked from the first n positions of another drafts
// what the source drafts from the same history, with no target decode of its own; a sequence that was neither
// decoded nor forked, and a fork of more positions than the source holds, are clear errors.
TEST(DflashFork, ForkedSequenceDraftsAsItsSource) {
  const auto target = shipped_target();
  const auto dm = load_drafter(shipped_drafter_file(), target);
  Session ts(target, {.n_ctx = 256, .n_seq_max = 3}), ds(dm, {.n_ctx = 256, .n_seq_max = 3});
  DflashDrafter drafter(ds, ts, {.log = false});
  const std::vector<int32_t> prompt = {0, 417, 1210, 4145, 306, 258, 1210, 1327, 893, 417, 1210};
  const int32_t n = int32_t(prompt.size()) - 1;  // the target holds all but the last token
  Batch b;
  for (int32_t j = 0; j < n; ++j) b.add(prompt[size_t(j)], j, 0, false);
  ts.decode(b);
  drafter.target_decoded(b);
  ts.seq_fork(0, 1, n);
  drafter.fork(0, 1, n);
  const SamplingParams greedy = testing::greedy_sampling();
  const std::vector<int32_t> seqs = {0, 1}, n_max = {7, 7};
  const std::vector<const std::vector<int32_t>*> hist = {&prompt, &prompt};
  const std::vector<SamplingParams> sampling(2, greedy);
  std::vector<Draft> out;
  drafter.draft(seqs, hist, n_max, sampling, 0.0f, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].tokens.size(), 7u);
  EXPECT_EQ(out[1].tokens, out[0].tokens);
  const std::vector<int32_t> seq2 = {2}, n2 = {7};
  const std::vector<const std::vector<int32_t>*> h2 = {&prompt};
  const std::vector<SamplingParams> s2(1, greedy);
  EXPECT_NE(error_of([&] {
              drafter.draft(seq2, h2, n2, s2, 0.0f, out);
            }).find("has target features up to position 0"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { drafter.fork(0, 2, n + 5); }).find("fork of " + std::to_string(n + 5) + " positions"),
      std::string::npos);
}

}  // namespace
}  // namespace tandem
