// CPU matmul against a double-precision loop over the dequantized weights, for every weight dtype, with both
// the AVX2 and the scalar kernels.
//
// Error bounds (per output y[o, t], exact = sum_i w_i x_i in double, w = the dequantized weights):
// - f32 / f16 / bf16 weights (f32 products, f32 sums in any order): the classic summation bound
//   |y - exact| <= n * u * sum_i |w_i x_i| with u = 2^-24, times 1.5 for slack in how the bound is reached.
// - quantized weights: x is rounded to 8 bits per block (d_b = max|x over block b| / 127, |x_i - d_b q_i| <=
//   d_b / 2), so |y - exact| <= sum_i |w_i| d_b(i) / 2 (x 1.001 for the f32 rounding of d and x / d) plus the
//   f32 summation term above. That bound is rigorous but loose, so a second check bounds the RMS error over
//   all outputs: per term the rounding error is ~uniform with sd d / sqrt(12), giving an expected relative
//   RMS error of about (max|x| / 127) / sqrt(12) / rms(x) ~ 0.6% for 256-blocks of N(0, 1) (max ~ 2.9 sigma)
//   and ~0.5% for 32-blocks; the test allows 1.5%.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul_kernels.h"
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "test_cpu_ops_util.h"

namespace tandem::test {
namespace {

constexpr double kU = 1.0 / (1 << 24);

struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // dequantized, row-major {in, out}
  Tensor tensor;
};

Weights make_weights(DType type, int64_t n_in, int64_t n_out, uint32_t seed) {
  Weights w;
  const std::vector<float> src = random_normal(size_t(n_in * n_out), seed, 0.5f);
  const size_t row_bytes = dtype_row_bytes(type, n_in);
  w.bytes.resize(row_bytes * size_t(n_out));
  w.deq.resize(src.size());
  for (int64_t o = 0; o < n_out; ++o) {
    quant::quantize_row_naive(type, src.data() + o * n_in, w.bytes.data() + size_t(o) * row_bytes, n_in);
    quant::dequantize_row(type, w.bytes.data() + size_t(o) * row_bytes, w.deq.data() + o * n_in, n_in);
  }
  w.tensor = Tensor::contiguous(type, {n_in, n_out}, w.bytes.data());
  return w;
}

int64_t act_block(DType type) {
  switch (type) {
    case DType::Q8_0:
    case DType::Q4_0:
      return 32;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return 256;
    default:
      return 0;  // f32 activations
  }
}

struct MatmulCase {
  DType type;
  int64_t n_in, n_out, T;
};

class CpuMatmul : public SimdParam {};

// Checks the per-output bound; returns {sum of squared errors, sum of squared exact values} for the RMS
// check.
std::pair<double, double> run_case(Ops& ops, Stream& s, const MatmulCase& c, uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(c.type)) + " in=" + std::to_string(c.n_in) +
               " out=" + std::to_string(c.n_out) + " T=" + std::to_string(c.T));
  Weights w = make_weights(c.type, c.n_in, c.n_out, seed);
  std::vector<float> x = random_normal(size_t(c.n_in * c.T), seed + 1);
  std::vector<float> y(size_t(c.n_out * c.T), NAN);
  ops.matmul(s, w.tensor, f32(x, {c.n_in, c.T}), f32(y, {c.n_out, c.T}));

  const int64_t blk = act_block(c.type);
  double err2 = 0.0, ref2 = 0.0;
  for (int64_t t = 0; t < c.T; ++t) {
    const float* xt = x.data() + t * c.n_in;
    std::vector<double> half_step(size_t(c.n_in), 0.0);  // d_b / 2 of each x value's block
    if (blk) {
      for (int64_t b0 = 0; b0 < c.n_in; b0 += blk) {
        double amax = 0.0;
        for (int64_t i = b0; i < b0 + blk; ++i) amax = std::max(amax, std::fabs(double(xt[i])));
        for (int64_t i = b0; i < b0 + blk; ++i) half_step[size_t(i)] = amax / 127.0 / 2.0;
      }
    }
    for (int64_t o = 0; o < c.n_out; ++o) {
      const float* wo = w.deq.data() + o * c.n_in;
      double exact = 0.0, abs_sum = 0.0, quant_bound = 0.0;
      for (int64_t i = 0; i < c.n_in; ++i) {
        exact += double(wo[i]) * double(xt[i]);
        abs_sum += std::fabs(double(wo[i]) * double(xt[i]));
        quant_bound += std::fabs(double(wo[i])) * half_step[size_t(i)];
      }
      const double bound = 1.5 * double(c.n_in) * kU * abs_sum * (blk ? 2.0 : 1.0) + 1.001 * quant_bound;
      const double got = y[size_t(t * c.n_out + o)];
      EXPECT_LE(std::fabs(got - exact), bound) << "o=" << o << " t=" << t << " exact=" << exact;
      if (std::fabs(got - exact) > bound) return {0.0, 1.0};
      err2 += (got - exact) * (got - exact);
      ref2 += exact * exact;
    }
  }
  return {err2, ref2};
}

const DType kAllTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                           DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

TEST_P(CpuMatmul, EveryDtypeAgainstDoubleReference) {
  uint32_t seed = 100;
  for (DType type : kAllTypes) {
    double err2 = 0.0, ref2 = 0.0;  // over all outputs of the type (one output alone is too few for an RMS)
    for (int64_t T : {1, 3, 17, 70}) {  // 70 > 64 spans two column tiles
      for (int64_t n_out : {1, 7, 33}) {
        const int64_t n_in = (T == 17) ? 768 : 512;
        const auto [e, r] = run_case(ops(), stream(), {type, n_in, n_out, T}, seed++);
        err2 += e;
        ref2 += r;
      }
    }
    if (act_block(type)) {
      std::printf("  %s: relative RMS error vs the exact product %.3f%%\n", dtype_name(type),
                  100.0 * std::sqrt(err2 / ref2));
      EXPECT_LE(std::sqrt(err2 / ref2), 0.015)
          << dtype_name(type) << ": relative RMS error of the 8-bit path";
    }
  }
}

TEST_P(CpuMatmul, BlockMultiplesThatAreNot256) {
  // Row lengths that are multiples of 32 only, for the 32-blocks and the plain types (and odd ones for f32).
  uint32_t seed = 900;
  for (DType type : {DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16})
    run_case(ops(), stream(), {type, 96, 5, 3}, seed++);
  run_case(ops(), stream(), {DType::F32, 37, 9, 5}, seed++);
}

TEST_P(CpuMatmul, StridedActivationAndOutputRows) {
  // x and y as views into wider buffers (row stride larger than the row).
  Weights w = make_weights(DType::Q4_K, 256, 10, 7);
  const int64_t T = 5, x_pitch = 300, y_pitch = 16;
  std::vector<float> xbuf = random_normal(size_t(x_pitch * T), 8);
  std::vector<float> ybuf(size_t(y_pitch * T), -7.0f), yref(size_t(10 * T));
  Tensor x = Tensor::contiguous(DType::F32, {256, T}, xbuf.data());
  x.nb[1] = x_pitch * sizeof(float);
  Tensor y = Tensor::contiguous(DType::F32, {10, T}, ybuf.data());
  y.nb[1] = y_pitch * sizeof(float);
  ops().matmul(stream(), w.tensor, x, y);
  std::vector<float> xc(size_t(256 * T));
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(&xc[size_t(t * 256)], &xbuf[size_t(t * x_pitch)], 256 * sizeof(float));
  ops().matmul(stream(), w.tensor, f32(xc, {256, T}), f32(yref, {10, T}));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < 10; ++o) EXPECT_EQ(ybuf[size_t(t * y_pitch + o)], yref[size_t(t * 10 + o)]);
    for (int64_t o = 10; o < y_pitch; ++o)
      EXPECT_EQ(ybuf[size_t(t * y_pitch + o)], -7.0f) << "wrote past the row";
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, CpuMatmul, ::testing::Bool(), simd_name);

// The two kernel sets compute identical integer sums, so they agree to f32 rounding of the final sums.
TEST(CpuMatmulKernels, Avx2MatchesScalar) {
  if (!cpu::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  uint32_t seed = 500;
  for (DType type : kAllTypes) {
    SCOPED_TRACE(dtype_name(type));
    Weights w = make_weights(type, 1024, 9, seed++);
    std::vector<float> x = random_normal(1024 * 6, seed++);
    std::vector<float> y_avx(9 * 6), y_scalar(9 * 6);
    Ops& ops = test_device().ops();
    cpu::set_simd_enabled(true);
    ops.matmul(test_device().default_stream(), w.tensor, f32(x, {1024, 6}), f32(y_avx, {9, 6}));
    cpu::set_simd_enabled(false);
    ops.matmul(test_device().default_stream(), w.tensor, f32(x, {1024, 6}), f32(y_scalar, {9, 6}));
    cpu::set_simd_enabled(true);
    double scale = 0.0;
    for (float v : y_scalar) scale = std::max(scale, std::fabs(double(v)));
    for (size_t i = 0; i < y_avx.size(); ++i) EXPECT_NEAR(y_avx[i], y_scalar[i], 2e-5 * scale) << i;
  }
}

// The AVX-512 VNNI prefill path (Q8_0, 8 or more rows) gives the AVX2 kernel's bits: the whole product with
// it on and off, and every row against that row computed alone (one row always takes the AVX2 kernel), so a
// row's result does not depend on the batch around it. Weights include the extreme level -128 (which
// quantization never writes but a file may hold) and all-zero blocks.
TEST(CpuMatmulKernels, VnniPrefillMatchesAvx2BitForBit) {
  if (!cpu::cpu_has_avx512_vnni()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  Ops& ops = test_device().ops();
  Stream& st = test_device().default_stream();
  uint32_t seed = 700;
  for (int64_t n_in : {32, 96, 1024}) {
    for (int64_t T : {8, 9, 15, 16, 63, 64, 65, 130}) {
      SCOPED_TRACE("n_in=" + std::to_string(n_in) + " T=" + std::to_string(T));
      const int64_t n_out = 11;
      Weights w = make_weights(DType::Q8_0, n_in, n_out, seed++);
      auto* blocks = reinterpret_cast<quant::BlockQ8_0*>(w.bytes.data());
      blocks[0].qs[3] = -128;
      blocks[0].qs[17] = -128;
      if (n_in >= 96) std::memset(blocks[1].qs, 0, 32);
      std::vector<float> x = random_normal(size_t(n_in * T), seed++, 1.5f);
      std::vector<float> y_vnni(size_t(n_out * T)), y_avx2(size_t(n_out * T)), y_row(static_cast<size_t>(n_out));
      ops.matmul(st, w.tensor, f32(x, {n_in, T}), f32(y_vnni, {n_out, T}));
      cpu::set_vnni_enabled(false);
      ops.matmul(st, w.tensor, f32(x, {n_in, T}), f32(y_avx2, {n_out, T}));
      cpu::set_vnni_enabled(true);
      EXPECT_EQ(std::memcmp(y_vnni.data(), y_avx2.data(), y_vnni.size() * sizeof(float)), 0);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> xt(x.begin() + t * n_in, x.begin() + (t + 1) * n_in);
        ops.matmul(st, w.tensor, f32(xt, {n_in, 1}), f32(y_row, {n_out, 1}));
        ASSERT_EQ(std::memcmp(y_row.data(), y_vnni.data() + t * n_out, size_t(n_out) * sizeof(float)), 0)
            << "row " << t;
      }
    }
  }
}

TEST(CpuMatmulKernels, ActivationQuantizationIsBitIdentical) {
  if (!cpu::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::vector<float> x = random_normal(1024, 3, 2.0f);
  x[5] = 0.0f;  // exact zeros and halves must round the same way in both
  x[6] = 0.5f;
  std::vector<uint8_t> a(4096), b(4096);
  cpu::scalar::quantize_q8x32(x.data(), a.data(), 1024);
  cpu::avx2::quantize_q8x32(x.data(), b.data(), 1024);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), cpu::act_row_bytes(cpu::ActFormat::Q8x32, 1024)), 0);
  cpu::scalar::quantize_q8x256(x.data(), a.data(), 1024);
  cpu::avx2::quantize_q8x256(x.data(), b.data(), 1024);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), cpu::act_row_bytes(cpu::ActFormat::Q8x256, 1024)), 0);
}

TEST(CpuMatmulErrors, BadShapesAndTypes) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  Weights w = make_weights(DType::Q8_0, 64, 4, 1);
  std::vector<float> x(64 * 2, 1.0f), y(4 * 2);
  EXPECT_THROW(ops.matmul(s, w.tensor, f32(x, {32, 4}), f32(y, {4, 2})), Error);  // x width != in
  EXPECT_THROW(ops.matmul(s, w.tensor, f32(x, {64, 2}), f32(y, {2, 4})), Error);  // y shape
  std::vector<int32_t> wi(64 * 4);
  EXPECT_THROW(ops.matmul(s, i32(wi, {64, 4}), f32(x, {64, 2}), f32(y, {4, 2})), Error);  // weight type
  Tensor on_gpu = f32(x, {64, 2});
  on_gpu.device = DeviceId{DeviceKind::CUDA, 0};
  EXPECT_THROW(ops.matmul(s, w.tensor, on_gpu, f32(y, {4, 2})), Error);
}

TEST(CpuWorkspace, ReserveThenNoGrowth) {
  DeviceOptions o;
  o.n_threads = 2;
  auto dev = create_device(DeviceId{DeviceKind::CPU, 1}, o);
  auto& ops = static_cast<cpu::CpuOps&>(dev->ops());
  WorkspacePlan plan;
  plan.max_rows = 8;
  plan.max_matmul_in = 512;
  plan.max_head_dim = 64;
  plan.max_n_head = 4;
  plan.max_seq_len = 64;
  plan.max_vocab = 1000;
  ops.reserve(plan);
  const size_t reserved = ops.workspace_bytes();
  EXPECT_GT(reserved, 0u);
  for (DType type : {DType::Q8_0, DType::Q4_K, DType::F32}) {
    Weights w = make_weights(type, 512, 3, 2);
    std::vector<float> x = random_normal(512 * 8, 3), y(3 * 8);
    ops.matmul(dev->default_stream(), w.tensor, f32(x, {512, 8}), f32(y, {3, 8}));
  }
  std::vector<float> logits = random_normal(1000 * 2, 4), u = {0.25f, 0.75f};
  std::vector<int32_t> out(2);
  SamplerParams sp;
  sp.top_p = 0.9f;
  ops.sample_rows(dev->default_stream(), f32(logits, {1000, 2}), sp, f32(u, {2}), i32(out, {2}));
  EXPECT_EQ(ops.workspace_bytes(), reserved) << "an op allocated within the reserved bounds";
}

}  // namespace
}  // namespace tandem::test
