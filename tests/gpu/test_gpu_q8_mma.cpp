// The tensor-core Q8_0 products of 8..16 columns (gemv_quant_mma.cu, TANDEM_Q8_MMA): every column of a
// T-column call must equal, bit for bit, the one-column call on that column through the direct kernel (the
// path a decode step of one row takes), for matmul and the fused forms (segments, SwiGLU, GeGLU with the
// norm, the residual add), and agree with the CPU. Shapes: K = 256 (only the block's first warp has blocks),
// 2304 (warps with 3 and 2 steps), 4096; N = 37 / 13 / 5 (partial tiles, three segments); T = 3 (below
// kQ8MmaMinCols: the direct kernel), 8, 9, 16 (one launch: one and two 8-column tiles), 24 and 21 (16 + 8 and
// 16 + 5 columns, batch-invariant mode: past one launch the fused products otherwise decline; the 5-column
// rest goes to the direct kernel).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_kernels.h"
#include "backend/kernel_profile.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

class GpuQ8Mma : public GpuTest {
 protected:
  void TearDown() override {
    cuda::set_q8_mma(std::nullopt);
    if (gpu_) gops().set_batch_invariant(false);
  }
  Pair weights(int64_t K, int64_t N, std::mt19937& rng) {
    std::vector<float> deq;
    const std::vector<uint8_t> bytes = random_weights(DType::Q8_0, K, N, rng, deq);
    return make(DType::Q8_0, {K, N}, bytes.data());
  }
  static std::vector<float> column(const std::vector<float>& v, int64_t rows, int64_t t) {
    return std::vector<float>(v.begin() + t * rows, v.begin() + (t + 1) * rows);
  }
};

// What one call of every form writes, for T columns of x (and r, the residual the add updates in place).
struct Outputs {
  std::vector<float> mm, multi[3], swiglu, geglu, add;
};

TEST_F(GpuQ8Mma, ColumnsEqualTheOneColumnProductBitForBit) {
  std::string why;
  std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
  ASSERT_NE(prof, nullptr) << why;
  uint32_t seed = 4242;
  const float eps = 1e-6f;
  for (int64_t K : {256, 2304, 4096}) {
    for (int64_t T : {3, 8, 9, 16, 24, 21}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " T=" + std::to_string(T));
      std::mt19937 rng(seed++);
      const int64_t Ns[3] = {37, 13, 5};
      const int64_t N = Ns[0];
      Pair W[3] = {weights(K, Ns[0], rng), weights(K, Ns[1], rng), weights(K, Ns[2], rng)};
      const std::vector<float> xv = random_floats(size_t(K * T), rng, -2.0f, 2.0f);
      const std::vector<float> rv = random_floats(size_t(N * T), rng, -3.0f, 3.0f);
      const std::vector<float> nw = random_floats(size_t(K), rng, 0.5f, 1.5f);
      Pair NW = make_f32({K}, nw);

      // Runs every form on columns x (T_ of them) and returns what they wrote.
      auto run = [&](const std::vector<float>& x, const std::vector<float>& r, int64_t T_) {
        Pair X = make_f32({K, T_}, x), H = make_out(DType::F32, {K, T_}), R = make_f32({N, T_}, r);
        Pair Y = make_out(DType::F32, {N, T_}), Tmp = make_out(DType::F32, {N, T_});
        Pair Ym[3] = {make_out(DType::F32, {Ns[0], T_}), make_out(DType::F32, {Ns[1], T_}),
                      make_out(DType::F32, {Ns[2], T_})};
        Pair G = make_out(DType::F32, {N, T_}), U = make_out(DType::F32, {N, T_}),
             O = make_out(DType::F32, {N, T_}), O2 = make_out(DType::F32, {N, T_});
        gops().matmul(gs(), W[0].dev, X.dev, Y.dev);
        const Tensor Wd[3] = {W[0].dev, W[1].dev, W[2].dev};
        const Tensor Yd[3] = {Ym[0].dev, Ym[1].dev, Ym[2].dev};
        gops().matmul_multi(gs(), Wd, X.dev, Yd);
        gops().matmul_swiglu(gs(), W[0].dev, W[0].dev, X.dev, G.dev, U.dev, O.dev);
        gops().norm_matmul_geglu(gs(), X.dev, NW.dev, eps, H.dev, W[0].dev, W[0].dev, G.dev, U.dev, O2.dev);
        gops().matmul_add(gs(), W[0].dev, X.dev, Tmp.dev, R.dev);
        gs().synchronize();
        Outputs o;
        o.mm = download_f32(Y);
        for (int s = 0; s < 3; ++s) o.multi[s] = download_f32(Ym[s]);
        o.swiglu = download_f32(O);
        o.geglu = download_f32(O2);
        o.add = download_f32(R);
        return o;
      };

      cuda::set_q8_mma(true);
      gops().set_batch_invariant(T > cuda::kQ8MmaMaxCols);
      Outputs many;
      const int64_t launches = launches_of(*gpu_, *prof, "gemv_q8_mma", [&] { many = run(xv, rv, T); });
      // matmul, matmul_multi, swiglu, geglu, add: one launch each per 16 columns (a rest of fewer than
      // kQ8MmaMinCols columns: the direct kernel)
      const int64_t chunks =
          T / cuda::kQ8MmaMaxCols + (T % cuda::kQ8MmaMaxCols >= cuda::kQ8MmaMinCols ? 1 : 0);
      EXPECT_EQ(launches, 5 * chunks) << "the tensor-core path did not take the products it should";

      cuda::set_q8_mma(false);
      gops().set_batch_invariant(false);
      for (int64_t t = 0; t < T; ++t) {
        const Outputs one = run(column(xv, K, t), column(rv, N, t), 1);
        auto same = [&](const std::vector<float>& a, const std::vector<float>& b, int64_t n,
                        const char* what) {
          for (int64_t o = 0; o < n; ++o)
            ASSERT_EQ(std::memcmp(&a[size_t(t * n + o)], &b[size_t(o)], 4), 0)
                << what << " column " << t << " row " << o << ": " << a[size_t(t * n + o)] << " vs "
                << b[size_t(o)];
        };
        same(many.mm, one.mm, N, "matmul");
        for (int s = 0; s < 3; ++s) same(many.multi[s], one.multi[s], Ns[s], "matmul_multi");
        same(many.swiglu, one.swiglu, N, "matmul_swiglu");
        same(many.geglu, one.geglu, N, "norm_matmul_geglu");
        same(many.add, one.add, N, "matmul_add");
      }

      // And against the CPU (the bound of test_gpu_matmul.cpp's quantized products).
      Pair X = make_f32({K, T}, xv), Yc = make_out(DType::F32, {N, T});
      cops().matmul(cs(), W[0].cpu, X.cpu, Yc.cpu);
      EXPECT_LT(rel_l2(many.mm, host_f32(Yc)), 3e-2);
    }
  }
}

// The wide form (TANDEM_Q8_MMA_WIDE, 17..64 columns of a plain product that need not be batch-invariant): one
// launch; every output within the bound of a product over 8-bit activations (test_gpu_fused_gemv.cpp's: the
// activations' rounding sum |W| d / 2, plus 1e-5 of sum |W x|); a column's value independent of the other
// columns of the call (the first 17 columns of a 40- or 64-column call equal a 17-column call's, bit for
// bit); and a batch-invariant session does not take it (the exact 16-column launches instead).
TEST_F(GpuQ8Mma, WideColumnsAreCloseAndIndependentOfTheOthers) {
  ForcedSwitch q8_mma(cuda::set_q8_mma, true), q8_mma_wide(cuda::set_q8_mma_wide, true);
  std::string why;
  std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
  ASSERT_NE(prof, nullptr) << why;
  uint32_t seed = 777;
  for (int64_t K : {256, 2304, 4096}) {
    std::vector<float> first17;
    for (int64_t T : {int64_t(17), int64_t(24), int64_t(cuda::kQ8WideMaxCols), int64_t(cuda::kQ8WideMaxCols) + 1}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " T=" + std::to_string(T));
      std::mt19937 rng(seed + uint32_t(K));  // the same weights and the same first columns for every T
      const int64_t N = 37;
      std::vector<float> w;
      const std::vector<uint8_t> bytes = random_weights(DType::Q8_0, K, N, rng, w);
      Pair W = make(DType::Q8_0, {K, N}, bytes.data());
      const std::vector<float> xv = random_floats(size_t(K * (cuda::kQ8WideMaxCols + 1)), rng, -2.0f, 2.0f);
      const std::vector<float> xt(xv.begin(), xv.begin() + K * T);
      Pair X = make_f32({K, T}, xt), Y = make_out(DType::F32, {N, T});
      gops().set_batch_invariant(false);
      const bool wide = T <= cuda::kQ8WideMaxCols;  // past it, the dequantized weights and cuBLAS
      EXPECT_EQ(launches_of(*gpu_, *prof, "gemv_q8_mma", [&] { gops().matmul(gs(), W.dev, X.dev, Y.dev); }),
                wide ? 1 : 0);
      const std::vector<float> y = download_f32(Y);
      std::vector<double> sum_abs(size_t(N * T));  // sum |W x| of each output
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < N; ++o) {
          const float* x = xt.data() + t * K;
          double e = 0, S = 0, qerr = 0;
          for (int64_t b = 0; b < K; b += 32) {
            float amax = 0;
            for (int64_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
            for (int64_t i = b; i < b + 32; ++i) {
              const double p = double(w[size_t(o * K + i)]) * x[i];
              e += p;
              S += std::fabs(p);
              qerr += std::fabs(w[size_t(o * K + i)]) * amax / 127.0 / 2;
            }
          }
          ASSERT_LE(std::fabs(y[size_t(t * N + o)] - e), qerr + 1e-5 * S + 1e-6)
              << "y[" << o << ", " << t << "]";
          sum_abs[size_t(t * N + o)] = S;
        }
      if (T == 17) {
        first17 = y;
      } else if (wide) {
        EXPECT_EQ(std::memcmp(first17.data(), y.data(), first17.size() * 4), 0)
            << "the first 17 columns changed with the other columns of the call";
      }
      gops().set_batch_invariant(true);
      EXPECT_EQ(launches_of(*gpu_, *prof, "gemv_q8_mma", [&] { gops().matmul(gs(), W.dev, X.dev, Y.dev); }),
                T / cuda::kQ8MmaMaxCols + (T % cuda::kQ8MmaMaxCols >= cuda::kQ8MmaMinCols ? 1 : 0))
          << "a batch-invariant session took the wide path";
      gops().set_batch_invariant(false);
      // The same 8-bit activations and integer sums as the exact kernel: only the order of the K / 32 float
      // terms differs (a bound that a wrong scale or column would break, unlike the one above).
      const std::vector<float> y_exact = download_f32(Y);
      for (size_t i = 0; wide && i < y.size(); ++i)
        ASSERT_LE(std::fabs(double(y[i]) - y_exact[i]), 2e-5 * sum_abs[i] + 1e-6) << "output " << i;
    }
  }
}

}  // namespace
}  // namespace tandem::gpu_test
