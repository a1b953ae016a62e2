// Q8_0 products for a few columns at once (8..16: a speculative verify block, sequences decoding together)
// on the tensor cores, with every (row, column) sum bit for bit what the one-column direct kernel computes.
//
// Why: the direct kernel (gemv_quant_direct.cu) takes each 32-value block of a row with 8 dp4a per column,
// and loads the column's activations once per 2 rows: at 8 columns a Qwen3-8B-shape Q8_0 verify pass took 7.4
// ms where one column took 4.5 ms, and a 16-row verify fell to dequantization plus cuBLAS, 13.3 ms
// (fourteenth session, H100; bench/BENCHMARKS.md). Here the integer dot products of a block run as two int8
// mma.sync m16n8k16 (values 0..15 and 16..31) for 16 rows x 8 columns at a time, and the rows are staged in
// shared memory with 16-byte asynchronous copies, so the weights are read once for all the columns.
//
// Bit for bit: an integer dot product is exact whichever unit computes it, so what must agree is the float
// part. The direct kernel's lane l sums the terms of blocks l, l + 32, l + 64, ... in that order (one "slot"
// per lane) and then adds the 32 slots with warp_sum's butterfly. Here warp w of a block owns slots 8w .. 8w
// + 7 of the block's 16 rows (blocks 32j + 8w + s, s = 0..7, for j = 0, 1, ...: 8 consecutive blocks, 272
// bytes a row, 16-byte aligned when the rows are), keeps one accumulator per slot in registers, adds each
// block's term with the same expression (q8_group_term, gemv_quant_pieces.cuh), and at the end the 32 slots
// of each output are added by one thread in warp_sum's order for lane 0 (butterfly_sum). So the same value,
// whatever the number of columns and whichever kernel runs: a row of a verify block equals the one-row decode
// of that row (speculative decoding's greedy acceptance relies on it).
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_quant_pieces.cuh"
#include "backend/cuda/gemv_units.cuh"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/pdl.cuh"
#include "core/env_switch.h"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTileRows = 16;     // the mma's M: one block of threads owns 16 weight rows
constexpr int kBlockBytes = 34;   // a Q8_0 block: fp16 d, 32 int8 values
constexpr int kSlotsPerWarp = 8;  // consecutive blocks a warp takes per step (its 8 slots)
constexpr int kChunkBytes = kSlotsPerWarp * kBlockBytes;  // 272 bytes of one row per warp and step
constexpr int kChunkVecs = kChunkBytes / 16;              // 17 16-byte copies
constexpr int kStages = 3;                                // steps of a warp in shared memory (2 in flight)
constexpr int kWarpStageBytes = kTileRows * kChunkBytes;  // 4352
constexpr int kSmemBytes = kWarps * kStages * kWarpStageBytes;  // 52224
constexpr int kMaxColsPerLaunch = 16;                           // two 8-column mma tiles

static_assert(kChunkBytes % 16 == 0, "a warp's step of a row must be whole 16-byte copies");
static_assert(kWarps * kSlotsPerWarp == kWarpSize, "the block's warps own the 32 slots of warp_sum");
constexpr int kSlotPitch = 33;  // floats between outputs in the slot sums: 32 slots + 1 (no bank conflicts)
static_assert(2 * kTileRows * 8 * kSlotPitch * sizeof(float) <= size_t(kSmemBytes),
              "the slot sums reuse the stages");
static_assert(8 * kTileRows * 8 * (kWarps + 1) * sizeof(float) <= size_t(kSmemBytes), "so do the wide sums");

// Output rows of a tile: 16 rows of one segment, or for the gated forms 8 gate rows (tile rows 0..7) and the
// same 8 up rows (8..15), so that an output's gate and up sums lie in the same slot arrays.
template <GemvEpilogue EPI>
constexpr int outs_per_tile() {
  return gemv_outs_per_unit<EPI, kTileRows>();
}

// 4 consecutive int8 values at a 2-byte aligned shared-memory address (a Q8_0 block's values start 2 bytes
// in), packed with the lowest address in the lowest byte, as mma.sync and dp4a take them.
__device__ __forceinline__ uint32_t ld_s8x4(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

// The sum of 32 slot values s[0..31] exactly as warp_sum computes it in lane 0 when lane l holds s[l]: at
// each step o = 16, 8, 4, 2, 1 lane l adds lane l ^ o's value to its own (v + partner), so lane 0's result is
// this tree (l < o: l ^ o = l + o). One thread per output instead of one warp: the warps' serial shuffles
// were most of a small product's time.
__device__ __forceinline__ float butterfly_sum(const float* s) {
  float v[16];
#pragma unroll
  for (int l = 0; l < 16; ++l) v[l] = s[l] + s[l + 16];
#pragma unroll
  for (int l = 0; l < 8; ++l) v[l] = v[l] + v[l + 8];
#pragma unroll
  for (int l = 0; l < 4; ++l) v[l] = v[l] + v[l + 4];
#pragma unroll
  for (int l = 0; l < 2; ++l) v[l] = v[l] + v[l + 2];
  return v[0] + v[1];
}

// c = a b for one 16 x 8 x 16 int8 tile (s32 results, exact). Fragments (lane = 4 g + t4): a[0] = row g,
// values 4 t4 .. 4 t4 + 3; a[1] = row g + 8, the same values; b = column g, values 4 t4 .. 4 t4 + 3; c[q] =
// row g, column 2 t4 + q and c[2 + q] = row g + 8, column 2 t4 + q (q = 0, 1).
__device__ __forceinline__ void mma_s8_16816(int (&c)[4], const uint32_t (&a)[2], uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b), "r"(0), "r"(0), "r"(0), "r"(0));
}

// c += a b, the same tile with the results added to c's (exact: integers).
__device__ __forceinline__ void mma_s8_16816_acc(int (&c)[4], const uint32_t (&a)[2], uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b));
}

// One launch: columns 0 .. T-1 (T <= 8 NT) of the activations xq / xds (launch_quantize_q8's layout for T
// columns of K values), one tile of 16 weight rows per block of threads. kWide (TANDEM_Q8_MMA_WIDE, 17..kQ8WideMaxCols
// columns, calls that need not be batch-invariant): one accumulator a warp instead of 8 slots, so that 8
// column tiles fit the registers; a block's 32-value block adds d_w d_x (lo + hi) to it, and the 4 warps'
// sums are added in warp order at the end. A column's value then does not depend on the other columns of the
// call (the same order for every T), but is not the direct kernel's.
template <int NT, GemvEpilogue EPI, bool kWide>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    gemv_q8_mma_kernel(const GemvArgs a, int T, const int8_t* xq, const float2* xds) {
  constexpr int kSlots = kWide ? 1 : kSlotsPerWarp;  // accumulators a warp keeps per output
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ const uint8_t* rows[kTileRows];
  constexpr int per = outs_per_tile<EPI>();
  pdl_trigger();
  int seg = 0;
  int64_t row0 = 0;
  if (!gemv_find_unit<EPI, per>(a, blockIdx.x, seg, row0)) return;  // (the whole block: one tile per block)
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t4 = lane % 4;
  const int64_t N = gemv_seg(a, seg).N, K = a.K, n_blocks = K / 32;
  if (threadIdx.x < kTileRows) {
    const int r = threadIdx.x;
    const GemvSeg& sg = kIsGlu<EPI> ? gemv_seg(a, r < per ? 0 : 1) : gemv_seg(a, seg);
    const int64_t o = row0 + r % per;
    rows[r] =
        static_cast<const uint8_t*>(sg.W) + (o < N ? o : row0) * sg.w_ld;  // a row past N: never written
  }
  __syncthreads();

  // This warp's steps: blocks 32 j + 8 warp .. + 7 of every row (n_blocks % 8 == 0: a step is whole or
  // absent).
  const int64_t first = int64_t(warp) * kSlotsPerWarp;
  const int64_t n_steps = n_blocks > first ? (n_blocks - first + 31) / 32 : 0;
  uint8_t* stage0 = smem + warp * kStages * kWarpStageBytes;
  auto issue = [&](int64_t j) {
    if (j < n_steps) {
      uint8_t* dst = stage0 + (j % kStages) * kWarpStageBytes;
      const int64_t off = (32 * j + first) * kBlockBytes;
      for (int i = lane; i < kTileRows * kChunkVecs; i += kWarpSize) {
        const int r = i / kChunkVecs, v = i % kChunkVecs;
        __pipeline_memcpy_async(dst + r * kChunkBytes + 16 * v, rows[r] + off + 16 * v, 16);
      }
    }
    __pipeline_commit();  // (an empty group past the end keeps the count of groups in flight uniform)
  };
  issue(0);
  issue(1);
  pdl_wait();  // the activations are the previous kernel's output; the weights above are not

  float acc[kSlots][NT][4];
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[s][nt][q] = 0.0f;

  for (int64_t j = 0; j < n_steps; ++j) {
    issue(j + 2);
    __pipeline_wait_prior(2);  // this lane's copies of step j have landed
    __syncwarp();              // and every lane's
    const uint8_t* st = stage0 + (j % kStages) * kWarpStageBytes;
#pragma unroll
    for (int s = 0; s < kSlotsPerWarp; ++s) {
      const int64_t b = 32 * j + first + s;  // the block: slot 8 warp + s of the direct kernel's lanes
      const uint8_t* ra = st + g * kChunkBytes + s * kBlockBytes;  // row g of the tile
      const uint8_t* rb = ra + 8 * kChunkBytes;                    // row g + 8
      const uint32_t a_lo[2] = {ld_s8x4(ra + 2 + 4 * t4), ld_s8x4(rb + 2 + 4 * t4)};
      const uint32_t a_hi[2] = {ld_s8x4(ra + 18 + 4 * t4), ld_s8x4(rb + 18 + 4 * t4)};
      const float da = fp16_bits_to_float(*reinterpret_cast<const uint16_t*>(ra));
      const float db = fp16_bits_to_float(*reinterpret_cast<const uint16_t*>(rb));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int cb = 8 * nt + g;  // this lane's column of the b fragment
        uint32_t b_lo = 0, b_hi = 0;
        if (cb < T) {
          const int8_t* xv = xq + int64_t(cb) * K + 32 * b + 4 * t4;
          b_lo = *reinterpret_cast<const uint32_t*>(xv);
          b_hi = *reinterpret_cast<const uint32_t*>(xv + 16);
        }
        int lo[4], hi[4];  // (kWide: lo is the whole block's sum, hi unused)
        mma_s8_16816(lo, a_lo, b_lo);
        if constexpr (kWide)
          mma_s8_16816_acc(lo, a_hi, b_hi);
        else
          mma_s8_16816(hi, a_hi, b_hi);
        float dx[2];  // the activations' scales of this lane's two result columns
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int c = 8 * nt + 2 * t4 + q;
          dx[q] = c < T ? xds[int64_t(c) * n_blocks + b].x : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if constexpr (kWide)
            acc[0][nt][q] = __fmaf_rn(float(lo[q]), (q < 2 ? da : db) * dx[q & 1], acc[0][nt][q]);
          else
            acc[s][nt][q] = q8_group_term(acc[s][nt][q], dx[q & 1], q < 2 ? da : db, lo[q], hi[q]);
        }
      }
    }
    __syncwarp();  // every lane is done with this stage before a later issue() overwrites it
  }
  __pipeline_wait_prior(0);
  __syncthreads();  // every warp is out of its stages: they become the slot sums

  // sums[nt][row][col][slot] (slot = 8 warp + s, or the warp when kWide; pitch floats an output)
  constexpr int pitch = kWide ? kWarps + 1 : kSlotPitch;
  float* sums = reinterpret_cast<float*>(smem);
  auto at = [&](int nt, int r, int c) { return sums + ((nt * kTileRows + r) * 8 + c) * pitch; };
#pragma unroll
  for (int s = 0; s < kSlots; ++s)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        at(nt, g + 8 * (q >> 1), 2 * t4 + (q & 1))[warp * kSlots + s] = acc[s][nt][q];
  __syncthreads();
  auto total = [&](const float* v) {
    if constexpr (kWide) {
      return ((v[0] + v[1]) + v[2]) + v[3];
    } else {
      return butterfly_sum(v);
    }
  };

  // One output per thread (the columns written: T <= 8 NT): its 32 slots added as warp_sum adds them for lane
  // 0.
  const GemvSeg& out = gemv_seg(a, seg);
  for (int i = threadIdx.x; i < per * T; i += kWarps * kWarpSize) {
    const int r = i % per, col = i / per, nt = col / 8, c = col % 8;
    const int64_t o = row0 + r;
    float val = total(at(nt, r, c));
    if constexpr (kIsGlu<EPI>) val = glu_gate<EPI == GemvEpilogue::GeGlu>(val, total(at(nt, r + per, c)));
    if (o >= N) continue;
    if constexpr (EPI == GemvEpilogue::AddResidual)
      val = out.r[col * out.r_ld + o] + val;  // add(x, proj)'s order
    out.y[col * out.y_ld + o] = val;
  }
}

template <int NT, GemvEpilogue EPI, bool kWide = false>
void launch_nt(const GemvArgs& c, unsigned grid, int nc, const int8_t* xq, const float2* xds,
               cudaStream_t stream) {
  allow_dynamic_smem(gemv_q8_mma_kernel<NT, EPI, kWide>, kSmemBytes);
  launch_pdl(gemv_q8_mma_kernel<NT, EPI, kWide>, dim3(grid), dim3(kWarps * kWarpSize), size_t(kSmemBytes),
             stream, c, nc, xq, xds);
  TANDEM_CUDA_CHECK_LAUNCH();
}

template <GemvEpilogue EPI>
void launch_epi(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  constexpr int per = outs_per_tile<EPI>();
  const int64_t tiles = gemv_units<EPI, per>(a);
  if (tiles == 0) return;
  check(tiles <= 0x7fffffff, "launch_gemv_q8_mma: too many rows for one launch");
  const int64_t K = a.K, T = a.T;
  const int8_t* xq = static_cast<const int8_t*>(scratch);
  const float2* xds =
      reinterpret_cast<const float2*>(static_cast<const char*>(scratch) + q8_scales_offset(K, T));
  for (int64_t t0 = 0; t0 < T; t0 += kMaxColsPerLaunch) {
    const int nc = int(std::min<int64_t>(kMaxColsPerLaunch, T - t0));
    const GemvArgs c = gemv_columns(a, t0);
    const int8_t* xq_c = xq + t0 * K;
    const float2* xds_c = xds + t0 * (K / 32);
    if (nc > 8)
      launch_nt<2, EPI>(c, unsigned(tiles), nc, xq_c, xds_c, stream);
    else
      launch_nt<1, EPI>(c, unsigned(tiles), nc, xq_c, xds_c, stream);
  }
}

// The plain product of 17..kQ8WideMaxCols columns (matmul, not batch-invariant) in one launch: up to 8 column
// tiles.
void launch_wide(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  const int64_t tiles = gemv_units<GemvEpilogue::Store, kTileRows>(a);
  const int64_t K = a.K, T = a.T;
  const int8_t* xq = static_cast<const int8_t*>(scratch);
  const float2* xds =
      reinterpret_cast<const float2*>(static_cast<const char*>(scratch) + q8_scales_offset(K, T));
  const unsigned grid = unsigned(tiles);
  const int nc = int(T);
  switch ((T + 7) / 8) {
    case 3:
      return launch_nt<3, GemvEpilogue::Store, true>(a, grid, nc, xq, xds, stream);
    case 4:
      return launch_nt<4, GemvEpilogue::Store, true>(a, grid, nc, xq, xds, stream);
    case 5:
      return launch_nt<5, GemvEpilogue::Store, true>(a, grid, nc, xq, xds, stream);
    case 6:
      return launch_nt<6, GemvEpilogue::Store, true>(a, grid, nc, xq, xds, stream);
    case 7:
      return launch_nt<7, GemvEpilogue::Store, true>(a, grid, nc, xq, xds, stream);
    default:
      return launch_nt<8, GemvEpilogue::Store, true>(a, grid, nc, xq, xds, stream);
  }
}

// On since the fifteenth session's GPU run (cuda_kernels.h); TANDEM_Q8_MMA_WIDE=0 turns it off.
EnvSwitch g_q8_mma_wide{"TANDEM_Q8_MMA_WIDE", true};

// On by default since the fourteenth session's GPU runs (H100: GpuQ8Mma bit for bit, the whole GPU test
// binary with it on; Qwen3-8B-shape Q8_0 decode of 16 sequences 935 -> 1937 t/s); TANDEM_Q8_MMA=0 turns it
// off.
EnvSwitch g_q8_mma{"TANDEM_Q8_MMA", true};

}  // namespace

bool gemv_q8_mma_applies(const GemvArgs& a) {
  // From kQ8MmaMinCols columns on: below, the direct kernel is as fast or faster (the same bits either way).
  return g_q8_mma.on() && a.T >= kQ8MmaMinCols && a.wt == DType::Q8_0 && a.q8_count == nullptr &&
         gemv_quant_direct_supports(a);
}

void set_q8_mma(std::optional<bool> on) {
  g_q8_mma.set(on);
}

bool gemv_q8_mma_wide_applies(const GemvArgs& a) {
  return g_q8_mma_wide.on() && a.T > kQ8MmaMaxCols && a.T <= kQ8WideMaxCols && a.wt == DType::Q8_0 &&
         a.n_seg == 1 && a.epi == GemvEpilogue::Store && a.q8_count == nullptr &&
         gemv_quant_direct_supports(a);
}

void launch_gemv_q8_mma_wide(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  check(a.T > kQ8MmaMaxCols && a.T <= kQ8WideMaxCols && a.wt == DType::Q8_0 && a.n_seg == 1 &&
            a.epi == GemvEpilogue::Store && a.q8_count == nullptr && gemv_quant_direct_supports(a),
        "launch_gemv_q8_mma_wide: arguments the wide tensor-core Q8_0 path cannot take");
  if (a.seg[0].N == 0) return;
  launch_wide(a, scratch, stream);
}

void set_q8_mma_wide(std::optional<bool> on) {
  g_q8_mma_wide.set(on);
}

void launch_gemv_q8_mma(const GemvArgs& a, const void* scratch, cudaStream_t stream) {
  check(a.wt == DType::Q8_0 && a.q8_count == nullptr && gemv_quant_direct_supports(a),
        "launch_gemv_q8_mma: arguments the tensor-core Q8_0 path cannot take");
  if (a.T == 0) return;
  switch (a.epi) {
    case GemvEpilogue::Store:
      return launch_epi<GemvEpilogue::Store>(a, scratch, stream);
    case GemvEpilogue::AddResidual:
      return launch_epi<GemvEpilogue::AddResidual>(a, scratch, stream);
    case GemvEpilogue::SwiGlu:
      return launch_epi<GemvEpilogue::SwiGlu>(a, scratch, stream);
    case GemvEpilogue::GeGlu:
      return launch_epi<GemvEpilogue::GeGlu>(a, scratch, stream);
  }
}

}  // namespace tandem::cuda
