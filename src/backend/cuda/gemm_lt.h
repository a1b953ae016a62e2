// Tensor-core matrix products through cuBLASLt for the many-row (prefill) path of matmul:
//   C {N, T} (F32, column stride ldc) = A^T B, A = weights as rows of K values (lda between rows),
//   B = activations as T columns of K values (ldb between columns), A and B both BF16, both F16 or both F32.
// Plans (descriptors + the heuristic's algorithm) are cached per shape, so a call after the first does no
// host work beyond a map lookup, allocates nothing, and can be captured in a CUDA graph.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

namespace tandem::cuda {

enum class GemmType { BF16, F16, F32 };

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Workspace cuBLASLt may use (device memory owned by the caller; kept until the next call).
  void set_workspace(void* data, size_t bytes) {
    workspace_ = data;
    workspace_bytes_ = bytes;
  }
  void matmul(GemmType type, const void* A, int64_t lda, const void* B, int64_t ldb, float* C, int64_t ldc,
              int64_t N, int64_t T, int64_t K, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, size_t>;
  const Plan& plan(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
};

}  // namespace tandem::cuda
