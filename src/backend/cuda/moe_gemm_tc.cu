// Tensor-core grouped GEMM of matmul_id for many routed rows (prefill), for 16-bit and block-quantized expert
// weights (f32 weights keep moe.cu's f32 kernel).
//
// 1. moe_group_kernel sorts the routed rows ("slots" s = j + k t) by expert: per-expert counts, their prefix
//    sums (offsets {n_expert + 1}) and the slots of each expert contiguous in `sorted`. One block; it runs on
//    the device from the router's ids, so a step stays recordable as a CUDA graph.
// 2. moe_gemm_tc_kernel: block (64 output features, expert e) walks e's slots 32 at a time and multiplies
//    them with e's weights through mma.sync m16n8k16 (f32 accumulators). The weight tile {64 rows, 32 inputs}
//    goes to shared memory as 16-bit values: copied for F16/BF16, decoded from the blocks in place for Q8_0,
//    Q4_0, Q4_K, Q5_K, Q6_K (to bf16; only the tile is decoded, never the whole tensor). The activations are
//    rounded to the weights' 16-bit type (f16 for F16 weights, bf16 otherwise), as matmul's cuBLASLt path
//    does. Experts nobody chose return at once; each expert's weights are read once per 32 of its rows.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/mma_m16n8k16.cuh"
#include "backend/cuda/moe_grouped_args.h"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/tensor_rows.h"

namespace tandem::cuda {
namespace {

// ---- slots grouped by expert
// --------------------------------------------------------------------------------------
constexpr int kGroupThreads = 1024;

__global__ void __launch_bounds__(kGroupThreads)
    moe_group_kernel(const int32_t* __restrict__ ids, int64_t n_slots, int n_expert,
                     int32_t* __restrict__ offsets, int32_t* __restrict__ sorted) {
  extern __shared__ int32_t cursor[];  // n_expert: counts, then each expert's next free position
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int32_t e = ids[s];
    if (e >= 0 && e < n_expert) atomicAdd(&cursor[e], 1);  // an invalid id (never from the router) is skipped
  }
  __syncthreads();
  if (threadIdx.x < kWarpSize) {  // exclusive prefix sum: lane l owns a contiguous run of experts
    const int lane = threadIdx.x, per = (n_expert + kWarpSize - 1) / kWarpSize;
    const int e0 = min(lane * per, n_expert), e1 = min(e0 + per, n_expert);
    int32_t local = 0;
    for (int e = e0; e < e1; ++e) local += cursor[e];
    int32_t incl = local;
#pragma unroll
    for (int o = 1; o < kWarpSize; o <<= 1) {
      const int32_t v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    int32_t run = incl - local;
    for (int e = e0; e < e1; ++e) {
      const int32_t c = cursor[e];
      offsets[e] = run;
      cursor[e] = run;
      run += c;
    }
    if (lane == kWarpSize - 1) offsets[n_expert] = incl;
  }
  __syncthreads();
  // The order inside an expert's run does not matter: every slot's sums are its own.
  for (int64_t s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int32_t e = ids[s];
    if (e >= 0 && e < n_expert) sorted[atomicAdd(&cursor[e], 1)] = int32_t(s);
  }
}

// ---- the grouped GEMM
// ---------------------------------------------------------------------------------------------
constexpr int kBN = 64;          // output features (weight rows) per block
constexpr int kBM = 32;          // routed rows per chunk
constexpr int kBK = 32;          // inputs per step
constexpr int kLd = kBK + 8;     // shared row stride in 16-bit values: fragment loads hit 32 distinct banks
constexpr int kTcThreads = 128;  // 4 warps: 2 x 2 warp tiles of 32 features x 16 routed rows

template <bool F16>
__device__ __forceinline__ uint4 pack8(const float* v) {
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t lo = F16 ? float_to_fp16_bits(v[2 * q]) : float_to_bf16_bits(v[2 * q]);
    const uint32_t hi = F16 ? float_to_fp16_bits(v[2 * q + 1]) : float_to_bf16_bits(v[2 * q + 1]);
    w[q] = lo | (hi << 16);  // the lower address holds the lower half
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <DType WT>
__global__ void __launch_bounds__(kTcThreads) moe_gemm_tc_kernel(GroupedGemmArgs a) {
  constexpr bool kF16 = WT == DType::F16;
  constexpr bool k16bit = WT == DType::F16 || WT == DType::BF16;
  // Two buffers (16-bit weights): the step being multiplied and the next one being stored.
  __shared__ __align__(16) uint16_t ws[2][kBN][kLd];
  __shared__ __align__(16) uint16_t xs[2][kBM][kLd];
  __shared__ int32_t slots[kBM];
  const int e = int(blockIdx.y);
  const int32_t begin = a.offsets[e], end = a.offsets[e + 1];
  if (begin >= end) return;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, t4 = lane % 4;   // the mma fragment coordinates of this lane
  const int wn = warp % 2, wm = warp / 2;  // warp tile: features 32 wn .. +31, routed rows 16 wm .. +15
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  const int wr = tid / 2, wh = tid % 2;  // this thread loads weight row wr, inputs 16 wh .. + 15 of a step
  const int xm = tid / 4, xq = tid % 4;  // and routed row xm, inputs 8 xq .. + 7
  const char* wrow = n0 + wr < a.N ? a.W + size_t(e) * a.w_es + size_t(n0 + wr) * a.w_ld : nullptr;
  // One step's values of this thread, as 16-bit values in registers (w0, w1: 16 weights; xv: 8 activations).
  auto load = [&](const float* xr, int64_t k0, uint4& w0, uint4& w1, uint4& xv) {
    w0 = w1 = make_uint4(0, 0, 0, 0);
    if (wrow) {
      if constexpr (k16bit) {
        const uint4* src = reinterpret_cast<const uint4*>(wrow + size_t(k0 + 16 * wh) * 2);
        w0 = src[0];
        w1 = src[1];
      } else {
        float v[16];
        moe::load8<WT>(wrow, k0 + 16 * wh, v);
        moe::load8<WT>(wrow, k0 + 16 * wh + 8, v + 8);
        w0 = pack8<false>(v);
        w1 = pack8<false>(v + 8);
      }
    }
    float v[8] = {};
    if (xr) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = xr[k0 + 8 * xq + j];
    }
    xv = pack8<kF16>(v);
  };
  auto store = [&](int buf, const uint4& w0, const uint4& w1, const uint4& xv) {
    uint4* dst = reinterpret_cast<uint4*>(&ws[buf][wr][16 * wh]);
    dst[0] = w0;
    dst[1] = w1;
    *reinterpret_cast<uint4*>(&xs[buf][xm][8 * xq]) = xv;
  };
  for (int32_t c0 = begin; c0 < end; c0 += kBM) {
    const int count = min(kBM, end - c0);
    if (tid < kBM) slots[tid] = tid < count ? a.sorted[c0 + tid] : -1;
    __syncthreads();
    const int32_t sx = slots[xm];
    const float* xr = sx < 0 ? nullptr
                             : reinterpret_cast<const float*>(a.x + size_t(sx / a.k) * a.x_nb2 +
                                                              size_t(a.kx == 1 ? 0 : sx % a.k) * a.x_nb1);
    float acc[2][2][4] = {};
    auto multiply = [&](int buf) {  // acc += the step in buffer buf
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        uint32_t af[2][4], bf[2][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = 32 * wn + 16 * i + g;
          af[i][0] = ld32(&ws[buf][r][kk + 2 * t4]);
          af[i][1] = ld32(&ws[buf][r + 8][kk + 2 * t4]);
          af[i][2] = ld32(&ws[buf][r][kk + 2 * t4 + 8]);
          af[i][3] = ld32(&ws[buf][r + 8][kk + 2 * t4 + 8]);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int c = 16 * wm + 8 * j + g;
          bf[j][0] = ld32(&xs[buf][c][kk + 2 * t4]);
          bf[j][1] = ld32(&xs[buf][c][kk + 2 * t4 + 8]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) mma16816<kF16>(acc[i][j], af[i], bf[j]);
      }
    };
    uint4 w0, w1, xv;
    if constexpr (k16bit) {
      // 16-bit weights: the next step's loads are in flight during this step's products; two buffers, one
      // barrier per step (a buffer is rewritten only after every warp passed the barrier that ended its use).
      load(xr, 0, w0, w1, xv);
      store(0, w0, w1, xv);
      __syncthreads();
      int buf = 0;
      for (int64_t k0 = 0; k0 < a.K; k0 += kBK) {
        const bool next = k0 + kBK < a.K;
        if (next) load(xr, k0 + kBK, w0, w1, xv);
        multiply(buf);
        if (next) store(buf ^ 1, w0, w1, xv);
        __syncthreads();
        buf ^= 1;
      }
    } else {
      // Block types: decoding waits for its loads anyway; one buffer, load-decode-store then multiply.
      for (int64_t k0 = 0; k0 < a.K; k0 += kBK) {
        load(xr, k0, w0, w1, xv);
        store(0, w0, w1, xv);
        __syncthreads();
        multiply(0);
        __syncthreads();
      }
    }
    // acc[i][j][2 h + q]: feature 32 wn + 16 i + g + 8 h, routed row 16 wm + 8 j + 2 t4 + q.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int32_t s = slots[16 * wm + 8 * j + 2 * t4 + q];
          if (s < 0) continue;
          float* yr = reinterpret_cast<float*>(a.y + size_t(s / a.k) * a.y_nb2 + size_t(s % a.k) * a.y_nb1);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t o = n0 + 32 * wn + 16 * i + g + 8 * h;
            if (o < a.N) yr[o] = acc[i][j][2 * h + q];
          }
        }
    __syncthreads();  // slots are rewritten by the next chunk
  }
}

template <DType WT>
void launch_tc(const GroupedGemmArgs& a, int64_t n_expert, cudaStream_t stream) {
  const dim3 grid(unsigned((a.N + kBN - 1) / kBN), unsigned(n_expert));
  moe_gemm_tc_kernel<WT><<<grid, kTcThreads, 0, stream>>>(a);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool moe_gemm_tc_supports(const Tensor& W) {
  if (W.ne[0] % kBK != 0 || W.ne[2] > kMoeGroupMaxExperts) return false;
  switch (W.type) {
    case DType::F16:
    case DType::BF16:  // 16-byte loads of 16 values
      return aligned16(W.data) && W.nb[1] % 16 == 0 && W.nb[2] % 16 == 0;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void launch_moe_group(const int32_t* ids, int64_t n_slots, int64_t n_expert, int32_t* offsets,
                      int32_t* sorted, cudaStream_t stream) {
  moe_group_kernel<<<1, kGroupThreads, size_t(n_expert) * sizeof(int32_t), stream>>>(
      ids, n_slots, int(n_expert), offsets, sorted);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_moe_gemm_tc(const Tensor& W, const Tensor& x, const int32_t* offsets, const int32_t* sorted,
                        const Tensor& y, cudaStream_t stream) {
  const GroupedGemmArgs a = grouped_gemm_args(W, x, offsets, sorted, y);
  if (a.N == 0 || y.ne[2] == 0) return;
  const int64_t n_expert = W.ne[2];
  switch (W.type) {
    case DType::F16:
      return launch_tc<DType::F16>(a, n_expert, stream);
    case DType::BF16:
      return launch_tc<DType::BF16>(a, n_expert, stream);
    case DType::Q8_0:
      return launch_tc<DType::Q8_0>(a, n_expert, stream);
    case DType::Q4_0:
      return launch_tc<DType::Q4_0>(a, n_expert, stream);
    case DType::Q4_K:
      return launch_tc<DType::Q4_K>(a, n_expert, stream);
    case DType::Q5_K:
      return launch_tc<DType::Q5_K>(a, n_expert, stream);
    case DType::Q6_K:
      return launch_tc<DType::Q6_K>(a, n_expert, stream);
    default:
      throw Error(std::string("matmul_id: the tensor-core grouped GEMM has no path for ") +
                  dtype_name(W.type));
  }
}

}  // namespace tandem::cuda
