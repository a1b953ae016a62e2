// The step seam on cuda:0 (the CPU cases are tests/test_step_api.cpp): logits stay on the GPU and equal the
// host copies bit for bit; the device sampler gives the ids the CPU sampler op gives for the same logits and
// uniforms; taps into a device buffer (with the written / read events) equal taps into host memory; masks,
// non-writing rows, added embeddings from a device buffer and sliding-window KV agree with the CPU session.
#include <cmath>
#include <filesystem>
#include <random>

#include "../test_model_fixture.h"
#include "gpu_test_util.h"
#include "model/model_impl.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"

namespace tandem::gpu_test {
namespace {

double rel_l2(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<float> copy_row(const Session& s, size_t r) {
  const auto l = s.logits(r);
  return {l.begin(), l.end()};
}

struct Models {
  testing::TinyModel tiny;
  std::shared_ptr<Model> cpu, gpu;
};

Models load_models(const testing::TinyConfig& c, const testing::WriteOptions& o = {}) {
  Models m;
  m.tiny = testing::make_tiny(c);
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_gpu_step_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "m.gguf").string();
  testing::write_tiny_gguf(m.tiny, path, o);
  ModelParams cp, gp;
  gp.device = "cuda:0";
  m.cpu = Model::load(path, cp);
  m.gpu = Model::load(path, gp);
  return m;
}

testing::TinyConfig config() {
  testing::TinyConfig c;
  c.n_vocab = 700;
  c.n_embd = 128;
  c.n_layer = 3;
  c.n_head = 8;
  c.n_head_kv = 2;
  c.head_dim = 16;
  c.n_ff = 256;
  c.seed = 41;
  return c;
}

SessionParams params() {
  SessionParams p;
  p.n_ctx = 512;
  p.n_seq_max = 4;
  p.n_batch = 64;
  p.n_logits_max = 64;
  p.block_size = 8;
  p.kv_type = KvType::F32;
  p.explicit_mask_cols = 128;
  return p;
}

std::vector<int32_t> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % 690);
  return t;
}

TEST(GpuStepApi, DeviceLogitsStayOnTheGpuAndEqualTheHostCopies) {
  TANDEM_REQUIRE_GPU();
  Models m = load_models(config());
  Session s(m.gpu, params());
  Batch b;
  b.add_sequence(random_tokens(40, 1), 0, 0, false);
  b.logits[10] = b.logits[39] = 1;
  s.decode(b);
  const Tensor L = s.device_logits();
  EXPECT_EQ(L.device.kind, DeviceKind::CUDA);
  Device& dev = m.gpu->impl().main_device();
  for (size_t r : {size_t(10), size_t(39)}) {
    std::vector<float> col(700);
    dev.copy_to_host(dev.default_stream(), col.data(),
                     static_cast<const char*>(L.data) + size_t(s.logits_index(r)) * L.nb[1], 700 * 4);
    dev.default_stream().synchronize();
    EXPECT_EQ(col, copy_row(s, r));
  }
}

TEST(GpuStepApi, TheDeviceSamplerGivesTheCpuSamplerOpsIdsForTheSameLogitsAndSeed) {
  TANDEM_REQUIRE_GPU();
  Models m = load_models(config());
  Session s(m.gpu, params());
  Batch b;
  for (int q = 0; q < 4; ++q) b.add_sequence(random_tokens(9, 10 + uint32_t(q)), 0, q, true);
  s.decode(b);
  auto cpu = create_device(DeviceId{DeviceKind::CPU, 0});
  const std::vector<size_t> rows = {8, 17, 26, 35};
  int compared = 0;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<Sampler> samplers, refs;
    for (size_t i = 0; i < 4; ++i) {
      SamplingParams p;
      p.temperature = i == 0 ? 0.0f : 0.5f + 0.4f * float(i);
      p.top_k = i == 1 ? 0 : 40;
      p.top_p = i == 2 ? 0.9f : 1.0f;
      p.min_p = i == 3 ? 0.05f : 0.0f;
      p.seed = 1000 + uint64_t(trial) * 4 + i;
      samplers.emplace_back(p);
      refs.emplace_back(p);
    }
    std::vector<Sampler*> ptrs;
    for (auto& x : samplers) ptrs.push_back(&x);
    const std::vector<int32_t> got = s.sample(rows, ptrs);
    for (size_t i = 0; i < 4; ++i) {
      std::vector<float> l = copy_row(s, rows[i]);
      const SamplingParams& p = refs[i].params();
      float u = p.greedy() ? 0.0f : float(refs[i].rng().uniform());
      int32_t want = -1;
      cpu->ops().sample_rows(cpu->default_stream(),
                             Tensor::contiguous(DType::F32, {700, 1}, l.data(), cpu->id()),
                             SamplerParams{p.temperature, p.top_k, p.top_p, p.min_p},
                             Tensor::contiguous(DType::F32, {1}, &u, cpu->id()),
                             Tensor::contiguous(DType::I32, {1}, &want, cpu->id()));
      EXPECT_EQ(got[i], want) << "trial " << trial << " sampler " << i;
      ++compared;
    }
  }
  std::printf("[ sampler  ] %d device draws equal to the CPU op's\n", compared);
}

TEST(GpuStepApi, TapsIntoADeviceBufferEqualTapsIntoHostMemory) {
  TANDEM_REQUIRE_GPU();
  Models m = load_models(config());
  const std::vector<int32_t> layers = {0, 1, 3};
  const size_t per_row = layers.size() * 128;
  Device& dev = m.gpu->impl().main_device();
  Buffer dbuf = dev.allocate(per_row * 64 * sizeof(float));
  std::vector<float> hbuf(per_row * 64), from_dev(per_row * 64), cbuf(per_row * 64);
  Session on_dev(m.gpu, params()), on_host(m.gpu, params()), cpu(m.cpu, params());
  auto read_event = dev.create_event();
  on_dev.set_taps(layers, {dev.id(), dbuf.data(), 0, 0, read_event.get()});
  on_host.set_taps(layers, {DeviceId{DeviceKind::CPU, 0}, hbuf.data(), 0, 0, nullptr});
  cpu.set_taps(layers, {DeviceId{DeviceKind::CPU, 0}, cbuf.data(), 0, 0, nullptr});
  const auto toks = random_tokens(20, 3);
  for (int step = 0; step < 3; ++step) {
    Batch b;
    if (step == 0)
      b.add_sequence(toks, 0, 0, true);
    else
      b.add(toks[size_t(step)], 19 + step, 0, true);  // decode steps: recorded graphs with taps
    for (Session* s : {&on_dev, &on_host, &cpu}) s->decode(b);
    Event* written = on_dev.taps_written();
    ASSERT_NE(written, nullptr);
    Stream& st = dev.default_stream();
    written->wait(st);
    dev.copy_to_host(st, from_dev.data(), dbuf.data(), b.size() * per_row * sizeof(float));
    read_event->record(st);
    st.synchronize();
    on_host.synchronize();
    cpu.synchronize();
    const size_t n = b.size() * per_row;
    EXPECT_TRUE(std::equal(from_dev.begin(), from_dev.begin() + ptrdiff_t(n), hbuf.begin()))
        << "step " << step;
    EXPECT_LT(rel_l2(std::span(hbuf).first(n), std::span(cbuf).first(n)), 1e-4) << "step " << step;
  }
}

TEST(GpuStepApi, MasksQuietRowsAndDeviceEmbeddingsAgreeWithTheCpu) {
  TANDEM_REQUIRE_GPU();
  Models m = load_models(config());
  const auto prompt = random_tokens(21, 5), canvas = random_tokens(16, 6);
  Device& dev = m.gpu->impl().main_device();
  std::vector<float> extra(16 * 128);
  std::mt19937 rng(7);
  for (float& v : extra) v = float(rng() % 2000) / 1000.0f - 1.0f;
  Buffer dextra = dev.allocate(extra.size() * 4);
  dev.copy_from_host(dev.default_stream(), dextra.data(), extra.data(), extra.size() * 4);
  dev.default_stream().synchronize();
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind);
    Session c(m.cpu, params()), g(m.gpu, params());
    Batch p;
    p.add_sequence(prompt, 0, 0, false);
    c.decode(p);
    g.decode(p);
    Batch q, qc;
    for (int32_t i = 0; i < 16; ++i) q.add(canvas[size_t(i)], 21 + i, 0, true, /*write*/ kind == 0, i);
    qc = q;
    q.embedding_source = {dev.id(), dextra.data(), 16, 0};
    qc.embeddings = extra;
    if (kind == 0) q.mask.kind = AttentionMask::BlockBidirectional;
    if (kind == 1) q.mask.kind = AttentionMask::PrefixRegion, q.mask.prefix_len = 21;
    if (kind == 2) {
      q.mask.kind = AttentionMask::Explicit;
      q.mask.mask_cols = 37;
      q.mask.explicit_mask.assign(16 * 37, 0.0f);
      for (size_t r = 0; r < 16; ++r)
        for (size_t j = 0; j < 37; ++j)
          if ((r + j) % 5 == 0) q.mask.explicit_mask[r * 37 + j] = -INFINITY;
    }
    qc.mask = q.mask;
    c.decode(qc);
    g.decode(q);
    for (size_t r = 0; r < 16; ++r) EXPECT_LT(rel_l2(copy_row(g, r), copy_row(c, r)), 5e-3) << "row " << r;
    if (kind > 0) {
      EXPECT_EQ(g.seq_len(0), 21);  // quiet rows: the next token continues the prompt
      Batch n;
      n.add(3, 21, 0, true);
      Session ref(m.gpu, params());
      ref.decode(p);
      ref.decode(n);
      g.decode(n);
      EXPECT_EQ(copy_row(g, 0), copy_row(ref, 0));
    }
  }
}

TEST(GpuStepApi, SlidingKvEqualsFullKvOnTheGpu) {
  TANDEM_REQUIRE_GPU();
  testing::TinyConfig c = config();
  testing::WriteOptions o;
  o.extra_keys["qwen3.attention.sliding_window"] = gguf::Value::u32(12);
  o.extra_keys["qwen3.attention.sliding_window_pattern"] = gguf::Value::array(
      gguf::ValueType::BOOL,
      {gguf::Value::boolean(true), gguf::Value::boolean(false), gguf::Value::boolean(true)});
  Models m = load_models(c, o);
  SessionParams p = params();
  p.n_batch = 8;
  Session slide(m.gpu, p);
  p.keep_full_kv = true;
  Session full(m.gpu, p), cpu(m.cpu, p);
  const auto prompt = random_tokens(30, 9);
  for (Session* s : {&slide, &full, &cpu}) {
    Batch b;
    b.add_sequence(prompt, 0, 0, true);
    s->decode(b);
  }
  int32_t tok =
      int32_t(std::max_element(cpu.logits(29).begin(), cpu.logits(29).end()) - cpu.logits(29).begin());
  for (int32_t pos = 30; pos < 120; ++pos) {
    Batch b;
    b.add(tok, pos, 0, true);
    for (Session* s : {&slide, &full, &cpu}) s->decode(b);
    ASSERT_EQ(copy_row(slide, 0), copy_row(full, 0)) << "position " << pos;
    EXPECT_LT(rel_l2(copy_row(slide, 0), copy_row(cpu, 0)), 5e-3) << "position " << pos;
    const auto l = cpu.logits(0);
    tok = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
  }
}

}  // namespace
}  // namespace tandem::gpu_test
