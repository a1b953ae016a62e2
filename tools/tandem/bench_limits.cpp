// The hardware limits of `tandem bench` (bench.h). The device's copy bandwidth is measured at start (a
// device-to-device copy of >= 1 GiB on CUDA, a host memcpy on the CPU; bytes read + written) unless --bw
// gives it. The matmul rate is --tflops, else 797 TFLOP/s on CUDA (bf16, measured on an H200) or a measured
// f32 matmul on the CPU.
//
// The limits are measured on the main device; under tensor and row splits over several GPUs, whose ranks read
// their shards at the same time, they are multiplied by the number of GPUs (CPU "devices" share one memory,
// and layer splits run one device at a time, so those keep the one-device limits).
#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include "bench.h"

namespace tandem::cli::bench {
namespace {

// Copy bandwidth in bytes/s (read + write), best of several copies of `bytes`.
double measure_copy_bandwidth(Device& dev, size_t bytes) {
  Buffer a = dev.allocate(bytes), b = dev.allocate(bytes);
  Stream& s = dev.default_stream();
  if (dev.id().kind == DeviceKind::CPU) {
    std::memset(a.data(), 1, bytes);
    std::memset(b.data(), 2, bytes);
  }
  dev.copy_device_to_device(s, b.data(), a.data(), bytes);  // warm up (first touch, clocks)
  dev.synchronize();
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    const int n = dev.id().kind == DeviceKind::CPU ? 1 : 10;
    for (int k = 0; k < n; ++k)
      dev.copy_device_to_device(s, (k & 1) ? a.data() : b.data(), (k & 1) ? b.data() : a.data(), bytes);
    dev.synchronize();
    best = std::max(best, 2.0 * double(bytes) * n / seconds_since(t0));
  }
  return best;
}

// F32-weight matmul rate on the CPU, in FLOP/s (the CPU has no bf16 matrix unit to compare against).
double measure_cpu_matmul_rate(Device& dev) {
  const int64_t K = 1024, N = 1024, T = 64;
  std::vector<float> w(static_cast<size_t>(K * N)), x(size_t(K * T)), y(static_cast<size_t>(N * T));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  for (auto& v : w) v = d(rng);
  for (auto& v : x) v = d(rng);
  Tensor W = Tensor::contiguous(DType::F32, {K, N}, w.data(), dev.id());
  Tensor X = Tensor::contiguous(DType::F32, {K, T}, x.data(), dev.id());
  Tensor Y = Tensor::contiguous(DType::F32, {N, T}, y.data(), dev.id());
  WorkspacePlan plan;
  plan.max_rows = T;
  plan.max_matmul_in = K;
  dev.ops().reserve(plan);
  dev.ops().matmul(dev.default_stream(), W, X, Y);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    dev.ops().matmul(dev.default_stream(), W, X, Y);
    best = std::max(best, 2.0 * double(K * N * T) / seconds_since(t0));
  }
  return best;
}

}  // namespace

Limits hardware_limits(Device& dev, const MeshSpec& mesh, double bw_gbs, double tflops) {
  const bool gpu = dev.id().kind == DeviceKind::CUDA;
  const double bw_one =
      bw_gbs > 0 ? bw_gbs * 1e9 : measure_copy_bandwidth(dev, gpu ? (size_t(1) << 30) : (size_t(64) << 20));
  const double rate_one = tflops > 0 ? tflops * 1e12 : gpu ? 797e12 : measure_cpu_matmul_rate(dev);
  // GPUs of a tensor or row split work at the same time (see the top of this file).
  const bool concurrent = gpu && (mesh.mode == SplitMode::Tensor || mesh.mode == SplitMode::Row);
  // Distinct GPUs only: ranks that share one GPU (cuda:0,cuda:0) share its bandwidth and its matmul rate.
  std::set<int> gpus;
  for (const DeviceId& d : mesh.devices) gpus.insert(d.index);
  Limits l;
  l.limit_devices = concurrent ? int(gpus.size()) : 1;
  l.bw = bw_one * l.limit_devices;
  l.rate = rate_one * l.limit_devices;
  l.bw_given = bw_gbs > 0;
  l.rate_source = tflops > 0 ? "given" : gpu ? "H200 bf16, issue 5" : "measured f32 matmul";
  return l;
}

}  // namespace tandem::cli::bench
