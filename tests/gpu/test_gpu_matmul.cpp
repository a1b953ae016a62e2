// CUDA matmul against the exact product (double precision, dequantized weights) for every weight dtype, on odd
// shapes (K, N and T not multiples of any tile) that reach every path: the scalar and the vector
// matrix-vector kernels (T = 1), the integer-dot-product kernel (quantized, T <= 8) and cuBLASLt (larger T).
//
// Error bounds, per output element, with S = sum_i |W[i, o] x[i, t]|:
//   F32/F16/BF16 weights, T = 1: f32 products and sums: |err| <= 1e-5 S.
//   F16/BF16 weights, T > 1 (cuBLASLt): x is rounded to the weight's 16-bit type (unit roundoff 2^-9 bf16,
//     2^-12 f16): |err| <= 2^-8 S (bf16), 2^-10 S (f16), plus 1e-5 S. F32: 1e-5 S.
//   quantized, T <= 8: x is rounded to multiples of d = max|x over its 32 values| / 127 (backend.h):
//     |err| <= sum_i |W[i, o]| d(i) / 2 + 1e-5 S.
//   quantized, T > 8: W and x are rounded to bf16: |err| <= 2^-7 S.
// The CPU op's result is also compared, as a relative L2 error, within the sum of both backends' bounds.
#include <algorithm>

#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

struct MatmulCase {
  DType type;
  int64_t K, N, T;
};

class GpuMatmul : public GpuTest {
 protected:
  void run_case(const MatmulCase& c, uint32_t seed, bool strided) {
    SCOPED_TRACE(std::string(dtype_name(c.type)) + " K=" + std::to_string(c.K) + " N=" + std::to_string(c.N) +
                 " T=" + std::to_string(c.T) + (strided ? " strided x/y" : ""));
    std::mt19937 rng(seed);
    std::vector<float> w;
    const std::vector<uint8_t> wbytes = random_weights(c.type, c.K, c.N, rng, w);
    Pair W = make(c.type, {c.K, c.N}, wbytes.data());
    // x and y: contiguous, or every other row of a buffer twice as tall (row stride 2 * row bytes).
    const int64_t rows = strided ? 2 * c.T : c.T;
    const std::vector<float> xbuf = random_floats(size_t(c.K * rows), rng, -2.0f, 2.0f);
    Pair X = make_f32({c.K, rows}, xbuf);
    Pair Y = make_out(DType::F32, {c.N, rows});
    Tensor xv = X.dev, yv = Y.dev, xc = X.cpu, yc = Y.cpu;
    if (strided) {
      for (Tensor* t : {&xv, &yv, &xc, &yc}) {
        t->ne[1] = c.T;
        t->nb[1] *= 2;
        t->nb[2] = t->nb[1] * size_t(c.T);
        t->nb[3] = t->nb[2];
      }
    }
    gops().matmul(gs(), W.dev, xv, yv);
    gs().synchronize();
    const std::vector<float> y = download_f32(Y);
    cops().matmul(cs(), W.cpu, xc, yc);
    const std::vector<float> ycpu = host_f32(Y);

    const bool quant = dtype_traits(c.type).quantized;
    const double rel16 = c.type == DType::BF16 ? std::ldexp(1.0, -8) : c.type == DType::F16 ? std::ldexp(1.0, -10) : 0.0;
    double worst = 0;
    std::vector<float> got, exp_v;
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t xr = strided ? 2 * t : t;
      const float* x = xbuf.data() + xr * c.K;
      std::vector<double> d(static_cast<size_t>(c.K / 32));
      for (int64_t b = 0; b < c.K / 32; ++b) {
        float m = 0;
        for (int i = 0; i < 32; ++i) m = std::max(m, std::fabs(x[b * 32 + i]));
        d[size_t(b)] = m / 127.0;
      }
      for (int64_t o = 0; o < c.N; ++o) {
        double exact = 0, S = 0, qerr = 0;
        for (int64_t i = 0; i < c.K; ++i) {
          const double p = double(w[size_t(o * c.K + i)]) * x[i];
          exact += p;
          S += std::fabs(p);
          if (quant) qerr += std::fabs(w[size_t(o * c.K + i)]) * d[size_t(i / 32)] / 2;
        }
        double bound;
        if (!quant) {
          bound = (c.T > 1 ? rel16 : 0.0) * S + 1e-5 * S;
        } else {
          bound = c.T <= 8 ? qerr + 1e-5 * S : std::ldexp(1.0, -7) * S;
        }
        bound += 1e-6;
        const float g = y[size_t(xr * c.N + o)];
        ASSERT_TRUE(std::isfinite(g)) << "y[" << o << ", " << t << "] not written";
        ASSERT_LE(std::fabs(g - exact), bound) << "y[" << o << ", " << t << "] = " << g << ", exact " << exact;
        worst = std::max(worst, std::fabs(g - exact) / bound);
        got.push_back(g);
        exp_v.push_back(ycpu[size_t(xr * c.N + o)]);
      }
    }
    // Rows of y between the strided rows must be left alone (still poisoned).
    if (strided) {
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t o = 0; o < c.N; ++o) ASSERT_TRUE(std::isnan(y[size_t((2 * t + 1) * c.N + o)]));
    }
    // CPU vs CUDA: both are within their bounds of the exact product; quantized paths differ most (CPU K-types
    // quantize x per 256 values): a relative L2 difference of 3% is far outside what either should produce.
    EXPECT_LT(rel_l2(got, exp_v), quant ? 3e-2 : 1e-2);
  }
};

TEST_F(GpuMatmul, DenseWeights) {
  uint32_t seed = 1;
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (auto [K, N] : {std::pair<int64_t, int64_t>{100, 37}, {1000, 129}})
      for (int64_t T : {1, 3, 8, 9, 40}) run_case({t, K, N, T}, seed++, false);
}

TEST_F(GpuMatmul, QuantizedWeights) {
  uint32_t seed = 100;
  for (DType t : {DType::Q8_0, DType::Q4_0})
    for (auto [K, N] : {std::pair<int64_t, int64_t>{96, 37}, {1056, 130}})
      for (int64_t T : {1, 5, 8, 9, 32, 33, 70}) run_case({t, K, N, T}, seed++, false);
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K})
    for (auto [K, N] : {std::pair<int64_t, int64_t>{256, 37}, {768, 130}})
      for (int64_t T : {1, 5, 8, 9, 32, 33, 70}) run_case({t, K, N, T}, seed++, false);
}

TEST_F(GpuMatmul, StridedActivations) {
  uint32_t seed = 500;
  for (DType t : {DType::BF16, DType::Q8_0, DType::Q4_K})
    for (int64_t T : {1, 4, 12, 40}) run_case({t, 512, 65, T}, seed++, true);
}

TEST_F(GpuMatmul, RejectsBadInput) {
  std::mt19937 rng(7);
  std::vector<float> w;
  const auto wb = random_weights(DType::BF16, 64, 8, rng, w);
  Pair W = make(DType::BF16, {64, 8}, wb.data());
  Pair X = make_f32({64, 2}, random_floats(128, rng));
  Pair Y = make_out(DType::F32, {8, 2});
  Pair Ybad = make_out(DType::F32, {9, 2});
  EXPECT_THROW(gops().matmul(gs(), W.dev, X.dev, Ybad.dev), Error);
  EXPECT_THROW(gops().matmul(gs(), W.cpu, X.dev, Y.dev), Error);  // weights on the host
  // More rows than the workspace was reserved for: an Error, not an allocation.
  std::vector<float> big_x(size_t(64) * 300);
  Pair Xbig = make_f32({64, 300}, big_x);
  Pair Ybig = make_out(DType::F32, {8, 300});
  EXPECT_THROW(gops().matmul(gs(), W.dev, Xbig.dev, Ybig.dev), Error);
}

}  // namespace
}  // namespace tandem::gpu_test
