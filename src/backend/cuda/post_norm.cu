// gemma4's fused row norms: the post-normed residual adds (Ops::norm_residual_add, Ops::moe_residual_add) and the
// two norms of a MoE layer's input (Ops::moe_input_norms), in one launch each.
// Unfused, a MoE layer's FFN tail is five launches (three norms, two adds, and the layer's output scale a
// sixth), each a few microseconds on one 2816-value row at decode: the launches, not the bytes, are the cost.
// One block (hidden-state rows) or one warp (short rows) per row, the reductions of row_norm.cuh, and every
// rounding of the unfused ops kept (__fadd_rn / __fmul_rn: no multiply-add contraction across what were
// separate kernels), so the results are the composition's bit for bit.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/row_norm.cuh"
#include "backend/cuda/tensor_rows.h"
#include "core/env_switch.h"

namespace tandem::cuda {
namespace {

// The selected experts' outputs of a MoE row and their weights (Ops::moe_combine's inputs): y {n, k, T} at y
// with strides y_nb1 (experts) and y_nb2 (rows); weights {k, T} contiguous. y == nullptr: none.
struct ExpertOutputs {
  const char* y = nullptr;
  size_t y_nb1 = 0, y_nb2 = 0;
  int k = 0;
  const float* weights = nullptr;
};

// Row r: y = dense, or (moe given) dense[i] = rms_norm(dense)[i] + rms_norm(moe)[i] written back into dense (a
// thread reads back only what it wrote: the loops of this kernel and row_sum_squares stride alike), moe[i] first
// written as moe_combine_kernel's sum when the experts' outputs are given; then x = (x + rms_norm(y, w_out)) *
// out_scale.
// kPrefetch (k <= kPrefetchMaxK; the default, TANDEM_COMBINE_PREFETCH=0 turns it off): a thread loads the k
// experts' values of its element before summing them (the same sum in the same order): the plain loop's one load
// per expert in turn made a chain of ~88 dependent global loads per thread, ~16 us of the decode step's MoE
// post-norm on an H100.
constexpr int kPrefetchMaxK = 8;

template <bool kBlock, bool kPrefetch>
__global__ void __launch_bounds__(kBlock ? kBlockNormThreads : kWarpSize)
    post_norm_residual_kernel(RowView x, RowView dense, const float* __restrict__ w_dense, ExpertOutputs ex,
                              RowView moe, const float* __restrict__ w_moe, const float* __restrict__ w_out,
                              float eps, float out_scale) {
  __shared__ float red[32];
  pdl_trigger();  // pdl.cuh
  pdl_wait();
  const int64_t r = blockIdx.x, n = x.ne0;
  const int step = kBlock ? int(blockDim.x) : kWarpSize;
  const int first = kBlock ? int(threadIdx.x) : int(threadIdx.x % kWarpSize);
  float* xr = x.row_as<float>(r);
  float* yr = dense.row_as<float>(r);
  if (moe.data != nullptr) {
    float* mr = moe.row_as<float>(r);
    if (kPrefetch && ex.y != nullptr) {  // the same sum, the k loads of an element issued together
      float wj[kPrefetchMaxK];
#pragma unroll
      for (int j = 0; j < kPrefetchMaxK; ++j) wj[j] = j < ex.k ? ex.weights[r * ex.k + j] : 0.0f;
      const char* yr_ex = ex.y + r * ex.y_nb2;
      for (int64_t i = first; i < n; i += step) {
        float yv[kPrefetchMaxK];
#pragma unroll
        for (int j = 0; j < kPrefetchMaxK; ++j)
          yv[j] = j < ex.k ? reinterpret_cast<const float*>(yr_ex + j * ex.y_nb1)[i] : 0.0f;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < kPrefetchMaxK; ++j)
          if (j < ex.k) acc += wj[j] * yv[j];
        mr[i] = acc;
      }
    } else if (ex.y != nullptr) {  // moe_combine_kernel's sum, in its order
      for (int64_t i = first; i < n; i += step) {
        float acc = 0.0f;
        for (int j = 0; j < ex.k; ++j)
          acc += ex.weights[r * ex.k + j] * reinterpret_cast<const float*>(ex.y + r * ex.y_nb2 + j * ex.y_nb1)[i];
        mr[i] = acc;
      }
    }
    const float inv_d = rms_inverse(row_sum_squares<kBlock>(yr, n, red), n, eps);
    const float inv_m = rms_inverse(row_sum_squares<kBlock>(mr, n, red), n, eps);
    for (int64_t i = first; i < n; i += step) yr[i] = __fadd_rn(yr[i] * inv_d * w_dense[i], mr[i] * inv_m * w_moe[i]);
  }
  const float inv = rms_inverse(row_sum_squares<kBlock>(yr, n, red), n, eps);
  for (int64_t i = first; i < n; i += step) {
    const float v = __fadd_rn(xr[i], yr[i] * inv * w_out[i]);
    xr[i] = out_scale != 1.0f ? __fmul_rn(v, out_scale) : v;
  }
}

// Row r of x: r = ((x * inv) * r_factor) * r_scale and h = (x * inv) * h_norm, the products of rms_norm, scale
// and mul in their order.
template <bool kBlock>
__global__ void __launch_bounds__(kBlock ? kBlockNormThreads : kWarpSize)
    moe_input_norms_kernel(RowView x, float eps, float r_factor, const float* __restrict__ r_scale, RowView r,
                           const float* __restrict__ h_norm, RowView h) {
  __shared__ float red[32];
  pdl_trigger();  // pdl.cuh
  pdl_wait();
  const int64_t row = blockIdx.x, n = x.ne0;
  const int step = kBlock ? int(blockDim.x) : kWarpSize;
  const int first = kBlock ? int(threadIdx.x) : int(threadIdx.x % kWarpSize);
  const float* xr = x.row_as<const float>(row);
  float* rr = r.row_as<float>(row);
  float* hr = h.row_as<float>(row);
  const float inv = rms_inverse(row_sum_squares<kBlock>(xr, n, red), n, eps);
  for (int64_t i = first; i < n; i += step) {
    const float v = xr[i];
    rr[i] = v * inv * r_factor * r_scale[i];
    hr[i] = v * inv * h_norm[i];
  }
}

// ---- the register-resident variants (TANDEM_NORM_REGS) -----------------------------------------------------
// At decode a hidden-state row is one block on one SM, and the kernels above are chains of dependent global
// accesses: every loop that stores (mr, yr, xr) may alias the loads of its next iteration, so a thread's ~11
// elements are read one memory latency after another, three or four times a row (~15 us for the MoE tail on
// an H100 where its ~150 KB take ~1 us). Here a thread keeps its elements of every row in registers: all
// loads are issued first (the norm weights, model constants, even before pdl_wait), then the three block
// reductions, then the stores. The elements a thread owns (first, first + 256, ...) and the order it sums
// them in are row_sum_squares's, and every expression is the kernels' above, so the values are the same bit
// for bit. Rows of at most kRegsMaxN values (4096: gemma4's 2816, 3840 and 4096-wide
// hidden states); longer rows take the kernels above, and so does a MoE tail with the experts' outputs unless
// post_norm_residual_moe_tail_kernel (below) takes it.
constexpr int kRegsPer = 16;
constexpr int kRegsMaxN = kRegsPer * kBlockNormThreads;  // 4096

// A thread's elements of a row (0 past its end): row_norm.cuh's load_row_strided for a block row.
__device__ __forceinline__ void load_row_regs(const float* __restrict__ p, int n, float (&v)[kRegsPer]) {
  load_row_strided<kRegsPer, kBlockNormThreads>(p, n, int(threadIdx.x), v);
}

// row_sum_squares<true> over the thread's registers: the same elements in the same order.
__device__ __forceinline__ float regs_sum_squares(const float (&v)[kRegsPer], int n, float* red) {
  return block_sum(strided_sum_squares<kRegsPer, kBlockNormThreads>(v, n, int(threadIdx.x)), red);
}

// post_norm_residual_kernel<true, *> with the row in registers, no experts' outputs (the attention tail: kMoe
// false; a MoE tail whose sum is given: kMoe).
template <bool kMoe>
__global__ void __launch_bounds__(kBlockNormThreads)
    post_norm_residual_regs_kernel(RowView x, RowView dense, const float* __restrict__ w_dense, RowView moe,
                                   const float* __restrict__ w_moe, const float* __restrict__ w_out, float eps,
                                   float out_scale) {
  __shared__ float red[32];
  pdl_trigger();  // pdl.cuh
  const int64_t r = blockIdx.x;
  const int n = int(x.ne0);
  float wo[kRegsPer], wd[kRegsPer], wm[kRegsPer];
  load_row_regs(w_out, n, wo);  // weights: never written during a step, read before the wait
  if constexpr (kMoe) {
    load_row_regs(w_dense, n, wd);
    load_row_regs(w_moe, n, wm);
  }
  pdl_wait();
  float* xr = x.row_as<float>(r);
  float* yr = dense.row_as<float>(r);
  float xv[kRegsPer], yv[kRegsPer];
  load_row_regs(yr, n, yv);
  load_row_regs(xr, n, xv);
  if constexpr (kMoe) {
    float mv[kRegsPer];
    load_row_regs(moe.row_as<float>(r), n, mv);
    const float inv_d = rms_inverse(regs_sum_squares(yv, n, red), n, eps);
    const float inv_m = rms_inverse(regs_sum_squares(mv, n, red), n, eps);
#pragma unroll
    for (int e = 0; e < kRegsPer; ++e) {
      const int i = int(threadIdx.x) + e * kBlockNormThreads;
      yv[e] = __fadd_rn(yv[e] * inv_d * wd[e], mv[e] * inv_m * wm[e]);
      if (i < n) yr[i] = yv[e];
    }
  }
  const float inv = rms_inverse(regs_sum_squares(yv, n, red), n, eps);
#pragma unroll
  for (int e = 0; e < kRegsPer; ++e) {
    const int i = int(threadIdx.x) + e * kBlockNormThreads;
    const float v = __fadd_rn(xv[e], yv[e] * inv * wo[e]);
    if (i < n) xr[i] = out_scale != 1.0f ? __fmul_rn(v, out_scale) : v;
  }
}

// The MoE tail with the experts' outputs (post_norm_residual_kernel<true, *> with ex.y given, K = k <=
// kPrefetchMaxK experts, rows of at most kRegsMaxN values) on kTailThreads threads. Its cost is the experts'
// sum: K x n loads (8 x 2816 for the 26B-A4B shape), ~88 a thread on 256 threads. Here every thread sums
// kTailPer elements, K loads each, and no load waits for a branch: K is a template parameter and the loads
// past the row's end read its last element instead (their results are never stored), so that all of a
// thread's loads can be in flight together (with a per-load `j < k && i < n` test, ncu measured 26 us for
// ~6 us of memory round trips: the loads went one branch at a time). The sums and the dense branch go to
// shared memory, and the reductions are row_sum_squares's: the first kBlockNormThreads threads sum the same
// elements in the same order (the others add +0 to block_sum, which then sees the same 32 values), so the
// bits are the 256-thread kernel's.
constexpr int kTailThreads = 512;
constexpr int kTailPer = kRegsMaxN / kTailThreads;  // 8 elements a thread in the elementwise phases

template <int K>
__global__ void __launch_bounds__(kTailThreads)
    post_norm_residual_moe_tail_kernel(RowView x, RowView dense, const float* __restrict__ w_dense,
                                       ExpertOutputs ex, RowView moe, const float* __restrict__ w_moe,
                                       const float* __restrict__ w_out, float eps, float out_scale) {
  __shared__ float m_s[kRegsMaxN], y_s[kRegsMaxN];  // (elements n.. hold copies of the last: never read)
  __shared__ float red[32];
  pdl_trigger();  // pdl.cuh
  const int64_t r = blockIdx.x;
  const int n = int(x.ne0), tid = int(threadIdx.x), last = n - 1;
  float wd[kTailPer], wm[kTailPer], wo[kTailPer];
#pragma unroll
  for (int q = 0; q < kTailPer; ++q) {  // weights, before the wait
    const int ic = min(tid + q * kTailThreads, last);
    wd[q] = w_dense[ic];
    wm[q] = w_moe[ic];
    wo[q] = w_out[ic];
  }
  pdl_wait();
  float* xr = x.row_as<float>(r);
  float* yr = dense.row_as<float>(r);
  float* mr = moe.row_as<float>(r);
  float wj[K];
  const float* yj[K];
#pragma unroll
  for (int j = 0; j < K; ++j) {
    wj[j] = ex.weights[r * K + j];
    yj[j] = reinterpret_cast<const float*>(ex.y + r * ex.y_nb2 + j * ex.y_nb1);
  }
  float xv[kTailPer], mv[kTailPer];
#pragma unroll
  for (int q = 0; q < kTailPer; ++q) {  // moe_combine_kernel's sum in its order; the dense branch; x
    const int i = tid + q * kTailThreads, ic = min(i, last);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc += wj[j] * yj[j][ic];
    mv[q] = acc;
    xv[q] = xr[ic];
    m_s[i] = acc;
    y_s[i] = yr[ic];
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < kTailPer; ++q) {
    const int i = tid + q * kTailThreads;
    if (i < n) mr[i] = mv[q];
  }
  // RMS of each branch: row_sum_squares<true>'s elements and order on the first 256 threads.
  float ss_d = 0.0f, ss_m = 0.0f;
  if (tid < kBlockNormThreads)
    for (int i = tid; i < n; i += kBlockNormThreads) {
      ss_d += y_s[i] * y_s[i];
      ss_m += m_s[i] * m_s[i];
    }
  const float inv_d = rms_inverse(block_sum(ss_d, red), n, eps);
  const float inv_m = rms_inverse(block_sum(ss_m, red), n, eps);
  float yv[kTailPer];
#pragma unroll
  for (int q = 0; q < kTailPer; ++q) {  // (a thread rewrites only the elements it read)
    const int i = tid + q * kTailThreads;
    yv[q] = __fadd_rn(y_s[i] * inv_d * wd[q], mv[q] * inv_m * wm[q]);
    y_s[i] = yv[q];
    if (i < n) yr[i] = yv[q];
  }
  __syncthreads();
  float ss = 0.0f;
  if (tid < kBlockNormThreads)
    for (int i = tid; i < n; i += kBlockNormThreads) ss += y_s[i] * y_s[i];
  const float inv = rms_inverse(block_sum(ss, red), n, eps);
#pragma unroll
  for (int q = 0; q < kTailPer; ++q) {
    const int i = tid + q * kTailThreads;
    const float v = __fadd_rn(xv[q], yv[q] * inv * wo[q]);
    if (i < n) xr[i] = out_scale != 1.0f ? __fmul_rn(v, out_scale) : v;
  }
}

// moe_input_norms_kernel<true> with the row in registers.
__global__ void __launch_bounds__(kBlockNormThreads)
    moe_input_norms_regs_kernel(RowView x, float eps, float r_factor, const float* __restrict__ r_scale, RowView r,
                                const float* __restrict__ h_norm, RowView h) {
  __shared__ float red[32];
  pdl_trigger();  // pdl.cuh
  const int64_t row = blockIdx.x;
  const int n = int(x.ne0);
  float rs[kRegsPer], hn[kRegsPer], xv[kRegsPer];
  load_row_regs(r_scale, n, rs);  // weights, before the wait
  load_row_regs(h_norm, n, hn);
  pdl_wait();
  load_row_regs(x.row_as<const float>(row), n, xv);
  float* rr = r.row_as<float>(row);
  float* hr = h.row_as<float>(row);
  const float inv = rms_inverse(regs_sum_squares(xv, n, red), n, eps);
#pragma unroll
  for (int e = 0; e < kRegsPer; ++e) {
    const int i = int(threadIdx.x) + e * kBlockNormThreads;
    if (i < n) {
      rr[i] = xv[e] * inv * r_factor * rs[e];
      hr[i] = xv[e] * inv * hn[e];
    }
  }
}

// kPrefetch: on since the fourteenth session's GPU run (GpuGemma4, GpuMoe; TANDEM_COMBINE_PREFETCH=0 turns it off).
EnvSwitch g_combine_prefetch{"TANDEM_COMBINE_PREFETCH", true};
// The register-resident kernels: on since the fifteenth session's H100 run (GpuDecodeFusion and the whole GPU
// test binary with them; under ncu the attention tail 13.2 -> 8.1 us and the MoE input norms 13.1 -> 4.6 us;
// gemma4 26B-A4B shape, 30 layers, bf16 tg128 177.0 -> 182.8 t/s); TANDEM_NORM_REGS=0 turns them off.
EnvSwitch g_norm_regs{"TANDEM_NORM_REGS", true};
// post_norm_residual_moe_tail_kernel: on since the fifteenth session's second H100 run (GpuDecodeFusion and the
// whole GPU test binary with it; gemma4 26B-A4B shape, 30 layers, bf16 tg128 196.6 -> 201.5 t/s); its loads
// without branches, written after that run, passed the next one (every GPU test but an unrelated attention
// case; 205.7 t/s).
// TANDEM_MOE_TAIL=0 turns it off.
EnvSwitch g_moe_tail{"TANDEM_MOE_TAIL", true};

}  // namespace

void set_norm_regs(std::optional<bool> on) {
  g_norm_regs.set(on);
}

void set_moe_tail(std::optional<bool> on) {
  g_moe_tail.set(on);
}

void launch_moe_input_norms(const Tensor& x, float eps, float r_factor, const float* r_scale, const Tensor& r,
                            const float* h_norm, const Tensor& h, cudaStream_t stream) {
  const RowView xv = row_view(x), rv = row_view(r), hv = row_view(h);
  const int64_t rows = xv.n_rows();
  if (rows == 0) return;
  if (xv.ne0 >= kBlockNormMin && xv.ne0 <= kRegsMaxN && g_norm_regs.on()) {
    launch_pdl(moe_input_norms_regs_kernel, dim3(unsigned(rows)), dim3(kBlockNormThreads), 0, stream, xv, eps, r_factor,
               r_scale, rv, h_norm, hv);
  } else if (xv.ne0 >= kBlockNormMin) {
    launch_pdl(moe_input_norms_kernel<true>, dim3(unsigned(rows)), dim3(kBlockNormThreads), 0, stream, xv, eps,
               r_factor, r_scale, rv, h_norm, hv);
  } else {
    launch_pdl(moe_input_norms_kernel<false>, dim3(unsigned(rows)), dim3(kWarpSize), 0, stream, xv, eps, r_factor,
               r_scale, rv, h_norm, hv);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_post_norm_residual(const Tensor& x, const Tensor& dense, const float* w_dense, const Tensor* expert_out,
                               const float* weights, const Tensor* moe, const float* w_moe, const float* w_out,
                               float eps, float out_scale, cudaStream_t stream) {
  const RowView xv = row_view(x), dv = row_view(dense);
  const RowView mv = moe ? row_view(*moe) : RowView{};
  ExpertOutputs ex;
  if (expert_out) {
    ex.y = static_cast<const char*>(expert_out->data);
    ex.y_nb1 = expert_out->nb[1];
    ex.y_nb2 = expert_out->nb[2];
    ex.k = int(expert_out->ne[1]);
    ex.weights = weights;
  }
  const int64_t rows = xv.n_rows();
  if (rows == 0) return;
  const bool prefetch = ex.y != nullptr && ex.k <= kPrefetchMaxK && g_combine_prefetch.on();
  const bool block = xv.ne0 >= kBlockNormMin;
  const bool fits = block && xv.ne0 <= kRegsMaxN;
  if (fits && ex.y != nullptr && ex.k >= 1 && ex.k <= kPrefetchMaxK && g_moe_tail.on()) {
    using Kernel = decltype(&post_norm_residual_moe_tail_kernel<1>);
    static constexpr Kernel kByK[kPrefetchMaxK] = {
        post_norm_residual_moe_tail_kernel<1>, post_norm_residual_moe_tail_kernel<2>,
        post_norm_residual_moe_tail_kernel<3>, post_norm_residual_moe_tail_kernel<4>,
        post_norm_residual_moe_tail_kernel<5>, post_norm_residual_moe_tail_kernel<6>,
        post_norm_residual_moe_tail_kernel<7>, post_norm_residual_moe_tail_kernel<8>};
    launch_pdl(kByK[ex.k - 1], dim3(unsigned(rows)), dim3(kTailThreads), 0, stream, xv, dv, w_dense, ex, mv, w_moe,
               w_out, eps, out_scale);
    TANDEM_CUDA_CHECK_LAUNCH();
    return;
  }
  if (fits && ex.y == nullptr && g_norm_regs.on()) {
    const auto kernel = moe == nullptr ? post_norm_residual_regs_kernel<false> : post_norm_residual_regs_kernel<true>;
    launch_pdl(kernel, dim3(unsigned(rows)), dim3(kBlockNormThreads), 0, stream, xv, dv, w_dense, mv, w_moe, w_out,
               eps, out_scale);
    TANDEM_CUDA_CHECK_LAUNCH();
    return;
  }
  const auto kernel = block ? (prefetch ? post_norm_residual_kernel<true, true>
                                       : post_norm_residual_kernel<true, false>)
                            : (prefetch ? post_norm_residual_kernel<false, true>
                                        : post_norm_residual_kernel<false, false>);
  launch_pdl(kernel, dim3(unsigned(rows)), dim3(block ? kBlockNormThreads : kWarpSize), 0, stream, xv, dv, w_dense,
             ex, mv, w_moe, w_out, eps, out_scale);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
