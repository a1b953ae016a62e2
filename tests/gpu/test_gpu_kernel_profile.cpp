// The kernel profiler (src/backend/kernel_profile.h) on a GPU: it records the kernels launched in its window,
// directly and from a CUDA graph (a decode step runs as one), with their count, and nothing outside it. Fails
// (not skips) when CUPTI cannot be loaded: the GPU machine's CUDA toolkit has it, and `tandem bench --profile`
// depends on it.
#include <string>

#include "backend/kernel_profile.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

class GpuKernelProfile : public GpuTest {};

int64_t calls_of(const KernelProfile& p, const std::string& part) {
  int64_t n = 0;
  for (const KernelStat& k : p.kernels)
    if (k.name.find(part) != std::string::npos) n += k.calls;
  return n;
}

TEST_F(GpuKernelProfile, RecordsDirectAndGraphLaunchesInItsWindowOnly) {
  std::string why;
  std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
  ASSERT_NE(prof, nullptr) << why;
  std::string again;
  EXPECT_EQ(KernelProfiler::start(&again), nullptr);  // one at a time
  EXPECT_NE(again.find("already running"), std::string::npos) << again;

  std::mt19937 rng(3);
  const int64_t n = 4096, rows = 8;  // one block a row: the block kernel
  Pair x = make_f32({n, rows}, random_floats(size_t(n * rows), rng));
  Pair out = make_out(DType::F32, {n, rows});
  gpu_->synchronize();
  gops().rms_norm(gs(), x.dev, nullptr, 1e-6f, out.dev);  // before the window: not counted
  gpu_->synchronize();

  prof->begin_window();
  for (int i = 0; i < 5; ++i) gops().rms_norm(gs(), x.dev, nullptr, 1e-6f, out.dev);
  gpu_->synchronize();
  const KernelProfile direct = prof->end_window();
  const int64_t per_call = calls_of(direct, "rms_norm");
  ASSERT_GE(per_call, 5) << "no rms_norm kernel recorded";
  EXPECT_EQ(per_call % 5, 0);
  EXPECT_EQ(direct.launches, per_call);
  EXPECT_GT(direct.busy_seconds, 0.0);
  EXPECT_LE(direct.busy_seconds, direct.span_seconds + 1e-12);
  EXPECT_GE(direct.kernel_seconds + 1e-12, direct.busy_seconds);

  // A graph of two calls: recorded and run once, then replayed twice: 3 x 2 calls.
  prof->begin_window();
  const std::function<void(Stream&)> body = [&](Stream& s) {
    gops().rms_norm(s, x.dev, nullptr, 1e-6f, out.dev);
    gops().rms_norm(s, x.dev, nullptr, 1e-6f, out.dev);
  };
  for (int i = 0; i < 3; ++i) gpu_->run_recorded(gs(), 0x70726f66696c65ull, body);
  gpu_->synchronize();
  const KernelProfile graphed = prof->end_window();
  EXPECT_EQ(calls_of(graphed, "rms_norm"), 6 * per_call / 5);

  prof->begin_window();  // nothing runs
  gpu_->synchronize();
  EXPECT_EQ(prof->end_window().launches, 0);

  prof.reset();  // a new profiler may start after the first ended
  std::unique_ptr<KernelProfiler> second = KernelProfiler::start(&why);
  ASSERT_NE(second, nullptr) << why;
  second->begin_window();
  gops().rms_norm(gs(), x.dev, nullptr, 1e-6f, out.dev);
  gpu_->synchronize();
  EXPECT_EQ(calls_of(second->end_window(), "rms_norm"), per_call / 5);
}

}  // namespace
}  // namespace tandem::gpu_test
