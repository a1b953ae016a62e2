// The kernel profiler's aggregation and names (src/backend/kernel_profile.h), on made-up records: busy time is
// the union of the kernels' intervals (overlaps counted once), idle is the span minus busy, kernels of one
// short name are summed, the table is by time. And `tandem bench --profile` refuses what it cannot profile.
// The CUPTI recording itself needs a GPU: tests/gpu/test_gpu_kernel_profile.cpp.
#include <gtest/gtest.h>

#include <string>

#include "backend/kernel_profile.h"
#include "test_cli_util.h"

namespace tandem {
namespace {

TEST(KernelProfile, BusyIsTheUnionOfIntervalsAndIdleTheRestOfTheSpan) {
  // a: [100, 200), b: [150, 250) overlaps a, c: [400, 450) after a gap of 150 ns, d: [420, 430) inside c.
  std::vector<KernelRecord> r = {{"c", 400, 450}, {"a", 100, 200}, {"d", 420, 430}, {"b", 150, 250}};
  const KernelProfile p = summarize_kernels(r);
  EXPECT_EQ(p.launches, 4);
  EXPECT_NEAR(p.span_seconds, 350e-9, 1e-15);
  EXPECT_NEAR(p.busy_seconds, (150 + 50) * 1e-9, 1e-15);  // [100, 250) and [400, 450)
  EXPECT_NEAR(p.idle_seconds(), 150e-9, 1e-15);
  EXPECT_NEAR(p.kernel_seconds, (100 + 100 + 50 + 10) * 1e-9, 1e-15);
  ASSERT_EQ(p.kernels.size(), 4u);
  EXPECT_EQ(p.kernels[0].name, "a");  // a and b tie at 100 ns: by name
  EXPECT_EQ(p.kernels[1].name, "b");
  EXPECT_EQ(p.kernels[2].name, "c");
  EXPECT_EQ(p.kernels[3].name, "d");
}

TEST(KernelProfile, CallsOfOneKernelAreSummedAndSortedByTime) {
  std::vector<KernelRecord> r;
  for (int i = 0; i < 5; ++i) r.push_back({"small", uint64_t(1000 * i), uint64_t(1000 * i + 10)});
  r.push_back({"big", 10000, 10200});
  r.push_back({"broken", 20000, 19000});  // end before start: dropped
  const KernelProfile p = summarize_kernels(r);
  ASSERT_EQ(p.kernels.size(), 2u);
  EXPECT_EQ(p.kernels[0].name, "big");
  EXPECT_EQ(p.kernels[0].calls, 1);
  EXPECT_EQ(p.kernels[1].name, "small");
  EXPECT_EQ(p.kernels[1].calls, 5);
  EXPECT_NEAR(p.kernels[1].seconds, 50e-9, 1e-15);
  EXPECT_EQ(p.launches, 6);
  EXPECT_TRUE(summarize_kernels({}).kernels.empty());
}

TEST(KernelProfile, ShortNamesDropReturnTypeNamespacesAndParameters) {
  // A mangled name as CUPTI reports it: void tandem::cuda::(anonymous namespace)::k<(tandem::DType)8, 1>(float const*, int)
  EXPECT_EQ(short_kernel_name("_ZN6tandem4cuda12_GLOBAL__N_11kILNS_5DTypeE8ELi1EEEvPKfi"), "k<(DType)8, 1>");
  EXPECT_EQ(short_kernel_name("void tandem::cuda::(anonymous namespace)::gemv<(tandem::DType)8, 1>"
                              "(tandem::cuda::GemvArgs, float const*)"),
            "gemv<(DType)8, 1>");
  EXPECT_EQ(short_kernel_name("void cub::DeviceReduceKernel<int>(int*)"), "DeviceReduceKernel<int>");
  EXPECT_EQ(short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32"), "sm90_xmma_gemm_bf16bf16_bf16f32");
  EXPECT_EQ(short_kernel_name("_Znot_a_valid_mangling"), "_Znot_a_valid_mangling");
}

TEST(KernelProfile, BenchProfileNeedsAGpuAndTgSteps) {
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  auto r = test::run_tandem("bench -m '" + model + "' --device cpu --profile -p 0 -n 4 -r 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("bench --profile: records the kernels of a GPU; the device is cpu"), std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace tandem
