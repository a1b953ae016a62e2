// Shared pieces of the GPU tests: a fixture with a CPU device (the reference) and cuda:0, device tensors that
// are poisoned before each run (0xFF bytes: NaN for floats, -1 for ints) so that unwritten outputs show, and
// error measures. Every test skips itself when no GPU is present.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kernel_profile.h"
#include "core/half.h"
#include "quant/quant.h"

namespace tandem::gpu_test {

inline bool have_gpu() { return device_count(DeviceKind::CUDA) > 0; }

// A kernel-path switch (an EnvSwitch, src/core/env_switch.h, through its cuda::set_* setter) forced for the
// rest of the scope (nullopt: left to the environment until the test sets it), then given back to the
// environment.
class ForcedSwitch {
 public:
  ForcedSwitch(void (*set)(std::optional<bool>), std::optional<bool> on) : set_(set) { set_(on); }
  ~ForcedSwitch() { set_(std::nullopt); }
  ForcedSwitch(const ForcedSwitch&) = delete;
  ForcedSwitch& operator=(const ForcedSwitch&) = delete;

 private:
  void (*set_)(std::optional<bool>);
};

// Executions of kernels whose short names contain `part` while work() runs (the device finishing it), counted by
// the kernel profiler: how a test sees that a fused path launched what it should (src/backend/kernel_profile.h).
inline int64_t launches_of(Device& dev, KernelProfiler& prof, const std::string& part,
                           const std::function<void()>& work) {
  dev.synchronize();
  prof.begin_window();
  work();
  dev.synchronize();
  int64_t n = 0;
  for (const KernelStat& k : prof.end_window().kernels)
    if (k.name.find(part) != std::string::npos) n += k.calls;
  return n;
}

#define TANDEM_REQUIRE_GPU()                                       \
  do {                                                             \
    if (!::tandem::gpu_test::have_gpu()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// A host tensor and its copy on a device, both contiguous, of the same dtype and shape.
struct Pair {
  std::vector<uint8_t> host;
  Buffer dev_buf;
  Tensor cpu;  // view of host
  Tensor dev;  // view of dev_buf
};

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    cpu_ = create_device(DeviceId{DeviceKind::CPU, 0});
    gpu_ = create_device(DeviceId{DeviceKind::CUDA, 0});
    WorkspacePlan plan;
    plan.max_rows = 256;
    plan.max_matmul_in = 4096;
    plan.max_head_dim = 256;
    plan.max_n_head = 64;
    plan.max_seq_len = 4096;
    plan.max_vocab = 200000;
    cpu_->ops().reserve(plan);
    gpu_->ops().reserve(plan);
  }

  Ops& cops() { return cpu_->ops(); }
  Ops& gops() { return gpu_->ops(); }
  Stream& cs() { return cpu_->default_stream(); }
  Stream& gs() { return gpu_->default_stream(); }

  // A tensor of `type` and dims with the given host bytes, copied to the GPU.
  Pair make(DType type, std::initializer_list<int64_t> dims, const void* bytes = nullptr) {
    Pair p;
    Tensor shape = Tensor::contiguous(type, dims, nullptr);
    const size_t n = shape.nbytes();
    p.host.assign(n, 0xFF);
    if (bytes) std::memcpy(p.host.data(), bytes, n);
    p.dev_buf = gpu_->allocate(n);
    p.cpu = Tensor::contiguous(type, dims, p.host.data(), DeviceId{DeviceKind::CPU, 0});
    p.dev = Tensor::contiguous(type, dims, p.dev_buf.data(), gpu_->id());
    upload(p);
    return p;
  }
  Pair make_f32(std::initializer_list<int64_t> dims, const std::vector<float>& v) {
    return make(DType::F32, dims, v.data());
  }
  Pair make_i32(std::initializer_list<int64_t> dims, const std::vector<int32_t>& v) {
    return make(DType::I32, dims, v.data());
  }
  // An output: host and device poisoned with 0xFF bytes.
  Pair make_out(DType type, std::initializer_list<int64_t> dims) { return make(type, dims, nullptr); }

  void upload(Pair& p) {
    gpu_->copy_from_host(gs(), p.dev_buf.data(), p.host.data(), p.host.size());
    gs().synchronize();
  }
  void poison(Pair& p) {
    std::fill(p.host.begin(), p.host.end(), uint8_t(0xFF));
    upload(p);
  }
  // The device contents, as host bytes of the same layout.
  std::vector<uint8_t> download(const Pair& p) {
    std::vector<uint8_t> out(p.host.size());
    gpu_->copy_to_host(gs(), out.data(), p.dev_buf.data(), out.size());
    gs().synchronize();
    return out;
  }
  std::vector<float> download_f32(const Pair& p) {
    const auto b = download(p);
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
  std::vector<int32_t> download_i32(const Pair& p) {
    const auto b = download(p);
    std::vector<int32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
  static std::vector<float> host_f32(const Pair& p) {
    std::vector<float> v(p.host.size() / 4);
    std::memcpy(v.data(), p.host.data(), p.host.size());
    return v;
  }
  static std::vector<int32_t> host_i32(const Pair& p) {
    std::vector<int32_t> v(p.host.size() / 4);
    std::memcpy(v.data(), p.host.data(), p.host.size());
    return v;
  }

  std::unique_ptr<Device> cpu_, gpu_;
};

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Relative L2 error ||a - b|| / ||b||; +inf when a has a non-finite value (an unwritten, poisoned output).
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    m = std::max(m, std::fabs(double(a[i]) - b[i]));
  }
  return m;
}

// Bytes of a weight matrix {K, N} of `type` made from random values in [-1, 1) (quantized with the reference
// quantizer for block types); `values` gets the dequantized (exact) weights.
inline std::vector<uint8_t> random_weights(DType type, int64_t K, int64_t N, std::mt19937& rng,
                                           std::vector<float>& values) {
  const std::vector<float> src = random_floats(size_t(K * N), rng);
  const size_t row_bytes = dtype_row_bytes(type, K);
  std::vector<uint8_t> bytes(row_bytes * size_t(N));
  values.resize(size_t(K * N));
  switch (type) {
    case DType::F32:
      std::memcpy(bytes.data(), src.data(), bytes.size());
      break;
    case DType::F16:
    case DType::BF16:
      for (size_t i = 0; i < src.size(); ++i) {
        const uint16_t h = type == DType::F16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
      break;
    default:
      quant::quantize_matrix(type, src.data(), bytes.data(), N, K, 4);
      break;
  }
  for (int64_t r = 0; r < N; ++r)
    quant::dequantize_row(type, bytes.data() + size_t(r) * row_bytes, values.data() + r * K, K);
  return bytes;
}

}  // namespace tandem::gpu_test
