#include "backend/cuda/gemm_lt.h"

#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace tandem::cuda {
namespace {

void lt_check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLASLt error: ") + cublasLtGetStatusString(status) + " in " + what);
}

cudaDataType_t data_type(GemmType t) {
  switch (t) {
    case GemmType::BF16:
      return CUDA_R_16BF;
    case GemmType::F16:
      return CUDA_R_16F;
    case GemmType::F32:
      break;
  }
  return CUDA_R_32F;
}

int alignment(const void* p, int64_t ld, size_t elem) {
  // The largest power of two (<= 256) dividing the address and the byte stride between columns.
  const uint64_t v = uint64_t(reinterpret_cast<uintptr_t>(p)) | uint64_t(ld) * elem | 256u;
  return int(v & (~v + 1));
}

}  // namespace

LtGemm::LtGemm() {
  lt_check(cublasLtCreate(&handle_), "cublasLtCreate");
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (handle_) cublasLtDestroy(handle_);
}

const LtGemm::Plan& LtGemm::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [type_i, lda, ldb, ldc, N, T, K, align_a, align_b, align_c, ws] = key;
  const cudaDataType_t in_type = data_type(GemmType(type_i));
  Plan p;
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  lt_check(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)),
           "TRANSA");
  lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)),
           "TRANSB");
  // Column-major views: A is K x N (ld lda), B is K x T (ld ldb), C is N x T (ld ldc).
  lt_check(cublasLtMatrixLayoutCreate(&p.a, in_type, uint64_t(K), uint64_t(N), lda), "layout A");
  lt_check(cublasLtMatrixLayoutCreate(&p.b, in_type, uint64_t(K), uint64_t(T), ldb), "layout B");
  lt_check(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, uint64_t(N), uint64_t(T), ldc), "layout C");

  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws_bytes = ws;
  const uint32_t aa = uint32_t(align_a), ab = uint32_t(align_b), ac = uint32_t(align_c);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                       sizeof(ws_bytes));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || returned == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
    throw Error("cuBLASLt found no algorithm for a " + std::to_string(N) + " x " + std::to_string(K) +
                " by " + std::to_string(K) + " x " + std::to_string(T) + " product");
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void LtGemm::matmul(GemmType type, const void* A, int64_t lda, const void* B, int64_t ldb, float* C,
                    int64_t ldc, int64_t N, int64_t T, int64_t K, cudaStream_t stream) {
  if (N == 0 || T == 0) return;
  const size_t elem = type == GemmType::F32 ? 4 : 2;
  const Key key{int(type),
                lda,
                ldb,
                ldc,
                N,
                T,
                K,
                alignment(A, lda, elem),
                alignment(B, ldb, elem),
                alignment(C, ldc, 4),
                workspace_bytes_};
  const Plan& p = plan(key);
  const float alpha = 1.0f, beta = 0.0f;
  lt_check(cublasLtMatmul(handle_, p.desc, &alpha, A, p.a, B, p.b, &beta, C, p.c, C, p.c, &p.algo, workspace_,
                          workspace_bytes_, stream),
           "cublasLtMatmul");
}

}  // namespace tandem::cuda
