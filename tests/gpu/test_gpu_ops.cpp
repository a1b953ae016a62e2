// CUDA row and elementwise ops against the CPU ops on random data, odd shapes, strided views; outputs
// poisoned (NaN) before each run so that an unwritten element fails the comparison.
//
// Error bounds: get_rows, embed_rows, copy, fill, add, mul, scale are exact (the same f32 operations, or
// exact dequantized values). rms_norm, softmax, silu/gelu, softcap, rope use library exp/tanh/sqrt/sin/cos
// whose CUDA and glibc versions differ by a few ulp: relative L2 error < 1e-5 (rope: < 1e-5 with positions up
// to 4096, where an ulp of theta is ~5e-4 rad... both compute theta with the same float operations, so only
// sin/cos differ).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_kernels.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

class GpuOps : public GpuTest {};

TEST_F(GpuOps, RmsNormWithAndWithoutWeight) {
  std::mt19937 rng(1);
  for (auto [n, rows] : {std::pair<int64_t, int64_t>{4096, 3}, {1031, 2}, {100, 17}, {1, 5}, {128, 40}}) {
    Pair x = make_f32({n, rows}, random_floats(size_t(n * rows), rng, -3, 3));
    Pair w = make_f32({n}, random_floats(size_t(n), rng));
    for (bool with_w : {true, false}) {
      Pair out = make_out(DType::F32, {n, rows});
      gops().rms_norm(gs(), x.dev, with_w ? &w.dev : nullptr, 1e-6f, out.dev);
      cops().rms_norm(cs(), x.cpu, with_w ? &w.cpu : nullptr, 1e-6f, out.cpu);
      EXPECT_LT(rel_l2(download_f32(out), host_f32(out)), 1e-5) << n << "x" << rows;
    }
    // In place.
    Pair y = make_f32({n, rows}, host_f32(x));
    gops().rms_norm(gs(), y.dev, &w.dev, 1e-5f, y.dev);
    cops().rms_norm(cs(), y.cpu, &w.cpu, 1e-5f, y.cpu);
    EXPECT_LT(rel_l2(download_f32(y), host_f32(y)), 1e-5);
  }
  // Per-head norm on a {head_dim, n_head, T} view.
  Pair x = make_f32({64, 6, 5}, random_floats(64 * 6 * 5, rng));
  Pair w = make_f32({64}, random_floats(64, rng));
  Pair out = make_out(DType::F32, {64, 6, 5});
  gops().rms_norm(gs(), x.dev, &w.dev, 1e-6f, out.dev);
  cops().rms_norm(cs(), x.cpu, &w.cpu, 1e-6f, out.cpu);
  EXPECT_LT(rel_l2(download_f32(out), host_f32(out)), 1e-5);
}

TEST_F(GpuOps, RopeNormAndNeox) {
  std::mt19937 rng(2);
  const int64_t hd = 128, n_head = 5, T = 7;
  std::vector<int32_t> pos(T);
  for (auto& p : pos) p = int32_t(rng() % 4096);
  Pair positions = make_i32({T}, pos);
  Pair ff = make_f32({32}, random_floats(32, rng, 0.5f, 4.0f));
  for (RopeMode mode : {RopeMode::Norm, RopeMode::Neox})
    for (int n_rot : {128, 64})
      for (bool with_ff : {false, true}) {
        if (with_ff && n_rot != 64) continue;
        SCOPED_TRACE("mode " + std::to_string(int(mode)) + " n_rot " + std::to_string(n_rot));
        const auto xs = random_floats(size_t(hd * n_head * T), rng);
        Pair x = make_f32({hd, n_head, T}, xs);
        RopeParams p;
        p.n_rot = n_rot;
        p.mode = mode;
        p.freq_base = 1e6f;
        p.freq_scale = 0.5f;
        p.attn_factor = 1.1f;
        p.freq_factors = with_ff ? &ff.dev : nullptr;
        gops().rope(gs(), x.dev, positions.dev, p);
        p.freq_factors = with_ff ? &ff.cpu : nullptr;
        cops().rope(cs(), x.cpu, positions.cpu, p);
        EXPECT_LT(rel_l2(download_f32(x), host_f32(x)), 2e-5);
      }
}

TEST_F(GpuOps, GatedActivationsAndElementwise) {
  std::mt19937 rng(3);
  for (auto [n, rows] : {std::pair<int64_t, int64_t>{12288, 2}, {37, 9}}) {
    Pair a = make_f32({n, rows}, random_floats(size_t(n * rows), rng, -6, 6));
    Pair b = make_f32({n, rows}, random_floats(size_t(n * rows), rng, -6, 6));
    Pair b1 = make_f32({n}, random_floats(size_t(n), rng));
    Pair out = make_out(DType::F32, {n, rows});
    gops().silu_mul(gs(), a.dev, b.dev, out.dev);
    cops().silu_mul(cs(), a.cpu, b.cpu, out.cpu);
    EXPECT_LT(rel_l2(download_f32(out), host_f32(out)), 1e-5);
    poison(out);
    gops().gelu_mul(gs(), a.dev, b.dev, out.dev);
    cops().gelu_mul(cs(), a.cpu, b.cpu, out.cpu);
    EXPECT_LT(rel_l2(download_f32(out), host_f32(out)), 1e-5);
    for (const Pair* bb : {&b, &b1}) {
      poison(out);
      gops().add(gs(), a.dev, bb->dev, out.dev);
      cops().add(cs(), a.cpu, bb->cpu, out.cpu);
      EXPECT_EQ(download_f32(out), host_f32(out));
      poison(out);
      gops().mul(gs(), a.dev, bb->dev, out.dev);
      cops().mul(cs(), a.cpu, bb->cpu, out.cpu);
      EXPECT_EQ(download_f32(out), host_f32(out));
    }
    poison(out);
    gops().scale(gs(), a.dev, 0.37f, out.dev);
    cops().scale(cs(), a.cpu, 0.37f, out.cpu);
    EXPECT_EQ(download_f32(out), host_f32(out));
    poison(out);
    gops().softcap(gs(), a.dev, 3.0f, out.dev);
    cops().softcap(cs(), a.cpu, 3.0f, out.cpu);
    EXPECT_LT(rel_l2(download_f32(out), host_f32(out)), 1e-5);
    poison(out);
    gops().softmax_rows(gs(), a.dev, out.dev);
    cops().softmax_rows(cs(), a.cpu, out.cpu);
    EXPECT_LT(rel_l2(download_f32(out), host_f32(out)), 1e-5);
    poison(out);
    gops().fill(gs(), out.dev, -2.5f);
    for (float v : download_f32(out)) ASSERT_EQ(v, -2.5f);
  }
  // Broadcast add in place on a strided view (every other row).
  Pair a = make_f32({33, 8}, random_floats(33 * 8, rng));
  Pair b = make_f32({33}, random_floats(33, rng));
  Tensor av = a.dev, ac = a.cpu;
  for (Tensor* t : {&av, &ac}) {
    t->ne[1] = 4;
    t->nb[1] *= 2;
  }
  gops().add(gs(), av, b.dev, av);
  cops().add(cs(), ac, b.cpu, ac);
  EXPECT_EQ(download_f32(a), host_f32(a));
}

// Softmax of long rows (canvas self-conditioning: rows of the vocabulary): 262144 values (16-byte path, in place
// as DeviceSelfCond calls it, logits spread like a peaky model's), 20001 (not a multiple of 4: the scalar path),
// and a row with -inf entries (masked logits); with TANDEM_WIDE_ROWS on (softmax_long_kernel) and off
// (softmax_kernel): both within rounding of the CPU.
TEST_F(GpuOps, SoftmaxOfLongRows) {
  ForcedSwitch wide_rows(cuda::set_wide_rows, std::nullopt);  // (set below, each way)
  std::mt19937 rng(606);
  for (bool wide : {false, true})
  for (int64_t n : {int64_t(262144), int64_t(20001)}) {
    cuda::set_wide_rows(wide);
    SCOPED_TRACE("n " + std::to_string(n) + (wide ? " wide" : ""));
    const int64_t rows = 3;
    std::vector<float> v = random_floats(size_t(n * rows), rng, -12.0f, 12.0f);
    for (int64_t i = 0; i < n; i += 7) v[size_t(n + i)] = -INFINITY;  // row 1: every seventh value masked
    Pair a = make_f32({n, rows}, v);
    Pair out = make_f32({n, rows}, std::vector<float>(size_t(n * rows), 0.0f));
    gops().softmax_rows(gs(), a.dev, out.dev);
    cops().softmax_rows(cs(), a.cpu, out.cpu);
    const std::vector<float> got = download_f32(out);
    EXPECT_LT(rel_l2(got, host_f32(out)), 1e-5);
    for (int64_t i = 0; i < n; i += 7) ASSERT_EQ(got[size_t(n + i)], 0.0f) << i;
    gops().softmax_rows(gs(), a.dev, a.dev);  // in place
    EXPECT_LT(rel_l2(download_f32(a), host_f32(out)), 1e-5);
  }
}

// The row kernels with more rows than a grid's y dimension takes (65535) and with several blocks a row
// (TANDEM_WIDE_ROWS): add, scale and rms_norm (decode-sized rows over many blocks; many rows over one block
// each) equal the CPU, on and off.
TEST_F(GpuOps, RowKernelsPastTheGridLimitAndWide) {
  ForcedSwitch wide_rows(cuda::set_wide_rows, std::nullopt);  // (set below, each way)
  std::mt19937 rng(707);
  for (bool wide : {false, true}) {
    cuda::set_wide_rows(wide);
    for (auto [n, rows] : {std::pair<int64_t, int64_t>{8, 70000}, {1024, 70000}, {4096, 2}, {262144, 1}}) {
      SCOPED_TRACE(std::to_string(n) + " x " + std::to_string(rows) + (wide ? " wide" : ""));
      Pair a = make_f32({n, rows}, random_floats(size_t(n * rows), rng, -3, 3));
      Pair b = make_f32({n, rows}, random_floats(size_t(n * rows), rng));
      Pair w = make_f32({n}, random_floats(size_t(n), rng));
      Pair out = make_out(DType::F32, {n, rows});
      gops().add(gs(), a.dev, b.dev, out.dev);
      cops().add(cs(), a.cpu, b.cpu, out.cpu);
      EXPECT_EQ(download_f32(out), host_f32(out)) << "add";
      gops().scale(gs(), a.dev, 0.37f, out.dev);
      cops().scale(cs(), a.cpu, 0.37f, out.cpu);
      EXPECT_EQ(download_f32(out), host_f32(out)) << "scale";
      gops().rms_norm(gs(), a.dev, &w.dev, 1e-6f, out.dev);
      cops().rms_norm(cs(), a.cpu, &w.cpu, 1e-6f, out.cpu);
      EXPECT_LT(rel_l2(download_f32(out), host_f32(out)), 1e-5) << "rms_norm";
    }
  }
}

TEST_F(GpuOps, GetRowsEveryDtype) {
  std::mt19937 rng(4);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t n = dtype_block_size(t) > 32 ? 512 : 96, vocab = 50;
    std::vector<float> values;
    const auto bytes = random_weights(t, n, vocab, rng, values);
    Pair table = make(t, {n, vocab}, bytes.data());
    std::vector<int32_t> id = {3, 49, 0, 3, 17};
    Pair ids = make_i32({5}, id);
    Pair out = make_out(DType::F32, {n, 5});
    gops().get_rows(gs(), table.dev, ids.dev, out.dev);
    const auto got = download_f32(out);
    for (size_t r = 0; r < id.size(); ++r)
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[r * size_t(n) + size_t(i)], values[size_t(id[r]) * size_t(n) + size_t(i)])
            << r << "," << i;
  }
}

// embed_rows against the CPU op: token only / added only / both / neither rows, a strided added tensor (NaN
// in the gaps), scale 1 and sqrt(n_embd). Bitwise: both compute the f32 product then the f32 sum, never
// fused, and the dequantized values are exact on both sides.
TEST_F(GpuOps, EmbedRowsMatchesCpu) {
  std::mt19937 rng(14);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t n = dtype_block_size(t) > 32 ? 512 : 96, vocab = 50, n_added = 7, stride = n + 16;
    std::vector<float> values;
    const auto bytes = random_weights(t, n, vocab, rng, values);
    Pair table = make(t, {n, vocab}, bytes.data());
    std::vector<float> added_host = random_floats(size_t(stride * n_added), rng, -2.0f, 2.0f);
    for (int64_t r = 0; r < n_added; ++r)
      for (int64_t i = n; i < stride; ++i) added_host[size_t(r * stride + i)] = NAN;
    Pair added = make_f32({stride, n_added}, added_host);
    Tensor added_c = added.cpu, added_g = added.dev;
    added_c.ne[0] = added_g.ne[0] = n;
    // token only, added only, both, neither, both, token only (the last token of the table), both
    const std::vector<int32_t> id = {3, -1, 49, -1, 0, 49, 17}, aid = {-1, 6, 0, -1, 3, -1, 6};
    const int64_t T = int64_t(id.size());
    Pair ids = make_i32({T}, id), aids = make_i32({T}, aid);
    for (float scale : {1.0f, std::sqrt(float(n))}) {
      SCOPED_TRACE(scale);
      Pair out = make_out(DType::F32, {n, T});
      gops().embed_rows(gs(), table.dev, ids.dev, scale, &added_g, &aids.dev, out.dev);
      cops().embed_rows(cs(), table.cpu, ids.cpu, scale, &added_c, &aids.cpu, out.cpu);
      const auto got = download_f32(out), want = host_f32(out);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[size_t(3 * n + i)], 0.0f) << "a row with neither is 0";
      // No added tensor: equals get_rows * scale (bit for bit at scale 1).
      Pair plain = make_out(DType::F32, {n, T}), rows = make_out(DType::F32, {n, T});
      std::vector<int32_t> tok = id;
      for (auto& x : tok) x = x < 0 ? 1 : x;  // get_rows needs a token in every row
      Pair tok_ids = make_i32({T}, tok);
      gops().embed_rows(gs(), table.dev, tok_ids.dev, scale, nullptr, nullptr, plain.dev);
      gops().get_rows(gs(), table.dev, tok_ids.dev, rows.dev);
      const auto p = download_f32(plain), r = download_f32(rows);
      for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], r[i] * scale) << "element " << i;
    }
  }
}

TEST_F(GpuOps, CopyConvertsAndCopiesBlocks) {
  std::mt19937 rng(5);
  const auto xs = random_floats(100 * 7, rng, -100, 100);
  Pair src = make_f32({100, 7}, xs);
  for (DType t : {DType::F16, DType::BF16}) {
    Pair dst = make_out(t, {100, 7});
    gops().copy(gs(), src.dev, dst.dev);
    cops().copy(cs(), src.cpu, dst.cpu);
    EXPECT_EQ(download(dst), dst.host) << dtype_name(t);
    Pair back = make_out(DType::F32, {100, 7});
    gops().copy(gs(), dst.dev, back.dev);
    cops().copy(cs(), dst.cpu, back.cpu);
    EXPECT_EQ(download_f32(back), host_f32(back));
  }
  std::vector<float> values;
  const auto qb = random_weights(DType::Q8_0, 64, 9, rng, values);
  Pair q = make(DType::Q8_0, {64, 9}, qb.data());
  Pair q2 = make_out(DType::Q8_0, {64, 9});
  gops().copy(gs(), q.dev, q2.dev);
  EXPECT_EQ(download(q2), qb);
  Pair bad = make_out(DType::Q4_0, {64, 9});
  EXPECT_THROW(gops().copy(gs(), q.dev, bad.dev), Error);
}

TEST_F(GpuOps, ArgmaxAndSampling) {
  std::mt19937 rng(6);
  const int64_t V = 151936, T = 24;
  std::vector<float> logits = random_floats(size_t(V * T), rng, -8, 8);
  // Ties: row 1 has its maximum twice; row 2 is constant.
  logits[size_t(V) + 10] = 20.0f;
  logits[size_t(V) + 99] = 20.0f;
  for (int64_t i = 0; i < V; ++i) logits[size_t(2 * V + i)] = 1.0f;
  Pair l = make_f32({V, T}, logits);
  Pair am = make_out(DType::I32, {T});
  gops().argmax_rows(gs(), l.dev, am.dev);
  cops().argmax_rows(cs(), l.cpu, am.cpu);
  EXPECT_EQ(download_i32(am), host_i32(am));

  std::vector<float> u(static_cast<size_t>(T));
  for (auto& x : u) x = std::uniform_real_distribution<float>(0.0f, 0.999f)(rng);
  Pair uni = make_f32({T}, u);
  const SamplerParams cases[] = {{0.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.0f},    {0.8f, 40, 1.0f, 0.0f},
                                 {1.0f, 0, 0.9f, 0.0f}, {0.7f, 50, 0.95f, 0.05f}, {1.2f, 1, 1.0f, 0.0f},
                                 {1.0f, 0, 1.0f, 0.1f}};
  for (const SamplerParams& p : cases) {
    SCOPED_TRACE("temp " + std::to_string(p.temperature) + " top_k " + std::to_string(p.top_k) + " top_p " +
                 std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p));
    Pair out = make_out(DType::I32, {T});
    gops().sample_rows(gs(), l.dev, p, uni.dev, out.dev);
    cops().sample_rows(cs(), l.cpu, p, uni.cpu, out.cpu);
    const auto g = download_i32(out), c = host_i32(out);
    // Both draw with the same rule; they can differ only where a running sum lands within rounding of u * W
    // (fixed-point sums on the GPU, float on the CPU): allow one such row of 24.
    int same = 0;
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_GE(g[size_t(t)], 0);
      ASSERT_LT(g[size_t(t)], V);
      same += g[size_t(t)] == c[size_t(t)];
    }
    EXPECT_GE(same, T - 1);
    if (p.temperature <= 0.0f || p.top_k == 1) {
      EXPECT_EQ(g, c);
    }
  }
}

// A small sampling case for compute-sanitizer's racecheck.
TEST_F(GpuOps, SmallSamplingForSanitizer) {
  std::mt19937 rng(8);
  const int64_t V = 3000, T = 3;
  Pair l = make_f32({V, T}, random_floats(size_t(V * T), rng, -4, 4));
  Pair uni = make_f32({T}, {0.1f, 0.5f, 0.9f});
  Pair out = make_out(DType::I32, {T});
  gops().sample_rows(gs(), l.dev, SamplerParams{0.9f, 20, 0.9f, 0.02f}, uni.dev, out.dev);
  cops().sample_rows(cs(), l.cpu, SamplerParams{0.9f, 20, 0.9f, 0.02f}, uni.cpu, out.cpu);
  EXPECT_EQ(download_i32(out), host_i32(out));
  Pair am = make_out(DType::I32, {T}), ent = make_out(DType::F32, {T}), smp = make_out(DType::I32, {T});
  gops().diffusion_sample_rows(gs(), l.dev, 1.0f, uni.dev, am.dev, ent.dev, smp.dev);
  EXPECT_EQ(download_i32(am).size(), size_t(T));
}

TEST_F(GpuOps, DiffusionSampleRows) {
  std::mt19937 rng(7);
  const int64_t V = 5000, T = 33;
  Pair l = make_f32({V, T}, random_floats(size_t(V * T), rng, -5, 5));
  std::vector<float> u(static_cast<size_t>(T));
  for (auto& x : u) x = std::uniform_real_distribution<float>(0.0f, 0.999f)(rng);
  Pair uni = make_f32({T}, u);
  Pair am = make_out(DType::I32, {T}), ent = make_out(DType::F32, {T}), smp = make_out(DType::I32, {T});
  gops().diffusion_sample_rows(gs(), l.dev, 1.3f, uni.dev, am.dev, ent.dev, smp.dev);
  cops().diffusion_sample_rows(cs(), l.cpu, 1.3f, uni.cpu, am.cpu, ent.cpu, smp.cpu);
  EXPECT_EQ(download_i32(am), host_i32(am));
  EXPECT_LT(rel_l2(download_f32(ent), host_f32(ent)), 1e-4);
  const auto g = download_i32(smp), c = host_i32(smp);
  int same = 0;
  for (int64_t t = 0; t < T; ++t) same += g[size_t(t)] == c[size_t(t)];
  EXPECT_GE(same, T - 1);  // a running float sum within rounding of u * Z can flip one row
}

}  // namespace
}  // namespace tandem::gpu_test
