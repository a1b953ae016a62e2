// Helpers of the CPU op tests (test_cpu_ops*.cpp): random data, tensors over std::vectors, and a fixture that
// runs every test twice, once with the AVX2 kernels and once with the scalar ones (cpu::set_simd_enabled).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"

namespace tandem::test {

// Normal(0, sigma) values; a drawn exact zero is replaced (inputs are never zero).
inline std::vector<float> random_normal(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = dist(rng);
    while (x == 0.0f);
  }
  return v;
}

template <class T>
Tensor view(std::vector<T>& v, DType type, std::initializer_list<int64_t> dims) {
  return Tensor::contiguous(type, dims, v.data());
}
inline Tensor f32(std::vector<float>& v, std::initializer_list<int64_t> dims) {
  return view(v, DType::F32, dims);
}
inline Tensor i32(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return view(v, DType::I32, dims);
}

// A CPU device with 3 threads (an odd count, so the tiling sees uneven splits) shared by the tests.
inline Device& test_device() {
  static std::unique_ptr<Device> dev = [] {
    DeviceOptions o;
    o.n_threads = 3;
    return create_device(DeviceId{DeviceKind::CPU, 0}, o);
  }();
  return *dev;
}

// Parameter: true = AVX2 kernels (where the CPU has them), false = scalar kernels.
class SimdParam : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { cpu::set_simd_enabled(GetParam()); }
  void TearDown() override { cpu::set_simd_enabled(true); }
  Device& dev() { return test_device(); }
  Ops& ops() { return dev().ops(); }
  Stream& stream() { return dev().default_stream(); }
};

inline std::string simd_name(const ::testing::TestParamInfo<bool>& info) {
  return info.param ? "Avx2" : "Scalar";
}

}  // namespace tandem::test
