#include "backend/cuda/kernel_smem.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "backend/cuda/cuda_check.h"

namespace tandem::cuda {

void allow_dynamic_smem(const void* kernel, int bytes) {
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::set<std::tuple<int, const void*, int>> done;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.emplace(device, kernel, bytes).second) return;
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

int resident_blocks(const void* kernel, int threads, size_t smem) {
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, kernel, threads, smem);
  if (auto it = known.find(key); it != known.end()) return it->second;
  int per_sm = 0, sms = 0;
  TANDEM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return known[key] = per_sm * sms;
}

}  // namespace tandem::cuda
