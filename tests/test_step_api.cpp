// The step seam (session.h, batch.h): every mask kind against the same attention with an explicit mask
// matrix, rows that write no K/V, added embeddings (host rows and a device source), device logits against the
// host copies, the device sampler against the CPU sampler op, taps under every split mode, and a model with
// per-layer head dims and a sliding-window layer whose KV keeps only its window against the same model with
// full KV. All on random tiny models (tests/test_model_fixture.h) on CPU devices.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "model/model_impl.h"
#include "runtime/session_impl.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "test_model_fixture.h"

namespace tandem {
namespace {

using testing::TinyConfig;
using testing::TinyModel;
using testing::WriteOptions;

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("tandem_test_step_" + std::to_string(::getpid()) + "_" + name);
}

std::shared_ptr<Model> load(const TinyModel& m, const std::string& name, const WriteOptions& o = {},
                            const std::string& devices = "", const std::string& split = "") {
  const auto path = temp_path(name + ".gguf");
  testing::write_tiny_gguf(m, path, o);
  ModelParams mp;
  mp.n_threads = 2;
  mp.devices = devices;
  mp.split_mode = split;
  auto model = Model::load(path.string(), mp);
  std::filesystem::remove(path);  // the mapping stays valid
  return model;
}

TinyConfig tiny_config() {
  TinyConfig c;
  c.n_layer = 2;
  c.n_vocab = 96;
  c.seed = 21;
  return c;
}

SessionParams f32_params(int32_t n_seq = 2) {
  SessionParams p;
  p.n_ctx = 128;
  p.n_seq_max = n_seq;
  p.kv_type = KvType::F32;
  p.n_batch = 32;
  p.n_logits_max = 32;
  p.block_size = 4;  // several blocks per sequence: copy-on-write and block tables are exercised
  p.explicit_mask_cols = 64;
  return p;
}

std::vector<int32_t> tokens(size_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = int32_t(rng.next() % uint64_t(vocab));
  return t;
}

std::vector<float> row(const Session& s, size_t r) {
  const auto l = s.logits(r);
  return {l.begin(), l.end()};
}

double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

// The explicit mask equal to a [lo, hi) range per row: 0 inside, -inf outside.
void add_range_mask(Batch& b, size_t r, int32_t lo, int32_t hi) {
  for (int32_t j = 0; j < b.mask.mask_cols; ++j)
    b.mask.explicit_mask[r * size_t(b.mask.mask_cols) + size_t(j)] = (j >= lo && j < hi) ? 0.0f : -INFINITY;
}

Batch with_explicit(const Batch& b, int32_t cols) {
  Batch e = b;
  e.mask = {};
  e.mask.kind = AttentionMask::Explicit;
  e.mask.mask_cols = cols;
  e.mask.explicit_mask.assign(b.size() * size_t(cols), 0.0f);
  return e;
}

// Prefills `prompt` into sequence `seq` of s.
void prefill(Session& s, std::span<const int32_t> prompt, int32_t seq) {
  Batch b;
  b.add_sequence(prompt, 0, seq, true);
  s.decode(b);
}

TEST(StepApi, EachMaskKindEqualsTheSameAttentionWithAnExplicitMask) {
  const TinyModel tm = testing::make_tiny(tiny_config());
  auto model = load(tm, "masks");
  const auto prompt = tokens(7, 96, 1), block = tokens(5, 96, 2);
  const int32_t P = int32_t(prompt.size()), C = int32_t(block.size());
  for (AttentionMask kind :
       {AttentionMask::Causal, AttentionMask::BlockBidirectional, AttentionMask::PrefixRegion}) {
    for (bool write : {true, false}) {
      SCOPED_TRACE(std::to_string(int(kind)) + (write ? " writing" : " not writing"));
      Session a(model, f32_params()), e(model, f32_params());
      Batch b;
      if (kind == AttentionMask::PrefixRegion) {
        // prompt and canvas in one pass (the UNIFIED phase): prompt rows causal, canvas rows see everything
        b.add_sequence(prompt, 0, 0, false);
        for (int32_t i = 0; i < C; ++i) b.add(block[size_t(i)], P + i, 0, true, write);
        if (!write) b.kv_write.assign(b.size(), 0);
        b.mask.kind = kind;
        b.mask.prefix_len = P;
      } else {
        prefill(a, prompt, 0);
        prefill(e, prompt, 0);
        for (int32_t i = 0; i < C; ++i) b.add(block[size_t(i)], P + i, 0, true, write);
        b.mask.kind = kind;
        b.mask.block_size = kind == AttentionMask::BlockBidirectional ? 3 : 0;  // blocks [P, P+3), [P+3, P+5)
      }
      Batch x = with_explicit(b, 64);
      for (size_t r = 0; r < b.size(); ++r) {
        const int32_t p = b.positions[r];
        int32_t hi = p + 1;
        if (kind == AttentionMask::BlockBidirectional) hi = std::min(P + C, P + ((p - P) / 3 + 1) * 3);
        if (kind == AttentionMask::PrefixRegion && p >= P) hi = P + C;
        add_range_mask(x, r, 0, hi);
      }
      a.decode(b);
      e.decode(x);
      for (size_t r = 0; r < b.size(); ++r)
        if (b.logits[r]) {
          EXPECT_LT(rel_err(row(a, r), row(e, r)), 1e-5) << "row " << r;
        }
    }
  }
}

TEST(StepApi, AnExplicitMaskWithBiasesChangesTheResultAndRejectsNaN) {
  const TinyModel tm = testing::make_tiny(tiny_config());
  auto model = load(tm, "bias");
  Session s(model, f32_params());
  Batch b;
  b.add_sequence(tokens(6, 96, 3), 0, 0, true);
  Batch x = with_explicit(b, 8);
  for (size_t r = 0; r < b.size(); ++r) add_range_mask(x, r, 0, b.positions[r] + 1);
  s.decode(x);
  const auto plain = row(s, 5);
  s.clear();
  x.mask.explicit_mask[5 * 8 + 2] = 1.5f;  // a finite bias on one visible position of the last row
  s.decode(x);
  EXPECT_GT(rel_err(row(s, 5), plain), 1e-4);
  s.clear();
  x.mask.explicit_mask[3] = NAN;
  EXPECT_THROW(s.decode(x), Error);
  EXPECT_EQ(s.seq_len(0), 0);
  SessionParams no_explicit = f32_params();
  no_explicit.explicit_mask_cols = 0;
  Session n(model, no_explicit);
  try {
    n.decode(with_explicit(b, 8));
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("explicit_mask_cols"), std::string::npos) << err.what();
  }
}

// The bytes of the first `len` cached positions of sequence `seq`, every layer and group (CPU devices).
std::vector<uint8_t> cache_bytes(const Session& s, int32_t seq) {
  Session::Impl& impl = s.impl();
  std::vector<uint8_t> out;
  for (size_t gi = 0; gi < impl.groups.size(); ++gi) {
    const KvCacheTable& t = *impl.groups[gi].table;
    for (const auto& rank : impl.ranks) {
      if (!rank->groups[gi].storage) continue;
      for (const KvLayerView& l : rank->groups[gi].storage->layers()) {
        for (int32_t p = 0; p < t.seq_len(seq); ++p) {
          const int32_t slot = t.slot(seq, p);
          for (const Tensor* kv : {&l.k, &l.v}) {
            const uint8_t* src = static_cast<const uint8_t*>(kv->data) + size_t(slot) * kv->nb[2];
            out.insert(out.end(), src, src + kv->nb[2]);
          }
        }
      }
    }
  }
  return out;
}

TEST(StepApi, RowsThatWriteNoKvLeaveTheCacheBitIdentical) {
  const TinyModel tm = testing::make_tiny(tiny_config());
  auto model = load(tm, "quiet");
  Session s(model, f32_params()), ref(model, f32_params());
  const auto prompt = tokens(6, 96, 4);  // 6 positions: the last block (of 4) is partly filled
  prefill(s, prompt, 0);
  prefill(ref, prompt, 0);
  s.seq_fork(0, 1);  // a fork shares the blocks: the quiet rows must not write into them either
  const std::vector<uint8_t> before = cache_bytes(s, 0);
  const int64_t free_before = s.kv_free_positions();

  Batch q;  // a diffusion-style canvas: bidirectional, writes nothing
  for (int32_t i = 0; i < 5; ++i) q.add(int32_t(10 + i), 6 + i, 0, true, false);
  q.mask.kind = AttentionMask::PrefixRegion;
  q.mask.prefix_len = 6;
  s.decode(q);
  EXPECT_EQ(s.seq_len(0), 6);
  EXPECT_EQ(s.kv_free_positions(), free_before);
  EXPECT_EQ(cache_bytes(s, 0), before);
  // The quiet rows saw the prompt and each other: the same as writing them in a throw-away sequence.
  Batch w = q;
  w.kv_write.clear();
  ref.seq_fork(0, 1);
  for (int32_t& sid : w.seq_ids) sid = 1;
  ref.decode(w);
  for (size_t r = 0; r < q.size(); ++r) EXPECT_EQ(row(s, r), row(ref, r)) << "row " << r;

  // The next real token continues the untouched prompt exactly.
  Batch next;
  next.add(7, 6, 0, true);
  s.decode(next);
  ref.seq_clear(1);
  ref.decode(next);
  EXPECT_EQ(row(s, 0), row(ref, 0));

  Batch mixed;  // one sequence's rows either all write or none do
  mixed.add(1, 7, 0, true, true);
  mixed.add(2, 8, 0, true, false);
  EXPECT_THROW(s.decode(mixed), Error);
  EXPECT_EQ(s.seq_len(0), 7);
}

TEST(StepApi, AddedEmbeddingsAreSummedWithTheTokenEmbedding) {
  const TinyConfig cfg = tiny_config();
  const TinyModel tm = testing::make_tiny(cfg);
  auto model = load(tm, "added");
  const int64_t E = cfg.n_embd;
  const auto toks = tokens(5, 96, 5);
  std::vector<float> extra(size_t(E) * toks.size());
  Rng rng(6);
  for (float& v : extra) v = float(rng.uniform() * 2 - 1);
  const std::vector<float>& table = tm.w.at("token_embd.weight");

  // (a) token + added host rows, (b) token + added rows of a source in (CPU device) memory, (c) the sum
  // computed here as a pure embedding row: the same f32 additions, so the logits are bit-identical.
  Session a(model, f32_params()), b(model, f32_params()), c(model, f32_params());
  Batch ba, bb, bc;
  for (size_t i = 0; i < toks.size(); ++i) {
    ba.add(toks[i], int32_t(i), 0, true, true, int32_t(i));
    bb.add(toks[i], int32_t(i), 0, true, true, int32_t(toks.size() - 1 - i));  // any row order
    std::vector<float> sum(static_cast<size_t>(E));
    for (int64_t k = 0; k < E; ++k)
      sum[size_t(k)] = table[size_t(toks[i]) * size_t(E) + size_t(k)] + extra[i * size_t(E) + size_t(k)];
    bc.add_embedding(sum, int32_t(i), 0, true);
  }
  ba.embeddings = extra;
  std::vector<float> reversed(extra.size());
  for (size_t i = 0; i < toks.size(); ++i)
    std::memcpy(&reversed[(toks.size() - 1 - i) * size_t(E)], &extra[i * size_t(E)], size_t(E) * 4);
  bb.embedding_source = {DeviceId{DeviceKind::CPU, 0}, reversed.data(), int64_t(toks.size()), 0};
  a.decode(ba);
  b.decode(bb);
  c.decode(bc);
  for (size_t r = 0; r < toks.size(); ++r) {
    EXPECT_EQ(row(a, r), row(c, r)) << "row " << r;
    EXPECT_EQ(row(b, r), row(c, r)) << "row " << r;
  }
  // and it is not the plain token embedding
  Session d(model, f32_params());
  Batch bd;
  bd.add_sequence(toks, 0, 0, true);
  d.decode(bd);
  EXPECT_GT(rel_err(row(d, 4), row(c, 4)), 1e-3);

  Batch bad;
  bad.add(kNoToken, 0, 0, true);
  EXPECT_THROW(a.decode(bad), Error);  // neither a token nor an embedding
  bad.clear();
  bad.add(3, 0, 1, true, true, 2);  // no embedding rows at all
  EXPECT_THROW(a.decode(bad), Error);
  EXPECT_EQ(a.seq_len(1), 0);
}

TEST(StepApi, DeviceLogitsEqualTheHostCopiesInEverySplitMode) {
  TinyConfig cfg = tiny_config();
  cfg.n_head = 4;
  cfg.n_head_kv = 2;
  const TinyModel tm = testing::make_tiny(cfg);
  for (const char* split : {"", "layer", "tensor", "row"}) {
    SCOPED_TRACE(split);
    auto model = std::string(split).empty() ? load(tm, "dl") : load(tm, "dl", {}, "cpu:0,cpu:1", split);
    Session s(model, f32_params());
    Batch b;
    b.add_sequence(tokens(9, 96, 7), 0, 0, false);
    b.logits[2] = b.logits[8] = 1;
    s.decode(b);
    const Tensor L = s.device_logits();
    ASSERT_EQ(L.ne[0], 96);
    ASSERT_EQ(L.ne[1], 2);
    for (size_t r : {size_t(2), size_t(8)}) {
      const float* col = reinterpret_cast<const float*>(static_cast<const char*>(L.data) +
                                                        size_t(s.logits_index(r)) * L.nb[1]);
      const auto host = s.logits(r);
      EXPECT_EQ(std::vector<float>(col, col + 96), std::vector<float>(host.begin(), host.end()));
    }
    EXPECT_THROW(s.logits(3), Error);  // not marked
  }
}

TEST(StepApi, TheDeviceSamplerEqualsTheCpuSamplerForTheSameSeed) {
  const TinyModel tm = testing::make_tiny(tiny_config());
  auto model = load(tm, "sample");
  Session s(model, f32_params(4));
  Batch b;
  for (int32_t q = 0; q < 4; ++q) b.add_sequence(tokens(4, 96, 10 + uint64_t(q)), 0, q, true);
  s.decode(b);
  const std::vector<size_t> rows = {3, 7, 11, 15};
  auto cpu = create_cpu_device(0, {});
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<SamplingParams> ps(4);
    ps[0].temperature = 0.0f;  // greedy
    ps[1].temperature = 0.9f, ps[1].top_k = 0, ps[1].top_p = 1.0f, ps[1].min_p = 0.0f;
    ps[2].temperature = 1.3f, ps[2].top_k = 20, ps[2].top_p = 0.8f, ps[2].min_p = 0.02f;
    ps[3].repeat_penalty = 1.3f;  // penalties: the host sampler
    std::vector<Sampler> samplers, refs;
    for (size_t i = 0; i < 4; ++i) {
      ps[i].seed = 100 + uint64_t(trial) * 7 + i;
      samplers.emplace_back(ps[i]);
      refs.emplace_back(ps[i]);
    }
    std::vector<Sampler*> ptrs;
    for (Sampler& x : samplers) ptrs.push_back(&x);
    const std::vector<int32_t> got = s.sample(rows, ptrs);
    for (size_t i = 0; i < 4; ++i) {
      const auto logits = s.logits(rows[i]);
      int32_t want = 0;
      if (i == 3) {
        want = refs[i].sample(logits);
      } else {
        // the CPU op with the uniform the sampler's generator gives next
        std::vector<float> l(logits.begin(), logits.end());
        float u = ps[i].greedy() ? 0.0f : float(refs[i].rng().uniform());
        int32_t out = -1;
        SamplerParams sp{ps[i].temperature, ps[i].top_k, ps[i].top_p, ps[i].min_p};
        cpu->ops().sample_rows(cpu->default_stream(),
                               Tensor::contiguous(DType::F32, {96, 1}, l.data(), cpu->id()), sp,
                               Tensor::contiguous(DType::F32, {1}, &u, cpu->id()),
                               Tensor::contiguous(DType::I32, {1}, &out, cpu->id()));
        want = out;
      }
      EXPECT_EQ(got[i], want) << "sampler " << i;
      if (i == 0) {
        EXPECT_EQ(got[i], argmax(logits));
      }
    }
  }
  // One setting for every row: one sample_rows call over the four columns, the same ids as row by row.
  SamplingParams one;
  one.temperature = 0.8f, one.top_k = 20, one.top_p = 0.9f, one.min_p = 0.0f;
  std::vector<Sampler> same, same_ref;
  for (size_t i = 0; i < 4; ++i) {
    one.seed = 500 + i;
    same.emplace_back(one);
    same_ref.emplace_back(one);
  }
  std::vector<Sampler*> same_ptrs;
  for (Sampler& x : same) same_ptrs.push_back(&x);
  const std::vector<size_t> reversed = {15, 11, 7, 3};  // any row order
  const std::vector<int32_t> got = s.sample(reversed, same_ptrs);
  for (size_t i = 0; i < 4; ++i) {
    std::vector<float> l(s.logits(reversed[i]).begin(), s.logits(reversed[i]).end());
    float u = float(same_ref[i].rng().uniform());
    int32_t want = -1;
    cpu->ops().sample_rows(cpu->default_stream(), Tensor::contiguous(DType::F32, {96, 1}, l.data(), cpu->id()),
                           SamplerParams{one.temperature, one.top_k, one.top_p, one.min_p},
                           Tensor::contiguous(DType::F32, {1}, &u, cpu->id()),
                           Tensor::contiguous(DType::I32, {1}, &want, cpu->id()));
    EXPECT_EQ(got[i], want) << "row " << reversed[i];
  }
  std::vector<Sampler*> none;
  EXPECT_THROW(s.sample(rows, none), Error);
}

TEST(StepApi, TapsEqualTheHiddenStatesUnderEverySplitMode) {
  TinyConfig cfg = tiny_config();
  cfg.n_layer = 4;
  const TinyModel tm = testing::make_tiny(cfg);
  const int64_t E = cfg.n_embd;
  const std::vector<int32_t> layers = {0, 2, 4};
  const auto toks = tokens(6, 96, 8);
  auto taps_of = [&](const std::shared_ptr<Model>& model) {
    Session s(model, f32_params());
    std::vector<float> buf(toks.size() * layers.size() * size_t(E), -7.0f);
    s.set_taps(layers, {DeviceId{DeviceKind::CPU, 0}, buf.data(), 0, 0, nullptr});
    const size_t per_row = layers.size() * size_t(E);
    Batch b;
    b.add_sequence(std::span(toks).first(4), 0, 0, true);
    s.decode(b);
    s.synchronize();
    std::vector<float> all(buf.begin(), buf.begin() + ptrdiff_t(4 * per_row));
    b.clear();
    b.add_sequence(std::span(toks).subspan(4), 4, 0, true);  // a second batch writes from row 0 again
    s.decode(b);
    s.synchronize();
    all.insert(all.end(), buf.begin(), buf.begin() + ptrdiff_t(2 * per_row));
    return all;
  };
  const std::vector<float> single = taps_of(load(tm, "taps"));
  // tap 0 of every row is the token's embedding
  const std::vector<float>& table = tm.w.at("token_embd.weight");
  for (size_t r = 0; r < 4; ++r)
    for (int64_t k = 0; k < E; ++k)
      ASSERT_EQ(single[r * layers.size() * size_t(E) + size_t(k)],
                table[size_t(toks[r]) * size_t(E) + size_t(k)]);
  for (const char* split : {"layer", "tensor", "row"}) {
    SCOPED_TRACE(split);
    const std::vector<float> got = taps_of(load(tm, "taps", {}, "cpu:0,cpu:1", split));
    ASSERT_EQ(got.size(), single.size());
    EXPECT_LT(rel_err(got, single), 1e-5);
  }
  Session s(load(tm, "taps"), f32_params());
  std::vector<float> buf(64);
  EXPECT_THROW(s.set_taps({2, 1}, {DeviceId{DeviceKind::CPU, 0}, buf.data(), 0, 0, nullptr}), Error);
  EXPECT_THROW(s.set_taps({9}, {DeviceId{DeviceKind::CPU, 0}, buf.data(), 0, 0, nullptr}), Error);
  EXPECT_EQ(s.taps_written(), nullptr);
}

TEST(StepApi, TapsOfOneModelFeedAnotherModelsRowsWithoutAHostCopy) {
  // The DFlash pattern: the target taps a layer into a buffer on its device; the drafter's rows name rows of
  // that buffer (EmbeddingSource) instead of carrying embeddings. Equal to copying the taps to the host.
  const TinyConfig cfg = tiny_config();
  const TinyModel target_m = testing::make_tiny(cfg);
  TinyConfig dcfg = cfg;
  dcfg.seed = 99;
  dcfg.n_layer = 1;
  const TinyModel draft_m = testing::make_tiny(dcfg);
  auto target = load(target_m, "feat_target"), draft = load(draft_m, "feat_draft");
  const int64_t E = cfg.n_embd;
  std::vector<float> feats(8 * size_t(E), 0.0f);
  Session t(target, f32_params()), d1(draft, f32_params()), d2(draft, f32_params());
  t.set_taps({1}, {DeviceId{DeviceKind::CPU, 0}, feats.data(), 0, 0, nullptr});
  const auto prompt = tokens(8, 96, 14);
  prefill(t, prompt, 0);
  ASSERT_NE(t.taps_written(), nullptr);
  t.synchronize();
  Batch a, b;
  for (int32_t i = 0; i < 8; ++i) {
    a.add(kNoToken, i, 0, true, true, 7 - i);  // rows of the feature buffer, in any order
    b.add_embedding(std::span(feats).subspan(size_t(7 - i) * size_t(E), size_t(E)), i, 0, true);
  }
  a.embedding_source = {DeviceId{DeviceKind::CPU, 0}, feats.data(), 8, 0};
  d1.decode(a);
  d2.decode(b);
  for (size_t r = 0; r < 8; ++r) EXPECT_EQ(row(d1, r), row(d2, r)) << "row " << r;
}

// qwen3 with per-layer shapes: layer 0 global (head dim 16, 2 KV heads), layer 1 sliding (window 6, head dim
// 8, 1 KV head, its own rope base, n_ff 64), layer 2 global.
TinyModel per_layer_model(WriteOptions& o) {
  TinyConfig c = tiny_config();
  c.n_layer = 3;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;
  TinyModel m = testing::make_tiny(c);
  Rng rng(31);
  auto matrix = [&](const std::string& name, int64_t in, int64_t out) {
    std::vector<float> v(size_t(in * out));
    for (float& x : v) x = float((rng.uniform() * 2 - 1) * 2.0 / std::sqrt(double(in)));
    m.w[name] = v;
    m.ne[name] = {in, out};
  };
  const int64_t hd = 8, kv = 1;
  matrix("blk.1.attn_q.weight", c.n_embd, c.n_head * hd);
  matrix("blk.1.attn_k.weight", c.n_embd, kv * hd);
  matrix("blk.1.attn_v.weight", c.n_embd, kv * hd);
  matrix("blk.1.attn_output.weight", c.n_head * hd, c.n_embd);
  for (const char* n : {"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"}) {
    m.w[n] = std::vector<float>(size_t(hd), 1.1f);
    m.ne[n] = {hd};
  }
  matrix("blk.1.ffn_gate.weight", c.n_embd, 64);  // and its own feed-forward width
  matrix("blk.1.ffn_up.weight", c.n_embd, 64);
  matrix("blk.1.ffn_down.weight", 64, c.n_embd);
  using gguf::Value;
  o.extra_keys["qwen3.feed_forward_length"] = Value::i32_array({int32_t(c.n_ff), 64, int32_t(c.n_ff)});
  o.skip_keys.insert("qwen3.feed_forward_length");
  o.extra_keys["qwen3.attention.sliding_window"] = Value::u32(6);
  o.extra_keys["qwen3.attention.sliding_window_pattern"] = Value::array(
      gguf::ValueType::BOOL, {Value::boolean(false), Value::boolean(true), Value::boolean(false)});
  o.extra_keys["qwen3.attention.key_length_swa"] = Value::u32(uint32_t(hd));
  o.extra_keys["qwen3.attention.value_length_swa"] = Value::u32(uint32_t(hd));
  o.extra_keys["qwen3.rope.freq_base_swa"] = Value::f32(500.0f);
  o.extra_keys["qwen3.attention.head_count_kv"] = Value::i32_array({2, 1, 2});
  o.skip_keys.insert("qwen3.attention.head_count_kv");
  return m;
}

TEST(StepApi, SlidingKvWithPerLayerShapesEqualsFullKvWithTheWindow) {
  WriteOptions o;
  const TinyModel tm = per_layer_model(o);
  auto model = load(tm, "swa", o);
  SessionParams p = f32_params(2);
  p.n_ctx = 96;
  p.n_batch = 4;  // small, so that the sliding group's pool is smaller than the context and evicts
  Session slide(model, p);
  p.keep_full_kv = true;
  Session full(model, p);
  ASSERT_EQ(slide.impl().groups.size(), 2u);
  ASSERT_TRUE(slide.impl().groups[1].evicts);
  ASSERT_FALSE(full.impl().groups[1].evicts);

  const auto prompt = tokens(10, 96, 9);  // prefill over three forward passes
  for (Session* s : {&slide, &full}) prefill(*s, prompt, 0);
  EXPECT_EQ(slide.logits(9).size(), 96u);
  EXPECT_EQ(row(slide, 9), row(full, 9));
  int32_t tok = argmax(slide.logits(9));
  for (int32_t pos = 10; pos < 60; ++pos) {  // far past the window plus the rollback room
    Batch b;
    b.add(tok, pos, 0, true);
    slide.decode(b);
    full.decode(b);
    ASSERT_EQ(row(slide, 0), row(full, 0)) << "position " << pos;
    tok = argmax(slide.logits(0));
  }
  const KvCacheTable& t = *slide.impl().groups[1].table;
  EXPECT_GT(t.first_kept(0), 0);  // the sliding layer dropped old blocks
  EXPECT_LT(t.n_used_blocks(), full.impl().groups[1].table->n_used_blocks());
  // rolling back a few positions is fine (and gives the full-KV result); further than kept is an error
  slide.seq_remove(0, 57);
  full.seq_remove(0, 57);
  Batch b;
  b.add(3, 57, 0, true);
  slide.decode(b);
  full.decode(b);
  EXPECT_EQ(row(slide, 0), row(full, 0));
  try {
    slide.seq_remove(0, 20);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slide.seq_len(0), 58);
}

TEST(StepApi, PerLayerShapesAreReadAndSplitByLayerAndByTensor) {
  WriteOptions o;
  const TinyModel tm = per_layer_model(o);
  auto model = load(tm, "swa_read", o);
  const ModelHparams& hp = model->impl().decoder().hparams();
  ASSERT_EQ(hp.layers.size(), 3u);
  EXPECT_EQ(hp.layers[0].head_dim_k, 16);
  EXPECT_EQ(hp.layers[1].head_dim_k, 8);
  EXPECT_EQ(hp.layers[1].n_head_kv, 1);
  EXPECT_EQ(hp.layers[1].sliding_window, 6);
  EXPECT_EQ(hp.layers[1].rope_freq_base, 500.0f);
  EXPECT_EQ(hp.layers[2].sliding_window, 0);
  EXPECT_EQ(hp.layers[1].n_ff, 64);
  try {  // layer 1 has one KV head for two ranks
    load(tm, "swa_tensor", o, "cpu:0,cpu:1", "tensor");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(layer 1) needs at least 2 KV heads"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--replicate-kv"), std::string::npos) << e.what();
  }
  // layer split, and tensor split with each layer cut on its own (layer 1's KV head copied): the logits of
  // one device
  const auto path = temp_path("swa_split.gguf");
  testing::write_tiny_gguf(tm, path, o);
  ModelParams tp;
  tp.n_threads = 2;
  tp.devices = "cpu:0,cpu:1";
  tp.split_mode = "tensor";
  tp.replicate_kv = true;
  auto tensor = Model::load(path.string(), tp);
  std::filesystem::remove(path);
  const auto& shard = tensor->impl().shards.at(1);
  ASSERT_EQ(shard.per_layer.size(), 3u);
  EXPECT_EQ(shard.per_layer[0].kv_heads, (Range{1, 2}));
  EXPECT_EQ(shard.per_layer[1].kv_heads, (Range{0, 1}));  // the copy
  EXPECT_EQ(shard.per_layer[1].ff, (Range{32, 64}));
  auto layer = load(tm, "swa_layer", o, "cpu:0,cpu:1", "layer");
  Session a(model, f32_params()), b(layer, f32_params()), t(tensor, f32_params());
  const auto prompt = tokens(12, 96, 12);
  for (Session* s : {&a, &b, &t}) prefill(*s, prompt, 0);
  EXPECT_LT(rel_err(row(b, 11), row(a, 11)), 1e-5);
  EXPECT_LT(rel_err(row(t, 11), row(a, 11)), 1e-5);
  for (int32_t pos = 12; pos < 20; ++pos) {  // decoding past the window too
    Batch d;
    d.add(int32_t(pos % 90), pos, 0, true);
    for (Session* s : {&a, &b, &t}) s->decode(d);
    EXPECT_LT(rel_err(row(t, 0), row(a, 0)), 1e-5) << "position " << pos;
  }
}

TEST(StepApi, AModelUsesAnotherModelsEmbeddingAndHeadWithoutCopies) {
  const TinyConfig cfg = tiny_config();
  const TinyModel tm = testing::make_tiny(cfg);
  auto lender = load(tm, "lender");
  WriteOptions o;
  o.skip_tensors = {"token_embd.weight", "output.weight"};
  const auto path = temp_path("borrower.gguf");
  testing::write_tiny_gguf(tm, path, o);
  try {
    Model::load(path.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token_embd.weight"), std::string::npos) << e.what();
  }
  ModelParams mp;
  mp.n_threads = 2;
  mp.share_weights_from = lender;
  auto borrower = Model::load(path.string(), mp);
  const auto* lt =
      lender->impl().decoder().shared_weight("token_embd.weight") ? &lender->impl().decoder() : nullptr;
  ASSERT_NE(lt, nullptr);
  EXPECT_EQ(borrower->impl().decoder().shared_weight("token_embd.weight")->data,
            lender->impl().decoder().shared_weight("token_embd.weight")->data);  // the same memory
  Session a(lender, f32_params()), b(borrower, f32_params());
  const auto prompt = tokens(8, 96, 13);
  prefill(a, prompt, 0);
  prefill(b, prompt, 0);
  EXPECT_EQ(row(a, 7), row(b, 7));

  TinyConfig other = cfg;
  other.n_embd = 32;
  auto small = load(testing::make_tiny(other), "lender_small");
  mp.share_weights_from = small;
  try {
    Model::load(path.string(), mp);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  mp.share_weights_from = lender;
  mp.devices = "cpu:0,cpu:1";
  mp.split_mode = "layer";
  EXPECT_THROW(Model::load(path.string(), mp), Error);
  std::filesystem::remove(path);
}

TEST(StepApi, BadStepsAreRefusedBeforeAnythingChanges) {
  const TinyModel tm = testing::make_tiny(tiny_config());
  auto model = load(tm, "badstep");
  SessionParams p = f32_params();
  p.n_batch = 8;
  p.n_logits_max = 8;
  Session s(model, p);
  Batch b;
  for (int32_t i = 0; i < 9; ++i) b.add(1, i, 0, false);
  b.mask.kind = AttentionMask::BlockBidirectional;
  try {
    s.decode(b);  // a non-causal step must fit in one forward pass
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one forward pass"), std::string::npos) << e.what();
  }
  b.mask.kind = AttentionMask::Explicit;
  b.mask.mask_cols = 4;
  EXPECT_THROW(s.decode(b), Error);  // no mask values
  b.clear();
  b.add(1, 0, 0, true);
  b.mask.kind = AttentionMask::PrefixRegion;
  b.mask.prefix_len = -1;
  EXPECT_THROW(s.decode(b), Error);
  b.tokens.push_back(2);  // sizes differ
  b.mask = {};
  EXPECT_THROW(s.decode(b), Error);
  EXPECT_EQ(s.seq_len(0), 0);
  EXPECT_EQ(s.kv_free_positions(), s.kv_capacity());
}

}  // namespace
}  // namespace tandem
