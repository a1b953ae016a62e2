// The mixture-of-experts ops on the CPU (backend.h: moe_route, matmul_id, moe_combine) against
// straightforward references written here: the router against a double-precision softmax / top-k /
// renormalisation; the expert matmul for every weight dtype against a double product with the dequantized
// weights (and bit for bit against Ops::matmul on each selected expert, which shares its kernels), with the
// input shared by the selected experts or one input per selected expert, few and many routed rows, and
// strided expert views (a fused gate_up half); the weighted sum against a double sum. Bad arguments are
// Errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "quant/quant.h"
#include "test_cpu_ops_util.h"

namespace tandem::test {
namespace {

class CpuMoeOps : public SimdParam {};

// Routing ids {k, T} with every expert in [0, n_expert), distinct per row, skewed so that some experts get
// many rows (more than one 64-row tile) and some none.
std::vector<int32_t> random_ids(int64_t k, int64_t T, int64_t n_expert, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(n_expert));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin() + 1, all.end(), rng);  // expert 0 in every row
    if (rng() % 2) std::swap(all[0], all[1]);
    ids.insert(ids.end(), all.begin(), all.begin() + k);
  }
  return ids;
}

TEST_P(CpuMoeOps, RouteIsSoftmaxTopKRenormalisedAndScaled) {
  const int64_t n_expert = 10, T = 7;
  std::vector<float> logits = random_normal(size_t(n_expert * T), 3, 2.0f);
  logits[5] = logits[3];  // a tie in row 0: the lower index wins
  std::vector<float> scale = random_normal(size_t(n_expert), 4);
  for (int64_t k : {1, 3, 10}) {
    for (bool with_scale : {false, true}) {
      SCOPED_TRACE("k " + std::to_string(k) + (with_scale ? " scaled" : ""));
      std::vector<int32_t> ids(size_t(k * T), -7);
      std::vector<float> w(size_t(k * T), -7.0f);
      Tensor st = f32(scale, {n_expert});
      ops().moe_route(stream(), f32(logits, {n_expert, T}), with_scale ? &st : nullptr, i32(ids, {k, T}),
                      f32(w, {k, T}));
      for (int64_t t = 0; t < T; ++t) {
        const float* l = logits.data() + t * n_expert;
        std::vector<int> order(static_cast<size_t>(n_expert));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
        double mx = *std::max_element(l, l + n_expert), z = 0, sel = 0;
        for (int64_t e = 0; e < n_expert; ++e) z += std::exp(double(l[e]) - mx);
        for (int64_t j = 0; j < k; ++j) sel += std::exp(double(l[order[size_t(j)]]) - mx) / z;
        for (int64_t j = 0; j < k; ++j) {
          const int e = order[size_t(j)];
          ASSERT_EQ(ids[size_t(t * k + j)], e) << "row " << t << " choice " << j;
          const double want = std::exp(double(l[e]) - mx) / z / std::max(sel, 6.1035e-5) *
                              (with_scale ? double(scale[size_t(e)]) : 1.0);
          EXPECT_NEAR(w[size_t(t * k + j)], want, 1e-6 * std::max(1.0, std::abs(want)));
        }
      }
    }
  }
}

struct IdCase {
  int64_t K, N, n_expert, k, T, kx;
};

// W {K, N, n_expert} of dtype dt (rows quantized from random values), y = matmul_id, checked against the
// double product with the dequantized weights and against Ops::matmul on each selected expert.
void check_matmul_id(Ops& ops, Stream& st, DType dt, const IdCase& c, bool fused_half) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " K " + std::to_string(c.K) + " T " + std::to_string(c.T) +
               " kx " + std::to_string(c.kx) + (fused_half ? " fused" : ""));
  const int64_t rows_per_expert = fused_half ? 2 * c.N : c.N;  // fused: use the second half as W
  const size_t row_bytes = dtype_row_bytes(dt, c.K);
  const std::vector<float> wf = random_normal(size_t(c.K * rows_per_expert * c.n_expert), 11, 0.5f);
  std::vector<uint8_t> wq(row_bytes * size_t(rows_per_expert * c.n_expert));
  std::vector<float> wd(wf.size());
  for (int64_t r = 0; r < rows_per_expert * c.n_expert; ++r) {
    quant::quantize_row(dt, wf.data() + r * c.K, wq.data() + size_t(r) * row_bytes, c.K);
    quant::dequantize_row(dt, wq.data() + size_t(r) * row_bytes, wd.data() + r * c.K, c.K);
  }
  Tensor W = Tensor::contiguous(dt, {c.K, rows_per_expert, c.n_expert}, wq.data());
  const int64_t row0 = fused_half ? c.N : 0;
  if (fused_half) {
    W.data = wq.data() + size_t(c.N) * row_bytes;
    W.ne[1] = c.N;  // nb[1], nb[2] stay the fused tensor's
  }
  std::vector<float> x = random_normal(size_t(c.K * c.kx * c.T), 12);
  std::vector<int32_t> ids = random_ids(c.k, c.T, c.n_expert, 13);
  std::vector<float> y(size_t(c.N * c.k * c.T), -1.0f);
  ops.matmul_id(st, W, f32(x, {c.K, c.kx, c.T}), i32(ids, {c.k, c.T}), f32(y, {c.N, c.k, c.T}));

  const double tol = dt == DType::F32 || dt == DType::F16 || dt == DType::BF16 ? 1e-5 : 2e-2;
  double worst = 0, scale = 0;
  std::vector<float> one(static_cast<size_t>(c.N));
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t j = 0; j < c.k; ++j) {
      const int64_t e = ids[size_t(t * c.k + j)];
      const float* xr = x.data() + (t * c.kx + (c.kx == 1 ? 0 : j)) * c.K;
      for (int64_t o = 0; o < c.N; ++o) {
        const float* wr = wd.data() + (e * rows_per_expert + row0 + o) * c.K;
        double ref = 0;
        for (int64_t i = 0; i < c.K; ++i) ref += double(wr[i]) * double(xr[i]);
        worst = std::max(worst, std::abs(double(y[size_t((t * c.k + j) * c.N + o)]) - ref));
        scale = std::max(scale, std::abs(ref));
      }
      // Ops::matmul on the expert's matrix gives the same values bit for bit (the same kernels).
      Tensor We = W;
      We.data = static_cast<char*>(W.data) + size_t(e) * W.nb[2];
      We.ne[2] = 1;
      We.nb[3] = We.nb[2] = We.nb[1] * size_t(c.N);
      std::vector<float> xcopy(xr, xr + c.K);
      ops.matmul(st, We, f32(xcopy, {c.K, 1}), f32(one, {c.N, 1}));
      for (int64_t o = 0; o < c.N; ++o)
        ASSERT_EQ(y[size_t((t * c.k + j) * c.N + o)], one[size_t(o)]) << "row " << t << " expert " << e;
    }
  }
  EXPECT_LE(worst / scale, tol);
}

TEST_P(CpuMoeOps, MatmulIdMatchesTheDequantizedProductForEveryDtype) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K,
                   DType::Q6_K}) {
    check_matmul_id(ops(), stream(), dt, {256, 24, 5, 2, 1, 1}, false);   // decode, shared input
    check_matmul_id(ops(), stream(), dt, {256, 24, 5, 2, 3, 2}, false);   // one input per expert
    check_matmul_id(ops(), stream(), dt, {512, 40, 6, 3, 70, 1}, false);  // > 64 rows on expert 0
    check_matmul_id(ops(), stream(), dt, {256, 16, 4, 2, 9, 2}, true);    // a fused gate_up half
  }
}

TEST_P(CpuMoeOps, CombineIsTheWeightedSumOverTheSelectedExperts) {
  const int64_t n = 37, k = 3, T = 5;
  std::vector<float> y = random_normal(size_t(n * k * T), 21), w = random_normal(size_t(k * T), 22);
  std::vector<float> out(size_t(n * T), -1.0f);
  ops().moe_combine(stream(), f32(y, {n, k, T}), f32(w, {k, T}), f32(out, {n, T}));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int64_t j = 0; j < k; ++j) ref += double(w[size_t(t * k + j)]) * y[size_t((t * k + j) * n + i)];
      EXPECT_NEAR(out[size_t(t * n + i)], ref, 1e-5 * std::max(1.0, std::abs(ref)));
    }
}

TEST_P(CpuMoeOps, BadArgumentsAreErrors) {
  std::vector<float> logits = random_normal(8, 1), w(16);
  std::vector<int32_t> ids(16);
  // k > n_expert
  EXPECT_THROW(ops().moe_route(stream(), f32(logits, {4, 2}), nullptr, i32(ids, {5, 2}), f32(w, {5, 2})),
               Error);
  // ids / weights of the wrong dtype
  EXPECT_THROW(ops().moe_route(stream(), f32(logits, {4, 2}), nullptr, f32(w, {2, 2}), f32(w, {2, 2})),
               Error);
  std::vector<float> wt = random_normal(32 * 4 * 3, 2), x = random_normal(32 * 2, 3), y(4 * 2 * 2);
  Tensor W = f32(wt, {32, 4, 3});
  std::vector<int32_t> good = {0, 2, 1, 0}, bad = {0, 3, 1, 0}, neg = {0, -1, 1, 0};
  ops().matmul_id(stream(), W, f32(x, {32, 1, 2}), i32(good, {2, 2}), f32(y, {4, 2, 2}));
  EXPECT_THROW(ops().matmul_id(stream(), W, f32(x, {32, 1, 2}), i32(bad, {2, 2}), f32(y, {4, 2, 2})), Error);
  EXPECT_THROW(ops().matmul_id(stream(), W, f32(x, {32, 1, 2}), i32(neg, {2, 2}), f32(y, {4, 2, 2})), Error);
  // x of the wrong width, y of the wrong shape
  EXPECT_THROW(ops().matmul_id(stream(), W, f32(x, {16, 1, 4}), i32(good, {2, 2}), f32(y, {4, 2, 2})), Error);
  EXPECT_THROW(ops().matmul_id(stream(), W, f32(x, {32, 1, 2}), i32(good, {2, 2}), f32(y, {8, 1, 2})), Error);
  std::vector<float> out(4 * 2);
  EXPECT_THROW(ops().moe_combine(stream(), f32(y, {4, 2, 2}), f32(w, {3, 2}), f32(out, {4, 2})), Error);
}

INSTANTIATE_TEST_SUITE_P(Simd, CpuMoeOps, ::testing::Bool(), simd_name);

}  // namespace
}  // namespace tandem::test
