// Token selection on the device: argmax, the top-k / top-p / min-p / temperature chain of sample_rows, and
// the per-row reduction of the entropy-bound diffusion sampler. One block per row.
//
// sample_rows never sorts the vocabulary. The chain's kept set is always a prefix of the order (logit
// descending, token id ascending), so each step is a selection in that order: a 4-pass radix select over the
// 32-bit order key of the logit (8 bits a pass; a histogram of counts, or of probability mass, over the
// candidates that match the digits chosen so far), then one ordered scan over the tokens whose key ties, in
// id order. Masses are fixed-point integers (exp(l - max) * 2^40), so every sum is exact and
// order-independent and the result is deterministic. The final draw walks the kept tokens in id order
// (backend.h), one ordered scan.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/tensor_rows.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr double kFixedOne = 1099511627776.0;  // 2^40

// Monotonic map of a float to uint32 (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <class T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int o = 1; o < kWarpSize; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

// Inclusive scan over the block (blockDim.x a multiple of 32); total gets the block sum. scratch: 32 T.
template <class T>
__device__ __forceinline__ T block_inclusive_scan(T v, T* scratch, T& total) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  v = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == kWarpSize - 1) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < n_warps ? scratch[lane] : T(0);
    w = warp_inclusive_scan(w);
    if (lane < n_warps) scratch[lane] = w;
  }
  __syncthreads();
  total = scratch[n_warps - 1];
  return warp > 0 ? v + scratch[warp - 1] : v;
}

// A thread's running (value, index) of the maximum, visiting indices in increasing order: the first index of
// the maximum wins, NaN never does.
__device__ __forceinline__ void argmax_visit(float v, int64_t i, float& bv, int& bi) {
  if (v != v) return;
  if (bi == INT_MAX || v > bv) {
    bv = v;
    bi = int(i);
  }
}

// First index of the maximum (NaN never wins); every thread gets (value, index).
//
// A row is read with 16-byte loads, kArgmaxLoads of them in flight per thread: one block walks the whole
// vocabulary (151936 logits, 594 KB for Qwen3), and a plain loop of 4-byte loads had one in flight per
// thread: 37 us per greedy token on an H100 (tandem bench --profile, tenth session), more than a layer's
// attention. Each thread still visits its indices in increasing order (head, 16-byte groups, tail).
constexpr int kArgmaxLoads = 8;
__device__ __forceinline__ void block_argmax(const float* row, int64_t V, float& best_v, int& best_i) {
  __shared__ float sv[32];
  __shared__ int si[32];
  float bv = -INFINITY;
  int bi = INT_MAX;
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  // Scalars up to the first 16-byte boundary (a row of an F32 tensor is 4-byte aligned), then float4 groups.
  const int64_t head = std::min<int64_t>(V, int64_t((16 - reinterpret_cast<uintptr_t>(row) % 16) % 16) / 4);
  for (int64_t i = tid; i < head; i += nt) argmax_visit(row[i], i, bv, bi);
  const float4* r4 = reinterpret_cast<const float4*>(row + head);
  const int64_t n4 = (V - head) / 4;
  int64_t j = tid;
  for (; j + (kArgmaxLoads - 1) * nt < n4; j += kArgmaxLoads * nt) {
    float4 g[kArgmaxLoads];
#pragma unroll
    for (int u = 0; u < kArgmaxLoads; ++u) g[u] = r4[j + u * nt];
#pragma unroll
    for (int u = 0; u < kArgmaxLoads; ++u) {
      const int64_t i0 = head + 4 * (j + u * nt);
      argmax_visit(g[u].x, i0, bv, bi);
      argmax_visit(g[u].y, i0 + 1, bv, bi);
      argmax_visit(g[u].z, i0 + 2, bv, bi);
      argmax_visit(g[u].w, i0 + 3, bv, bi);
    }
  }
  for (; j < n4; j += nt) {
    const float4 g = r4[j];
    const int64_t i0 = head + 4 * j;
    argmax_visit(g.x, i0, bv, bi);
    argmax_visit(g.y, i0 + 1, bv, bi);
    argmax_visit(g.z, i0 + 2, bv, bi);
    argmax_visit(g.w, i0 + 3, bv, bi);
  }
  for (int64_t i = head + 4 * n4 + tid; i < V; i += nt) argmax_visit(row[i], i, bv, bi);
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  __syncthreads();
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  const int n_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  bv = lane < n_warps ? sv[lane] : -INFINITY;
  bi = lane < n_warps ? si[lane] : INT_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  best_v = bv;
  best_i = bi == INT_MAX ? 0 : bi;
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(RowView logits, int32_t* __restrict__ out) {
  const int64_t t = blockIdx.x;
  float v;
  int i;
  block_argmax(logits.row_as<const float>(t), logits.ne0, v, i);
  if (threadIdx.x == 0) out[t] = i;
}

// ---- sample_rows ------------------------------------------------------------------------------------------
struct ChainState {
  float m;  // max logit
  float temp;
  float min_p;
  uint32_t tk;  // kept: key > tk, or key == tk and id <= tid
  int tid;
};

__device__ __forceinline__ bool in_prefix(const ChainState& s, uint32_t key, int id) {
  return key > s.tk || (key == s.tk && id <= s.tid);
}

// Kept by the chain so far (prefix), and by min_p when with_min_p.
__device__ __forceinline__ bool kept(const ChainState& s, float l, uint32_t key, int id, bool with_min_p) {
  if (!in_prefix(s, key, id)) return false;
  return !with_min_p || s.min_p <= 0.0f || expf(l - s.m) >= s.min_p;
}

__device__ __forceinline__ unsigned long long fixed_mass(float l, const ChainState& s, float temp) {
  const float e = expf((l - s.m) / temp);
  return e > 0.0f ? (unsigned long long)(double(e) * kFixedOne) : 0ull;  // 0 for -inf (and NaN) logits
}

struct SelectShared {
  unsigned int count[256];
  unsigned long long mass[256];
  unsigned long long scan[32];
  uint32_t prefix;
  unsigned long long rem;
  int found;
  int last;
  int take_last;
};

// Walks the kept tokens (with key == key_filter when use_key) in ascending id order and returns the first at
// which the running count (by_mass false) or fixed-point mass reaches `need`; the last such token if none
// does. sh.last gets the last candidate.
__device__ int ordered_select(const float* row, int64_t V, const ChainState& st, bool with_min_p,
                              bool by_mass, float temp, unsigned long long need, bool use_key,
                              uint32_t key_filter, SelectShared& sh) {
  const int tid = threadIdx.x;
  __syncthreads();
  if (tid == 0) {
    sh.found = -1;
    sh.last = -1;
  }
  __syncthreads();
  unsigned long long running = 0;
  for (int64_t base = 0; base < V; base += blockDim.x) {
    const int64_t i = base + tid;
    unsigned long long w = 0;
    bool cand = false;
    if (i < V) {
      const float l = row[i];
      const uint32_t key = order_key(l);
      cand = (!use_key || key == key_filter) && kept(st, l, key, int(i), with_min_p);
      if (cand) w = by_mass ? fixed_mass(l, st, temp) : 1ull;
    }
    unsigned long long total;
    const unsigned long long cum = running + block_inclusive_scan(w, sh.scan, total);
    if (cand) {
      atomicMax(&sh.last, int(i));
      if (cum >= need && cum - w < need) sh.found = int(i);
    }
    running += total;
    __syncthreads();
    if (sh.found >= 0) break;
  }
  __syncthreads();
  const int id = sh.found >= 0 ? sh.found : (sh.last >= 0 ? sh.last : 0);
  __syncthreads();
  return id;
}

// Selects, among kept tokens in chain order, the first at which the running count (by_mass false) or running
// fixed-point mass at temperature temp reaches `need` (>= 1). Returns (key, id) of that token through sh; if
// rounding leaves none, the last kept token.
__device__ void select_in_order(const float* row, int64_t V, const ChainState& st, bool with_min_p,
                                bool by_mass, float temp, unsigned long long need, SelectShared& sh,
                                uint32_t& key_out, int& id_out) {
  const int tid = threadIdx.x;
  uint32_t prefix = 0, mask = 0;
  unsigned long long rem = need;
  if (tid == 0) sh.take_last = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int d = tid; d < 256; d += blockDim.x) {
      sh.count[d] = 0;
      sh.mass[d] = 0;
    }
    __syncthreads();
    for (int64_t i = tid; i < V; i += blockDim.x) {
      const float l = row[i];
      const uint32_t key = order_key(l);
      if ((key & mask) != prefix || !kept(st, l, key, int(i), with_min_p)) continue;
      const int d = (key >> shift) & 255;
      atomicAdd(&sh.count[d], 1u);
      if (by_mass) atomicAdd(&sh.mass[d], fixed_mass(l, st, temp));
    }
    __syncthreads();
    if (tid == 0) {
      unsigned long long cum = 0;
      int chosen = -1, last_nonempty = 0;
      for (int d = 255; d >= 0; --d) {
        if (sh.count[d] == 0) continue;
        last_nonempty = d;
        if (sh.take_last) continue;  // looking for the last candidate: the lowest non-empty digit
        const unsigned long long w = by_mass ? sh.mass[d] : sh.count[d];
        if (cum + w >= rem) {
          chosen = d;
          break;
        }
        cum += w;
      }
      if (chosen < 0) {  // rounding left no token reaching `need`: the last kept token is the answer
        chosen = last_nonempty;
        sh.take_last = 1;
      }
      sh.prefix = prefix | (uint32_t(chosen) << shift);
      sh.rem = rem - cum;
    }
    __syncthreads();
    prefix = sh.prefix;
    rem = sh.rem;
    mask |= 255u << shift;
    __syncthreads();
  }
  key_out = prefix;
  // take_last: no token reaches `need`, so scan to the end and return the last tied candidate.
  id_out =
      ordered_select(row, V, st, with_min_p, by_mass, temp, sh.take_last ? ~0ull : rem, true, prefix, sh);
}

// Sum over kept tokens of the fixed-point mass at temperature temp (every thread gets it).
__device__ unsigned long long kept_mass(const float* row, int64_t V, const ChainState& st, bool with_min_p,
                                        float temp, unsigned long long* scratch) {
  unsigned long long acc = 0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float l = row[i];
    if (kept(st, l, order_key(l), int(i), with_min_p)) acc += fixed_mass(l, st, temp);
  }
  unsigned long long total;
  block_inclusive_scan(acc, scratch, total);
  return total;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(RowView logits, SamplerParams p, const float* __restrict__ uniforms,
                  int32_t* __restrict__ out) {
  __shared__ SelectShared sh;
  const int64_t t = blockIdx.x;
  const float* row = logits.row_as<const float>(t);
  const int64_t V = logits.ne0;
  float m;
  int best;
  block_argmax(row, V, m, best);
  if (!(p.temperature > 0.0f)) {
    if (threadIdx.x == 0) out[t] = best;
    return;
  }
  ChainState st{m, p.temperature, p.min_p, 0u, INT_MAX};
  uint32_t key;
  int id;
  if (p.top_k > 0 && p.top_k < V) {
    select_in_order(row, V, st, false, false, 1.0f, (unsigned long long)p.top_k, sh, key, id);
    st.tk = key;
    st.tid = id;
  }
  if (p.top_p < 1.0f) {
    const unsigned long long z = kept_mass(row, V, st, false, 1.0f, sh.scan);
    unsigned long long need = (unsigned long long)ceil(double(p.top_p) * double(z));
    if (need == 0) need = 1;
    select_in_order(row, V, st, false, true, 1.0f, need, sh, key, id);
    st.tk = key;
    st.tid = id;
  }
  const unsigned long long z = kept_mass(row, V, st, true, p.temperature, sh.scan);
  const double u = double(uniforms[t]);
  // First token whose running sum exceeds u * total: running >= floor(u * total) + 1.
  const unsigned long long need = (unsigned long long)(u * double(z)) + 1ull;
  id = ordered_select(row, V, st, true, true, p.temperature, need, false, 0u, sh);
  if (threadIdx.x == 0) out[t] = id;
}

// ---- diffusion_sample_rows
// ----------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads)
    diffusion_sample_kernel(RowView logits, float inv_temp, const float* __restrict__ uniforms,
                            int32_t* __restrict__ argmax_out, float* __restrict__ entropy_out,
                            int32_t* __restrict__ sampled_out) {
  __shared__ float red[32];
  __shared__ float scan[32];
  __shared__ int found;
  const int64_t t = blockIdx.x;
  const float* row = logits.row_as<const float>(t);
  const int64_t V = logits.ne0;
  // argmax of z = logits * inv_temp: the same index as of the logits for inv_temp > 0; computed on z anyway.
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float z = row[i] * inv_temp;
    if (z > bv || bi == INT_MAX) {
      if (z > bv || (bi == INT_MAX && !(z != z))) {
        bv = z;
        bi = int(i);
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  __shared__ float wv[32];
  __shared__ int wi[32];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) {
    wv[warp] = bv;
    wi[warp] = bi;
  }
  __syncthreads();
  const int n_warps = blockDim.x / kWarpSize;
  bv = lane < n_warps ? wv[lane] : -INFINITY;
  bi = lane < n_warps ? wi[lane] : INT_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const float m = bv;
  float z_sum = 0.0f, zw_sum = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float zm = row[i] * inv_temp - m;
    const float e = expf(zm);
    z_sum += e;
    zw_sum += zm * e;
  }
  const float Z = block_sum(z_sum, red);
  const float ZW = block_sum(zw_sum, red);
  if (threadIdx.x == 0) {
    argmax_out[t] = bi == INT_MAX ? 0 : bi;
    entropy_out[t] = logf(Z) - ZW / Z;
    found = INT_MAX;
  }
  __syncthreads();
  const float target = uniforms[t] * Z;
  float running = 0.0f;
  for (int64_t base = 0; base < V; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const float e = i < V ? expf(row[i] * inv_temp - m) : 0.0f;
    float total;
    const float cum = running + block_inclusive_scan(e, scan, total);
    // The first index whose running sum reaches the target. (Requiring also cum - e < target, i.e. that
    // this element crosses it, can miss: the scan's rounding may put cum - e of the crossing element at or
    // above the target while the previous element's cum stays below, and then no element claims it.)
    if (i < V && cum >= target) atomicMin(&found, int(i));
    running += total;
    __syncthreads();
    if (found != INT_MAX) break;
  }
  if (threadIdx.x == 0) sampled_out[t] = found != INT_MAX ? found : int(V - 1);
}

}  // namespace

void launch_argmax_rows(const Tensor& logits, int32_t* out, cudaStream_t stream) {
  const RowView l = row_view(logits);
  if (l.n_rows() == 0) return;
  argmax_kernel<<<unsigned(l.n_rows()), kThreads, 0, stream>>>(l, out);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_sample_rows(const Tensor& logits, const SamplerParams& p, const float* uniforms, int32_t* out,
                        cudaStream_t stream) {
  const RowView l = row_view(logits);
  if (l.n_rows() == 0) return;
  sample_kernel<<<unsigned(l.n_rows()), kThreads, 0, stream>>>(l, p, uniforms, out);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_diffusion_sample_rows(const Tensor& logits, float inv_temp, const float* uniforms,
                                  int32_t* argmax, float* entropy, int32_t* sampled, cudaStream_t stream) {
  const RowView l = row_view(logits);
  if (l.n_rows() == 0) return;
  diffusion_sample_kernel<<<unsigned(l.n_rows()), kThreads, 0, stream>>>(l, inv_temp, uniforms, argmax,
                                                                         entropy, sampled);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
