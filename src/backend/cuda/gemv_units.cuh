// Work units of the decode products (gemv_dense.cu, gemv_quant.cu, gemv_quant_direct.cu,
// gemv_q8_0_octets.cu): a product over up to three weight segments (GemvArgs) is cut into units of PER output
// rows, laid segment after segment; a SwiGlu product has one segment's units (its gate rows; the same up rows
// ride along).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace tandem::cuda {

__device__ __forceinline__ const GemvSeg& gemv_seg_at(const GemvArgs& a, int s) {
  return s == 0   ? a.seg[0]
         : s == 1 ? a.seg[1]
                  : a.seg[2];  // not a.seg[s]: keeps the array out of local memory
}

// The segment and first output row of work unit u; false past the last unit.
template <int PER>
__device__ __forceinline__ bool gemv_find_unit(const GemvArgs& a, bool swiglu, int64_t u, int& seg,
                                               int64_t& row0) {
  const int n_seg = swiglu ? 1 : a.n_seg;
  for (int s = 0; s < n_seg; ++s) {
    const int64_t nu = (gemv_seg_at(a, s).N + PER - 1) / PER;
    if (u < nu) {
      seg = s;
      row0 = u * PER;
      return true;
    }
    u -= nu;
  }
  return false;
}

}  // namespace tandem::cuda
