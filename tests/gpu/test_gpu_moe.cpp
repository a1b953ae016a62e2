// CUDA mixture-of-experts ops against the CPU ops and a double reference: the router (ids equal, weights
// within f32 rounding), the expert matmul for every weight dtype on all CUDA paths (one matrix-vector
// product per routed row for decode; for many rows the tensor-core grouped GEMM for 16-bit and quantized
// weights, the f32 grouped GEMM for F32 weights), with a shared input or one per expert and a strided expert
// view (a fused gate_up half); the weighted sum; and a recorded graph of route + matmul_id replayed after the
// router's input changed (the routing is read on the device, never on the host).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/kernel_profile.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

class GpuMoe : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    WorkspacePlan plan;
    plan.max_rows = 256;
    plan.max_matmul_in = 4096;
    plan.max_routed_rows = 4096;
    cops().reserve(plan);
    gops().reserve(plan);
  }
  struct Case {
    int64_t K, N, n_expert, k, T, kx;
    bool fused_half;
  };
  void run_case(DType dt, const Case& c);
  void check_recorded_routing(int64_t T);
};

std::vector<int32_t> random_ids(int64_t k, int64_t T, int64_t n_expert, std::mt19937& rng) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(n_expert));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin() + 1, all.end(), rng);  // expert 0 in every row: > 64 rows on one expert
    ids.insert(ids.end(), all.begin(), all.begin() + k);
  }
  return ids;
}

TEST_F(GpuMoe, RouteMatchesTheCpu) {
  std::mt19937 rng(1);
  const int64_t T = 37;
  // 128 experts (gemma4 26B-A4B), and counts that leave lanes empty or need 8 logits a lane (TANDEM_ROUTE_REGS).
  for (int64_t n_expert : {128, 100, 256})
  for (int64_t k : {1, 8}) {
    SCOPED_TRACE("n_expert " + std::to_string(n_expert) + " k " + std::to_string(k));
    for (bool scaled : {false, true}) {
      Pair logits = make_f32({n_expert, T}, random_floats(size_t(n_expert * T), rng, -4.0f, 4.0f));
      Pair scale = make_f32({n_expert}, random_floats(size_t(n_expert), rng, 0.5f, 1.5f));
      Pair ids = make_out(DType::I32, {k, T}), w = make_out(DType::F32, {k, T});
      cops().moe_route(cs(), logits.cpu, scaled ? &scale.cpu : nullptr, ids.cpu, w.cpu);
      gops().moe_route(gs(), logits.dev, scaled ? &scale.dev : nullptr, ids.dev, w.dev);
      EXPECT_EQ(download_i32(ids), host_i32(ids));
      EXPECT_LE(rel_l2(download_f32(w), host_f32(w)), 1e-5);
    }
  }
}

void GpuMoe::run_case(DType dt, const Case& c) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " T " + std::to_string(c.T) + " k " + std::to_string(c.k) +
               " kx " + std::to_string(c.kx) + (c.fused_half ? " fused half" : ""));
  std::mt19937 rng(uint32_t(c.T * 7 + c.kx));
  const int64_t rows = c.fused_half ? 2 * c.N : c.N;
  std::vector<float> wd;
  const std::vector<uint8_t> wb = random_weights(dt, c.K, rows * c.n_expert, rng, wd);
  Pair W = make(dt, {c.K, rows, c.n_expert}, wb.data());
  Tensor wc = W.cpu, wg = W.dev;
  if (c.fused_half) {  // the second half of every expert: strided rows per expert
    for (Tensor* v : {&wc, &wg}) {
      v->data = static_cast<char*>(v->data) + size_t(c.N) * v->nb[1];
      v->ne[1] = c.N;
    }
  }
  const std::vector<float> xv = random_floats(size_t(c.K * c.kx * c.T), rng);
  Pair x = make(DType::F32, {c.K, c.kx, c.T}, xv.data());
  const std::vector<int32_t> idv = random_ids(c.k, c.T, c.n_expert, rng);
  Pair ids = make(DType::I32, {c.k, c.T}, idv.data());
  Pair y = make(DType::F32, {c.N, c.k, c.T}, nullptr);
  cops().matmul_id(cs(), wc, x.cpu, ids.cpu, y.cpu);
  gops().matmul_id(gs(), wg, x.dev, ids.dev, y.dev);
  const std::vector<float> got = download_f32(y);
  // The double product with the dequantized weights.
  std::vector<float> ref(got.size());
  const int64_t row0 = c.fused_half ? c.N : 0;
  for (int64_t tt = 0; tt < c.T; ++tt)
    for (int64_t j = 0; j < c.k; ++j) {
      const int64_t e = idv[size_t(tt * c.k + j)];
      const float* xr = xv.data() + (tt * c.kx + (c.kx == 1 ? 0 : j)) * c.K;
      for (int64_t o = 0; o < c.N; ++o) {
        const float* wr = wd.data() + (e * rows + row0 + o) * c.K;
        double s = 0;
        for (int64_t i = 0; i < c.K; ++i) s += double(wr[i]) * xr[i];
        ref[size_t((tt * c.k + j) * c.N + o)] = float(s);
      }
    }
  // f32 products (decode's matrix-vector kernels, F32 weights) vs the tensor-core GEMM's 16-bit activations.
  const bool grouped = c.k * c.T > 64;
  const double tol = dt == DType::F32 || ((dt == DType::F16 || dt == DType::BF16) && !grouped) ? 1e-5
                     : dt == DType::F16                                                        ? 2e-3
                                                                                               : 2e-2;
  EXPECT_LE(rel_l2(got, ref), tol);
  std::vector<float> cpu_y(got.size());
  std::memcpy(cpu_y.data(), y.host.data(), y.host.size());
  EXPECT_LE(rel_l2(got, cpu_y), tol);
}

TEST_F(GpuMoe, MatmulIdMatchesTheCpuForEveryDtypeOnBothPaths) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K,
                   DType::Q6_K}) {
    run_case(dt, {512, 72, 16, 8, 1, 1, false});    // decode
    run_case(dt, {512, 72, 16, 8, 1, 8, false});    // down proj
    run_case(dt, {256, 40, 8, 2, 3, 1, true});      // fused half
    run_case(dt, {512, 100, 12, 4, 90, 1, false});  // grouped
    run_case(dt, {256, 70, 12, 4, 90, 4, true});    // grouped
  }
}

// Ops::matmul_id_geglu in one launch (gemv_id.cu, TANDEM_ID_GEGLU, off by default: turned on here) over the two
// halves of a fused gate_up tensor: bit for bit matmul_id twice + gelu_mul on the GPU (the composition), one
// launch of the GeGLU kernel (counted), close to the CPU's composition. Q6_K (no direct kernel) and a grouped
// batch (90 rows x 4 experts) take the composition: no GeGLU launch.
TEST_F(GpuMoe, GegluRoutedProductEqualsTheComposition) {
  ForcedSwitch id_geglu(cuda::set_id_geglu, true);
  std::string why;
  std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
  ASSERT_NE(prof, nullptr) << why;
  std::mt19937 rng(404);
  const int64_t K = 512, N = 72, n_expert = 16, k = 8;
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    for (int64_t T : {1, 3, 90}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T " + std::to_string(T));
      std::vector<float> wd;
      const std::vector<uint8_t> wb = random_weights(dt, K, 2 * N * n_expert, rng, wd);
      Pair W = make(dt, {K, 2 * N, n_expert}, wb.data());
      auto half = [&](Tensor v, int h) {  // rows [h N, (h + 1) N) of every expert: strided rows per expert
        v.data = static_cast<char*>(v.data) + size_t(h * N) * v.nb[1];
        v.ne[1] = N;
        return v;
      };
      const Tensor gc = half(W.cpu, 0), uc = half(W.cpu, 1), gg = half(W.dev, 0), ug = half(W.dev, 1);
      Pair x = make_f32({K, 1, T}, random_floats(size_t(K * T), rng));
      Pair ids = make(DType::I32, {k, T}, random_ids(k, T, n_expert, rng).data());
      Pair gate[2] = {make_out(DType::F32, {N, k, T}), make_out(DType::F32, {N, k, T})};
      Pair up[2] = {make_out(DType::F32, {N, k, T}), make_out(DType::F32, {N, k, T})};
      Pair out = make_out(DType::F32, {N, k, T});
      const int64_t launches = launches_of(*gpu_, *prof, "geglu", [&] {
        gops().matmul_id_geglu(gs(), gg, ug, x.dev, ids.dev, gate[0].dev, up[0].dev, out.dev);
      });
      const bool fused = T * k <= 64 && dt != DType::Q6_K;
      EXPECT_EQ(launches, fused ? 1 : 0);
      gops().Ops::matmul_id_geglu(gs(), gg, ug, x.dev, ids.dev, gate[1].dev, up[1].dev, gate[1].dev);
      cops().matmul_id_geglu(cs(), gc, uc, x.cpu, ids.cpu, gate[0].cpu, up[0].cpu, gate[0].cpu);
      gs().synchronize();
      const std::vector<float> got = download_f32(out);
      EXPECT_EQ(got, download_f32(gate[1])) << "fused vs matmul_id twice + gelu_mul on the GPU";
      const bool grouped = T * k > 64;
      const double tol = !grouped && (dt == DType::F32 || dt == DType::F16 || dt == DType::BF16) ? 1e-5 : 3e-2;
      EXPECT_LE(rel_l2(got, host_f32(gate[0])), tol) << "vs the CPU";
    }
}

// The direct routed kernel (gemv_id.cu, TANDEM_ID_DIRECT) on the types it takes, at decode sizes: the same
// bounds against the double reference and the CPU as the staged kernel; N not a multiple of a block's rows
// (8), a fused half (strided expert rows), per-slot inputs.
TEST_F(GpuMoe, DirectRoutedKernelMatchesTheCpu) {
  cuda::set_gemv_id_direct(true);
  for (DType dt : {DType::Q8_0, DType::Q4_K, DType::Q5_K}) {
    run_case(dt, {512, 72, 16, 8, 1, 1, false});
    run_case(dt, {512, 37, 16, 8, 1, 8, false});
    run_case(dt, {256, 41, 8, 2, 3, 1, true});
    run_case(dt, {1024, 96, 64, 8, 4, 1, false});
  }
  cuda::set_gemv_id_direct(std::nullopt);
}

// The tensor-core grouped GEMM on random inputs against a double reference that rounds as the kernel does
// (activations to the 16-bit type: f16 for F16 weights, bf16 otherwise; block-quantized weights decoded then
// rounded to bf16), so only the f32 accumulation order differs; and against the CPU op (exact f32 products)
// within the rounding of the activations. Rows: 150 tokens x top 8 of 32 experts, expert 0 in every token (5
// chunks of 32 rows), a feature count that is not a multiple of the 64-feature tile, shared and per-slot
// inputs.
TEST_F(GpuMoe, TensorCoreGroupedGemmMatchesARoundedReference) {
  for (DType dt :
       {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    for (int64_t kx : {int64_t(1), int64_t(8)}) {
      const int64_t K = 512, N = 200, n_expert = 32, k = 8, T = 150;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " kx " + std::to_string(kx));
      std::mt19937 rng(uint32_t(17 + kx));
      std::vector<float> wd;
      const std::vector<uint8_t> wb = random_weights(dt, K, N * n_expert, rng, wd);
      Pair W = make(dt, {K, N, n_expert}, wb.data());
      const std::vector<float> xv = random_floats(size_t(K * kx * T), rng);
      Pair x = make(DType::F32, {K, kx, T}, xv.data());
      const std::vector<int32_t> idv = random_ids(k, T, n_expert, rng);
      Pair ids = make(DType::I32, {k, T}, idv.data());
      Pair y = make(DType::F32, {N, k, T}, nullptr);
      gops().matmul_id(gs(), W.dev, x.dev, ids.dev, y.dev);
      cops().matmul_id(cs(), W.cpu, x.cpu, ids.cpu, y.cpu);
      const std::vector<float> got = download_f32(y);
      const bool f16 = dt == DType::F16;
      auto round_x = [&](float v) {
        return f16 ? fp16_to_fp32(fp32_to_fp16(v)) : bf16_to_fp32(fp32_to_bf16(v));
      };
      auto round_w = [&](float v) { return f16 || dt == DType::BF16 ? v : bf16_to_fp32(fp32_to_bf16(v)); };
      std::vector<float> ref(got.size());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t e = idv[size_t(t * k + j)];
          const float* xr = xv.data() + (t * kx + (kx == 1 ? 0 : j)) * K;
          for (int64_t o = 0; o < N; ++o) {
            const float* wr = wd.data() + (e * N + o) * K;
            double sum = 0;
            for (int64_t i = 0; i < K; ++i) sum += double(round_w(wr[i])) * round_x(xr[i]);
            ref[size_t((t * k + j) * N + o)] = float(sum);
          }
        }
      EXPECT_LE(rel_l2(got, ref), 1e-5);
      EXPECT_LE(rel_l2(got, host_f32(y)), f16 ? 2e-3 : 1e-2);
    }
  }
}

// The pipelined grouped GEMM (moe_gemm_pipelined.cu, TANDEM_MOE_PIPELINE) computes the register-staged kernel's
// sums in the same order from the same 16-bit operands: bit for bit its result, in one launch (counted), on
// F16/BF16 experts with shared and per-slot inputs; K of one step, of as many steps as the pipeline's prologue
// (3) and of 16; N past a 128-feature tile; experts with more than 32 rows (expert 0: every token, 5 chunks)
// and with fewer than 16 (the warps of rows 16..31 idle). And close to the CPU.
TEST_F(GpuMoe, PipelinedGroupedGemmEqualsTheRegisterStagedOne) {
  ForcedSwitch pipeline(cuda::set_moe_pipeline, std::nullopt);  // (set below, each way)
  std::string why;
  std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
  ASSERT_NE(prof, nullptr) << why;
  struct Shape {
    int64_t K, N;
  };
  for (DType dt : {DType::F16, DType::BF16})
    for (Shape sh : {Shape{512, 200}, Shape{32, 130}, Shape{96, 64}})
      for (int64_t kx : {int64_t(1), int64_t(8)}) {
        const int64_t n_expert = 32, k = 8, T = 150;
        SCOPED_TRACE(std::string(dtype_name(dt)) + " K " + std::to_string(sh.K) + " N " + std::to_string(sh.N) +
                     " kx " + std::to_string(kx));
        std::mt19937 rng(uint32_t(sh.K + sh.N + kx));
        std::vector<float> wd;
        const std::vector<uint8_t> wb = random_weights(dt, sh.K, sh.N * n_expert, rng, wd);
        Pair W = make(dt, {sh.K, sh.N, n_expert}, wb.data());
        Pair x = make_f32({sh.K, kx, T}, random_floats(size_t(sh.K * kx * T), rng));
        Pair ids = make(DType::I32, {k, T}, random_ids(k, T, n_expert, rng).data());
        Pair y[2] = {make_out(DType::F32, {sh.N, k, T}), make_out(DType::F32, {sh.N, k, T})};
        cuda::set_moe_pipeline(false);
        gops().matmul_id(gs(), W.dev, x.dev, ids.dev, y[0].dev);
        cuda::set_moe_pipeline(true);
        const int64_t launches = launches_of(*gpu_, *prof, "moe_gemm_pipelined", [&] {
          gops().matmul_id(gs(), W.dev, x.dev, ids.dev, y[1].dev);
        });
        EXPECT_EQ(launches, 1);
        cops().matmul_id(cs(), W.cpu, x.cpu, ids.cpu, y[0].cpu);
        gs().synchronize();
        const std::vector<float> got = download_f32(y[1]);
        EXPECT_EQ(got, download_f32(y[0])) << "pipelined vs register-staged";
        EXPECT_LE(rel_l2(got, host_f32(y[0])), dt == DType::F16 ? 2e-3 : 1e-2) << "vs the CPU";
      }
}

TEST_F(GpuMoe, CombineMatchesTheCpu) {
  std::mt19937 rng(5);
  const int64_t n = 300, k = 8, T = 9;
  Pair y = make_f32({n, k, T}, random_floats(size_t(n * k * T), rng));
  Pair w = make_f32({k, T}, random_floats(size_t(k * T), rng));
  Pair out = make_out(DType::F32, {n, T});
  cops().moe_combine(cs(), y.cpu, w.cpu, out.cpu);
  gops().moe_combine(gs(), y.dev, w.dev, out.dev);
  EXPECT_LE(rel_l2(download_f32(out), host_f32(out)), 1e-6);
}

// Route and expert matmul recorded once and replayed with other router logits: the replay follows the new
// routing (ids live on the device), as decode steps recorded as CUDA graphs need.
TEST_F(GpuMoe, RecordedRoutingFollowsNewLogits) {
  for (int64_t T : {int64_t(2), int64_t(40)}) {  // matrix-vector products per routed row; grouped GEMM
    SCOPED_TRACE("T " + std::to_string(T));
    check_recorded_routing(T);
  }
}

void GpuMoe::check_recorded_routing(int64_t T) {
  std::mt19937 rng(9);
  const int64_t n_expert = 16, k = 4, K = 256, N = 64;
  std::vector<float> wd;
  const std::vector<uint8_t> wb = random_weights(DType::Q4_K, K, N * n_expert, rng, wd);
  Pair W = make(DType::Q4_K, {K, N, n_expert}, wb.data());
  Pair x = make_f32({K, 1, T}, random_floats(size_t(K * T), rng));
  Pair logits = make_f32({n_expert, T}, random_floats(size_t(n_expert * T), rng, -3.0f, 3.0f));
  Pair ids = make_out(DType::I32, {k, T}), w = make_out(DType::F32, {k, T});
  Pair y = make_out(DType::F32, {N, k, T});
  auto body = [&](Stream& s) {
    gops().moe_route(s, logits.dev, nullptr, ids.dev, w.dev);
    gops().matmul_id(s, W.dev, x.dev, ids.dev, y.dev);
  };
  std::vector<int32_t> first_ids;
  for (int round = 0; round < 2; ++round) {
    if (round ==
        1) {  // new logits written into the same host bytes (logits.cpu views them) and device buffer
      const std::vector<float> v = random_floats(size_t(n_expert * T), rng, -3.0f, 3.0f);
      std::memcpy(logits.host.data(), v.data(), logits.host.size());
      upload(logits);
    }
    gpu_->run_recorded(gs(), 0x6d6f6500 + uint64_t(T), body);
    gs().synchronize();
    cops().moe_route(cs(), logits.cpu, nullptr, ids.cpu, w.cpu);
    cops().matmul_id(cs(), W.cpu, x.cpu, ids.cpu, y.cpu);
    EXPECT_EQ(download_i32(ids), host_i32(ids)) << "round " << round;
    EXPECT_LE(rel_l2(download_f32(y), host_f32(y)), 2e-2) << "round " << round;
    if (round == 0) first_ids = host_i32(ids);
  }
  // The second logits route elsewhere, so a replay that kept the first routing would have failed above.
  EXPECT_NE(first_ids, host_i32(ids));
}

}  // namespace
}  // namespace tandem::gpu_test
