// The attention inputs of one layer in one launch (Ops::qk_norm_rope_store): per-head RMS norm of q and k,
// rope on both, and k / v stored into the paged cache. Unfused this is six launches a layer (two norms, two
// ropes, two stores), each of a few microseconds for ~100 KB of data at decode: the launches, not the bytes,
// are the cost. One warp per head row: q rows, then k rows, then v rows (gemma4: an unweighted norm, then the
// store; otherwise the store only). The arithmetic is that of rms_norm_kernel, rope_kernel and kv_store_kernel
// (same order of operations), so the result is the same bit for bit as the unfused ops.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/row_norm.cuh"
#include "backend/cuda/tensor_rows.h"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;

struct CacheDst {
  char* base;
  size_t nb1, nb2, nb3;
  int block_size;
};

// Where head g of cache slot `slot` starts.
template <class Tag>
__device__ __forceinline__ typename Tag::storage* cache_row(const CacheDst& c, int32_t slot, int64_t g) {
  return reinterpret_cast<typename Tag::storage*>(c.base + size_t(slot % c.block_size) * c.nb2 +
                                                  size_t(slot / c.block_size) * c.nb3 + size_t(g) * c.nb1);
}

template <class Tag>
__device__ __forceinline__ void store_row(const CacheDst& c, int32_t slot, int64_t g, const float* src,
                                          int64_t n, int lane) {
  auto* pd = cache_row<Tag>(c, slot, g);
  for (int64_t i = lane; i < n; i += kWarpSize) Tag::store(pd + i, src[i]);
}

// Head rows of at most kLaneMax * 32 values (gemma4's 512-wide global heads) are read into registers first, all
// of a lane's loads at once: the loops above that store as they go (the V norm in place, the cache store from
// global memory) may alias their next load, so a lane's 8 or 16 values were as many memory latencies one after
// another. A lane's values are lane, lane + 32, ... in that order: row_sum_squares<false>'s, so the same bits.
// (row_norm.cuh's load_row_strided / strided_sum_squares with a warp's stride.)
constexpr int kLaneMax = 16;

__device__ __forceinline__ void load_lane_row(const float* p, int64_t n, int lane, float (&v)[kLaneMax]) {
  load_row_strided<kLaneMax, kWarpSize>(p, n, lane, v);
}

__device__ __forceinline__ float lane_row_sum_squares(const float (&v)[kLaneMax], int64_t n, int lane) {
  return warp_sum(strided_sum_squares<kLaneMax, kWarpSize>(v, n, lane));
}

struct RopeArgs {
  int n_rot;
  bool neox;
  float theta_scale, freq_scale, attn_factor;
  const float* freq_factors;
};

template <class KTag, class VTag>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    attn_inputs_kernel(RowView q, RowView k, RowView v, const float* __restrict__ q_norm,
                       const float* __restrict__ k_norm, bool norm_v, float eps, const int32_t* positions, RopeArgs rp,
                       const int32_t* slots, CacheDst kc, CacheDst vc) {
  extern __shared__ float rows_s[];  // [kWarps][head_dim_k]
  pdl_trigger();  // pdl.cuh
  pdl_wait();     // q, k, v come from the previous kernel
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  int64_t r = int64_t(blockIdx.x) * kWarps + warp;
  const int64_t nq = q.n_rows(), nk = k.n_rows(), nv = v.n_rows();
  if (r >= nq + nk + nv) return;
  if (r >= nq + nk) {  // v row: (normed without a weight, then) stored
    r -= nq + nk;
    const int64_t t = r / v.ne1, g = r % v.ne1;
    float* vr = v.row_as<float>(r);
    const int64_t n = v.ne0;
    if (n <= kLaneMax * kWarpSize) {  // the row in registers
      const int32_t slot = slots[t];
      float vv[kLaneMax];
      load_lane_row(vr, n, lane, vv);
      if (norm_v) {
        const float inv = rms_inverse(lane_row_sum_squares(vv, n, lane), n, eps);
#pragma unroll
        for (int e = 0; e < kLaneMax; ++e) {
          const int64_t i = lane + int64_t(e) * kWarpSize;
          vv[e] = vv[e] * inv;
          if (i < n) vr[i] = vv[e];
        }
      }
      if (slot >= 0) {
        auto* pd = cache_row<VTag>(vc, slot, g);
#pragma unroll
        for (int e = 0; e < kLaneMax; ++e) {
          const int64_t i = lane + int64_t(e) * kWarpSize;
          if (i < n) VTag::store(pd + i, vv[e]);
        }
      }
      return;
    }
    if (norm_v) {  // rms_norm_kernel's arithmetic with no weight, in place
      const float inv = rms_inverse(row_sum_squares<false>(vr, v.ne0, nullptr), v.ne0, eps);
      for (int64_t i = lane; i < v.ne0; i += kWarpSize) vr[i] = vr[i] * inv;
      __syncwarp();
    }
    const int32_t slot = slots[t];
    if (slot >= 0) store_row<VTag>(vc, slot, g, vr, v.ne0, lane);
    return;
  }
  const bool is_q = r < nq;
  if (!is_q) r -= nq;
  const RowView& x = is_q ? q : k;
  const float* w = is_q ? q_norm : k_norm;
  const int64_t t = r / x.ne1;
  float* xr = x.row_as<float>(r);
  float* s = rows_s + warp * x.ne0;
  const int64_t n = x.ne0;
  if (n <= kLaneMax * kWarpSize) {  // the row (and the norm's weights) in registers
    float xv[kLaneMax], wv[kLaneMax];
    load_lane_row(xr, n, lane, xv);
    if (w) {  // rms_norm_kernel's arithmetic
      load_lane_row(w, n, lane, wv);
      const float inv = rms_inverse(lane_row_sum_squares(xv, n, lane), n, eps);
#pragma unroll
      for (int e = 0; e < kLaneMax; ++e) {
        const int64_t i = lane + int64_t(e) * kWarpSize;
        if (i < n) s[i] = xv[e] * inv * wv[e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < kLaneMax; ++e) {
        const int64_t i = lane + int64_t(e) * kWarpSize;
        if (i < n) s[i] = xv[e];
      }
    }
  } else if (w) {  // rms_norm_kernel's arithmetic
    const float inv = rms_inverse(row_sum_squares<false>(xr, n, nullptr), n, eps);
    for (int64_t i = lane; i < n; i += kWarpSize) s[i] = xr[i] * inv * w[i];
  } else {
    for (int64_t i = lane; i < n; i += kWarpSize) s[i] = xr[i];
  }
  __syncwarp();
  // rope_kernel's arithmetic, one lane per rotated pair. theta_i is the running product pos * theta_scale * ...
  // (i factors, in that order); a lane's pairs i, i + 32, ... continue one product instead of restarting it (the
  // same multiplications in the same order: up to half - 1 of them a lane, not ~half^2 / 64; gemma4's global
  // layers rotate 256 pairs).
  const int half = rp.n_rot / 2;
  float running = float(positions[t]);
  int factors = 0;
  for (int i = lane; i < half; i += kWarpSize) {
    for (; factors < i; ++factors) running *= rp.theta_scale;
    const float ff = rp.freq_factors ? rp.freq_factors[i] : 1.0f;
    const float theta = rp.freq_scale * (running / ff);
    const float c = cosf(theta) * rp.attn_factor, sn = sinf(theta) * rp.attn_factor;
    const int i0 = rp.neox ? i : 2 * i;
    const int i1 = rp.neox ? i + half : 2 * i + 1;
    const float x0 = s[i0], x1 = s[i1];
    s[i0] = x0 * c - x1 * sn;
    s[i1] = x0 * sn + x1 * c;
  }
  __syncwarp();
  for (int64_t i = lane; i < n; i += kWarpSize) xr[i] = s[i];
  if (!is_q) {
    const int32_t slot = slots[t];
    if (slot >= 0) store_row<KTag>(kc, slot, r % x.ne1, s, n, lane);
  }
}

CacheDst cache_dst(const Tensor& c, int block_size) {
  return CacheDst{static_cast<char*>(c.data), c.nb[1], c.nb[2], c.nb[3], block_size};
}

template <class KTag, class VTag>
void launch_tags(const RowView& q, const RowView& k, const RowView& v, const float* qn, const float* kn,
                 bool norm_v, float eps, const int32_t* pos, const RopeArgs& rp, const int32_t* slots, const CacheDst& kc,
                 const CacheDst& vc, cudaStream_t stream) {
  const int64_t rows = q.n_rows() + k.n_rows() + v.n_rows();
  const size_t smem = size_t(kWarps) * size_t(q.ne0) * sizeof(float);
  launch_pdl(attn_inputs_kernel<KTag, VTag>, dim3(unsigned((rows + kWarps - 1) / kWarps)), dim3(kWarps * kWarpSize),
             smem, stream, q, k, v, qn, kn, norm_v, eps, pos, rp, slots, kc, vc);
  TANDEM_CUDA_CHECK_LAUNCH();
}

template <class KTag>
void launch_v(DType vt, const RowView& q, const RowView& k, const RowView& v, const float* qn, const float* kn,
              bool norm_v, float eps, const int32_t* pos, const RopeArgs& rp, const int32_t* slots, const CacheDst& kc,
              const CacheDst& vc, cudaStream_t stream) {
  switch (vt) {
    case DType::F32:
      return launch_tags<KTag, F32Tag>(q, k, v, qn, kn, norm_v, eps, pos, rp, slots, kc, vc, stream);
    case DType::F16:
      return launch_tags<KTag, F16Tag>(q, k, v, qn, kn, norm_v, eps, pos, rp, slots, kc, vc, stream);
    case DType::BF16:
      return launch_tags<KTag, BF16Tag>(q, k, v, qn, kn, norm_v, eps, pos, rp, slots, kc, vc, stream);
    default:
      throw Error(std::string("CUDA qk_norm_rope_store: unsupported V cache dtype ") + dtype_name(vt));
  }
}

}  // namespace

void launch_attn_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const float* q_norm,
                        const float* k_norm, bool norm_v, float eps, const int32_t* positions, const RopeParams& p,
                        const float* freq_factors, const KvLayerView& kv, const int32_t* slot_mapping,
                        cudaStream_t stream) {
  const RowView qv = row_view(q), kv_ = row_view(k), vv = row_view(v);
  if (qv.n_rows() + kv_.n_rows() + vv.n_rows() == 0) return;
  RopeArgs rp;
  rp.n_rot = p.n_rot;
  rp.neox = p.mode == RopeMode::Neox;
  rp.theta_scale = powf(p.freq_base, -2.0f / float(p.n_rot));  // as launch_rope
  rp.freq_scale = p.freq_scale;
  rp.attn_factor = p.attn_factor;
  rp.freq_factors = freq_factors;
  const CacheDst kc = cache_dst(kv.k, kv.block_size), vc = cache_dst(kv.v, kv.block_size);
  switch (kv.k.type) {
    case DType::F32:
      return launch_v<F32Tag>(kv.v.type, qv, kv_, vv, q_norm, k_norm, norm_v, eps, positions, rp, slot_mapping, kc, vc,
                              stream);
    case DType::F16:
      return launch_v<F16Tag>(kv.v.type, qv, kv_, vv, q_norm, k_norm, norm_v, eps, positions, rp, slot_mapping, kc, vc,
                              stream);
    case DType::BF16:
      return launch_v<BF16Tag>(kv.v.type, qv, kv_, vv, q_norm, k_norm, norm_v, eps, positions, rp, slot_mapping, kc,
                               vc, stream);
    default:
      throw Error(std::string("CUDA qk_norm_rope_store: unsupported K cache dtype ") + dtype_name(kv.k.type));
  }
}

}  // namespace tandem::cuda
