// Paged flash-decoding: attention for any number of query rows, split over the cache length.
//
// Grid: (split, kv head, row). A block takes the cache positions [split * L, +L) of one row that the row may
// see (L = split_len_for(max_seq_len): 64 positions up to 4k, 128 up to 16k, 256 beyond, so that a short
// context still spreads over enough blocks — 512 positions and 8 KV heads were 16 blocks with L = 256 on 132
// SMs; longer where fit_splits_to_waves saves a wave), for all query heads that share the KV head (GQA: K/V are read once per group,
// never repeated in memory), and writes an unnormalised partial output with its running max and sum. A second
// kernel combines the splits of each (row, head) (or, TANDEM_ATTN_FUSED_COMBINE, the last block of a group does:
// combine_when_last). Scores are f32 (plus the Explicit mask's bias); softmax is
// the usual max-subtracted exp. Block-table entries are read only for the positions [lo, hi) a row sees.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/env_switch.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 128;

struct DecodeShape {
  int64_t n_head, n_kv_head, hd_k, hd_v;
  int n_splits;
  int split_len;  // cache positions per split, <= kDecodeSplit (<= kMaxFittedSplit after fit_splits_to_waves)
  float scale;
  int n_hsplit = 1;  // blocks per KV head and split: its query heads divided among them (head_split_for)
};

// One block's split: its partial output and (max, sum) for the gqa query heads it takes (attention_split_kernel
// below is this, then the in-place combine when that is on).
template <class KTag, class VTag, int G>
__device__ __forceinline__ void split_partials(RowView q, const char* kc, size_t k_nb1, size_t k_slot,
                                               const char* vc, size_t v_nb1, size_t v_slot, const AttnMeta& meta,
                                               const DecodeShape& sh, int gqa, bool k_vec, bool v_pair, bool v_oct,
                                               float* part_o, float2* part_ml) {
  // (No __restrict__ on the cache and the partials: the previous kernel writes them while a PDL grid runs, so
  // they must not go through the non-coherent read-only path.)
  extern __shared__ int64_t smem_i64[];
  const int L = sh.split_len;
  int64_t* slot_s = smem_i64;                         // [L]
  float* q_s = reinterpret_cast<float*>(slot_s + L);  // [gqa][hd_k]
  float* p_s = q_s + gqa * sh.hd_k;                   // [gqa][L]

  const int split = blockIdx.x;
  const int g = blockIdx.y / sh.n_hsplit;  // the KV head; this block takes gqa of its query heads, from head0
  const int64_t head0 = int64_t(g) * (sh.n_head / sh.n_kv_head) + int64_t(blockIdx.y % sh.n_hsplit) * gqa;
  const int64_t r = blockIdx.z;
  const int tid = threadIdx.x;
  const RowRange rr = row_range(meta, r);
  if (rr.seq < 0) return;  // padding row: the combine writes zeros
  const int j0 = max(rr.lo, split * L);
  const int j1 = min(rr.hi, (split + 1) * L);
  const int64_t part_base =
      (r * sh.n_head + head0) * sh.n_splits + split;  // head h adds h*n_splits
  if (j0 >= j1) {
    for (int h = tid; h < gqa; h += blockDim.x)
      part_ml[part_base + int64_t(h) * sh.n_splits] = make_float2(-INFINITY, 0.0f);
    return;
  }
  const int n = j1 - j0;

  for (int64_t idx = tid; idx < gqa * sh.hd_k; idx += blockDim.x) {
    const int64_t h = idx / sh.hd_k, d = idx % sh.hd_k;
    q_s[idx] = q.row_as<const float>(r * sh.n_head + head0 + h)[d] * sh.scale;
  }
  for (int jj = tid; jj < n; jj += blockDim.x) slot_s[jj] = cache_slot(meta, rr.seq, j0 + jj);
  __syncthreads();

  // Scores: one thread per position, all heads of the group.
  for (int jj = tid; jj < n; jj += blockDim.x) {
    const auto* kp = reinterpret_cast<const typename KTag::storage*>(kc + slot_s[jj] * k_slot + g * k_nb1);
    float acc[G];
#pragma unroll
    for (int h = 0; h < G; ++h) acc[h] = 0.0f;
    constexpr bool k16 = sizeof(typename KTag::storage) == 2;
    if (k16 && k_vec) {  // 16-byte loads of the K row: 8 values each, kKChunk loads in flight (one at a time,
                         // a 256-byte row was 16 round trips to memory per position)
      constexpr int kKChunk = 8;
      const uint4* k4 = reinterpret_cast<const uint4*>(kp);
      const int64_t n8 = sh.hd_k / 8;
      for (int64_t c0 = 0; c0 < n8; c0 += kKChunk) {
        uint4 kv4[kKChunk];
#pragma unroll
        for (int u = 0; u < kKChunk; ++u)
          if (c0 + u < n8) kv4[u] = k4[c0 + u];
#pragma unroll
        for (int u = 0; u < kKChunk; ++u) {
          if (c0 + u >= n8) break;
          float kf[8];
          unpack8(kv4[u], kf, std::is_same_v<KTag, F16Tag>);
#pragma unroll
          for (int h = 0; h < G; ++h) {
            if (h < gqa) {
              const float* qh = q_s + h * sh.hd_k + (c0 + u) * 8;
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[h] += qh[e] * kf[e];
            }
          }
        }
      }
    } else {
      for (int64_t d = 0; d < sh.hd_k; ++d) {
        const float kv = KTag::load(kp + d);
#pragma unroll
        for (int h = 0; h < G; ++h)
          if (h < gqa) acc[h] += q_s[h * sh.hd_k + d] * kv;
      }
    }
    const float bias = mask_bias(meta, r, j0 + jj);  // Explicit mask (0 otherwise); -inf hides
#pragma unroll
    for (int h = 0; h < G; ++h)
      if (h < gqa) p_s[h * L + jj] = acc[h] + bias;
  }
  __syncthreads();

  // Softmax pieces of the group's heads, all heads at once: each thread's max and then sum over its positions,
  // one warp reduction per head, and one pass through shared memory per quantity (4 barriers whatever gqa; a
  // block reduction per head and quantity was 4 x gqa). A split whose scores are all -inf (Explicit mask) gets
  // m = -inf and l = 0, which the combine kernel skips (no exp(-inf - -inf)).
  {
    constexpr int kW = kThreads / kWarpSize;
    __shared__ float red_h[kW][G];
    const int warp = tid / kWarpSize, lane = tid % kWarpSize;
    float mh[G];
#pragma unroll
    for (int h = 0; h < G; ++h) mh[h] = -INFINITY;
    for (int jj = tid; jj < n; jj += blockDim.x)
#pragma unroll
      for (int h = 0; h < G; ++h)
        if (h < gqa) mh[h] = fmaxf(mh[h], p_s[h * L + jj]);
#pragma unroll
    for (int h = 0; h < G; ++h) {
      mh[h] = warp_max(mh[h]);
      if (lane == 0) red_h[warp][h] = mh[h];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float m = red_h[0][h];
#pragma unroll
      for (int w = 1; w < kW; ++w) m = fmaxf(m, red_h[w][h]);
      mh[h] = m;
    }
    __syncthreads();  // red_h is reused for the sums
    float lh[G];
#pragma unroll
    for (int h = 0; h < G; ++h) lh[h] = 0.0f;
    for (int jj = tid; jj < n; jj += blockDim.x)
#pragma unroll
      for (int h = 0; h < G; ++h)
        if (h < gqa) {
          const float e = mh[h] == -INFINITY ? 0.0f : expf(p_s[h * L + jj] - mh[h]);
          p_s[h * L + jj] = e;
          lh[h] += e;
        }
#pragma unroll
    for (int h = 0; h < G; ++h) {
      lh[h] = warp_sum(lh[h]);
      if (lane == 0) red_h[warp][h] = lh[h];
    }
    __syncthreads();  // (also publishes the exps in p_s to the output pass)
    if (tid == 0)
#pragma unroll
      for (int h = 0; h < G; ++h)
        if (h < gqa) {
          float l = 0.0f;
#pragma unroll
          for (int w = 0; w < kW; ++w) l += red_h[w][h];
          part_ml[part_base + int64_t(h) * sh.n_splits] = make_float2(mh[h], l);
        }
  }

  // Unnormalised output, octet path (16-bit V, head dim a multiple of 8 whose eighth divides kThreads, 16-byte
  // aligned rows, gqa <= 8): a thread owns 8 dims and every n_pg-th position, loads its 16 bytes of the V row
  // once for all gqa heads (16 threads read a 256-byte row in one go), and the n_pg position groups are summed
  // through shared memory. Against the paired path below (4 bytes a thread, 2 position groups), a thread walks
  // 4x fewer positions with 4x wider loads: fewer round trips to memory one after another.
  constexpr bool v16 = sizeof(typename VTag::storage) == 2;
  if constexpr (v16 && G <= 8) {
    if (v_oct) {
      const int n_do = int(sh.hd_v / 8), n_pg = kThreads / n_do;
      const int dq = tid % n_do, pg = tid / n_do;
      float acc[G][8];
#pragma unroll
      for (int h = 0; h < G; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] = 0.0f;
#pragma unroll 4
      for (int jj = pg; jj < n; jj += n_pg) {
        const uint4 w = reinterpret_cast<const uint4*>(vc + slot_s[jj] * v_slot + g * v_nb1)[dq];
        float vf[8];
        unpack8(w, vf, std::is_same_v<VTag, F16Tag>);
#pragma unroll
        for (int h = 0; h < G; ++h)
          if (h < gqa) {
            const float pw = p_s[h * L + jj];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[h][e] += pw * vf[e];
          }
      }
      float* red_v = p_s + gqa * L;  // [n_pg][gqa][hd_v], after the scores (launch_split sizes it)
#pragma unroll
      for (int h = 0; h < G; ++h)
        if (h < gqa) {
          float4* dst = reinterpret_cast<float4*>(red_v + (int64_t(pg) * gqa + h) * sh.hd_v + 8 * dq);
          dst[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
          dst[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
        }
      __syncthreads();
      for (int64_t idx = tid; idx < gqa * sh.hd_v; idx += blockDim.x) {
        float sum = 0.0f;
        for (int q = 0; q < n_pg; ++q) sum += red_v[int64_t(q) * gqa * sh.hd_v + idx];
        const int64_t h = idx / sh.hd_v, d = idx % sh.hd_v;
        part_o[(part_base + h * sh.n_splits) * sh.hd_v + d] = sum;
      }
      return;
    }
  }

  // Unnormalised output. Paired path (16-bit V, even head dim dividing 2 x kThreads, 4-byte aligned rows): a
  // thread owns a pair of dims and every n_pg-th position, loads the pair once for all gqa heads of the group
  // (a warp reads 128 contiguous bytes of a V row per position), and the position groups are summed through
  // shared memory. The one-thread-per-(head, dim) loop below walked all n positions serially and read each V
  // row once per head: decode attention ran at 7% of bandwidth at 4096 positions (H200, 2026-12-04).
  if (v16 && v_pair) {
    const int n_dp = int(sh.hd_v / 2), n_pg = kThreads / n_dp;
    const int dp = tid % n_dp, pg = tid / n_dp;
    float acc0[G], acc1[G];
#pragma unroll
    for (int h = 0; h < G; ++h) acc0[h] = acc1[h] = 0.0f;
    if (pg < n_pg) {
#pragma unroll 8
      for (int jj = pg; jj < n; jj += n_pg) {
        const uint32_t w = reinterpret_cast<const uint32_t*>(vc + slot_s[jj] * v_slot + g * v_nb1)[dp];
        float v0, v1;
        if constexpr (std::is_same_v<VTag, BF16Tag>) {
          v0 = __uint_as_float(w << 16);
          v1 = __uint_as_float(w & 0xffff0000u);
        } else {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
          v0 = f.x;
          v1 = f.y;
        }
#pragma unroll
        for (int h = 0; h < G; ++h)
          if (h < gqa) {
            const float pw = p_s[h * L + jj];
            acc0[h] += pw * v0;
            acc1[h] += pw * v1;
          }
      }
    }
    float* red_v = p_s + gqa * L;  // [n_pg][gqa][hd_v], after the scores (launch_split sizes it)
    if (pg < n_pg)
#pragma unroll
      for (int h = 0; h < G; ++h)
        if (h < gqa) {
          red_v[(int64_t(pg) * gqa + h) * sh.hd_v + 2 * dp] = acc0[h];
          red_v[(int64_t(pg) * gqa + h) * sh.hd_v + 2 * dp + 1] = acc1[h];
        }
    __syncthreads();
    for (int64_t idx = tid; idx < gqa * sh.hd_v; idx += blockDim.x) {
      float sum = 0.0f;
      for (int q = 0; q < n_pg; ++q) sum += red_v[int64_t(q) * gqa * sh.hd_v + idx];
      const int64_t h = idx / sh.hd_v, d = idx % sh.hd_v;
      part_o[(part_base + h * sh.n_splits) * sh.hd_v + d] = sum;
    }
    return;
  }
  // One thread per (head, dim), coalesced along the V row.
  for (int64_t idx = tid; idx < gqa * sh.hd_v; idx += blockDim.x) {
    const int64_t h = idx / sh.hd_v, d = idx % sh.hd_v;
    const float* ph = p_s + h * L;
    float acc = 0.0f;
    for (int jj = 0; jj < n; ++jj) {
      const auto* vp = reinterpret_cast<const typename VTag::storage*>(vc + slot_s[jj] * v_slot + g * v_nb1);
      acc += ph[jj] * VTag::load(vp + d);
    }
    part_o[(part_base + h * sh.n_splits) * sh.hd_v + d] = acc;
  }
}

// The output value v of dim i of a row, also quantized to 8 bits per 32 values into xq / xds when they are
// given (launch_quantize_q8's layout and arithmetic, so the product after reads what quantize_q8 would have
// written, bit for bit). The 32 values of a group are the 32 lanes of one warp (hd_v % 32 == 0 and whole warps:
// launch_attention_decode checks it).
__device__ __forceinline__ void emit_output(float* o, int64_t d, float v, int8_t* xq, float2* xds,
                                            int64_t row_base) {
  o[d] = v;
  if (xq != nullptr) warp_quantize_q8(v, &xq[row_base + d], &xds[(row_base + d) / 32]);
}

// A partial result, read through L2 (kL2: written by other blocks of the same grid, which this SM's L1 may
// hold stale) or plainly.
template <bool kL2, class T>
__device__ __forceinline__ T load_partial(const T* p) {
  if constexpr (kL2) {
    return __ldcg(p);
  } else {
    return *p;
  }
}

// The combine of one (row, head), by the calling block: the splits' weights exp(m_s - M) once into wts
// ([n_splits] of shared memory; threads over the splits, block reductions for M and the denominator), then
// each output dim sums its splits' partial outputs. seen false (a padding row), a row that sees no position,
// or whose every score is -inf: zeros. The block reductions synchronize; wts may be reused after a barrier.
template <bool kL2>
__device__ __forceinline__ void combine_head(const float* part_o, const float2* part_ml, int64_t base,
                                             int n_splits, int64_t hd_v, bool seen, float* o, int8_t* xq,
                                             float2* xds, int64_t q_base, float* wts, float* red) {
  float M = -INFINITY;
  if (seen) {
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
      const float2 ml = load_partial<kL2>(&part_ml[base + s]);
      if (ml.y > 0.0f) M = fmaxf(M, ml.x);
    }
  }
  M = block_max(M, red);
  if (M == -INFINITY) {
    for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) emit_output(o, d, 0.0f, xq, xds, q_base);
    return;
  }
  float den = 0.0f;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const float2 ml = load_partial<kL2>(&part_ml[base + s]);
    const float w = ml.y > 0.0f ? expf(ml.x - M) : 0.0f;
    wts[s] = w;
    den += w * ml.y;
  }
  den = block_sum(den, red);  // (its barrier also publishes wts)
  const float inv = 1.0f / den;
  for (int64_t d = threadIdx.x; d < hd_v; d += blockDim.x) {
    float num = 0.0f;
    for (int s = 0; s < n_splits; ++s)
      if (wts[s] > 0.0f) num += wts[s] * load_partial<kL2>(&part_o[(base + s) * hd_v + d]);
    emit_output(o, d, num * inv, xq, xds, q_base);
  }
}

// One block per (head, row): combine_head. xq / xds (or null): the output rows also quantized for the output
// projection (Ops::attention_project_add), K = n_head * hd_v values a row; q_base is where this (row, head)'s
// values sit in them (xq: K bytes a row; xds: K / 32 pairs a row).
__global__ void attention_combine_kernel(const float* part_o, const float2* part_ml, AttnMeta meta,
                                         int64_t n_head, int64_t hd_v, int n_splits, RowView out, int8_t* xq,
                                         float2* xds) {
  extern __shared__ float wts[];  // [n_splits]
  __shared__ float red[32];
  pdl_trigger();
  pdl_wait();  // the partial results of the split kernel
  const int64_t h = blockIdx.x, r = blockIdx.y;
  float* o = out.row_as<float>(r * n_head + h);
  const int seq = meta.seq_slot[r];
  const int64_t base = (r * n_head + h) * n_splits;
  combine_head<false>(part_o, part_ml, base, n_splits, hd_v, seq >= 0, o, xq, xds, (r * n_head + h) * hd_v,
                      wts, red);
}

// Off: measured slower than the combine launch it saves (fifteenth session, H100: gemma4 26B-A4B 30 layers bf16
// tg128 205.7 -> 202.2 t/s, Qwen3-8B-shape q4_k tg32 342.9 -> 312.8; one block of 128 threads combines a
// group's heads one after another where the combine kernel has a block per head, behind a fence and an atomic).
// Its GPU run passed the whole test binary but for DecodeCombinesInTheLastSplitBlock's projection case, which
// had more rows than the fused projection takes (the test's fault, fixed after the run, not rerun).
// TANDEM_ATTN_FUSED_COMBINE=1 turns it on.
EnvSwitch g_fused_combine{"TANDEM_ATTN_FUSED_COMBINE", false};

// The in-place combine (TANDEM_ATTN_FUSED_COMBINE): each block of attention_split_kernel counts itself done in
// counters[(row, blockIdx.y)] after its partials; the last of the n_splits blocks of a (row, KV head, head
// part) then does attention_combine_kernel's work for its gqa heads (reading the others' partials from L2), and
// sets the counter back to 0 for the next launch (a recorded graph replays it). One launch a layer fewer. The
// splits' weights and the denominator are the combine kernel's, summed by this block's 128 threads (the
// combine kernel has min(256, hd_v rounded up to 32) threads): the bits equal its only while each thread of both
// takes at most one split, or hd_v == 128.
__device__ void combine_when_last(const float* part_o, const float2* part_ml, const AttnMeta& meta,
                                  const DecodeShape& sh, int gqa, int* counters, RowView out, int8_t* xq,
                                  float2* xds) {
  extern __shared__ int64_t smem_i64[];
  __shared__ float red[32];
  __shared__ int last;
  const int g = blockIdx.y / sh.n_hsplit;
  const int64_t head0 = int64_t(g) * (sh.n_head / sh.n_kv_head) + int64_t(blockIdx.y % sh.n_hsplit) * gqa;
  const int64_t r = blockIdx.z;
  const int tid = threadIdx.x;
  if (meta.seq_slot[r] < 0) {  // padding row: zeros, written once (by split 0)
    if (blockIdx.x == 0)
      for (int hh = 0; hh < gqa; ++hh) {
        float* o = out.row_as<float>(r * sh.n_head + head0 + hh);
        for (int64_t d = tid; d < sh.hd_v; d += blockDim.x)
          emit_output(o, d, 0.0f, xq, xds, (r * sh.n_head + head0 + hh) * sh.hd_v);
      }
    return;
  }
  __threadfence();  // this block's partials, visible before it counts itself done
  __syncthreads();
  int* counter = counters + (r * gridDim.y + blockIdx.y);
  if (tid == 0) last = atomicAdd(counter, 1) == sh.n_splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  float* wts = reinterpret_cast<float*>(smem_i64);  // [n_splits] (launch_split sizes the shared memory for it)
  for (int hh = 0; hh < gqa; ++hh) {
    const int64_t h = head0 + hh;
    combine_head<true>(part_o, part_ml, (r * sh.n_head + h) * sh.n_splits, sh.n_splits, sh.hd_v, true,
                       out.row_as<float>(r * sh.n_head + h), xq, xds, (r * sh.n_head + h) * sh.hd_v, wts,
                       red);
    __syncthreads();  // wts is the next head's
  }
  if (tid == 0) *counter = 0;
}

// Grid: (split, KV head x head parts, row). kInPlace false: the partials only, combined by
// attention_combine_kernel; true: combined here by the last block (combine_when_last). A template parameter, so
// that the plain kernel's code (registers, occupancy, hence fit_splits_to_waves's schedule) is not the
// in-place one's.
template <class KTag, class VTag, int G, bool kInPlace>
__global__ void __launch_bounds__(kThreads)
    attention_split_kernel(RowView q, const char* kc, size_t k_nb1, size_t k_slot, const char* vc,
                           size_t v_nb1, size_t v_slot, AttnMeta meta, DecodeShape sh, int gqa, bool k_vec,
                           bool v_pair, bool v_oct, float* part_o, float2* part_ml, int* counters, RowView out,
                           int8_t* xq, float2* xds) {
  pdl_trigger();  // pdl.cuh
  pdl_wait();     // q and the cache rows of this step come from the previous kernel
  split_partials<KTag, VTag, G>(q, kc, k_nb1, k_slot, vc, v_nb1, v_slot, meta, sh, gqa, k_vec, v_pair, v_oct,
                                part_o, part_ml);
  if constexpr (kInPlace) combine_when_last(part_o, part_ml, meta, sh, gqa, counters, out, xq, xds);
}

// Positions per split for a launch over up to max_seq_len positions: 64 up to 4096 positions, 128 up to
// 16384, 256 beyond (kDecodeSplit). Short splits keep the GPU busy at short and middle contexts (8 KV heads x
// 33 splits of 256 were 264 blocks at 8k, each walking its positions mostly one memory round trip after
// another); the partials grow with the number of splits, hence 256 at long contexts (128+ splits already).
// TANDEM_ATTN_SPLIT=L (16..kDecodeSplit, a multiple of 16): L positions per split at every length, for
// measuring the schedule (bench --kernels' attention rows); 0 when unset or invalid.
int split_override() {
  static const int v = [] {
    const char* e = std::getenv("TANDEM_ATTN_SPLIT");
    const int n = e ? std::atoi(e) : 0;
    return n >= 16 && n <= kDecodeSplit && n % 16 == 0 ? n : 0;
  }();
  return v;
}
int split_len_for(int64_t max_seq_len) {
  if (split_override()) return split_override();
  return max_seq_len <= 4096 ? 64 : max_seq_len <= 16384 ? 128 : kDecodeSplit;
}
int n_splits_for(int64_t max_seq_len) {
  const int64_t L = split_len_for(max_seq_len);
  return int(std::max<int64_t>(1, (max_seq_len + L - 1) / L));
}
// The most splits any launch over <= max_seq_len positions uses (n_splits_for is not monotonic: 64 splits of
// 64 at 4096, 33 of 128 at 4097): what the scratch is sized for.
int n_splits_bound(int64_t max_seq_len) {
  if (split_override()) return int(std::max<int64_t>(1, (max_seq_len + split_override() - 1) / split_override()));
  const int64_t s64 = std::min<int64_t>(64, (max_seq_len + 63) / 64);
  const int64_t s128 = std::min<int64_t>(128, (max_seq_len + 127) / 128);
  const int64_t s256 = (max_seq_len + kDecodeSplit - 1) / kDecodeSplit;
  return int(std::max<int64_t>({1, s64, s128, s256}));
}

size_t align256(size_t n) {
  return (n + 255) & ~size_t(255);
}

EnvSwitch g_no_octet{"TANDEM_ATTN_NO_OCTET", false};  // =1: the paired output pass (launch_split)
bool octet_disabled() {
  return g_no_octet.on();
}

// Query heads of a GQA group divided among blocks (on since the fifteenth session's H100 run: GpuAttention and
// the whole GPU test binary with it; gemma4 26B-A4B shape, 30 layers, bf16 tg128 177.0 -> 182.6 t/s;
// TANDEM_ATTN_HEAD_SPLIT=0 turns it off): a block computes the scores of its heads with one thread per position, gqa x hd_k products a position,
// so gemma4's global layers (8 query heads of 512 per KV head, 2 KV heads) were 4 blocks of 4096 products a
// position at short contexts: ~57 us a layer on an H100 (fourteenth session). The groups are split until a
// block has at most 1024 (heads x head dim). A head's arithmetic does not depend on how many heads its block has
// (scores, softmax and output per head; the same output pass while gqa <= 8, the octet path's limit, so larger
// groups are left whole): the same bits either way.
EnvSwitch g_head_split{"TANDEM_ATTN_HEAD_SPLIT", true};
int head_split_for(int gqa, int64_t hd_k) {
  if (!g_head_split.on() || gqa > 8) return 1;
  int s = 1;
  while (s < gqa && int64_t(gqa / s) * hd_k > 1024) s *= 2;
  return gqa % s == 0 ? s : 1;
}

// A long context whose splits make a little more than a whole number of waves of blocks (the last one less than
// half full) takes longer splits instead, so that its blocks fit one wave fewer: at 32768 positions the Qwen3-8B
// shape's 131 splits x 8 KV heads were 1048 blocks where an H100 holds 792 (ncu, fifteenth session: 1.32
// waves, DRAM at 36%). Decided by the row count 1 (the blocks one row of the call makes), never by how many
// rows come with it, so a row's result does not depend on its batch; only lengthens splits (so the scratch
// sized by n_splits_bound holds), up to kMaxFittedSplit positions; TANDEM_ATTN_SPLIT and
// TANDEM_ATTN_WAVE_FIT=0 keep the plain schedule.
constexpr int kMaxFittedSplit = 512;
EnvSwitch g_wave_fit{"TANDEM_ATTN_WAVE_FIT", true};

template <class SmemFor, class WaveFor>
void fit_splits_to_waves(DecodeShape& sh, int64_t max_seq_len, const SmemFor& smem_for, const WaveFor& wave_for) {
  if (split_override() || !g_wave_fit.on()) return;
  const int64_t per_split = sh.n_kv_head * sh.n_hsplit;  // the blocks a split makes for one row
  const int64_t blocks = per_split * sh.n_splits, wave = wave_for(smem_for(sh.split_len));
  if (wave <= 0 || blocks <= wave) return;
  const int64_t waves = (blocks + wave - 1) / wave, last = blocks - (waves - 1) * wave;
  if (2 * last >= wave) return;
  const int64_t max_splits = (waves - 1) * wave / per_split;
  if (max_splits <= 0) return;
  const int64_t L = ((max_seq_len + max_splits - 1) / max_splits + 15) / 16 * 16;
  if (L <= sh.split_len || L > kMaxFittedSplit || wave_for(smem_for(int(L))) < wave) return;
  sh.split_len = int(L);
  sh.n_splits = int((max_seq_len + L - 1) / L);
}

// Where a launch writes: the partials, and with counters (the in-place combine) the output rows too.
struct SplitOutputs {
  float* part_o;
  float2* part_ml;
  int* counters;  // null: attention_combine_kernel combines
  RowView out;
  int8_t* xq;
  float2* xds;
};

template <class KTag, class VTag, int G>
void launch_split(const AttentionArgs& a, DecodeShape& sh, int gqa, const SplitOutputs& o, cudaStream_t stream) {
  // The paired P.V path (see the kernel) needs [n_pg][gqa][hd_v] floats after the scores: 2 x kThreads x gqa.
  const bool v16 = a.kv.v.type == DType::F16 || a.kv.v.type == DType::BF16;
  const int64_t n_dp = sh.hd_v / 2;
  const bool v_pair = v16 && sh.hd_v % 2 == 0 && n_dp > 0 && n_dp <= kThreads && kThreads % n_dp == 0 &&
                      (reinterpret_cast<uintptr_t>(a.kv.v.data) & 3) == 0 && a.kv.v.nb[1] % 4 == 0 &&
                      a.kv.v.nb[2] % 4 == 0;
  // The octet path needs 16-byte aligned V rows, an eighth of the head dim dividing kThreads, gqa <= 8, and
  // hd_k % 4 == 0 (its float4 stores after q_s and p_s),
  // (TANDEM_ATTN_NO_OCTET=1 turns it off, to compare).
  const int64_t n_do = sh.hd_v / 8;
  const bool v_oct = v16 && !octet_disabled() && sh.hd_v % 8 == 0 && sh.hd_k % 4 == 0 && n_do > 0 && n_do <= kThreads &&
                     kThreads % n_do == 0 && gqa <= 8 && (reinterpret_cast<uintptr_t>(a.kv.v.data) & 15) == 0 &&
                     a.kv.v.nb[1] % 16 == 0 && a.kv.v.nb[2] % 16 == 0;
  const size_t red_floats = v_oct    ? size_t(kThreads / n_do) * size_t(gqa) * size_t(sh.hd_v)
                            : v_pair ? size_t(kThreads / n_dp) * size_t(gqa) * size_t(sh.hd_v)
                                     : 0;
  auto smem_for = [&](int split_len) {
    const size_t split = size_t(gqa) * size_t(sh.hd_k) * 4 + size_t(gqa) * size_t(split_len) * 4 +
                         red_floats * 4 + size_t(split_len) * 8;
    const size_t wts = o.counters ? size_t((a.max_seq_len + split_len - 1) / split_len) * 4 : 0;
    return std::max(split, wts);  // (the in-place combine's split weights reuse the split's shared memory)
  };
  const auto kernel = o.counters ? attention_split_kernel<KTag, VTag, G, true>
                                 : attention_split_kernel<KTag, VTag, G, false>;
  allow_dynamic_smem(kernel, 160 * 1024);  // kernel_smem.h: per device
  fit_splits_to_waves(sh, a.max_seq_len, smem_for, [&](size_t bytes) {
    return bytes <= 160 * 1024 ? resident_blocks(kernel, kThreads, bytes) : 0;
  });
  const size_t smem = smem_for(sh.split_len);
  check(smem <= 160 * 1024, "CUDA attention: too many query heads per KV head for the decode kernel");
  const dim3 grid(unsigned(sh.n_splits), unsigned(sh.n_kv_head * sh.n_hsplit), unsigned(a.q.ne[2]));
  const bool k_vec = sh.hd_k % 8 == 0 && (reinterpret_cast<uintptr_t>(a.kv.k.data) & 15) == 0 &&
                     a.kv.k.nb[1] % 16 == 0 && a.kv.k.nb[2] % 16 == 0;
  launch_pdl(kernel, grid, dim3(kThreads), smem, stream, row_view(a.q),
             static_cast<const char*>(a.kv.k.data), a.kv.k.nb[1], a.kv.k.nb[2],
             static_cast<const char*>(a.kv.v.data), a.kv.v.nb[1], a.kv.v.nb[2], make_meta(a), sh, gqa, k_vec,
             v_pair, v_oct, o.part_o, o.part_ml, o.counters, o.out, o.xq, o.xds);
  TANDEM_CUDA_CHECK_LAUNCH();
}

template <class KTag, class VTag>
void launch_group(const AttentionArgs& a, DecodeShape& sh, int gqa, const SplitOutputs& o, cudaStream_t stream) {
  if (gqa <= 1) return launch_split<KTag, VTag, 1>(a, sh, gqa, o, stream);
  if (gqa <= 2) return launch_split<KTag, VTag, 2>(a, sh, gqa, o, stream);
  if (gqa <= 4) return launch_split<KTag, VTag, 4>(a, sh, gqa, o, stream);
  if (gqa <= 8) return launch_split<KTag, VTag, 8>(a, sh, gqa, o, stream);
  if (gqa <= 16) return launch_split<KTag, VTag, 16>(a, sh, gqa, o, stream);
  throw Error("CUDA attention: more than 16 query heads per KV head are not supported");
}

template <class KTag>
void launch_v(const AttentionArgs& a, DecodeShape& sh, int gqa, const SplitOutputs& o, cudaStream_t stream) {
  switch (a.kv.v.type) {
    case DType::F32:
      return launch_group<KTag, F32Tag>(a, sh, gqa, o, stream);
    case DType::F16:
      return launch_group<KTag, F16Tag>(a, sh, gqa, o, stream);
    case DType::BF16:
      return launch_group<KTag, BF16Tag>(a, sh, gqa, o, stream);
    default:
      throw Error(std::string("CUDA attention: unsupported V cache dtype ") + dtype_name(a.kv.v.type));
  }
}

}  // namespace

size_t attention_decode_scratch_bytes(int64_t T, int64_t n_head, int64_t hd_v, int64_t max_seq_len) {
  const size_t n = size_t(T) * size_t(n_head) * size_t(n_splits_bound(max_seq_len));
  return align256(n * size_t(hd_v) * 4) + align256(n * sizeof(float2));
}

size_t attention_decode_counters(int64_t T, int64_t n_head) {
  return size_t(T) * size_t(n_head);
}

void launch_attention_decode(const AttentionArgs& a, void* partials, size_t partials_bytes, cudaStream_t stream,
                             int8_t* xq, float2* xds, int* counters, size_t n_counters) {
  const int64_t T = a.q.ne[2];
  if (T == 0) return;
  DecodeShape sh;
  sh.n_head = a.q.ne[1];
  sh.n_kv_head = a.kv.k.ne[1];
  sh.hd_k = a.q.ne[0];
  sh.hd_v = a.kv.v.ne[0];
  sh.n_splits = n_splits_for(a.max_seq_len);
  sh.split_len = split_len_for(a.max_seq_len);
  sh.scale = a.scale;
  sh.n_hsplit = head_split_for(int(sh.n_head / sh.n_kv_head), sh.hd_k);
  const int gqa = int(sh.n_head / sh.n_kv_head) / sh.n_hsplit;  // query heads a block takes
  const size_t need = attention_decode_scratch_bytes(T, sh.n_head, sh.hd_v, a.max_seq_len);
  check(partials_bytes >= need, "CUDA attention: workspace too small (" + std::to_string(partials_bytes) +
                                    " bytes, need " + std::to_string(need) + "); reserve() a larger plan");
  check(T <= 65535, "CUDA attention: at most 65535 rows per call");
  const size_t n = size_t(T) * size_t(sh.n_head) * size_t(sh.n_splits);
  float* part_o = static_cast<float*>(partials);
  float2* part_ml =
      reinterpret_cast<float2*>(static_cast<char*>(partials) + align256(n * size_t(sh.hd_v) * 4));
  check(xq == nullptr || (xds != nullptr && sh.hd_v % 32 == 0 && a.out.is_contiguous()),
        "CUDA attention: a quantized output needs head_dim_v % 32 == 0 and a contiguous output");
  // (The caller's row chunks fit the counters: a fallback chosen by T would make a row's bits depend on its
  // batch, since the two combines sum the denominator over different thread partitions.)
  const bool in_place = counters != nullptr && g_fused_combine.on();
  check(!in_place || n_counters >= attention_decode_counters(T, sh.n_head),
        "CUDA attention: " + std::to_string(T) + " rows need more combine counters than the workspace has");
  const SplitOutputs o{part_o, part_ml, in_place ? counters : nullptr, row_view(a.out), xq, xds};
  switch (a.kv.k.type) {
    case DType::F32:
      launch_v<F32Tag>(a, sh, gqa, o, stream);
      break;
    case DType::F16:
      launch_v<F16Tag>(a, sh, gqa, o, stream);
      break;
    case DType::BF16:
      launch_v<BF16Tag>(a, sh, gqa, o, stream);
      break;
    default:
      throw Error(std::string("CUDA attention: unsupported K cache dtype ") + dtype_name(a.kv.k.type));
  }
  if (in_place) return;
  const dim3 grid(unsigned(sh.n_head), unsigned(T));
  const int threads = int(std::min<int64_t>(256, (sh.hd_v + 31) / 32 * 32));
  launch_pdl(attention_combine_kernel, grid, dim3(threads), size_t(sh.n_splits) * sizeof(float), stream,
             part_o, part_ml, make_meta(a), sh.n_head, sh.hd_v, sh.n_splits, row_view(a.out), xq, xds);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void set_attn_head_split(std::optional<bool> on) {
  g_head_split.set(on);
}

void set_attn_fused_combine(std::optional<bool> on) {
  g_fused_combine.set(on);
}

int attention_head_split_for(int gqa, int64_t hd_k) {
  return head_split_for(gqa, hd_k);
}

}  // namespace tandem::cuda
