// The fused decode products (Ops::matmul_multi, matmul_swiglu, matmul_add) on CUDA, for every weight dtype,
// on odd shapes (K not a multiple of the kernels' unrolled stride, N not a multiple of the rows per warp or
// block), T = 1..9 (9: past the fused kernels, the composition runs), random inputs:
//   - against the exact product (double, dequantized weights) with the bounds of test_gpu_matmul.cpp:
//     dense T <= 8: 1e-5 S (f32 products and sums, S = sum |W x|); quantized T <= 8: sum |W| d / 2 + 1e-5 S
//     (x rounded to multiples of d = max|x over 32| / 127); T > 8: 2^-8 S (bf16 x), 2^-10 S (f16), 2^-7 S
//     (quant);
//   - against the CPU composition (relative L2, as test_gpu_matmul.cpp);
//   - batch invariance: column t of a T-column call equals the 1-column call on that column, bit for bit, for
//     matmul and the three fused ops (speculative verify compares its rows with plain decode).
#include <algorithm>
#include <cmath>
#include <functional>

#include "backend/cuda/cuda_kernels.h"
#include "backend/kernel_profile.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

struct Mat {
  DType type;
  int64_t K, N;
  std::vector<float> w;  // dequantized, row o at w[o * K]
  Pair p;
};

class GpuFusedGemv : public GpuTest {
 protected:
  Mat make_mat(DType t, int64_t K, int64_t N, std::mt19937& rng) {
    Mat m{t, K, N, {}, {}};
    const std::vector<uint8_t> bytes = random_weights(t, K, N, rng, m.w);
    m.p = make(t, {K, N}, bytes.data());
    return m;
  }

  // The T columns of K values of x normed with weights nw, as rms_norm computes them (the sum of squares in double).
  static std::vector<float> normed(const std::vector<float>& xv, const std::vector<float>& nw, int64_t K, int64_t T,
                                   float eps) {
    std::vector<float> hv(xv.size());
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < K; ++i) ss += double(xv[size_t(t * K + i)]) * xv[size_t(t * K + i)];
      const float inv = float(1.0 / std::sqrt(ss / double(K) + eps));
      for (int64_t i = 0; i < K; ++i) hv[size_t(t * K + i)] = xv[size_t(t * K + i)] * inv * nw[size_t(i)];
    }
    return hv;
  }

  // |err| bound of y[o, t] = W x[:, t] on the GPU, and the exact value.
  static double exact(const Mat& m, const float* x, int64_t o, int64_t T, double& bound) {
    const bool quant = dtype_traits(m.type).quantized;
    double e = 0, S = 0, qerr = 0;
    for (int64_t b = 0; b < m.K; b += 32) {
      float amax = 0;
      for (int64_t i = b; i < std::min(b + 32, m.K); ++i) amax = std::max(amax, std::fabs(x[i]));
      for (int64_t i = b; i < std::min(b + 32, m.K); ++i) {
        const double p = double(m.w[size_t(o * m.K + i)]) * x[i];
        e += p;
        S += std::fabs(p);
        qerr += std::fabs(m.w[size_t(o * m.K + i)]) * amax / 127.0 / 2;
      }
    }
    if (T <= 8) {
      bound = (quant ? qerr : 0.0) + 1e-5 * S;
    } else {
      const double rel = quant                   ? std::ldexp(1.0, -7)
                         : m.type == DType::BF16 ? std::ldexp(1.0, -8)
                         : m.type == DType::F16  ? std::ldexp(1.0, -10)
                                                 : 0.0;
      bound = rel * S + 1e-5 * S;
    }
    bound += 1e-6;
    return e;
  }

  // Every dtype with its odd shapes: {K, N of Q, K, V-like segments}.
  struct Shape {
    DType type;
    int64_t K;
  };
  static std::vector<Shape> shapes() {
    std::vector<Shape> s;
    for (DType t : {DType::F32, DType::F16, DType::BF16})
      for (int64_t K : {100, 1000, 2056}) s.push_back({t, K});  // 100: no 16-byte path for 16-bit types
    for (DType t : {DType::Q8_0, DType::Q4_0})
      for (int64_t K : {96, 1056, 2304}) s.push_back({t, K});  // 2304 (K % 256 == 0): Q8_0's direct path
    for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K})
      for (int64_t K : {256, 2304}) s.push_back({t, K});
    return s;
  }
};

TEST_F(GpuFusedGemv, MultiMatchesExactProductAndCpu) {
  uint32_t seed = 11;
  for (const Shape& sh : shapes()) {
    for (int64_t T : {1, 3, 8, 9}) {
      SCOPED_TRACE(std::string(dtype_name(sh.type)) + " K=" + std::to_string(sh.K) +
                   " T=" + std::to_string(T));
      std::mt19937 rng(seed++);
      const int64_t Ns[3] = {37, 13, 5};
      Mat m[3] = {make_mat(sh.type, sh.K, Ns[0], rng), make_mat(sh.type, sh.K, Ns[1], rng),
                  make_mat(sh.type, sh.K, Ns[2], rng)};
      const std::vector<float> xv = random_floats(size_t(sh.K * T), rng, -2.0f, 2.0f);
      Pair X = make_f32({sh.K, T}, xv);
      Pair Y[3] = {make_out(DType::F32, {Ns[0], T}), make_out(DType::F32, {Ns[1], T}),
                   make_out(DType::F32, {Ns[2], T})};
      const Tensor Wd[3] = {m[0].p.dev, m[1].p.dev, m[2].p.dev};
      const Tensor Yd[3] = {Y[0].dev, Y[1].dev, Y[2].dev};
      gops().matmul_multi(gs(), Wd, X.dev, Yd);
      gs().synchronize();
      const Tensor Wc[3] = {m[0].p.cpu, m[1].p.cpu, m[2].p.cpu};
      const Tensor Yc[3] = {Y[0].cpu, Y[1].cpu, Y[2].cpu};
      cops().matmul_multi(cs(), Wc, X.cpu, Yc);
      for (int s = 0; s < 3; ++s) {
        const std::vector<float> y = download_f32(Y[s]);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t o = 0; o < Ns[s]; ++o) {
            double bound;
            const double e = exact(m[s], xv.data() + t * sh.K, o, T, bound);
            const float g = y[size_t(t * Ns[s] + o)];
            ASSERT_TRUE(std::isfinite(g)) << "segment " << s << " y[" << o << ", " << t << "] not written";
            ASSERT_LE(std::fabs(g - e), bound) << "segment " << s << " y[" << o << ", " << t << "]";
          }
        EXPECT_LT(rel_l2(y, host_f32(Y[s])), dtype_traits(sh.type).quantized ? 3e-2 : 1e-2)
            << "segment " << s;
      }
    }
  }
}

TEST_F(GpuFusedGemv, SwigluMatchesExactProductAndCpu) {
  uint32_t seed = 300;
  for (const Shape& sh : shapes()) {
    for (int64_t T : {1, 2, 8, 9}) {
      SCOPED_TRACE(std::string(dtype_name(sh.type)) + " K=" + std::to_string(sh.K) +
                   " T=" + std::to_string(T));
      std::mt19937 rng(seed++);
      const int64_t N = 41;  // odd: the last unit of gate/up rows is partial
      Mat g = make_mat(sh.type, sh.K, N, rng), u = make_mat(sh.type, sh.K, N, rng);
      const std::vector<float> xv = random_floats(size_t(sh.K * T), rng, -2.0f, 2.0f);
      Pair X = make_f32({sh.K, T}, xv);
      Pair G = make_out(DType::F32, {N, T}), U = make_out(DType::F32, {N, T}),
           O = make_out(DType::F32, {N, T});
      gops().matmul_swiglu(gs(), g.p.dev, u.p.dev, X.dev, G.dev, U.dev, O.dev);
      gs().synchronize();
      cops().matmul_swiglu(cs(), g.p.cpu, u.p.cpu, X.cpu, G.cpu, U.cpu, O.cpu);
      const std::vector<float> out = download_f32(O);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < N; ++o) {
          double bg, bu;
          const double eg = exact(g, xv.data() + t * sh.K, o, T, bg);
          const double eu = exact(u, xv.data() + t * sh.K, o, T, bu);
          const double sg = eg / (1.0 + std::exp(-eg));
          const double e = sg * eu;
          // silu' <= 1.1: |d(silu(g) u)| <= 1.1 bg (|u| + bu) + |silu(g)| bu, plus f32 rounding of the
          // result.
          const double bound =
              1.1 * bg * (std::fabs(eu) + bu) + std::fabs(sg) * bu + 1e-5 * std::fabs(e) + 1e-6;
          const float v = out[size_t(t * N + o)];
          ASSERT_TRUE(std::isfinite(v)) << "out[" << o << ", " << t << "] not written";
          ASSERT_LE(std::fabs(v - e), bound) << "out[" << o << ", " << t << "]";
        }
      EXPECT_LT(rel_l2(out, host_f32(O)), dtype_traits(sh.type).quantized ? 3e-2 : 1e-2);
    }
  }
}

TEST_F(GpuFusedGemv, AddMatchesExactProductAndCpu) {
  uint32_t seed = 600;
  for (const Shape& sh : shapes()) {
    for (int64_t T : {1, 5, 8, 9}) {
      SCOPED_TRACE(std::string(dtype_name(sh.type)) + " K=" + std::to_string(sh.K) +
                   " T=" + std::to_string(T));
      std::mt19937 rng(seed++);
      const int64_t N = 29;
      Mat m = make_mat(sh.type, sh.K, N, rng);
      const std::vector<float> xv = random_floats(size_t(sh.K * T), rng, -2.0f, 2.0f);
      const std::vector<float> rv = random_floats(size_t(N * T), rng, -3.0f, 3.0f);
      Pair X = make_f32({sh.K, T}, xv);
      Pair Y = make_f32({N, T}, rv);  // the residual, updated in place
      Pair tmp = make_out(DType::F32, {N, T});
      gops().matmul_add(gs(), m.p.dev, X.dev, tmp.dev, Y.dev);
      gs().synchronize();
      cops().matmul_add(cs(), m.p.cpu, X.cpu, tmp.cpu, Y.cpu);
      const std::vector<float> y = download_f32(Y);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < N; ++o) {
          double bound;
          const double e = exact(m, xv.data() + t * sh.K, o, T, bound) + rv[size_t(t * N + o)];
          bound += 1e-6 * std::fabs(e);
          const float v = y[size_t(t * N + o)];
          ASSERT_TRUE(std::isfinite(v)) << "y[" << o << ", " << t << "]";
          ASSERT_LE(std::fabs(v - e), bound) << "y[" << o << ", " << t << "]";
        }
      EXPECT_LT(rel_l2(y, host_f32(Y)), dtype_traits(sh.type).quantized ? 3e-2 : 1e-2);
    }
  }
}

// rms_norm fused into the products (Ops::norm_matmul_multi / norm_matmul_swiglu): the dense kernels norm x on
// the way, the quantized path norms it in the activation quantization. Against the exact product of the
// normed x (double norm, the bounds above) and against the CPU composition; T = 9 runs the composition on
// CUDA.
TEST_F(GpuFusedGemv, NormFusedMatchesExactProductAndCpu) {
  uint32_t seed = 2100;
  const float eps = 1e-5f;
  for (const Shape& sh : shapes()) {
    for (int64_t T : {1, 3, 8, 9}) {
      SCOPED_TRACE(std::string(dtype_name(sh.type)) + " K=" + std::to_string(sh.K) +
                   " T=" + std::to_string(T));
      std::mt19937 rng(seed++);
      const int64_t Ns[3] = {37, 13, 5};
      Mat m[3] = {make_mat(sh.type, sh.K, Ns[0], rng), make_mat(sh.type, sh.K, Ns[1], rng),
                  make_mat(sh.type, sh.K, Ns[2], rng)};
      const std::vector<float> xv = random_floats(size_t(sh.K * T), rng, -2.0f, 2.0f);
      const std::vector<float> nw = random_floats(size_t(sh.K), rng, 0.5f, 1.5f);
      const std::vector<float> hv = normed(xv, nw, sh.K, T, eps);
      Pair X = make_f32({sh.K, T}, xv), NW = make_f32({sh.K}, nw), H = make_out(DType::F32, {sh.K, T});
      Pair Y[3] = {make_out(DType::F32, {Ns[0], T}), make_out(DType::F32, {Ns[1], T}),
                   make_out(DType::F32, {Ns[2], T})};
      const Tensor Wd[3] = {m[0].p.dev, m[1].p.dev, m[2].p.dev};
      const Tensor Yd[3] = {Y[0].dev, Y[1].dev, Y[2].dev};
      gops().norm_matmul_multi(gs(), X.dev, NW.dev, eps, H.dev, Wd, Yd);
      // gate/up/out of the SwiGLU form over the first two matrices' rows (equal N: the first 13 of m[0]).
      Mat g = make_mat(sh.type, sh.K, 13, rng);
      Pair G = make_out(DType::F32, {13, T}), U = make_out(DType::F32, {13, T}),
           O = make_out(DType::F32, {13, T});
      gops().norm_matmul_swiglu(gs(), X.dev, NW.dev, eps, H.dev, g.p.dev, m[1].p.dev, G.dev, U.dev, O.dev);
      gs().synchronize();
      const Tensor Wc[3] = {m[0].p.cpu, m[1].p.cpu, m[2].p.cpu};
      const Tensor Yc[3] = {Y[0].cpu, Y[1].cpu, Y[2].cpu};
      cops().norm_matmul_multi(cs(), X.cpu, NW.cpu, eps, H.cpu, Wc, Yc);
      cops().norm_matmul_swiglu(cs(), X.cpu, NW.cpu, eps, H.cpu, g.p.cpu, m[1].p.cpu, G.cpu, U.cpu, O.cpu);
      for (int s = 0; s < 3; ++s) {
        const std::vector<float> y = download_f32(Y[s]);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t o = 0; o < Ns[s]; ++o) {
            double bound;
            const double e = exact(m[s], hv.data() + t * sh.K, o, T, bound);
            const float v = y[size_t(t * Ns[s] + o)];
            ASSERT_TRUE(std::isfinite(v)) << "segment " << s << " y[" << o << ", " << t << "] not written";
            ASSERT_LE(std::fabs(v - e), bound + 1e-5 * std::fabs(e))
                << "segment " << s << " y[" << o << ", " << t << "]";
          }
        EXPECT_LT(rel_l2(y, host_f32(Y[s])), dtype_traits(sh.type).quantized ? 3e-2 : 1e-2)
            << "segment " << s;
      }
      const std::vector<float> out = download_f32(O);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < 13; ++o) {
          double bg, bu;
          const double eg = exact(g, hv.data() + t * sh.K, o, T, bg);
          const double eu = exact(m[1], hv.data() + t * sh.K, o, T, bu);
          const double sg = eg / (1.0 + std::exp(-eg)), e = sg * eu;
          const double bound =
              1.1 * bg * (std::fabs(eu) + bu) + std::fabs(sg) * bu + 2e-5 * std::fabs(e) + 1e-6;
          ASSERT_LE(std::fabs(out[size_t(t * 13 + o)] - e), bound) << "swiglu out[" << o << ", " << t << "]";
        }
      EXPECT_LT(rel_l2(out, host_f32(O)), dtype_traits(sh.type).quantized ? 3e-2 : 1e-2) << "swiglu";
    }
  }
}

// The GeGlu epilogue (Ops::norm_matmul_geglu; TANDEM_GEGLU_EPILOGUE, off by default: turned on here): the norm,
// gate, up and gelu_tanh(gate) * up in one fused product, no gelu_mul launch (counted), against the exact GeGLU
// of the double products and the CPU composition; T = 9 runs the composition on CUDA.
TEST_F(GpuFusedGemv, GegluEpilogueMatchesExactProductAndCpu) {
  ForcedSwitch geglu_epilogue(cuda::set_geglu_epilogue, true);
  std::string why;
  std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
  ASSERT_NE(prof, nullptr) << why;
  uint32_t seed = 3100;
  const float eps = 1e-5f;
  for (const Shape& sh : shapes()) {
    for (int64_t T : {1, 3, 9}) {
      SCOPED_TRACE(std::string(dtype_name(sh.type)) + " K=" + std::to_string(sh.K) + " T=" + std::to_string(T));
      std::mt19937 rng(seed++);
      const int64_t N = 21;
      Mat g = make_mat(sh.type, sh.K, N, rng), u = make_mat(sh.type, sh.K, N, rng);
      const std::vector<float> xv = random_floats(size_t(sh.K * T), rng, -2.0f, 2.0f);
      const std::vector<float> nw = random_floats(size_t(sh.K), rng, 0.5f, 1.5f);
      const std::vector<float> hv = normed(xv, nw, sh.K, T, eps);
      Pair X = make_f32({sh.K, T}, xv), NW = make_f32({sh.K}, nw), H = make_out(DType::F32, {sh.K, T});
      Pair G = make_out(DType::F32, {N, T}), U = make_out(DType::F32, {N, T}), O = make_out(DType::F32, {N, T});
      const int64_t gelu_launches = launches_of(*gpu_, *prof, "glu_kernel", [&] {
        gops().norm_matmul_geglu(gs(), X.dev, NW.dev, eps, H.dev, g.p.dev, u.p.dev, G.dev, U.dev, O.dev);
      });
      // Fused up to 8 columns wherever the products are: block types always, dense rows of whole 16-byte
      // vectors (K % 4 for F32, K % 8 for 16-bit: K = 100 takes the composition, one GELU launch).
      const bool fusable = sh.type != DType::F32 && sh.type != DType::F16 && sh.type != DType::BF16
                               ? true
                               : sh.K % (sh.type == DType::F32 ? 4 : 8) == 0;
      if (T <= 8) {
        EXPECT_EQ(gelu_launches, fusable ? 0 : 1) << "fusable: " << fusable;
      }
      cops().norm_matmul_geglu(cs(), X.cpu, NW.cpu, eps, H.cpu, g.p.cpu, u.p.cpu, G.cpu, U.cpu, O.cpu);
      const std::vector<float> out = download_f32(O);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < N; ++o) {
          double bg, bu;
          const double eg = exact(g, hv.data() + t * sh.K, o, T, bg);
          const double eu = exact(u, hv.data() + t * sh.K, o, T, bu);
          const double ga = 0.5 * eg * (1.0 + std::tanh(0.7978845608028654 * (eg + 0.044715 * eg * eg * eg)));
          const double e = ga * eu;
          // |d gelu / dx| <= 1.13: the gate's error bound carries through with that factor.
          const double bound = 1.2 * bg * (std::fabs(eu) + bu) + std::fabs(ga) * bu + 2e-5 * std::fabs(e) + 1e-6;
          ASSERT_LE(std::fabs(out[size_t(t * N + o)] - e), bound) << "geglu out[" << o << ", " << t << "]";
        }
      EXPECT_LT(rel_l2(out, host_f32(O)), dtype_traits(sh.type).quantized ? 3e-2 : 1e-2) << "geglu vs CPU";
    }
  }
}

// Column t of an M-column call == the 1-column call on column t, bitwise, M = 2..8.
TEST_F(GpuFusedGemv, RowsAreBatchInvariant) {
  uint32_t seed = 900;
  for (const Shape& sh : shapes()) {
    for (int64_t M : {2, 5, 8}) {
      SCOPED_TRACE(std::string(dtype_name(sh.type)) + " K=" + std::to_string(sh.K) +
                   " M=" + std::to_string(M));
      std::mt19937 rng(seed++);
      const int64_t N = 23;
      Mat a = make_mat(sh.type, sh.K, N, rng), b = make_mat(sh.type, sh.K, N, rng);
      const std::vector<float> xv = random_floats(size_t(sh.K * M), rng, -2.0f, 2.0f);
      const std::vector<float> rv = random_floats(size_t(N * M), rng, -3.0f, 3.0f);
      Pair X = make_f32({sh.K, M}, xv);
      Pair Ym = make_out(DType::F32, {N, M}), Ym2 = make_out(DType::F32, {N, M});
      Pair Gs = make_out(DType::F32, {N, M}), Us = make_out(DType::F32, {N, M}),
           Om = make_out(DType::F32, {N, M});
      Pair Rm = make_f32({N, M}, rv), Tm = make_out(DType::F32, {N, M});
      gops().matmul(gs(), a.p.dev, X.dev, Ym.dev);
      const Tensor Wd[2] = {a.p.dev, b.p.dev};
      const Tensor Yd[2] = {Ym2.dev, Us.dev};
      gops().matmul_multi(gs(), Wd, X.dev, Yd);
      gops().matmul_swiglu(gs(), a.p.dev, b.p.dev, X.dev, Gs.dev, Us.dev, Om.dev);
      gops().matmul_add(gs(), a.p.dev, X.dev, Tm.dev, Rm.dev);
      gs().synchronize();
      const auto mm = download_f32(Ym), mmulti = download_f32(Ym2), msw = download_f32(Om),
                 madd = download_f32(Rm);
      for (int64_t t = 0; t < M; ++t) {
        const std::vector<float> xc(xv.begin() + t * sh.K, xv.begin() + (t + 1) * sh.K);
        const std::vector<float> rc(rv.begin() + t * N, rv.begin() + (t + 1) * N);
        Pair X1 = make_f32({sh.K, 1}, xc);
        Pair Y1 = make_out(DType::F32, {N, 1}), Y2 = make_out(DType::F32, {N, 1}),
             U1 = make_out(DType::F32, {N, 1});
        Pair G1 = make_out(DType::F32, {N, 1}), O1 = make_out(DType::F32, {N, 1});
        Pair R1 = make_f32({N, 1}, rc), T1 = make_out(DType::F32, {N, 1});
        gops().matmul(gs(), a.p.dev, X1.dev, Y1.dev);
        const Tensor Y1d[2] = {Y2.dev, U1.dev};
        gops().matmul_multi(gs(), Wd, X1.dev, Y1d);
        gops().matmul_swiglu(gs(), a.p.dev, b.p.dev, X1.dev, G1.dev, U1.dev, O1.dev);
        gops().matmul_add(gs(), a.p.dev, X1.dev, T1.dev, R1.dev);
        gs().synchronize();
        const auto s1 = download_f32(Y1), s2 = download_f32(Y2), s3 = download_f32(O1), s4 = download_f32(R1);
        for (int64_t o = 0; o < N; ++o) {
          const size_t i = size_t(t * N + o);
          ASSERT_EQ(std::memcmp(&mm[i], &s1[size_t(o)], 4), 0) << "matmul row " << t << " out " << o;
          ASSERT_EQ(std::memcmp(&mmulti[i], &s2[size_t(o)], 4), 0)
              << "matmul_multi row " << t << " out " << o;
          ASSERT_EQ(std::memcmp(&msw[i], &s3[size_t(o)], 4), 0) << "matmul_swiglu row " << t << " out " << o;
          ASSERT_EQ(std::memcmp(&madd[i], &s4[size_t(o)], 4), 0) << "matmul_add row " << t << " out " << o;
        }
      }
    }
  }
}

// The fused launch computes each segment exactly as matmul does (same kernel, same order): bitwise.
TEST_F(GpuFusedGemv, MultiEqualsSeparateMatmuls) {
  uint32_t seed = 1200;
  for (const Shape& sh : shapes()) {
    std::mt19937 rng(seed++);
    SCOPED_TRACE(std::string(dtype_name(sh.type)) + " K=" + std::to_string(sh.K));
    Mat a = make_mat(sh.type, sh.K, 64, rng), b = make_mat(sh.type, sh.K, 17, rng);
    const std::vector<float> xv = random_floats(size_t(sh.K), rng, -2.0f, 2.0f);
    Pair X = make_f32({sh.K, 1}, xv);
    Pair A1 = make_out(DType::F32, {64, 1}), B1 = make_out(DType::F32, {17, 1});
    Pair A2 = make_out(DType::F32, {64, 1}), B2 = make_out(DType::F32, {17, 1});
    const Tensor Wd[2] = {a.p.dev, b.p.dev};
    const Tensor Yd[2] = {A1.dev, B1.dev};
    gops().matmul_multi(gs(), Wd, X.dev, Yd);
    gops().matmul(gs(), a.p.dev, X.dev, A2.dev);
    gops().matmul(gs(), b.p.dev, X.dev, B2.dev);
    gs().synchronize();
    EXPECT_EQ(download(A1), download(A2));
    EXPECT_EQ(download(B1), download(B2));
  }
}

// More units than blocks resident at once: each block of the persistent quantized kernel walks several units
// through its two shared-memory buffers (and the dense kernel has thousands of warps). 2 x 20011 rows.
TEST_F(GpuFusedGemv, ManyUnitsPerBlock) {
  uint32_t seed = 1500;
  for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::BF16}) {
    for (int64_t T : {1, 3}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " T=" + std::to_string(T));
      std::mt19937 rng(seed++);
      const int64_t K = 256, N = 20011;
      Mat g = make_mat(t, K, N, rng), u = make_mat(t, K, N, rng);
      const std::vector<float> xv = random_floats(size_t(K * T), rng, -2.0f, 2.0f);
      Pair X = make_f32({K, T}, xv);
      Pair G = make_out(DType::F32, {N, T}), U = make_out(DType::F32, {N, T}),
           O = make_out(DType::F32, {N, T});
      const Tensor Wd[2] = {g.p.dev, u.p.dev};
      const Tensor Yd[2] = {G.dev, U.dev};
      gops().matmul_multi(gs(), Wd, X.dev, Yd);
      gs().synchronize();
      const std::vector<float> yg = download_f32(G), yu = download_f32(U);
      for (int64_t c = 0; c < T; ++c)
        for (int64_t o = 0; o < N; ++o) {
          double bg, bu;
          const double eg = exact(g, xv.data() + c * K, o, T, bg), eu = exact(u, xv.data() + c * K, o, T, bu);
          ASSERT_LE(std::fabs(yg[size_t(c * N + o)] - eg), bg) << "gate row " << o << " col " << c;
          ASSERT_LE(std::fabs(yu[size_t(c * N + o)] - eu), bu) << "up row " << o << " col " << c;
        }
      gops().matmul_swiglu(gs(), g.p.dev, u.p.dev, X.dev, G.dev, U.dev, O.dev);
      gs().synchronize();
      const std::vector<float> out = download_f32(O);
      for (int64_t i = 0; i < N * T; ++i) {
        const double ref = double(yg[size_t(i)]) / (1.0 + std::exp(-double(yg[size_t(i)]))) * yu[size_t(i)];
        ASSERT_NEAR(out[size_t(i)], ref, 1e-5 * (std::fabs(ref) + 1.0)) << "swiglu " << i;
      }
    }
  }
}

// Quantized rows too long for two staging buffers (Q8_0, K = 30016: 31.9 KB a row) take the one-buffer path.
TEST_F(GpuFusedGemv, LongQuantizedRowsUseOneBuffer) {
  WorkspacePlan plan;
  plan.max_rows = 8;
  plan.max_matmul_in = 30016;
  gops().reserve(plan);
  cops().reserve(plan);
  std::mt19937 rng(1700);
  const int64_t K = 30016, N = 9;
  Mat m = make_mat(DType::Q8_0, K, N, rng);
  for (int64_t T : {1, 3}) {
    const std::vector<float> xv = random_floats(size_t(K * T), rng, -2.0f, 2.0f);
    Pair X = make_f32({K, T}, xv);
    Pair Y = make_out(DType::F32, {N, T});
    gops().matmul(gs(), m.p.dev, X.dev, Y.dev);
    gs().synchronize();
    const std::vector<float> y = download_f32(Y);
    for (int64_t c = 0; c < T; ++c)
      for (int64_t o = 0; o < N; ++o) {
        double b;
        const double e = exact(m, xv.data() + c * K, o, T, b);
        ASSERT_LE(std::fabs(y[size_t(c * N + o)] - e), b) << "row " << o << " col " << c;
      }
  }
}

// Weights that do not start on a 16-byte boundary (a GGUF tensor at an odd offset): the staging copies head
// and tail bytes one by one and K-type rows take the unaligned decoding. Same bounds as above.
TEST_F(GpuFusedGemv, MisalignedQuantizedRows) {
  uint32_t seed = 1900;
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    for (size_t offset : {size_t(2), size_t(6)}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " offset " + std::to_string(offset));
      std::mt19937 rng(seed++);
      const int64_t K = t == DType::Q8_0 || t == DType::Q4_0 ? 1056 : 768, N = 19, T = 3;
      Mat m = make_mat(t, K, N, rng);
      Buffer buf = gpu_->allocate(m.p.host.size() + 16);
      char* base = static_cast<char*>(buf.data()) + offset;
      gpu_->copy_from_host(gs(), base, m.p.host.data(), m.p.host.size());
      const Tensor W = Tensor::contiguous(t, {K, N}, base, gpu_->id());
      const std::vector<float> xv = random_floats(size_t(K * T), rng, -2.0f, 2.0f);
      Pair X = make_f32({K, T}, xv);
      Pair Y = make_out(DType::F32, {N, T});
      gops().matmul(gs(), W, X.dev, Y.dev);
      gs().synchronize();
      const std::vector<float> y = download_f32(Y);
      for (int64_t c = 0; c < T; ++c)
        for (int64_t o = 0; o < N; ++o) {
          double b;
          const double e = exact(m, xv.data() + c * K, o, T, b);
          ASSERT_LE(std::fabs(y[size_t(c * N + o)] - e), b) << "row " << o << " col " << c;
        }
    }
  }
}

// Ops::ffn_swiglu_add (norm, gate/up with SwiGLU, down with the residual add): on CUDA with quantized
// weights the gate/up product writes the down product's 8-bit activations itself (the warp completing each
// group of 32 outputs quantizes them). Bitwise the same y and act as norm_matmul_swiglu + matmul_add on the GPU,
// also when replayed as a recording (the group counters must be back at zero after every launch), one
// quantization launch fewer (counted with the kernel profiler), and close to the CPU's composition. Q6_K gate/up
// (not on the direct kernel) and F16 take the composition.
TEST_F(GpuFusedGemv, SwigluFfnHandsTheDownProductItsQuantizedInput) {
  ForcedSwitch swiglu_q8(cuda::set_ffn_swiglu_q8, true);  // (off by default: slower, cuda_ops.cpp)
  std::mt19937 rng(77);
  std::string why;
  for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16})
    for (int64_t T : {1, 3, 8}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " T " + std::to_string(T));
      const int64_t E = 512, F = 768;  // F: 24 groups of 32, over many blocks
      Mat g = make_mat(t, E, F, rng), u = make_mat(t, E, F, rng), d = make_mat(t, F, E, rng);
      Pair x = make_f32({E, T}, random_floats(size_t(E * T), rng, -2, 2));
      Pair nw = make_f32({E}, random_floats(size_t(E), rng, 0.5f, 1.5f));
      Pair y1 = make_f32({E, T}, host_f32(x)), y2 = make_f32({E, T}, host_f32(x));
      Pair h = make_out(DType::F32, {E, T}), gate = make_out(DType::F32, {F, T}), up = make_out(DType::F32, {F, T}),
           act1 = make_out(DType::F32, {F, T}), act2 = make_out(DType::F32, {F, T}), tmp = make_out(DType::F32, {E, T});
      std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
      ASSERT_NE(prof, nullptr) << why;
      // y1 += ffn(y1) one way, y2 += ffn(y2) the other (the replays below run it again: the group counters must
      // be back at zero after every launch)
      const int64_t fused = launches_of(*gpu_, *prof, "quantize_q8", [&] {
        gops().ffn_swiglu_add(gs(), y1.dev, nw.dev, 1e-6f, h.dev, g.p.dev, u.p.dev, gate.dev, up.dev, act1.dev,
                              d.p.dev, tmp.dev, y1.dev);
      });
      const int64_t composed = launches_of(*gpu_, *prof, "quantize_q8", [&] {
        gops().norm_matmul_swiglu(gs(), y2.dev, nw.dev, 1e-6f, h.dev, g.p.dev, u.p.dev, gate.dev, up.dev, act2.dev);
        gops().matmul_add(gs(), d.p.dev, act2.dev, tmp.dev, y2.dev);
      });
      const bool quant = t != DType::F16;
      EXPECT_EQ(composed, quant ? 2 : 0);
      EXPECT_EQ(fused, t == DType::Q6_K ? 2 : quant ? 1 : 0);
      EXPECT_EQ(download_f32(act1), download_f32(act2));
      EXPECT_EQ(download_f32(y1), download_f32(y2));
      prof.reset();
      // Again, each way, as recordings replayed twice (the step graphs of a decode).
      for (int rep = 0; rep < 2; ++rep) {
        gpu_->run_recorded(gs(), 0x6666ull + uint64_t(t) * 16 + uint64_t(T), [&](Stream& st) {
          gops().ffn_swiglu_add(st, y1.dev, nw.dev, 1e-6f, h.dev, g.p.dev, u.p.dev, gate.dev, up.dev, act1.dev,
                                d.p.dev, tmp.dev, y1.dev);
        });
        gops().norm_matmul_swiglu(gs(), y2.dev, nw.dev, 1e-6f, h.dev, g.p.dev, u.p.dev, gate.dev, up.dev,
                                  act2.dev);
        gops().matmul_add(gs(), d.p.dev, act2.dev, tmp.dev, y2.dev);
        gpu_->synchronize();
        EXPECT_EQ(download_f32(y1), download_f32(y2)) << "replay " << rep;
      }
      // Against the CPU composition, from the same start.
      Pair yc = make_f32({E, T}, host_f32(x));
      Pair yg = make_f32({E, T}, host_f32(x));
      gops().ffn_swiglu_add(gs(), yg.dev, nw.dev, 1e-6f, h.dev, g.p.dev, u.p.dev, gate.dev, up.dev, act1.dev,
                            d.p.dev, tmp.dev, yg.dev);
      cops().ffn_swiglu_add(cs(), yc.cpu, nw.cpu, 1e-6f, h.cpu, g.p.cpu, u.p.cpu, gate.cpu, up.cpu, act1.cpu,
                            d.p.cpu, tmp.cpu, yc.cpu);
      EXPECT_LT(rel_l2(download_f32(yg), host_f32(yc)), 2e-2);
    }
}

}  // namespace
}  // namespace tandem::gpu_test
