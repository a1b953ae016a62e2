// CPU ops other than matmul and attention, each against a plain double-precision loop on random inputs, with
// both the AVX2 and the scalar kernels; plus the CPU device (allocation, copies) and bad-input errors.
//
// Bounds: rms_norm sums squares in double and scales in f32, so the result is within a few f32 ulps: 1e-6
// relative. rope: the reference computes theta the way backend.h defines it (f32 running product, as ggml)
// and cos/sin in double; the kernel uses cosf/sinf (<= 1 ulp) and one rounding per product: 1e-6 * max|x|.
// Activations / softmax use expf / tanhf (<= 2 ulp): 1e-6 relative plus 1e-7 absolute.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/half.h"
#include "quant/quant.h"
#include "test_cpu_ops_util.h"

namespace tandem::test {
namespace {

class CpuOpsTest : public SimdParam {};

TEST_P(CpuOpsTest, RmsNormWithAndWithoutWeight) {
  for (int64_t n : {64, 100, 4096}) {
    const int64_t rows = 5;
    std::vector<float> x = random_normal(size_t(n * rows), uint32_t(n), 3.0f),
                       w = random_normal(size_t(n), 2);
    std::vector<float> out(x.size()), out_nw(x.size());
    Tensor wt = f32(w, {n});
    ops().rms_norm(stream(), f32(x, {n, rows}), &wt, 1e-6f, f32(out, {n, rows}));
    ops().rms_norm(stream(), f32(x, {n, rows}), nullptr, 1e-5f, f32(out_nw, {n, rows}));
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0.0;
      for (int64_t i = 0; i < n; ++i) ss += double(x[size_t(r * n + i)]) * x[size_t(r * n + i)];
      for (int64_t i = 0; i < n; ++i) {
        const double xi = x[size_t(r * n + i)];
        const double ref = xi / std::sqrt(ss / double(n) + 1e-6) * w[size_t(i)];
        const double ref_nw = xi / std::sqrt(ss / double(n) + 1e-5);
        ASSERT_NEAR(out[size_t(r * n + i)], ref, 1e-6 * std::fabs(ref) + 1e-12) << n << " " << r << " " << i;
        ASSERT_NEAR(out_nw[size_t(r * n + i)], ref_nw, 1e-6 * std::fabs(ref_nw) + 1e-12);
      }
    }
  }
}

// gemma4's post-normed residual adds (Ops::norm_residual_add, Ops::moe_residual_add) against the formula in
// double: x = (x + rms(y) * w_out) * s, y = dense or rms(dense) * w_dense + rms(moe) * w_moe.
TEST_P(CpuOpsTest, PostNormResidualAdds) {
  auto rms_row = [](const float* v, int64_t n, double eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(v[i]) * v[i];
    return 1.0 / std::sqrt(ss / double(n) + eps);
  };
  for (int64_t n : {64, 2816})
    for (int variant : {0, 1, 2}) {  // dense; MoE with the experts' sum; MoE from 2 experts' outputs and weights
      const bool moe = variant > 0, combine = variant == 2;
      const int64_t rows = 3;
      const float eps = 1e-6f, out_scale = 0.4f;
      const std::vector<float> x0 = random_normal(size_t(n * rows), uint32_t(n) + 1, 2.0f),
                               d0 = random_normal(size_t(n * rows), 5, 3.0f),
                               m0 = random_normal(size_t(n * rows), 6, 0.5f);
      std::vector<float> x = x0, d = d0, m = m0;
      std::vector<float> ey = random_normal(size_t(n * 2 * rows), 10, 0.5f), ew = random_normal(size_t(2 * rows), 11);
      std::vector<float> m_in = m0;  // the expert branch's sum as the op sees it
      if (combine)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < n; ++i)
            m_in[size_t(r * n + i)] = ew[size_t(2 * r)] * ey[size_t((2 * r) * n + i)] +
                                      ew[size_t(2 * r + 1)] * ey[size_t((2 * r + 1) * n + i)];
      Tensor ey_t = f32(ey, {n, 2, rows}), ew_t = f32(ew, {2, rows});
      std::vector<float> w1 = random_normal(size_t(n), 7), w2 = random_normal(size_t(n), 8),
                         w3 = random_normal(size_t(n), 9);
      if (moe) {
        ops().moe_residual_add(stream(), f32(x, {n, rows}), f32(d, {n, rows}), f32(w1, {n}),
                               combine ? &ey_t : nullptr, combine ? &ew_t : nullptr, f32(m, {n, rows}), f32(w2, {n}),
                               f32(w3, {n}), eps, out_scale);
      } else {
        ops().norm_residual_add(stream(), f32(x, {n, rows}), f32(d, {n, rows}), f32(w3, {n}), eps, out_scale);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const size_t o = size_t(r * n);
        std::vector<float> y(d0.begin() + long(o), d0.begin() + long(o + size_t(n)));
        if (moe) {
          const double a = rms_row(&d0[o], n, eps), b = rms_row(&m_in[o], n, eps);
          for (int64_t i = 0; i < n; ++i)
            y[size_t(i)] = float(d0[o + size_t(i)] * a * w1[size_t(i)] + m_in[o + size_t(i)] * b * w2[size_t(i)]);
        }
        const double c = rms_row(y.data(), n, eps);
        for (int64_t i = 0; i < n; ++i) {
          const double ref = (x0[o + size_t(i)] + y[size_t(i)] * c * w3[size_t(i)]) * out_scale;
          ASSERT_NEAR(x[o + size_t(i)], ref, 1e-5 * (std::fabs(ref) + 1.0)) << n << " " << moe << " " << r << " " << i;
        }
      }
      std::vector<float> bad(size_t(n + 1));
      EXPECT_THROW(ops().norm_residual_add(stream(), f32(x, {n, rows}), f32(d, {n, rows}), f32(bad, {n + 1}), eps, 1.0f),
                   Error);
      // Aliased operands are rejected before anything is written (the fused kernels read rows of one while
      // writing another): x is left as it was.
      const std::vector<float> x_before = x;
      EXPECT_THROW(ops().norm_residual_add(stream(), f32(x, {n, rows}), f32(x, {n, rows}), f32(w3, {n}), eps, 1.0f),
                   Error);
      EXPECT_THROW(ops().moe_residual_add(stream(), f32(x, {n, rows}), f32(d, {n, rows}), f32(w1, {n}), nullptr,
                                          nullptr, f32(d, {n, rows}), f32(w2, {n}), f32(w3, {n}), eps, 1.0f),
                   Error);
      EXPECT_THROW(ops().moe_input_norms(stream(), f32(x, {n, rows}), eps, 0.5f, f32(w1, {n}), f32(x, {n, rows}),
                                         f32(w2, {n}), f32(m, {n, rows})),
                   Error);
      EXPECT_EQ(x, x_before);
    }
}

TEST_P(CpuOpsTest, RmsNormPerHeadInPlaceOnStridedView) {
  // {head_dim, n_head, T} view into a fused buffer whose rows are wider: per-head norm, in place.
  const int64_t hd = 16, n_head = 3, T = 2, pitch = 3 * hd * n_head;  // q | k | v rows of width 48 each
  std::vector<float> buf = random_normal(size_t(pitch * T), 5), orig = buf, w = random_normal(size_t(hd), 6);
  Tensor x = Tensor::contiguous(DType::F32, {hd, n_head, T}, buf.data() + hd * n_head);  // the k part
  x.nb[2] = size_t(pitch) * sizeof(float);
  Tensor wt = f32(w, {hd});
  ops().rms_norm(stream(), x, &wt, 1e-6f, x);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < pitch; ++i) {
      const int64_t part = i / (hd * n_head);
      const size_t at = size_t(t * pitch + i);
      if (part != 1) {
        ASSERT_EQ(buf[at], orig[at]) << "touched outside the view";
        continue;
      }
      const int64_t h = (i % (hd * n_head)) / hd, d = i % hd;
      double ss = 0.0;
      for (int64_t k = 0; k < hd; ++k) {
        const double v = orig[size_t(t * pitch + hd * n_head + h * hd + k)];
        ss += v * v;
      }
      const double ref = orig[at] / std::sqrt(ss / double(hd) + 1e-6) * w[size_t(d)];
      ASSERT_NEAR(buf[at], ref, 1e-6 * std::fabs(ref) + 1e-12);
    }
}

// theta exactly as backend.h defines it (f32 running product), rotation in double.
std::vector<double> rope_reference(const std::vector<float>& x, int64_t hd, int64_t n_head, int64_t T,
                                   const std::vector<int32_t>& pos, const RopeParams& p, const float* ff) {
  std::vector<double> out(x.begin(), x.end());
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));
  for (int64_t t = 0; t < T; ++t) {
    float theta = float(pos[size_t(t)]);
    for (int i = 0; i < p.n_rot / 2; ++i, theta *= theta_scale) {
      const double angle = double((ff ? theta / ff[i] : theta) * p.freq_scale);
      const double c = std::cos(angle) * p.attn_factor, s = std::sin(angle) * p.attn_factor;
      for (int64_t h = 0; h < n_head; ++h) {
        const size_t base = size_t((t * n_head + h) * hd);
        const size_t i0 = base + size_t(p.mode == RopeMode::Norm ? 2 * i : i);
        const size_t i1 = base + size_t(p.mode == RopeMode::Norm ? 2 * i + 1 : i + p.n_rot / 2);
        const double x0 = x[i0], x1 = x[i1];
        out[i0] = x0 * c - x1 * s;
        out[i1] = x0 * s + x1 * c;
      }
    }
  }
  return out;
}

TEST_P(CpuOpsTest, RopeNormAndNeoxWithFactorsAndPartialRotation) {
  const int64_t hd = 64, n_head = 3, T = 5;
  std::vector<int32_t> pos = {0, 1, 7, 1000, 4095};
  std::vector<float> ff = random_normal(48 / 2, 11);
  for (float& f : ff) f = 1.0f + std::fabs(f);  // factors >= 1 like llama3's
  for (RopeMode mode : {RopeMode::Norm, RopeMode::Neox}) {
    for (int n_rot : {64, 48, 10}) {
      for (bool with_ff : {false, true}) {
        if (with_ff && n_rot != 48) continue;
        SCOPED_TRACE(std::string(mode == RopeMode::Norm ? "norm" : "neox") +
                     " n_rot=" + std::to_string(n_rot) + (with_ff ? " ff" : ""));
        RopeParams p;
        p.n_rot = n_rot;
        p.mode = mode;
        p.freq_base = 1000000.0f;
        p.freq_scale = with_ff ? 0.25f : 1.0f;
        p.attn_factor = with_ff ? 1.2f : 1.0f;
        Tensor fft = f32(ff, {n_rot / 2});
        p.freq_factors = with_ff ? &fft : nullptr;
        std::vector<float> x = random_normal(size_t(hd * n_head * T), uint32_t(n_rot));
        const auto ref = rope_reference(x, hd, n_head, T, pos, p, with_ff ? ff.data() : nullptr);
        ops().rope(stream(), f32(x, {hd, n_head, T}), i32(pos, {T}), p);
        for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], ref[i], 2e-6 * 4.0) << i;
      }
    }
  }
}

TEST_P(CpuOpsTest, RopeMatchesExactThetaForSmallPositions) {
  // Against the mathematically exact angle (double pow), where the f32 theta has not drifted: positions < 64.
  const int64_t hd = 32, T = 4;
  std::vector<int32_t> pos = {0, 3, 17, 63};
  std::vector<float> x = random_normal(size_t(hd * T), 3), x0 = x;
  RopeParams p;
  p.n_rot = 32;
  p.mode = RopeMode::Neox;
  p.freq_base = 10000.0f;
  ops().rope(stream(), f32(x, {hd, 1, T}), i32(pos, {T}), p);
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < 16; ++i) {
      const double theta = pos[size_t(t)] * std::pow(10000.0, -2.0 * i / 32.0);
      const double a = x0[size_t(t * hd + i)], b = x0[size_t(t * hd + i + 16)];
      EXPECT_NEAR(x[size_t(t * hd + i)], a * std::cos(theta) - b * std::sin(theta), 2e-5);
      EXPECT_NEAR(x[size_t(t * hd + i + 16)], a * std::sin(theta) + b * std::cos(theta), 2e-5);
    }
}

TEST_P(CpuOpsTest, GatedActivations) {
  const int64_t n = 300, rows = 3;
  std::vector<float> g = random_normal(size_t(n * rows), 1, 3.0f), u = random_normal(size_t(n * rows), 2);
  std::vector<float> silu(g.size()), gelu(g.size());
  ops().silu_mul(stream(), f32(g, {n, rows}), f32(u, {n, rows}), f32(silu, {n, rows}));
  ops().gelu_mul(stream(), f32(g, {n, rows}), f32(u, {n, rows}), f32(gelu, {n, rows}));
  for (size_t i = 0; i < g.size(); ++i) {
    const double x = g[i];
    const double s = x / (1.0 + std::exp(-x)) * u[i];
    const double ge = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    ASSERT_NEAR(silu[i], s, 1e-6 * std::fabs(s) + 1e-7 * std::fabs(u[i]));
    ASSERT_NEAR(gelu[i], ge, 1e-6 * std::fabs(ge) + 1e-6 * std::fabs(u[i]) * std::fabs(x));
  }
}

TEST_P(CpuOpsTest, AddMulScaleSoftcapFillWithBroadcast) {
  const int64_t n = 37, rows = 4;
  std::vector<float> a = random_normal(size_t(n * rows), 1, 10.0f), b = random_normal(size_t(n * rows), 2);
  std::vector<float> row = random_normal(size_t(n), 3), out(a.size());
  ops().add(stream(), f32(a, {n, rows}), f32(b, {n, rows}), f32(out, {n, rows}));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[i], a[i] + b[i]);
  ops().mul(stream(), f32(a, {n, rows}), f32(row, {n}), f32(out, {n, rows}));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[i], a[i] * row[i % size_t(n)]);
  ops().add(stream(), f32(a, {n, rows}), f32(row, {n}), f32(out, {n, rows}));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[i], a[i] + row[i % size_t(n)]);
  ops().scale(stream(), f32(a, {n, rows}), 0.125f, f32(out, {n, rows}));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[i], a[i] * 0.125f);
  ops().softcap(stream(), f32(a, {n, rows}), 5.0f, f32(out, {n, rows}));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(out[i], 5.0 * std::tanh(a[i] / 5.0), 2e-6 * 5.0);
  std::vector<float> in_place = a;
  ops().add(stream(), f32(in_place, {n, rows}), f32(b, {n, rows}), f32(in_place, {n, rows}));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(in_place[i], a[i] + b[i]);
  ops().fill(stream(), f32(out, {n, rows}), -2.5f);
  for (float v : out) ASSERT_EQ(v, -2.5f);
  std::vector<float> bad(size_t(n * 2));
  EXPECT_THROW(ops().add(stream(), f32(a, {n, rows}), f32(bad, {n, 2}), f32(out, {n, rows})), Error);
  EXPECT_THROW(ops().softcap(stream(), f32(a, {n, rows}), 0.0f, f32(out, {n, rows})), Error);
}

TEST_P(CpuOpsTest, SoftmaxRows) {
  const int64_t n = 1000, rows = 3;
  std::vector<float> x = random_normal(size_t(n * rows), 4, 5.0f), out(x.size());
  ops().softmax_rows(stream(), f32(x, {n, rows}), f32(out, {n, rows}));
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, z = 0.0;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(x[size_t(r * n + i)]));
    for (int64_t i = 0; i < n; ++i) z += std::exp(x[size_t(r * n + i)] - mx);
    for (int64_t i = 0; i < n; ++i) {
      const double ref = std::exp(x[size_t(r * n + i)] - mx) / z;
      ASSERT_NEAR(out[size_t(r * n + i)], ref, 2e-6 * ref + 1e-9);
    }
  }
}

TEST_P(CpuOpsTest, CopyConvertsAndCopiesStridedViews) {
  const int64_t n = 24, rows = 3;
  std::vector<float> x = random_normal(size_t(n * rows), 9, 100.0f), back(x.size());
  std::vector<uint16_t> h(x.size()), bf(x.size()), h2(x.size());
  ops().copy(stream(), f32(x, {n, rows}), view(h, DType::F16, {n, rows}));
  ops().copy(stream(), f32(x, {n, rows}), view(bf, DType::BF16, {n, rows}));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], fp32_to_fp16(x[i]));
    ASSERT_EQ(bf[i], fp32_to_bf16(x[i]));
  }
  ops().copy(stream(), view(h, DType::F16, {n, rows}), f32(back, {n, rows}));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(back[i], fp16_to_fp32(h[i]));
  ops().copy(stream(), view(bf, DType::BF16, {n, rows}), view(h2, DType::F16, {n, rows}));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(h2[i], fp32_to_fp16(bf16_to_fp32(bf[i])));
  // A strided source: every other row of a {n, 2 * rows} buffer.
  std::vector<float> wide = random_normal(size_t(n * rows * 2), 10), packed(size_t(n * rows));
  Tensor src = f32(wide, {n, rows});
  src.nb[1] *= 2;
  ops().copy(stream(), src, f32(packed, {n, rows}));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(packed[size_t(r * n + i)], wide[size_t(2 * r * n + i)]);
  std::vector<int32_t> ints(x.size());
  EXPECT_THROW(ops().copy(stream(), f32(x, {n, rows}), i32(ints, {n, rows})), Error);
}

TEST_P(CpuOpsTest, GetRowsForEveryTableType) {
  const int64_t n = 256, vocab = 6;
  std::vector<float> table = random_normal(size_t(n * vocab), 12);
  std::vector<int32_t> ids = {5, 0, 5, 2};
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<uint8_t> q(dtype_row_bytes(t, n) * size_t(vocab));
    quant::quantize_matrix(t, table.data(), q.data(), vocab, n);
    std::vector<float> out(size_t(n * 4)), ref(static_cast<size_t>(n));
    ops().get_rows(stream(), Tensor::contiguous(t, {n, vocab}, q.data()), i32(ids, {4}), f32(out, {n, 4}));
    for (int r = 0; r < 4; ++r) {
      quant::dequantize_row(t, q.data() + size_t(ids[size_t(r)]) * dtype_row_bytes(t, n), ref.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[size_t(r * n + i)], ref[size_t(i)]);
    }
    std::vector<int32_t> bad = {6};
    EXPECT_THROW(ops().get_rows(stream(), Tensor::contiguous(t, {n, vocab}, q.data()), i32(bad, {1}),
                                f32(out, {n, 1})),
                 Error);
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, CpuOpsTest, ::testing::Bool(), simd_name);

// ---- embed_rows (StepApiEmbed)
// ------------------------------------------------------------------------------

// The rows of table (of `type`, quantized from random values) as the reference dequantizer gives them.
std::vector<float> dequantized_rows(DType type, const std::vector<uint8_t>& q, int64_t n, int64_t vocab) {
  std::vector<float> rows(size_t(n * vocab));
  for (int64_t v = 0; v < vocab; ++v)
    quant::dequantize_row(type, q.data() + size_t(v) * dtype_row_bytes(type, n), rows.data() + v * n, n);
  return rows;
}

TEST(StepApiEmbed, TokenAddedBothAndNeither) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const int64_t n = 64, vocab = 9, n_added = 5, added_stride = n + 12;
  const std::vector<float> values = random_normal(size_t(n * vocab), 30);
  // added: rows `added_stride` floats apart (a strided view), the gaps NaN (never read).
  std::vector<float> added_storage = random_normal(size_t(added_stride * n_added), 31);
  for (int64_t r = 0; r < n_added; ++r)
    for (int64_t i = n; i < added_stride; ++i) added_storage[size_t(r * added_stride + i)] = NAN;
  Tensor added = f32(added_storage, {added_stride, n_added});
  added.ne[0] = n;
  // token only, added only, both, neither, both (a repeat), token only
  std::vector<int32_t> ids = {3, -1, 8, -1, 3, 0}, added_ids = {-1, 4, 0, -1, 2, -1};
  const int64_t T = int64_t(ids.size());
  for (DType t : {DType::F32, DType::F16, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<uint8_t> q(dtype_row_bytes(t, n) * size_t(vocab));
    quant::quantize_matrix(t, values.data(), q.data(), vocab, n);
    const std::vector<float> rows = dequantized_rows(t, q, n, vocab);
    const Tensor table = Tensor::contiguous(t, {n, vocab}, q.data());
    for (float scale : {1.0f, std::sqrt(float(n)), -0.37f}) {
      std::vector<float> out(size_t(n * T), NAN);
      Tensor added_ids_t = i32(added_ids, {T});
      ops.embed_rows(s, table, i32(ids, {T}), scale, &added, &added_ids_t, f32(out, {n, T}));
      for (int64_t r = 0; r < T; ++r)
        for (int64_t i = 0; i < n; ++i) {
          const float tok = ids[size_t(r)] >= 0 ? rows[size_t(ids[size_t(r)] * n + i)] * scale : 0.0f;
          const float add = added_ids[size_t(r)] >= 0
                                ? added_storage[size_t(added_ids[size_t(r)] * added_stride + i)]
                                : 0.0f;
          ASSERT_EQ(out[size_t(r * n + i)], tok + add) << "row " << r << " dim " << i << " scale " << scale;
        }
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[size_t(3 * n + i)], 0.0f) << "a row with neither is 0";
    }
  }
}

TEST(StepApiEmbed, ScaleOneEqualsGetRowsBitwise) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const int64_t n = 256, vocab = 7;
  const std::vector<float> values = random_normal(size_t(n * vocab), 40);
  std::vector<int32_t> ids = {6, 0, 2, 6, 5};
  const int64_t T = int64_t(ids.size());
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<uint8_t> q(dtype_row_bytes(t, n) * size_t(vocab));
    quant::quantize_matrix(t, values.data(), q.data(), vocab, n);
    const Tensor table = Tensor::contiguous(t, {n, vocab}, q.data());
    std::vector<float> got(size_t(n * T), NAN), want(size_t(n * T), NAN), scaled(size_t(n * T), NAN);
    ops.get_rows(s, table, i32(ids, {T}), f32(want, {n, T}));
    // No added tensor: added_ids is ignored (here a null pointer).
    ops.embed_rows(s, table, i32(ids, {T}), 1.0f, nullptr, nullptr, f32(got, {n, T}));
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
    // scale sqrt(n_embd) (gemma's embedding scale): get_rows * scale, in f32.
    const float scale = std::sqrt(float(n));
    ops.embed_rows(s, table, i32(ids, {T}), scale, nullptr, nullptr, f32(scaled, {n, T}));
    for (size_t i = 0; i < scaled.size(); ++i) ASSERT_EQ(scaled[i], want[i] * scale) << i;
    // An added tensor whose added_ids are all -1 adds nothing.
    std::vector<float> added = random_normal(size_t(n * 2), 41);
    std::vector<int32_t> none(size_t(T), -1);
    Tensor added_t = f32(added, {n, 2}), none_t = i32(none, {T});
    std::fill(got.begin(), got.end(), NAN);
    ops.embed_rows(s, table, i32(ids, {T}), 1.0f, &added_t, &none_t, f32(got, {n, T}));
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  }
}

TEST(StepApiEmbed, BadArgumentsAreErrors) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const int64_t n = 32, vocab = 4, n_added = 3;
  std::vector<float> table = random_normal(size_t(n * vocab), 50),
                     added = random_normal(size_t(n * n_added), 51);
  std::vector<float> out(size_t(n * 2));
  const Tensor tab = f32(table, {n, vocab});
  Tensor add = f32(added, {n, n_added});
  auto call = [&](std::vector<int32_t> ids, std::vector<int32_t> aids, bool with_added = true) {
    Tensor aid_t = i32(aids, {2});
    ops.embed_rows(s, tab, i32(ids, {2}), 2.0f, with_added ? &add : nullptr, &aid_t, f32(out, {n, 2}));
  };
  EXPECT_NO_THROW(call({3, -1}, {-1, 2}));
  EXPECT_THROW(call({4, 0}, {0, 0}), Error);      // id >= n_vocab
  EXPECT_THROW(call({-2, 0}, {0, 0}), Error);     // id < -1
  EXPECT_THROW(call({0, 1}, {3, 0}), Error);      // added id >= n_added
  EXPECT_THROW(call({0, 1}, {0, -5}), Error);     // added id < -1
  EXPECT_NO_THROW(call({0, 1}, {7, -5}, false));  // added_ids are ignored without added
  // added with the wrong row length; added without added_ids; out of the wrong shape.
  Tensor narrow = f32(added, {n - 8, n_added});
  std::vector<int32_t> ids = {0, 1}, aids = {0, 1};
  Tensor ids_t = i32(ids, {2}), aids_t = i32(aids, {2});
  EXPECT_THROW(ops.embed_rows(s, tab, ids_t, 1.0f, &narrow, &aids_t, f32(out, {n, 2})), Error);
  EXPECT_THROW(ops.embed_rows(s, tab, ids_t, 1.0f, &add, nullptr, f32(out, {n, 2})), Error);
  EXPECT_THROW(ops.embed_rows(s, tab, ids_t, 1.0f, nullptr, nullptr, f32(out, {n / 2, 4})), Error);
}

// ---- sampling reductions ----------------------------------------------------------------------------------

// The SamplerParams chain of backend.h, written literally: rank everything, apply each step, draw in id
// order.
int32_t sample_reference(const std::vector<float>& x, const SamplerParams& sp, float u) {
  const int64_t n = int64_t(x.size());
  if (sp.temperature <= 0.0f) return int32_t(std::max_element(x.begin(), x.end()) - x.begin());
  std::vector<int32_t> rank(static_cast<size_t>(n));
  std::iota(rank.begin(), rank.end(), 0);
  std::stable_sort(rank.begin(), rank.end(),
                   [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
  const double mx = x[size_t(rank[0])];
  int64_t kept = n;
  if (sp.top_k > 0) kept = std::min<int64_t>(kept, sp.top_k);
  if (sp.top_p < 1.0f) {
    double z = 0.0, cum = 0.0;
    for (int64_t i = 0; i < kept; ++i) z += std::exp(double(x[size_t(rank[size_t(i)])]) - mx);
    for (int64_t i = 0; i < kept; ++i) {
      cum += std::exp(double(x[size_t(rank[size_t(i)])]) - mx);
      if (cum >= double(sp.top_p) * z) {
        kept = i + 1;
        break;
      }
    }
  }
  std::vector<bool> keep(size_t(n), false);
  for (int64_t i = 0; i < kept; ++i) {
    const int32_t v = rank[size_t(i)];
    if (sp.min_p > 0.0f && std::exp(double(x[size_t(v)]) - mx) < double(sp.min_p)) continue;
    keep[size_t(v)] = true;
  }
  double total = 0.0;
  for (int64_t v = 0; v < n; ++v)
    if (keep[size_t(v)]) total += std::exp((double(x[size_t(v)]) - mx) / double(sp.temperature));
  double cum = 0.0;
  int32_t last = -1;
  for (int64_t v = 0; v < n; ++v) {
    if (!keep[size_t(v)]) continue;
    cum += std::exp((double(x[size_t(v)]) - mx) / double(sp.temperature));
    last = int32_t(v);
    if (cum > double(u) * total) return int32_t(v);
  }
  return last;
}

TEST(CpuSampling, ArgmaxTakesTheFirstMaximum) {
  std::vector<float> logits = random_normal(50 * 3, 1);
  logits[10] = 9.0f;
  logits[20] = 9.0f;  // tie in row 0: the first wins
  logits[50 + 49] = 7.0f;
  std::vector<int32_t> out(3);
  test_device().ops().argmax_rows(test_device().default_stream(), f32(logits, {50, 3}), i32(out, {3}));
  EXPECT_EQ(out[0], 10);
  EXPECT_EQ(out[1], 49);
  EXPECT_EQ(out[2], int32_t(std::max_element(logits.begin() + 100, logits.end()) - logits.begin() - 100));
}

TEST(CpuSampling, SampleRowsFollowsTheChainExactly) {
  const int64_t V = 500, T = 40;
  std::vector<float> logits = random_normal(size_t(V * T), 2, 2.0f);
  for (int64_t t = 0; t < T; t += 7) logits[size_t(t * V + 3)] = logits[size_t(t * V + 4)];  // ties
  std::vector<float> u(static_cast<size_t>(T));
  std::mt19937 rng(3);
  for (auto& v : u) v = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
  const SamplerParams chains[] = {{0.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.0f},    {0.7f, 40, 1.0f, 0.0f},
                                  {0.8f, 0, 0.9f, 0.0f}, {1.2f, 50, 0.95f, 0.05f}, {1.0f, 0, 1.0f, 0.1f},
                                  {0.5f, 1, 1.0f, 0.0f}, {1.0f, 1000, 0.5f, 0.0f}};
  for (const SamplerParams& sp : chains) {
    SCOPED_TRACE("temp=" + std::to_string(sp.temperature) + " top_k=" + std::to_string(sp.top_k) +
                 " top_p=" + std::to_string(sp.top_p) + " min_p=" + std::to_string(sp.min_p));
    std::vector<int32_t> out(static_cast<size_t>(T));
    test_device().ops().sample_rows(test_device().default_stream(), f32(logits, {V, T}), sp, f32(u, {T}),
                                    i32(out, {T}));
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
      ASSERT_EQ(out[size_t(t)], sample_reference(row, sp, u[size_t(t)])) << "row " << t;
    }
  }
}

TEST(CpuSampling, SampleRowsDistributionMatchesSoftmax) {
  // Many uniforms on one row: the frequencies follow softmax(logits / temperature) over the kept tokens.
  const int64_t V = 8, T = 20000;
  std::vector<float> row = {1.0f, 0.5f, -1.0f, 2.0f, 0.0f, -3.0f, 1.5f, 0.25f};
  std::vector<float> logits(size_t(V * T)), u(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    std::copy(row.begin(), row.end(), logits.begin() + t * V);
    u[size_t(t)] = (float(t) + 0.5f) / float(T);
  }
  SamplerParams sp{0.8f, 5, 1.0f, 0.0f};
  std::vector<int32_t> out(static_cast<size_t>(T));
  test_device().ops().sample_rows(test_device().default_stream(), f32(logits, {V, T}), sp, f32(u, {T}),
                                  i32(out, {T}));
  // top 5 by logit: ids 3, 6, 0, 1, 7
  const int kept[] = {3, 6, 0, 1, 7};
  double z = 0.0;
  for (int v : kept) z += std::exp(row[size_t(v)] / 0.8);
  std::vector<int> count(size_t(V), 0);
  for (int32_t v : out) ++count[size_t(v)];
  for (int v = 0; v < V; ++v) {
    const bool is_kept = std::find(std::begin(kept), std::end(kept), v) != std::end(kept);
    const double p = is_kept ? std::exp(row[size_t(v)] / 0.8) / z : 0.0;
    EXPECT_NEAR(count[size_t(v)] / double(T), p, 1.0 / double(T) + 1e-9) << "token " << v;
  }
}

TEST(CpuSampling, DiffusionSampleRows) {
  const int64_t V = 300, T = 9;
  std::vector<float> logits = random_normal(size_t(V * T), 5, 3.0f), u(static_cast<size_t>(T)),
                     entropy(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) u[size_t(t)] = (float(t) + 0.3f) / float(T);
  std::vector<int32_t> am(static_cast<size_t>(T)), smp(static_cast<size_t>(T));
  const float inv_temp = 1.0f / 0.7f;
  test_device().ops().diffusion_sample_rows(test_device().default_stream(), f32(logits, {V, T}), inv_temp,
                                            f32(u, {T}), i32(am, {T}), f32(entropy, {T}), i32(smp, {T}));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = logits.data() + t * V;
    std::vector<double> z(static_cast<size_t>(V));
    int32_t best = 0;
    for (int64_t v = 0; v < V; ++v) {
      z[size_t(v)] = double(x[v] * inv_temp);
      if (z[size_t(v)] > z[size_t(best)]) best = int32_t(v);
    }
    double sum = 0.0, h = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[size_t(v)] - z[size_t(best)]);
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(z[size_t(v)] - z[size_t(best)]) / sum;
      if (p > 0) h -= p * std::log(p);
    }
    double cum = 0.0;
    int32_t pick = int32_t(V - 1);
    for (int64_t v = 0; v < V; ++v) {
      cum += std::exp(z[size_t(v)] - z[size_t(best)]);
      if (cum >= double(u[size_t(t)]) * sum) {
        pick = int32_t(v);
        break;
      }
    }
    EXPECT_EQ(am[size_t(t)], best);
    EXPECT_NEAR(entropy[size_t(t)], h, 1e-5 * h + 1e-7);
    EXPECT_EQ(smp[size_t(t)], pick);
  }
}

TEST(CpuSampling, BadParametersAreErrors) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  std::vector<float> logits = random_normal(20, 1), u = {0.5f};
  std::vector<int32_t> out(1);
  EXPECT_THROW(ops.sample_rows(s, f32(logits, {20, 1}), {1.0f, -1, 1.0f, 0.0f}, f32(u, {1}), i32(out, {1})),
               Error);
  EXPECT_THROW(ops.sample_rows(s, f32(logits, {20, 1}), {1.0f, 0, 0.0f, 0.0f}, f32(u, {1}), i32(out, {1})),
               Error);
  std::vector<float> u_bad = {1.0f};
  EXPECT_THROW(ops.sample_rows(s, f32(logits, {20, 1}), {}, f32(u_bad, {1}), i32(out, {1})), Error);
  std::vector<float> u2 = {0.1f, 0.2f};
  EXPECT_THROW(ops.sample_rows(s, f32(logits, {20, 1}), {}, f32(u2, {2}), i32(out, {1})), Error);
}

// ---- the device -------------------------------------------------------------------------------------------

TEST(CpuDevice, AllocationCopiesAndFactory) {
  auto dev = create_device(DeviceId{DeviceKind::CPU, 2});
  EXPECT_EQ(dev->id(), (DeviceId{DeviceKind::CPU, 2}));
  EXPECT_GT(dev->total_memory(), 0u);
  EXPECT_NE(dev->name().find("cpu:2"), std::string::npos);
  Buffer b = dev->allocate(1000);
  ASSERT_TRUE(b);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_EQ(b.size(), 1000u);
  Buffer moved = std::move(b);
  EXPECT_FALSE(b);
  std::vector<uint8_t> src(1000);
  std::iota(src.begin(), src.end(), 0);
  Stream& s = dev->default_stream();
  dev->copy_from_host(s, moved.data(), src.data(), 1000);
  std::vector<uint8_t> back(1000);
  dev->copy_to_host(s, back.data(), moved.data(), 1000);
  EXPECT_EQ(back, src);
  // copy_2d: gather a 3 x 4 sub-matrix of a 3 x 10 byte matrix.
  std::vector<uint8_t> sub(12);
  dev->copy_2d(s, sub.data(), 4, src.data() + 2, 10, 4, 3, CopyKind::DeviceToHost);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(sub[size_t(r * 4 + c)], src[size_t(r * 10 + 2 + c)]);
  auto other = create_device(DeviceId{DeviceKind::CPU, 3});
  Buffer ob = other->allocate(1000);
  copy_between_devices(s, *other, ob.data(), *dev, moved.data(), 1000);
  EXPECT_EQ(std::memcmp(ob.data(), src.data(), 1000), 0);
  auto ev = dev->create_event();
  ev->record(s);
  ev->wait(*dev->create_stream());
  ev->synchronize();
  EXPECT_EQ(device_count(DeviceKind::CPU), 1);
#if !defined(TANDEM_HAVE_CUDA)
  EXPECT_THROW(create_device(DeviceId{DeviceKind::CUDA, 0}), Error);
#endif
}

}  // namespace
}  // namespace tandem::test
