// The arguments of matmul_id's grouped GEMMs (moe_gemm_tc.cu: register-staged, any 16-bit or block weight type;
// moe_gemm_pipelined.cu: cp.async pipeline, F16/BF16; moe.cu's f32 fallback adds its ids), made from the op's
// tensors in one place.
// W {K, N, n_expert}; x F32 {K, kx, T} (kx 1: every slot of a token reads the same row); y F32 {N, k, T}; slot
// s = j + k t; offsets / sorted: the slots grouped by expert (launch_moe_group).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace tandem::cuda {

struct GroupedGemmArgs {
  const char* W;
  size_t w_ld, w_es;
  int64_t K, N;
  const char* x;
  size_t x_nb1, x_nb2;
  int kx, k;
  const int32_t* offsets;
  const int32_t* sorted;
  char* y;
  size_t y_nb1, y_nb2;
};

inline GroupedGemmArgs grouped_gemm_args(const Tensor& W, const Tensor& x, const int32_t* offsets,
                                         const int32_t* sorted, const Tensor& y) {
  GroupedGemmArgs a;
  a.W = static_cast<const char*>(W.data);
  a.w_ld = W.nb[1];
  a.w_es = W.nb[2];
  a.K = W.ne[0];
  a.N = W.ne[1];
  a.x = static_cast<const char*>(x.data);
  a.x_nb1 = x.nb[1];
  a.x_nb2 = x.nb[2];
  a.kx = int(x.ne[1]);
  a.k = int(y.ne[1]);
  a.offsets = offsets;
  a.sorted = sorted;
  a.y = static_cast<char*>(y.data);
  a.y_nb1 = y.nb[1];
  a.y_nb2 = y.nb[2];
  return a;
}

}  // namespace tandem::cuda
