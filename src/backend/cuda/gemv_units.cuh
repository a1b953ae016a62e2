// How the fused decode products (GemvArgs, cuda_kernels.h) lay their work out over the grid: units of `per`
// output rows, segment after segment; the gated forms (SwiGlu, GeGlu) have one segment of outputs, each unit
// taking its gate rows and the same up rows. Shared by the dense (gemv_dense.cu), staged (gemv_quant.cu),
// direct (gemv_quant_direct.cu) and tensor-core (gemv_quant_mma.cu) kernels, which differ only in `per`.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace tandem::cuda {

// Output rows of a unit of R weight rows: R, or for the gated forms R / 2 gate rows and the same R / 2 up
// rows.
template <GemvEpilogue EPI, int R>
constexpr int gemv_outs_per_unit() {
  return kIsGlu<EPI> ? R / 2 : R;
}

// Segment s (a switch, not an index: a.seg indexed by a run-time value would go through local memory).
__device__ __forceinline__ const GemvSeg& gemv_seg(const GemvArgs& a, int s) {
  return s == 0 ? a.seg[0] : s == 1 ? a.seg[1] : a.seg[2];
}

// The segment and first output row of work unit u; false past the end.
template <GemvEpilogue EPI, int per>
__device__ __forceinline__ bool gemv_find_unit(const GemvArgs& a, int64_t u, int& seg, int64_t& row0) {
  const int n = kIsGlu<EPI> ? 1 : a.n_seg;
  for (int s = 0; s < n; ++s) {
    const int64_t nu = (gemv_seg(a, s).N + per - 1) / per;
    if (u < nu) {
      seg = s;
      row0 = u * per;
      return true;
    }
    u -= nu;
  }
  return false;
}

// The number of units of a launch (host side).
template <GemvEpilogue EPI, int per>
inline int64_t gemv_units(const GemvArgs& a) {
  int64_t units = 0;
  const int n = kIsGlu<EPI> ? 1 : a.n_seg;
  for (int s = 0; s < n; ++s) units += (a.seg[s].N + per - 1) / per;
  return units;
}

}  // namespace tandem::cuda
