// CUDA mixture-of-experts kernels (Ops::moe_route, matmul_id, moe_combine; backend.h).
//
// Everything stays on the device: the router writes ids/weights into fixed buffers and the expert matmul
// reads them there, so a decode step with MoE layers can be recorded as one CUDA graph.
//
// moe_gemm_kernel is the grouped GEMM for many routed rows (prefill): block (output tile, expert e) collects
// the routed rows that chose e (a warp scans ids 32 at a time with a ballot) in chunks of kTileM, and
// multiplies them with tiles of e's weights decoded to f32 in shared memory (dequant8 for block types, read
// in place: only the kTileN x kTileK weight tile is ever decoded). Each expert's weights are read once per
// kTileM of its rows; experts nobody chose cost one scan of ids.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/moe_grouped_args.h"
#include "backend/cuda/moe_tiles.cuh"
#include "core/env_switch.h"

namespace tandem::cuda {
namespace {

constexpr float kMinWeightSum = 6.1035e-5f;  // C.5: the selected probabilities' sum is clamped to >= this

// ---- router: one warp per row
// -------------------------------------------------------------------------------
constexpr int kRouteWarps = 4;

// Warp argmax over the lanes' (best, best_e) candidates: the larger logit, ties to the lower index; best_e ==
// none marks a lane without one.
__device__ __forceinline__ void warp_argmax(float& best, int32_t& best_e, int32_t none) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oe = __shfl_xor_sync(0xffffffffu, best_e, o);
    if (oe < none && (best_e == none || ob > best || (ob == best && oe < best_e))) {
      best = ob;
      best_e = oe;
    }
  }
}

// Lane j < k holds the row's j-th choice and its probability: the weights renormalised over the k choices
// (summed in j order, as the CPU) and scaled by the chosen expert's down scale.
__device__ __forceinline__ void store_route(int lane, int k, int32_t chosen, float p_sel,
                                            const float* __restrict__ expert_scale, int32_t* __restrict__ id,
                                            float* __restrict__ w) {
  float sum = 0.0f;
  for (int q = 0; q < k; ++q) sum += __shfl_sync(0xffffffffu, p_sel, q);
  if (lane < k) {
    const float inv = 1.0f / fmaxf(sum, kMinWeightSum);
    id[lane] = chosen;
    w[lane] = p_sel * inv * (expert_scale ? expert_scale[chosen] : 1.0f);
  }
}

__global__ void __launch_bounds__(kRouteWarps* kWarpSize)
    moe_route_kernel(const float* __restrict__ logits, int64_t l_ld, int64_t n_expert, int64_t T, int k,
                     const float* __restrict__ expert_scale, int32_t* __restrict__ ids,
                     float* __restrict__ weights) {
  __shared__ int32_t chosen_ids[kRouteWarps][32];  // the experts already picked for this warp's row
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + threadIdx.x / kWarpSize;
  if (t >= T) return;  // whole warps leave together
  const int lane = threadIdx.x % kWarpSize;
  int32_t* picked = chosen_ids[threadIdx.x / kWarpSize];
  const float* l = logits + t * l_ld;
  float mx = -INFINITY;
  for (int64_t e = lane; e < n_expert; e += kWarpSize) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float z = 0.0f;
  for (int64_t e = lane; e < n_expert; e += kWarpSize) z += expf(l[e] - mx);
  z = warp_sum(z);
  int32_t* id = ids + t * k;
  float* w = weights + t * k;
  int32_t chosen = -1;  // lane j < k keeps the j-th choice
  float p_sel = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int32_t best_e = int32_t(n_expert);
    for (int64_t e = lane; e < n_expert; e += kWarpSize) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken |= picked[q] == int32_t(e);
      if (!taken && (l[e] > best || best_e == int32_t(n_expert))) {
        best = l[e];
        best_e = int32_t(e);
      }
    }
    warp_argmax(best, best_e, int32_t(n_expert));
    if (lane == j) {
      chosen = best_e;
      p_sel = expf(best - mx) / z;
      picked[j] = best_e;
    }
    __syncwarp();
  }
  store_route(lane, k, chosen, p_sel, expert_scale, id, w);
}

// The same routing with a lane's logits held in registers (kPer per lane, n_expert <= 32 kPer) and the experts
// already chosen as a bit mask in those registers' owners (the default since the fourteenth session's GPU run;
// TANDEM_ROUTE_REGS=0 takes the kernel above): the kernel above re-reads the
// logits and scans the chosen list in shared memory in each of its k rounds, ~10 us a decode row on an H100
// (thirteenth session's profile), a chain of dependent loads. Same comparisons in the same order: the same ids
// and weights bit for bit.
template <int kPer>
__global__ void __launch_bounds__(kRouteWarps* kWarpSize)
    moe_route_regs_kernel(const float* __restrict__ logits, int64_t l_ld, int64_t n_expert, int64_t T, int k,
                          const float* __restrict__ expert_scale, int32_t* __restrict__ ids,
                          float* __restrict__ weights) {
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + threadIdx.x / kWarpSize;
  if (t >= T) return;  // whole warps leave together
  const int lane = threadIdx.x % kWarpSize;
  const int ne = int(n_expert);
  const float* l = logits + t * l_ld;
  float v[kPer];  // v[s]: the logit of expert lane + 32 s
#pragma unroll
  for (int s = 0; s < kPer; ++s) v[s] = lane + s * kWarpSize < ne ? l[lane + s * kWarpSize] : 0.0f;
  float mx = -INFINITY;
#pragma unroll
  for (int s = 0; s < kPer; ++s)
    if (lane + s * kWarpSize < ne) mx = fmaxf(mx, v[s]);
  mx = warp_max(mx);
  float z = 0.0f;
#pragma unroll
  for (int s = 0; s < kPer; ++s)
    if (lane + s * kWarpSize < ne) z += expf(v[s] - mx);
  z = warp_sum(z);
  unsigned taken = 0;  // bit s: expert lane + 32 s is chosen
  int32_t chosen = -1;
  float p_sel = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int32_t best_e = ne;
#pragma unroll
    for (int s = 0; s < kPer; ++s) {
      const int e = lane + s * kWarpSize;
      if (e < ne && !((taken >> s) & 1u) && (v[s] > best || best_e == ne)) {
        best = v[s];
        best_e = e;
      }
    }
    warp_argmax(best, best_e, ne);
    // Lane j's pick, as the plain kernel's picked[j] (with a NaN logit the butterfly can leave lanes disagreeing).
    const int32_t pick = __shfl_sync(0xffffffffu, best_e, j);
    if (pick < ne && pick % kWarpSize == lane) taken |= 1u << (pick / kWarpSize);
    if (lane == j) {
      chosen = best_e;
      p_sel = expf(best - mx) / z;
    }
  }
  store_route(lane, k, chosen, p_sel, expert_scale, ids + t * k, weights + t * k);
}

// ---- weighted sum over the selected experts
// -----------------------------------------------------------------
__global__ void moe_combine_kernel(const char* __restrict__ y, size_t y_nb1, size_t y_nb2, int64_t n, int k, int64_t T,
                                   const float* __restrict__ weights, char* __restrict__ out,
                                   size_t out_nb1) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // Rows stride by gridDim.y: a grid has at most 65535 rows in y, a prefill batch may have more tokens.
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j)
      acc += weights[t * k + j] * reinterpret_cast<const float*>(y + t * y_nb2 + j * y_nb1)[i];
    reinterpret_cast<float*>(out + t * out_nb1)[i] = acc;
  }
}

// ---- grouped GEMM over the rows routed to each expert
// --------------------------------------------------------
constexpr int kTileN = 64;  // weight rows (outputs) per block
constexpr int kTileM = 32;  // routed rows per chunk
constexpr int kTileK = 32;  // inputs per step (inside one block of every block type)
constexpr int kThreads = 256;

// The tensor-core GEMMs' arguments (moe_grouped_args.h) with the routing as this kernel reads it: each block
// scans ids for its expert's slots (offsets / sorted unused).
struct GemmArgs : GroupedGemmArgs {
  const int32_t* ids;
  int64_t n_slots;
};

template <DType WT>
__global__ void __launch_bounds__(kThreads) moe_gemm_kernel(GemmArgs a) {
  __shared__ float ws[kTileK][kTileN];
  __shared__ float xs[kTileK][kTileM + 1];
  __shared__ int64_t slots[kTileM];
  __shared__ int s_count;
  __shared__ int64_t s_pos;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int64_t n0 = int64_t(blockIdx.x) * kTileN;
  const int32_t e = int32_t(blockIdx.y);
  const char* We = a.W + size_t(e) * a.w_es;
  const int tx = tid % 16, ty = tid / 16;
  if (tid == 0) s_pos = 0;
  __syncthreads();
  for (;;) {
    if (warp == 0) {  // collect the next kTileM rows routed to e, in slot order
      int count = 0;
      int64_t p = s_pos;
      while (count < kTileM && p < a.n_slots) {
        const int64_t i = p + lane;
        const bool m = i < a.n_slots && a.ids[i] == e;
        const unsigned mask = __ballot_sync(0xffffffffu, m);
        const int before = __popc(mask & ((1u << lane) - 1u));
        const int take = min(__popc(mask), kTileM - count);
        if (m && before < take) slots[count + before] = i;
        if (__popc(mask) > take) {  // stop at the first match left for the next chunk
          const unsigned rest = __ballot_sync(0xffffffffu, m && before == take);
          p += __ffs(rest) - 1;
          count += take;
          break;
        }
        count += take;
        p += kWarpSize;
      }
      if (lane == 0) {
        s_count = count;
        s_pos = p;
      }
    }
    __syncthreads();
    const int count = s_count;
    if (count == 0) return;
    float acc[4][2] = {};
    for (int64_t k0 = 0; k0 < a.K; k0 += kTileK) {
      {  // weights: thread -> row tid / 4, values 8 (tid % 4) .. + 7
        const int r = tid / 4, g = tid % 4;
        float v[8] = {};
        if (n0 + r < a.N) moe::load8<WT>(We + size_t(n0 + r) * a.w_ld, k0 + 8 * g, v);
#pragma unroll
        for (int q = 0; q < 8; ++q) ws[8 * g + q][r] = v[q];
      }
      {  // activations: thread -> routed row tid / 8, values 4 (tid % 8) .. + 3
        const int m = tid / 8, g = tid % 8;
        float v[4] = {};
        if (m < count) {
          const int64_t s = slots[m];
          const float* xr = reinterpret_cast<const float*>(a.x + size_t(s / a.k) * a.x_nb2 +
                                                           size_t(a.kx == 1 ? 0 : s % a.k) * a.x_nb1);
#pragma unroll
          for (int q = 0; q < 4; ++q) v[q] = xr[k0 + 4 * g + q];
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) xs[4 * g + q][m] = v[q];
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kTileK; ++kk) {
        float wv[4], xv[2];
#pragma unroll
        for (int i = 0; i < 4; ++i) wv[i] = ws[kk][tx + 16 * i];
#pragma unroll
        for (int j = 0; j < 2; ++j) xv[j] = xs[kk][ty + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) acc[i][j] += wv[i] * xv[j];
      }
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int m = ty + 16 * j;
      if (m >= count) continue;
      const int64_t s = slots[m];
      float* yr = reinterpret_cast<float*>(a.y + size_t(s / a.k) * a.y_nb2 + size_t(s % a.k) * a.y_nb1);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t o = n0 + tx + 16 * i;
        if (o < a.N) yr[o] = acc[i][j];
      }
    }
    __syncthreads();  // slots / s_pos are rewritten by the next chunk
  }
}

template <DType WT>
void launch_gemm(const GemmArgs& a, int64_t n_expert, cudaStream_t stream) {
  const dim3 grid(unsigned((a.N + kTileN - 1) / kTileN), unsigned(n_expert));
  moe_gemm_kernel<WT><<<grid, kThreads, 0, stream>>>(a);
  TANDEM_CUDA_CHECK_LAUNCH();
}

// moe_route_regs_kernel: on since the fourteenth session's GPU run (GpuMoe; TANDEM_ROUTE_REGS=0 turns it off).
EnvSwitch g_route_regs{"TANDEM_ROUTE_REGS", true};

}  // namespace

void launch_moe_route(const Tensor& logits, const float* expert_scale, int32_t* ids, float* weights, int k,
                      cudaStream_t stream) {
  const int64_t T = logits.ne[1], n_expert = logits.ne[0];
  if (T == 0) return;
  const dim3 grid(unsigned((T + kRouteWarps - 1) / kRouteWarps)), block(kRouteWarps * kWarpSize);
  const float* l = static_cast<const float*>(logits.data);
  const int64_t l_ld = int64_t(logits.nb[1] / 4);
  if (g_route_regs.on() && n_expert <= 8 * kWarpSize && k <= kWarpSize) {
    if (n_expert <= 4 * kWarpSize)
      moe_route_regs_kernel<4><<<grid, block, 0, stream>>>(l, l_ld, n_expert, T, k, expert_scale, ids, weights);
    else
      moe_route_regs_kernel<8><<<grid, block, 0, stream>>>(l, l_ld, n_expert, T, k, expert_scale, ids, weights);
  } else {
    moe_route_kernel<<<grid, block, 0, stream>>>(l, l_ld, n_expert, T, k, expert_scale, ids, weights);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_moe_combine(const Tensor& y, const float* weights, const Tensor& out, cudaStream_t stream) {
  const int64_t n = y.ne[0], k = y.ne[1], T = y.ne[2];
  if (n == 0 || T == 0) return;
  const dim3 grid(unsigned((n + 255) / 256), unsigned(std::min<int64_t>(T, 65535)));
  moe_combine_kernel<<<grid, 256, 0, stream>>>(static_cast<const char*>(y.data), y.nb[1], y.nb[2], n, int(k), T,
                                               weights, static_cast<char*>(out.data), out.nb[1]);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_moe_gemm(const Tensor& W, const Tensor& x, const int32_t* ids, const Tensor& y,
                     cudaStream_t stream) {
  GemmArgs a{grouped_gemm_args(W, x, nullptr, nullptr, y), ids, y.ne[1] * y.ne[2]};
  if (a.n_slots == 0 || a.N == 0) return;
  const int64_t n_expert = W.ne[2];
  switch (W.type) {
    case DType::F32:
      return launch_gemm<DType::F32>(a, n_expert, stream);
    case DType::F16:
      return launch_gemm<DType::F16>(a, n_expert, stream);
    case DType::BF16:
      return launch_gemm<DType::BF16>(a, n_expert, stream);
    case DType::Q8_0:
      return launch_gemm<DType::Q8_0>(a, n_expert, stream);
    case DType::Q4_0:
      return launch_gemm<DType::Q4_0>(a, n_expert, stream);
    case DType::Q4_K:
      return launch_gemm<DType::Q4_K>(a, n_expert, stream);
    case DType::Q5_K:
      return launch_gemm<DType::Q5_K>(a, n_expert, stream);
    case DType::Q6_K:
      return launch_gemm<DType::Q6_K>(a, n_expert, stream);
    default:
      throw Error(std::string("matmul_id: unsupported weight dtype ") + dtype_name(W.type));
  }
}

}  // namespace tandem::cuda
