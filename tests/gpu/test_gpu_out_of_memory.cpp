// CUDA out of memory at load names what did not fit (the weights, the KV cache and --ctx, the working buffers
// and --batch), how much it needed and how much was free, and the command exits 1 with that message (no
// signal, no CUDA error code). The test takes the GPU's memory itself (cudaMalloc until only a little is
// left: a real shortage, no knob in tandem), then loads the shipped small model (28 MB of weights; KV 8 KiB a
// position; working buffers about 28 KB a --batch row).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../test_cli_util.h"
#include "core/out_of_memory.h"
#include "tandem/model.h"
#include "tandem/session.h"

namespace tandem {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// These tests take nearly all of the GPU's memory: beside other GPU work they would make it fail (and see
// memory move under them). They run only when asked, alone (scripts/device/hardening.sh sets the variable).
#define TANDEM_REQUIRE_GPU_ALONE()                                                                    \
  do {                                                                                                \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";                                                \
    if (!std::getenv("TANDEM_GPU_OOM_TESTS"))                                                         \
      GTEST_SKIP() << "takes the GPU's memory: run alone with TANDEM_GPU_OOM_TESTS=1 (hardening.sh)"; \
  } while (0)

// Holds all but about `leave` bytes of cuda:0's free memory while it lives.
class MemoryHog {
 public:
  explicit MemoryHog(size_t leave) {
    cudaSetDevice(0);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    for (size_t chunk = size_t(1) << 30; chunk >= (size_t(2) << 20);) {
      cudaMemGetInfo(&free_b, &total_b);
      if (free_b < leave + chunk) {
        chunk /= 2;
        continue;
      }
      void* p = nullptr;
      if (cudaMalloc(&p, chunk) != cudaSuccess) {
        cudaGetLastError();
        chunk /= 2;
        continue;
      }
      blocks_.push_back(p);
    }
    cudaMemGetInfo(&free_b, &total_b);
    free_ = free_b;
  }
  ~MemoryHog() {
    for (void* p : blocks_) cudaFree(p);
  }
  size_t free_bytes() const { return free_; }

 private:
  std::vector<void*> blocks_;
  size_t free_ = 0;
};

const std::string kModel = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";

std::string load_error(const ModelParams& mp) {
  try {
    (void)Model::load(kModel, mp);
  } catch (const OutOfMemory& e) {
    return e.what();
  } catch (const Error& e) {
    return std::string("(not OutOfMemory) ") + e.what();
  }
  return "(loaded)";
}

std::string session_error(const std::shared_ptr<Model>& model, int32_t n_ctx, int32_t n_batch) {
  SessionParams sp;
  sp.n_ctx = n_ctx;
  sp.n_batch = n_batch;
  try {
    Session s(model, sp);
  } catch (const Error& e) {
    return e.what();
  }
  return "(created)";
}

// Every message is printed, passed or not (the device logs show what a user would read).
void expect_has(const std::string& msg, const std::vector<std::string>& parts) {
  std::printf("[ message  ] %s\n", msg.c_str());
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
}

TEST(GpuOutOfMemory, WeightsThatDoNotFitNameTheirSizeAndTheFreeMemory) {
  TANDEM_REQUIRE_GPU_ALONE();
  ModelParams mp;
  mp.device = "cuda:0";
  MemoryHog hog(size_t(8) << 20);  // 8 MiB left: the weights need 28 MB
  const std::string msg = load_error(mp);
  expect_has(msg, {"the model's weights need", "on cuda:0", "free of", "GiB", "smaller quantization"});
}

TEST(GpuOutOfMemory, AKvCacheThatDoesNotFitNamesCtxTheBytesAndTheFreeMemory) {
  TANDEM_REQUIRE_GPU_ALONE();
  ModelParams mp;
  mp.device = "cuda:0";
  const auto model = Model::load(kModel, mp);
  MemoryHog hog(size_t(64) << 20);
  // 65536 positions x 8 KiB = 512 MiB of KV cache (and a few blocks of room for a batch), more than the 64
  // MiB left, less than the device has in all (the allocation itself fails, not the up-front check).
  const std::string msg = session_error(model, 65536, 64);
  expect_has(msg, {"the KV cache for a context of 65536 positions (--ctx) needs 5", " MiB) on cuda:0",
                   "out of device memory allocating", "free of", "use a smaller --ctx"});
}

TEST(GpuOutOfMemory, WorkingBuffersThatDoNotFitNameBatch) {
  TANDEM_REQUIRE_GPU_ALONE();
  ModelParams mp;
  mp.device = "cuda:0";
  const auto model = Model::load(kModel, mp);
  MemoryHog hog(size_t(600) << 20);
  // 256 positions + room for one 32768-row batch of KV (about 260 MiB) fit in the 600 MiB left; the working
  // buffers of 32768-row batches (about 28 KB a row: 900 MB) do not.
  const std::string msg = session_error(model, 256, 32768);
  expect_has(msg, {"the working buffers for batches of 32768 rows (--batch) do not fit", "MiB free of",
                   "use a smaller --batch"});
}

// The command line: exit status 1 and the message on one line, not a signal or a CUDA error code.
TEST(GpuOutOfMemory, TheCommandExitsOneWithTheMessage) {
  TANDEM_REQUIRE_GPU_ALONE();
  // The child process's own CUDA context takes part of the 600 MiB left; the weights fit in the rest, a KV
  // cache of 120000 positions (960 MiB) does not.
  MemoryHog hog(size_t(600) << 20);
  const auto r = test::run_tandem("generate -m " + kModel + " --devices cuda:0 -p hi -n 1 --ctx 120000");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  // What does not fit first depends on the child's own CUDA context: the weights, (expected) the KV cache,
  // or, when the context itself took the rest (H200 run of 2026-12-04), the device's first stream.
  std::printf("[ message  ] %s\n", r.out.c_str());
  const bool named = r.out.find("error: the KV cache for a context of 120000 positions (--ctx) needs") !=
                         std::string::npos ||
                     r.out.find("error: the model's weights need") != std::string::npos ||
                     r.out.find("out of device memory setting up the device") != std::string::npos;
  EXPECT_TRUE(named) << r.out;
  EXPECT_NE(r.out.find("free of"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem
