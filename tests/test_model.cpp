// Loading llama / qwen3 GGUFs and running them through a Session, against a double-precision reference
// forward pass on tiny random models: logits, incremental decoding, batches of several sequences, forks,
// rollback, hidden-state taps, and every bad input the loader and the session must reject.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "test_model_fixture.h"

namespace tandem {
namespace {

using testing::reference_forward;
using testing::row_rel_error;
using testing::TinyConfig;
using testing::TinyModel;
using testing::WriteOptions;

constexpr double kTol = 1e-4;  // max |a - b| / max |b| per row, f32 weights and f32 KV cache

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("tandem_test_model_" + std::to_string(::getpid()) + "_" + name);
}

struct Loaded {
  TinyModel tiny;
  std::shared_ptr<Model> model;
};

Loaded load_tiny(const TinyConfig& cfg, const std::string& name) {
  Loaded l;
  l.tiny = testing::make_tiny(cfg);
  const auto path = temp_path(name + ".gguf");
  testing::write_tiny_gguf(l.tiny, path);
  ModelParams mp;
  mp.n_threads = 2;
  l.model = Model::load(path.string(), mp);
  std::filesystem::remove(path);  // the mapping stays valid
  return l;
}

SessionParams f32_session(int32_t n_seq = 1, int32_t n_ctx = 256) {
  SessionParams p;
  p.n_ctx = n_ctx;
  p.n_seq_max = n_seq;
  p.kv_type = KvType::F32;
  p.n_batch = 64;
  p.n_logits_max = 64;
  return p;
}

std::vector<int32_t> random_tokens(int n, int64_t n_vocab, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t(r.next() % uint64_t(n_vocab)));
  return t;
}

// Decodes tokens as one sequence with logits on every row and compares each row with the reference.
void expect_matches_reference(const Loaded& l, const std::vector<int32_t>& tokens, double tol,
                              SessionParams sp = f32_session()) {
  Session s(l.model, sp);
  Batch b;
  for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], int32_t(i), 0, true);
  s.decode(b);
  const auto ref = reference_forward(l.tiny, tokens);
  double worst = 0;
  for (size_t i = 0; i < tokens.size(); ++i)
    worst = std::max(worst, row_rel_error(s.logits(i), ref.logits[i]));
  EXPECT_LE(worst, tol);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", worst);
  ::testing::Test::RecordProperty("max_rel_error", buf);
}

TEST(Model, Qwen3MatchesTheReferenceForward) {
  TinyConfig c;
  c.arch = "qwen3";
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 32;  // n_head * head_dim != n_embd, as qwen3 allows
  const Loaded l = load_tiny(c, "qwen3");
  EXPECT_EQ(l.model->info().arch, "qwen3");
  EXPECT_EQ(l.model->info().n_vocab, c.n_vocab);
  EXPECT_EQ(l.model->info().eos_ids, std::vector<int32_t>{int32_t(c.n_vocab - 1)});
  expect_matches_reference(l, random_tokens(40, c.n_vocab, 3), kTol);
}

TEST(Model, LlamaWithGqaRopeFreqsAndTiedHeadMatchesTheReference) {
  TinyConfig c;
  c.arch = "llama";
  c.n_head = 8;
  c.n_head_kv = 2;
  c.head_dim = 8;
  c.tied = true;
  c.rope_freqs = true;
  c.freq_base = 500000.0f;
  const Loaded l = load_tiny(c, "llama");
  expect_matches_reference(l, random_tokens(33, c.n_vocab, 4), kTol);
}

TEST(Model, LinearRopeScalingAndBf16WeightsMatchTheReference) {
  TinyConfig c;
  c.arch = "llama";
  c.rope_scale_linear = 4.0f;
  c.wtype = DType::BF16;  // the reference uses the same rounded weights
  const Loaded l = load_tiny(c, "llama_bf16");
  expect_matches_reference(l, random_tokens(20, c.n_vocab, 5), kTol);
  c.arch = "qwen3";
  c.wtype = DType::F16;
  c.rope_scale_linear = 0;
  const Loaded q = load_tiny(c, "qwen3_f16");
  expect_matches_reference(q, random_tokens(20, c.n_vocab, 6), kTol);
}

TEST(Model, ChunkedPrefillAndSmallBlocksGiveTheSameLogits) {
  TinyConfig c;
  const Loaded l = load_tiny(c, "chunks");
  SessionParams sp = f32_session(1, 100);
  sp.n_batch = 7;
  sp.n_logits_max = 3;
  sp.block_size = 4;
  expect_matches_reference(l, random_tokens(30, c.n_vocab, 7), kTol, sp);
}

TEST(Model, TokenByTokenDecodingMatchesTheReference) {
  TinyConfig c;
  const Loaded l = load_tiny(c, "incremental");
  const auto tokens = random_tokens(24, c.n_vocab, 8);
  const auto ref = reference_forward(l.tiny, tokens);
  SessionParams sp = f32_session();
  sp.block_size = 8;
  Session s(l.model, sp);
  Batch b;
  b.add_sequence(std::span(tokens).first(10), 0, 0, true);
  s.decode(b);
  EXPECT_LE(row_rel_error(s.logits(9), ref.logits[9]), kTol);
  EXPECT_THROW(s.logits(3), Error);  // not marked
  for (size_t i = 10; i < tokens.size(); ++i) {
    b.clear();
    b.add(tokens[i], int32_t(i), 0, true);
    s.decode(b);
    EXPECT_LE(row_rel_error(s.logits(0), ref.logits[i]), kTol) << "position " << i;
  }
  EXPECT_EQ(s.seq_len(0), 24);
}

TEST(Model, ABatchOfSequencesGivesEachSequencesOwnLogits) {
  TinyConfig c;
  c.arch = "llama";
  const Loaded l = load_tiny(c, "batch");
  std::vector<std::vector<int32_t>> seqs = {random_tokens(13, c.n_vocab, 10), random_tokens(5, c.n_vocab, 11),
                                            random_tokens(21, c.n_vocab, 12),
                                            random_tokens(1, c.n_vocab, 13)};
  SessionParams sp = f32_session(4);
  sp.block_size = 4;
  sp.n_batch = 16;  // forces several forward passes with rows of all sequences
  Session s(l.model, sp);
  // interleave rows of the four sequences
  Batch b;
  std::vector<size_t> next(4, 0);
  std::vector<std::vector<size_t>> row_of(4);
  for (bool more = true; more;) {
    more = false;
    for (size_t q = 0; q < 4; ++q) {
      if (next[q] >= seqs[q].size()) continue;
      row_of[q].push_back(b.size());
      b.add(seqs[q][next[q]], int32_t(next[q]), int32_t(q), true);
      ++next[q];
      more = true;
    }
  }
  s.decode(b);
  for (size_t q = 0; q < 4; ++q) {
    const auto ref = reference_forward(l.tiny, seqs[q]);
    for (size_t i = 0; i < seqs[q].size(); ++i)
      EXPECT_LE(row_rel_error(s.logits(row_of[q][i]), ref.logits[i]), kTol) << "seq " << q << " pos " << i;
  }
}

TEST(Model, ForkedSequencesContinueIndependently) {
  TinyConfig c;
  const Loaded l = load_tiny(c, "fork");
  const auto prompt = random_tokens(10, c.n_vocab, 20);  // 10 = 2 full blocks of 4 + a shared partial block
  SessionParams sp = f32_session(3);
  sp.block_size = 4;
  Session s(l.model, sp);
  Batch b;
  b.add_sequence(prompt, 0, 0, true);
  s.decode(b);
  s.seq_fork(0, 1);
  s.seq_fork(0, 2);
  const auto kv_before = s.kv_free_positions();
  EXPECT_EQ(s.seq_len(2), 10);
  std::vector<std::vector<int32_t>> full(3, prompt);
  for (int step = 0; step < 6; ++step) {
    b.clear();
    for (int q = 0; q < 3; ++q) {
      const int32_t t = int32_t((q * 31 + step * 7) % c.n_vocab);
      full[size_t(q)].push_back(t);
      b.add(t, int32_t(prompt.size()) + step, q, true);
    }
    s.decode(b);
    for (int q = 0; q < 3; ++q) {
      const auto ref = reference_forward(l.tiny, full[size_t(q)]);
      EXPECT_LE(row_rel_error(s.logits(size_t(q)), ref.logits.back()), kTol)
          << "seq " << q << " step " << step;
    }
  }
  // Forks share the two full prompt blocks: 3 sequences of 16 positions use 2 + 3 * 2 = 8 blocks, not 12; the
  // prompt took 3 (the shared partial block was copied for each sequence, then freed).
  EXPECT_EQ(kv_before - s.kv_free_positions(), (8 - 3) * 4);
}

TEST(Model, RemovingATailAndDecodingOtherTokensMatchesTheReference) {
  TinyConfig c;
  const Loaded l = load_tiny(c, "rollback");
  auto tokens = random_tokens(20, c.n_vocab, 30);
  SessionParams sp = f32_session();
  sp.block_size = 4;
  Session s(l.model, sp);
  Batch b;
  b.add_sequence(tokens, 0, 0, false);
  s.decode(b);
  s.seq_remove(0, 13);  // reject 13..19 (a speculative draft)
  EXPECT_EQ(s.seq_len(0), 13);
  tokens.resize(13);
  const auto more = random_tokens(4, c.n_vocab, 31);
  tokens.insert(tokens.end(), more.begin(), more.end());
  b.clear();
  b.add_sequence(more, 13, 0, true);
  for (auto& f : b.logits) f = 1;
  s.decode(b);
  const auto ref = reference_forward(l.tiny, tokens);
  for (size_t i = 0; i < 4; ++i) EXPECT_LE(row_rel_error(s.logits(i), ref.logits[13 + i]), kTol);
}

TEST(Model, TapsReturnTheInputOfTheChosenLayers) {
  TinyConfig c;
  c.n_layer = 3;
  const Loaded l = load_tiny(c, "taps");
  const auto tokens = random_tokens(9, c.n_vocab, 40);
  const auto ref = reference_forward(l.tiny, tokens);
  SessionParams sp = f32_session();
  sp.n_batch = 4;  // taps of several forward passes land in the right rows
  Session s(l.model, sp);
  const std::vector<int32_t> layers = {0, 2, 3};
  std::vector<float> dst(tokens.size() * layers.size() * size_t(c.n_embd), -1.0f);
  TapDestination td;
  td.data = dst.data();
  s.set_taps(layers, td);
  Batch b;
  b.add_sequence(tokens, 0, 0, true);
  s.decode(b);
  for (size_t r = 0; r < tokens.size(); ++r)
    for (size_t k = 0; k < layers.size(); ++k) {
      std::span<const float> got(dst.data() + (r * layers.size() + k) * size_t(c.n_embd), size_t(c.n_embd));
      EXPECT_LE(row_rel_error(got, ref.hidden[size_t(layers[k])][r]), kTol)
          << "row " << r << " layer " << layers[k];
    }
  EXPECT_THROW(s.set_taps({4}, td), Error);
  s.set_taps({}, td);
}

TEST(Model, EmbeddingRowsGiveTheSameLogitsAsTokenRows) {
  TinyConfig c;
  const Loaded l = load_tiny(c, "embd");
  const auto tokens = random_tokens(6, c.n_vocab, 50);
  const auto ref = reference_forward(l.tiny, tokens);
  Session s(l.model, f32_session());
  Batch b;
  const auto& emb = l.tiny.w.at("token_embd.weight");
  for (size_t i = 0; i < tokens.size(); ++i)
    b.add_embedding(std::span(emb).subspan(size_t(tokens[i] * c.n_embd), size_t(c.n_embd)), int32_t(i), 0,
                    true);
  s.decode(b);
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_LE(row_rel_error(s.logits(i), ref.logits[i]), kTol);
}

// ---- bad input
// -------------------------------------------------------------------------------------------------

std::string load_error(const TinyConfig& c, const WriteOptions& o) {
  const TinyModel m = testing::make_tiny(c);
  const auto path = temp_path("bad.gguf");
  testing::write_tiny_gguf(m, path, o);
  std::string msg;
  try {
    Model::load(path.string());
  } catch (const Error& e) {
    msg = e.what();
  }
  std::filesystem::remove(path);
  return msg;
}

TEST(Model, LoaderErrorsNameTheProblem) {
  TinyConfig c;
  WriteOptions o;
  o.skip_tensors = {"blk.1.attn_k.weight"};
  EXPECT_EQ(load_error(c, o), "missing tensor blk.1.attn_k.weight");

  o = {};
  o.reshape["blk.0.attn_q.weight"] = {64, 32};
  EXPECT_EQ(load_error(c, o), "tensor blk.0.attn_q.weight has shape {64, 32}, expected {64, 64}");

  o = {};
  o.skip_keys = {"qwen3.attention.layer_norm_rms_epsilon"};
  const std::string no_key = load_error(c, o);
  EXPECT_NE(no_key.find("qwen3.attention.layer_norm_rms_epsilon"), std::string::npos) << no_key;
  EXPECT_NE(no_key.find("missing"), std::string::npos) << no_key;

  o = {};
  o.skip_tensors = {"blk.0.attn_q_norm.weight"};
  EXPECT_EQ(load_error(c, o), "missing tensor blk.0.attn_q_norm.weight");

  o = {};
  o.extra_keys["general.architecture"] = gguf::Value::string("mamba9");
  const std::string unknown = load_error(c, o);
  EXPECT_NE(unknown.find("unknown architecture 'mamba9'; supported: llama, qwen3, gemma4"), std::string::npos)
      << unknown;

  o = {};
  o.extra_tensors = {{"blk.0.attn_q.bias", {64}}};  // a bias qwen3 does not have
  EXPECT_NE(load_error(c, o).find("does not know how to use: blk.0.attn_q.bias"), std::string::npos);

  o = {};
  o.extra_keys["qwen3.attention.head_count_kv"] = gguf::Value::u32(3);
  EXPECT_NE(load_error(c, o).find("multiple of attention.head_count_kv"), std::string::npos);

  o = {};
  o.extra_keys["qwen3.rope.scaling.type"] = gguf::Value::string("yarn");
  EXPECT_NE(load_error(c, o).find("rope scaling type 'yarn'"), std::string::npos);
}

TEST(Model, IntegerKeysOfAnyWidthAndPerLayerArraysAreAccepted) {
  TinyConfig c;
  const TinyModel m = testing::make_tiny(c);
  const auto path = temp_path("wide.gguf");
  WriteOptions o;
  o.wide_ints = true;
  testing::write_tiny_gguf(m, path, o);
  auto model = Model::load(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(model->info().n_ff, c.n_ff);
  EXPECT_EQ(model->info().n_head_kv, c.n_head_kv);
  EXPECT_EQ(model->info().n_head, c.n_head);
}

TEST(Model, SessionRejectsBadBatchesWithoutChangingTheCache) {
  TinyConfig c;
  const Loaded l = load_tiny(c, "badbatch");
  SessionParams sp = f32_session(2, 32);
  sp.block_size = 8;
  Session s(l.model, sp);
  Batch b;
  b.add(5, 0, 0, true);
  b.add(int32_t(c.n_vocab), 1, 0, true);
  try {
    s.decode(b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "token id 96 is out of range: the vocabulary has 96 tokens (0..95)");
  }
  EXPECT_EQ(s.seq_len(0), 0);
  b.clear();
  b.add(5, 1, 0, true);
  EXPECT_THROW(s.decode(b), Error);  // position 1 does not continue an empty sequence
  b.clear();
  b.add(5, 0, 2, true);
  EXPECT_THROW(s.decode(b), Error);  // no sequence 2
  EXPECT_THROW(s.decode(Batch{}), Error);
  // 32 positions fit, 33 do not
  b.clear();
  b.add_sequence(random_tokens(30, c.n_vocab, 60), 0, 0, true);
  s.decode(b);
  b.clear();
  b.add_sequence(random_tokens(3, c.n_vocab, 61), 0, 1, true);
  try {
    s.decode(b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.seq_len(1), 0);
  s.seq_clear(0);
  s.decode(b);
  EXPECT_EQ(s.seq_len(1), 3);
}

}  // namespace
}  // namespace tandem
