// Tensor-core grouped GEMM of matmul_id for 16-bit expert weights, with the tiles streamed into shared memory by
// cp.async in a four-stage pipeline (TANDEM_MOE_PIPELINE=1; moe_gemm_tc.cu's kernel otherwise).
//
// Why: a canvas step of DiffusionGemma (256 rows x top-8 of 128 experts, ~16 rows an expert) reads every
// expert's weights once, so the grouped GEMM is a stream of weights at ~16 FLOP a byte: bandwidth-bound. The
// register-staged kernel of moe_gemm_tc.cu keeps one 4 KB step a block in flight (one step of prefetch, 32
// bytes a thread) and loads the f32 activations with eight 4-byte loads a thread a step; it ran at ~50% of the
// bandwidth (tenth session, 334 us a call at 6 layers on an H100). Here a block (128 output features, expert e,
// 8 warps) keeps three 10 KB weight steps in flight with 16-byte cp.async copies that bypass the registers,
// and the activations travel the same way as f32 (converted to 16 bits when the fragments are built, with the
// same rounding as moe_gemm_tc.cu: the results are bit for bit the same, the sums being in the same order).
//
// Layout: stage s holds ws[s] {128 features, 32 inputs} 16-bit (rows padded to 40 values: 80 bytes, 16-byte
// aligned, fragment loads conflict-free) and xs[s] {32 routed rows, 32 inputs} f32 (rows padded to 40 floats:
// the float2 fragment loads of a half-warp hit 32 distinct banks). Warp w multiplies features 32 (w % 4) .. +31
// with routed rows 16 (w / 4) .. +15; a warp whose rows are all past the expert's count skips its products.
// Rows past N and routed rows past the count are zero-filled (cp.async with source size 0).
#include <cuda_runtime.h>


#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/mma_m16n8k16.cuh"
#include "backend/cuda/moe_grouped_args.h"
#include "backend/cuda/tensor_rows.h"

namespace tandem::cuda {
namespace {

constexpr int kBN = 128;  // output features (weight rows) per block
constexpr int kBM = 32;   // routed rows per chunk
constexpr int kBK = 32;   // inputs per step
constexpr int kStages = 4;
constexpr int kThreads = 256;  // 8 warps: 4 x 2 warp tiles of 32 features x 16 routed rows
constexpr int kWLd = kBK + 8;  // 16-bit values a shared weight row
constexpr int kXLd = kBK + 8;  // floats a shared activation row
constexpr size_t kWStageBytes = size_t(kBN) * kWLd * 2;
constexpr size_t kXStageBytes = size_t(kBM) * kXLd * 4;
constexpr size_t kSmemBytes = kStages * (kWStageBytes + kXStageBytes);  // 60 KB
static_assert(kBN * kBK * 2 / 16 == 2 * kThreads, "two 16-byte weight copies a thread a step");
static_assert(kBM * kBK * 4 / 16 == kThreads, "one 16-byte activation copy a thread a step");

// 16 bytes global -> shared, bypassing L1 and the registers; valid == false writes 16 zero bytes (src unread).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {  // until at most kPending of this thread's groups are in flight
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

template <bool F16>
__device__ __forceinline__ uint32_t pack2(float2 v) {  // the lower input in the lower half
  const uint32_t lo = F16 ? float_to_fp16_bits(v.x) : float_to_bf16_bits(v.x);
  const uint32_t hi = F16 ? float_to_fp16_bits(v.y) : float_to_bf16_bits(v.y);
  return lo | (hi << 16);
}

template <DType WT>
__global__ void __launch_bounds__(kThreads) moe_gemm_pipelined_kernel(GroupedGemmArgs a) {
  constexpr bool kF16 = WT == DType::F16;  // activations rounded to the weights' type (bf16 for BF16)
  extern __shared__ __align__(16) uint8_t smem[];
  auto ws = reinterpret_cast<uint16_t(*)[kBN][kWLd]>(smem);
  auto xs = reinterpret_cast<float(*)[kBM][kXLd]>(smem + kStages * kWStageBytes);
  __shared__ int32_t slots[kBM];
  const int e = int(blockIdx.y);
  const int32_t begin = a.offsets[e], end = a.offsets[e + 1];
  if (begin >= end) return;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, t4 = lane % 4;   // the mma fragment coordinates of this lane
  const int wn = warp % 4, wm = warp / 4;  // warp tile: features 32 wn .. +31, routed rows 16 wm .. +15
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  // This thread's copies a step: weight rows wr and wr + 64, 16-byte piece wp (8 inputs); routed row xr, piece
  // xp (4 inputs). A row past N copies zeros from row 0 (a valid address, never read).
  const int wr = tid / 4, wp = tid % 4, xr = tid / 8, xp = tid % 8;
  const char* wexp = a.W + size_t(e) * a.w_es;
  const bool wv0 = n0 + wr < a.N, wv1 = n0 + wr + 64 < a.N;
  const char* w0 = wexp + (wv0 ? size_t(n0 + wr) * a.w_ld : 0) + 16 * wp;
  const char* w1 = wexp + (wv1 ? size_t(n0 + wr + 64) * a.w_ld : 0) + 16 * wp;
  const int64_t n_steps = a.K / kBK;
  for (int32_t c0 = begin; c0 < end; c0 += kBM) {
    const int count = min(kBM, end - c0);
    if (tid < kBM) slots[tid] = tid < count ? a.sorted[c0 + tid] : -1;
    __syncthreads();
    const int32_t sx = slots[xr];
    const char* xrow = sx < 0 ? a.x
                              : a.x + size_t(sx / a.k) * a.x_nb2 + size_t(a.kx == 1 ? 0 : sx % a.k) * a.x_nb1;
    xrow += 16 * xp;
    auto issue = [&](int stage, int64_t step) {  // step's tiles into stage (one commit group)
      const size_t wb = size_t(step) * kBK * 2, xb = size_t(step) * kBK * 4;
      cp_async16(&ws[stage][wr][8 * wp], w0 + wb, wv0);
      cp_async16(&ws[stage][wr + 64][8 * wp], w1 + wb, wv1);
      cp_async16(&xs[stage][xr][4 * xp], xrow + xb, sx >= 0);
    };
    const bool active = 16 * wm < count;  // warp-uniform: rows 16 wm .. hold at least one routed row
    float acc[2][2][4] = {};
    auto multiply = [&](int stage) {  // acc += the step in stage
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        uint32_t af[2][4], bf[2][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = 32 * wn + 16 * i + g;
          af[i][0] = ld32(&ws[stage][r][kk + 2 * t4]);
          af[i][1] = ld32(&ws[stage][r + 8][kk + 2 * t4]);
          af[i][2] = ld32(&ws[stage][r][kk + 2 * t4 + 8]);
          af[i][3] = ld32(&ws[stage][r + 8][kk + 2 * t4 + 8]);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int c = 16 * wm + 8 * j + g;
          bf[j][0] = pack2<kF16>(*reinterpret_cast<const float2*>(&xs[stage][c][kk + 2 * t4]));
          bf[j][1] = pack2<kF16>(*reinterpret_cast<const float2*>(&xs[stage][c][kk + 2 * t4 + 8]));
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) mma16816<kF16>(acc[i][j], af[i], bf[j]);
      }
    };
    // The pipeline: kStages - 1 steps in flight before the first product; at step t, wait for t's group, one
    // barrier (t's tiles visible to every warp, and every warp done with step t - 1, whose stage the copies of
    // step t + kStages - 1 now overwrite), issue those copies, multiply step t. A group is committed every
    // iteration, empty past the last step, so that "at most kStages - 2 pending" always means "step t landed".
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_steps) issue(s, s);
      cp_async_commit();
    }
    for (int64_t t = 0; t < n_steps; ++t) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      const int64_t next = t + kStages - 1;
      if (next < n_steps) issue(int(next % kStages), next);
      cp_async_commit();
      if (active) multiply(int(t % kStages));
    }
    cp_async_wait<0>();
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
    __syncthreads();  // slots and every stage are rewritten by the next chunk
  }
}

template <DType WT>
void launch(const GroupedGemmArgs& a, int64_t n_expert, cudaStream_t stream) {
  allow_dynamic_smem(moe_gemm_pipelined_kernel<WT>, int(kSmemBytes));  // kernel_smem.h: per device
  const dim3 grid(unsigned((a.N + kBN - 1) / kBN), unsigned(n_expert));
  moe_gemm_pipelined_kernel<WT><<<grid, kThreads, kSmemBytes, stream>>>(a);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool moe_gemm_pipelined_supports(const Tensor& W, const Tensor& x) {
  // moe_gemm_tc_supports: K % 32, the expert count, 16-byte aligned 16-bit rows of W; here x's rows too (16-byte
  // copies of both operands).
  return (W.type == DType::F16 || W.type == DType::BF16) && moe_gemm_tc_supports(W) && x.type == DType::F32 &&
         x.nb[0] == 4 && aligned16(x.data) && x.nb[1] % 16 == 0 && x.nb[2] % 16 == 0;
}

void launch_moe_gemm_pipelined(const Tensor& W, const Tensor& x, const int32_t* offsets, const int32_t* sorted,
                               const Tensor& y, cudaStream_t stream) {
  const GroupedGemmArgs a = grouped_gemm_args(W, x, offsets, sorted, y);
  if (a.N == 0 || y.ne[2] == 0) return;
  if (W.type == DType::F16) return launch<DType::F16>(a, W.ne[2], stream);
  if (W.type == DType::BF16) return launch<DType::BF16>(a, W.ne[2], stream);
  throw Error(std::string("matmul_id: the pipelined grouped GEMM has no path for ") + dtype_name(W.type));
}

}  // namespace tandem::cuda
