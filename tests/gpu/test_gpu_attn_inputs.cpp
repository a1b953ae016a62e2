// Ops::qk_norm_rope_store on CUDA (one launch: q/k per-head norms, rope, K/V store) against the CPU composition
// (rms_norm, rope, kv_store one at a time) on random inputs, and against the CUDA ops one at a time, which it
// must equal bit for bit (same arithmetic in the same order). Odd shapes: 3 KV heads of 6 query heads, head dim
// 72 with n_rot 40 (dims past n_rot pass through), T = 1..5, NORM and NEOX modes, with and without norms and
// freq factors, with gemma4's unweighted V norm, f32 / f16 / bf16 caches, a slot of -1 (row not stored).
// Then gemma4's post-norm residual adds (Ops::norm_residual_add, Ops::moe_residual_add): bit for bit the CUDA
// ops one at a time, within f32 rounding of the CPU, for short (warp) and long (block) rows.
#include "backend/cuda/cuda_kernels.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

// gemma4's fused row-norm kernels are off by default (TANDEM_ROW_FUSION, cuda_ops.cpp): these tests turn them on.
class GpuDecodeFusion : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    cuda::set_row_fusion(true);
  }
  void TearDown() override {
    cuda::set_row_fusion(std::nullopt);
    GpuTest::TearDown();
  }
};

TEST_F(GpuDecodeFusion, QkNormRopeStoreMatchesTheOpsOneAtATime) {
  std::string why;
  std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
  ASSERT_NE(prof, nullptr) << why;
  uint32_t seed = 7;
  const int64_t n_head = 6, n_kv = 3, bs = 4, n_blocks = 5;
  // Head dims: 72 with 40 rotated (dims past n_rot pass through); 512 (gemma4's global heads, the longest row a
  // lane keeps in registers) and 520 (the loop path) rotated whole: a lane's running theta over 8+ pairs.
  for (int64_t hd : {int64_t(72), int64_t(512), int64_t(520)})
  for (DType ct : {DType::F32, DType::F16, DType::BF16})
    for (RopeMode mode : {RopeMode::Norm, RopeMode::Neox})
      for (int variant = 0; variant < 3; ++variant)
        for (int64_t T : {1, 5}) {
          SCOPED_TRACE(std::string(dtype_name(ct)) + (mode == RopeMode::Neox ? " neox" : " norm") + " variant " +
                       std::to_string(variant) + " T=" + std::to_string(T) + " hd=" + std::to_string(hd));
          const int n_rot = hd == 72 ? 40 : int(hd);
          std::mt19937 rng(seed++);
          const bool norms = variant != 1, norm_v = variant == 2;  // 2: gemma4 (V normed without a weight)
          const auto qv = random_floats(size_t(hd * n_head * T), rng, -2, 2);
          const auto kv_ = random_floats(size_t(hd * n_kv * T), rng, -2, 2);
          const auto vv = random_floats(size_t(hd * n_kv * T), rng, -2, 2);
          const auto qn = random_floats(size_t(hd), rng, 0.5f, 1.5f), kn = random_floats(size_t(hd), rng, 0.5f, 1.5f);
          const auto ffv = random_floats(size_t(n_rot / 2), rng, 1.0f, 4.0f);
          std::vector<int32_t> pos(static_cast<size_t>(T)), slots(static_cast<size_t>(T));
          for (int64_t t = 0; t < T; ++t) {
            pos[size_t(t)] = int32_t(100 + 37 * t);
            slots[size_t(t)] = t == 2 ? -1 : int32_t((t * 7 + 3) % (bs * n_blocks));
          }
          // Two copies of everything: one for the fused op, one for the ops one at a time.
          Pair Q[2] = {make_f32({hd, n_head, T}, qv), make_f32({hd, n_head, T}, qv)};
          Pair K[2] = {make_f32({hd, n_kv, T}, kv_), make_f32({hd, n_kv, T}, kv_)};
          Pair V[2] = {make_f32({hd, n_kv, T}, vv), make_f32({hd, n_kv, T}, vv)};
          Pair QN = make_f32({hd}, qn), KN = make_f32({hd}, kn), FF = make_f32({n_rot / 2}, ffv);
          Pair P = make_i32({T}, pos), S = make_i32({T}, slots);
          std::vector<uint8_t> zeros(size_t(hd * n_kv * bs * n_blocks) * dtype_block_bytes(ct), 0);
          Pair KC[2] = {make(ct, {hd, n_kv, bs, n_blocks}, zeros.data()), make(ct, {hd, n_kv, bs, n_blocks}, zeros.data())};
          Pair VC[2] = {make(ct, {hd, n_kv, bs, n_blocks}, zeros.data()), make(ct, {hd, n_kv, bs, n_blocks}, zeros.data())};
          RopeParams rp;
          rp.n_rot = n_rot;
          rp.mode = mode;
          rp.freq_base = 10000.0f;
          rp.freq_scale = 0.5f;
          rp.attn_factor = 1.25f;
          rp.freq_factors = norms ? nullptr : &FF.dev;
          const Tensor* qnp = norms ? &QN.dev : nullptr;
          const Tensor* knp = norms ? &KN.dev : nullptr;
          // One launch of the fused kernel (so the bitwise comparison below is not the composition with itself).
          EXPECT_EQ(launches_of(*gpu_, *prof, "attn_inputs_kernel", [&] {
                      gops().qk_norm_rope_store(gs(), Q[0].dev, K[0].dev, V[0].dev, qnp, knp, norm_v, 1e-6f, P.dev,
                                                rp, KvLayerView{KC[0].dev, VC[0].dev, int(bs)}, S.dev);
                    }),
                    1);
          gops().Ops::qk_norm_rope_store(gs(), Q[1].dev, K[1].dev, V[1].dev, qnp, knp, norm_v, 1e-6f, P.dev, rp,
                                         KvLayerView{KC[1].dev, VC[1].dev, int(bs)}, S.dev);
          gs().synchronize();
          EXPECT_EQ(download(Q[0]), download(Q[1])) << "q";
          EXPECT_EQ(download(K[0]), download(K[1])) << "k";
          EXPECT_EQ(download(V[0]), download(V[1])) << "v";
          EXPECT_EQ(download(KC[0]), download(KC[1])) << "K cache";
          EXPECT_EQ(download(VC[0]), download(VC[1])) << "V cache";
          // CPU reference.
          RopeParams rc = rp;
          rc.freq_factors = norms ? nullptr : &FF.cpu;
          cops().qk_norm_rope_store(cs(), Q[1].cpu, K[1].cpu, V[1].cpu, norms ? &QN.cpu : nullptr,
                                    norms ? &KN.cpu : nullptr, norm_v, 1e-6f, P.cpu, rc,
                                    KvLayerView{KC[1].cpu, VC[1].cpu, int(bs)}, S.cpu);
          EXPECT_LT(rel_l2(download_f32(Q[0]), host_f32(Q[1])), 1e-5) << "q vs CPU";
          EXPECT_LT(rel_l2(download_f32(K[0]), host_f32(K[1])), 1e-5) << "k vs CPU";
          EXPECT_LT(rel_l2(download_f32(V[0]), host_f32(V[1])), 1e-5) << "v vs CPU";
          const double tol = ct == DType::F32 ? 1e-5 : 1e-2;
          auto as_f32 = [&](const std::vector<uint8_t>& b) {
            std::vector<float> f(b.size() / dtype_block_bytes(ct));
            for (size_t i = 0; i < f.size(); ++i) {
              if (ct == DType::F32) {
                std::memcpy(&f[i], &b[4 * i], 4);
              } else {
                uint16_t h;
                std::memcpy(&h, &b[2 * i], 2);
                f[i] = ct == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
              }
            }
            return f;
          };
          EXPECT_LT(rel_l2(as_f32(download(KC[0])), as_f32(KC[1].host)), tol) << "K cache vs CPU";
          EXPECT_LT(rel_l2(as_f32(download(VC[0])), as_f32(VC[1].host)), tol) << "V cache vs CPU";
        }
}

TEST_F(GpuDecodeFusion, PostNormResidualAddsMatchTheOpsOneAtATime) {
  std::string why;
  std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
  ASSERT_NE(prof, nullptr) << why;
  uint32_t seed = 31;
  // TANDEM_NORM_REGS and TANDEM_MOE_TAIL off, then on (post_norm.cu): a block row of at most 4096 values then
  // kept in registers, or the MoE tail with <= 8 experts' outputs on 512 threads; 5000 values and 9 experts
  // fall back to the loop kernels.
  for (bool regs : {false, true})
  for (int64_t n : {72, 2816, 3000, 4096, 5000})  // a warp per row; a block per row (>= 1024 values)
    for (int64_t T : {1, 3})
      for (float out_scale : {1.0f, 0.37f})
        for (int variant : {0, 1, 2, 3, 4}) {  // dense; MoE with the sum given; MoE from 3, 8 or 9 experts' outputs
          ForcedSwitch norm_regs(cuda::set_norm_regs, regs), moe_tail(cuda::set_moe_tail, regs);
          const bool moe = variant > 0, combine = variant >= 2;
          const int64_t k = variant == 3 ? 8 : variant == 4 ? 9 : 3;
          SCOPED_TRACE("n=" + std::to_string(n) + " T=" + std::to_string(T) + " scale " + std::to_string(out_scale) +
                       (moe ? combine ? " moe from " + std::to_string(k) + " experts' outputs" : std::string(" moe")
                            : std::string(" dense")) +
                       (regs ? " TANDEM_NORM_REGS=1 TANDEM_MOE_TAIL=1" : ""));
          std::mt19937 rng(seed++);
          const auto xv = random_floats(size_t(n * T), rng, -2, 2), dv = random_floats(size_t(n * T), rng, -3, 3);
          const auto mv = random_floats(size_t(n * T), rng, -1, 1);
          const auto w1 = random_floats(size_t(n), rng, 0.5f, 1.5f), w2 = random_floats(size_t(n), rng, 0.5f, 1.5f);
          const auto w3 = random_floats(size_t(n), rng, 0.5f, 1.5f);
          // [0]: the fused op; [1]: the ops one at a time (the Ops composition) on the GPU, then on the CPU.
          Pair X[2] = {make_f32({n, T}, xv), make_f32({n, T}, xv)};
          Pair D[2] = {make_f32({n, T}, dv), make_f32({n, T}, dv)};
          Pair M[2] = {make_f32({n, T}, mv), make_f32({n, T}, mv)};
          Pair W1 = make_f32({n}, w1), W2 = make_f32({n}, w2), W3 = make_f32({n}, w3);
          Pair EY = make_f32({n, k, T}, random_floats(size_t(n * k * T), rng, -1, 1));
          Pair EW = make_f32({k, T}, random_floats(size_t(k * T), rng, 0.1f, 0.6f));
          // The experts' outputs and weights for the fused op, the GPU composition and the CPU composition.
          const Tensor* ey[3] = {combine ? &EY.dev : nullptr, combine ? &EY.dev : nullptr, combine ? &EY.cpu : nullptr};
          const Tensor* ew[3] = {combine ? &EW.dev : nullptr, combine ? &EW.dev : nullptr, combine ? &EW.cpu : nullptr};
          const bool fits = regs && n >= 1024 && n <= 4096;
          const bool expect_regs = fits && !combine, expect_tail = fits && combine && k <= 8;
          const int64_t fused = launches_of(*gpu_, *prof, "post_norm_residual", [&] {
            if (moe) {
              gops().moe_residual_add(gs(), X[0].dev, D[0].dev, W1.dev, ey[0], ew[0], M[0].dev, W2.dev, W3.dev, 1e-6f, out_scale);
            } else {
              gops().norm_residual_add(gs(), X[0].dev, D[0].dev, W3.dev, 1e-6f, out_scale);
            }
          });
          EXPECT_EQ(fused, 1) << "one launch of the fused kernel";
          // The same call again on scratch copies, to see which kernel ran.
          Pair Xs = make_f32({n, T}, xv), Ds = make_f32({n, T}, dv), Ms = make_f32({n, T}, mv);
          auto fused_again = [&] {
            if (moe) {
              gops().moe_residual_add(gs(), Xs.dev, Ds.dev, W1.dev, ey[0], ew[0], Ms.dev, W2.dev, W3.dev, 1e-6f, out_scale);
            } else {
              gops().norm_residual_add(gs(), Xs.dev, Ds.dev, W3.dev, 1e-6f, out_scale);
            }
          };
          EXPECT_EQ(launches_of(*gpu_, *prof, "post_norm_residual_regs", fused_again), expect_regs ? 1 : 0)
              << "the register-resident kernel ran iff it applies";
          EXPECT_EQ(launches_of(*gpu_, *prof, "post_norm_residual_moe_tail", fused_again), expect_tail ? 1 : 0)
              << "the 512-thread MoE tail ran iff it applies";
          if (moe) {
            gops().Ops::moe_residual_add(gs(), X[1].dev, D[1].dev, W1.dev, ey[1], ew[1], M[1].dev, W2.dev, W3.dev, 1e-6f,
                                         out_scale);
            cops().moe_residual_add(cs(), X[1].cpu, D[1].cpu, W1.cpu, ey[2], ew[2], M[1].cpu, W2.cpu, W3.cpu, 1e-6f, out_scale);
          } else {
            gops().Ops::norm_residual_add(gs(), X[1].dev, D[1].dev, W3.dev, 1e-6f, out_scale);
            cops().norm_residual_add(cs(), X[1].cpu, D[1].cpu, W3.cpu, 1e-6f, out_scale);
          }
          gs().synchronize();
          EXPECT_EQ(download(X[0]), download(X[1])) << "x: fused vs the CUDA ops one at a time";
          EXPECT_LT(rel_l2(download_f32(X[0]), host_f32(X[1])), 1e-6) << "x vs CPU";
          // The residual must have changed (the branch is not a no-op) and stayed finite.
          EXPECT_GT(rel_l2(download_f32(X[0]), xv), 1e-2);
        }
}

TEST_F(GpuDecodeFusion, MoeInputNormsMatchTheOpsOneAtATime) {
  std::string why;
  std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
  ASSERT_NE(prof, nullptr) << why;
  uint32_t seed = 53;
  for (bool regs : {false, true})  // TANDEM_NORM_REGS off and on (4096 values the longest row it keeps)
  for (int64_t n : {72, 2816, 4096, 5000})
    for (int64_t T : {1, 4}) {
      ForcedSwitch norm_regs(cuda::set_norm_regs, regs);
      SCOPED_TRACE("n=" + std::to_string(n) + " T=" + std::to_string(T) + (regs ? " TANDEM_NORM_REGS=1" : ""));
      std::mt19937 rng(seed++);
      const auto xv = random_floats(size_t(n * T), rng, -2, 2);
      const auto rs = random_floats(size_t(n), rng, 0.5f, 1.5f), hn = random_floats(size_t(n), rng, 0.5f, 1.5f);
      Pair X = make_f32({n, T}, xv), RS = make_f32({n}, rs), HN = make_f32({n}, hn);
      Pair R[2] = {make_out(DType::F32, {n, T}), make_out(DType::F32, {n, T})};
      Pair H[2] = {make_out(DType::F32, {n, T}), make_out(DType::F32, {n, T})};
      const float factor = 1.0f / std::sqrt(float(n));
      EXPECT_EQ(launches_of(*gpu_, *prof, "moe_input_norms",
                            [&] { gops().moe_input_norms(gs(), X.dev, 1e-6f, factor, RS.dev, R[0].dev, HN.dev, H[0].dev); }),
                1);
      const int64_t regs_launches = launches_of(*gpu_, *prof, "moe_input_norms_regs", [&] {
        gops().moe_input_norms(gs(), X.dev, 1e-6f, factor, RS.dev, R[0].dev, HN.dev, H[0].dev);  // same inputs again
      });
      EXPECT_EQ(regs_launches, regs && n >= 1024 && n <= 4096 ? 1 : 0) << "the register-resident kernel ran iff it applies";
      gops().Ops::moe_input_norms(gs(), X.dev, 1e-6f, factor, RS.dev, R[1].dev, HN.dev, H[1].dev);
      cops().moe_input_norms(cs(), X.cpu, 1e-6f, factor, RS.cpu, R[1].cpu, HN.cpu, H[1].cpu);
      gs().synchronize();
      EXPECT_EQ(download(R[0]), download(R[1])) << "router input: fused vs the CUDA ops one at a time";
      EXPECT_EQ(download(H[0]), download(H[1])) << "expert input: fused vs the CUDA ops one at a time";
      EXPECT_LT(rel_l2(download_f32(R[0]), host_f32(R[1])), 1e-6) << "router input vs CPU";
      EXPECT_LT(rel_l2(download_f32(H[0]), host_f32(H[1])), 1e-6) << "expert input vs CPU";
    }
}

}  // namespace
}  // namespace tandem::gpu_test
