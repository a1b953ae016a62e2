// Flash attention for prefill (many query rows) on tensor cores (WMMA, bf16/f16 operands, f32 accumulation).
//
// A block of BM / 16 warps takes BM consecutive query rows of one query head and walks the cache in tiles of
// BN positions: S = Q K^T on tensor cores, an online softmax per row in f32 (running max m, sum l, rescale
// alpha), then O += P V on tensor cores with O kept in shared memory as f32. Head dims up to 256 use 64 x 64
// tiles (4 warps); up to 512 (gemma4's global layers) 32 x 32 tiles (2 warps), so that Q, K, V and O of a
// block still fit the 227 KB of shared memory. GQA reads K/V of head h /
// (n_head/n_kv). Rows of a tile may belong to several sequences (continuous batching): the tile is processed
// once per distinct sequence, with the rows of other sequences masked out, so the result is exact for any row
// order. Visibility of each (row, position) follows AttentionBatch (mask kind, sliding window, kv_begin).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <climits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_smem.h"
#include "backend/cuda/device_utils.cuh"
#include "core/env_switch.h"

namespace tandem::cuda {
namespace {

using namespace nvcuda;

// Tile shapes: BM query rows per block (one warp per 16), BN cache positions per tile (a multiple of 32).
constexpr int kWideHeadDim = 256;  // head dims up to this: 64 x 64 tiles; above (up to kMaxHeadDim): 32 x 32
constexpr int kMaxHeadDim = 512;
// TANDEM_FLASH_HD512 (on; =0 turns it off): head dims 257..512 take this kernel (32 x 32 tiles); off, they go to
// the split-K decode kernel. On since its GPU tests passed (twelfth session, H100).
EnvSwitch g_flash_hd512{"TANDEM_FLASH_HD512", true};

struct Layout {  // element strides and byte offsets of the shared-memory regions
  int ldq, ldk, lds, ldp, ldo;
  size_t q, k, v, s, p, o, stats, bytes;
};

__host__ __device__ inline size_t round128(size_t n) {
  return (n + 127) & ~size_t(127);
}

template <int kBM, int kBN>
__host__ __device__ inline Layout make_layout(int hd) {
  Layout L;
  L.ldq = hd + 8;
  L.ldk = hd + 8;
  L.lds = kBN + 4;
  L.ldp = kBN + 8;
  L.ldo = hd + 4;
  size_t off = 0;
  L.q = off;
  off = round128(off + size_t(kBM) * L.ldq * 2);
  L.k = off;
  off = round128(off + size_t(kBN) * L.ldk * 2);
  L.v = off;
  off = round128(off + size_t(kBN) * L.ldk * 2);
  L.s = off;
  off = round128(off + size_t(kBM) * L.lds * 4);
  L.p = off;
  off = round128(off + size_t(kBM) * L.ldp * 2);
  L.o = off;
  off = round128(off + size_t(kBM) * L.ldo * 4);
  L.stats = off;
  off = round128(off + size_t(kBM) * 4 * 6 + size_t(kBN) * 8 + 64);
  L.bytes = off;
  return L;
}

template <class T16>
__device__ __forceinline__ T16 to16(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 to16<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half to16<__half>(float v) {
  return __float2half_rn(v);
}

template <class T16, int kBM, int kBN>
__global__ void __launch_bounds__(kBM / 16 * kWarpSize)
    flash_prefill_kernel(RowView q, const char* __restrict__ kc, size_t k_nb1, size_t k_slot,
                         const char* __restrict__ vc, size_t v_nb1, size_t v_slot, AttnMeta meta, int64_t T,
                         int64_t n_head, int gqa, int hd, float scale, RowView out) {
  constexpr int kThreads = kBM / 16 * kWarpSize;
  extern __shared__ __align__(128) uint8_t smem[];
  const Layout L = make_layout<kBM, kBN>(hd);
  T16* Qs = reinterpret_cast<T16*>(smem + L.q);
  T16* Ks = reinterpret_cast<T16*>(smem + L.k);
  T16* Vs = reinterpret_cast<T16*>(smem + L.v);
  float* Ss = reinterpret_cast<float*>(smem + L.s);
  T16* Ps = reinterpret_cast<T16*>(smem + L.p);
  float* Os = reinterpret_cast<float*>(smem + L.o);
  float* m_s = reinterpret_cast<float*>(smem + L.stats);
  float* l_s = m_s + kBM;
  int* seq_s = reinterpret_cast<int*>(l_s + kBM);
  int* lo_s = seq_s + kBM;
  int* hi_s = lo_s + kBM;
  int* done_s = hi_s + kBM;
  int64_t* slot_s = reinterpret_cast<int64_t*>(done_s + kBM);
  int* seg = reinterpret_cast<int*>(slot_s + kBN);  // current sequence, its lo, its hi

  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int64_t r0 = int64_t(blockIdx.x) * kBM;
  const int64_t h = blockIdx.y;
  const int g = int(h / gqa);

  for (int i = tid; i < kBM; i += kThreads) {
    const int64_t r = r0 + i;
    RowRange rr{-1, 0, 0};
    if (r < T) rr = row_range(meta, r);
    seq_s[i] = rr.seq;
    lo_s[i] = rr.lo;
    hi_s[i] = rr.hi;
    done_s[i] = 0;
    m_s[i] = -INFINITY;
    l_s[i] = 0.0f;
  }
  for (int idx = tid; idx < kBM * hd; idx += kThreads) {
    const int i = idx / hd, d = idx % hd;
    const int64_t r = r0 + i;
    const float v = r < T ? q.row_as<const float>(r * n_head + h)[d] * scale : 0.0f;
    Qs[i * L.ldq + d] = to16<T16>(v);
    Os[i * L.ldo + d] = 0.0f;
  }
  __syncthreads();

  const int vec_per_row = hd / 8;  // 16-byte vectors per K/V row
  for (;;) {
    if (tid == 0) {  // next sequence present in the tile, and the union of its rows' visible ranges
      int s = -1, lo = INT_MAX, hi = 0;
      for (int i = 0; i < kBM; ++i) {
        if (done_s[i] || seq_s[i] < 0) continue;
        if (s < 0) s = seq_s[i];
        if (seq_s[i] != s) continue;
        done_s[i] = 1;
        if (hi_s[i] > lo_s[i]) {
          lo = min(lo, lo_s[i]);
          hi = max(hi, hi_s[i]);
        }
      }
      seg[0] = s;
      seg[1] = lo;
      seg[2] = hi;
    }
    __syncthreads();
    const int s_cur = seg[0], kv_lo = seg[1], kv_hi = seg[2];
    __syncthreads();  // everyone has read seg before thread 0 may rewrite it
    if (s_cur < 0) break;

    for (int j0 = kv_lo; j0 < kv_hi; j0 += kBN) {
      // K and V tiles (zeros past the end, so that P = 0 never meets garbage). [kv_lo, kv_hi) is the union of
      // the rows' ranges; a position in a gap between them that no row sees may lie in an evicted block
      // (entry -1): it is loaded as zeros too.
      for (int jj = tid; jj < kBN; jj += kThreads)
        slot_s[jj] = j0 + jj < kv_hi ? cache_slot(meta, s_cur, j0 + jj) : -1;
      __syncthreads();
      // Asynchronous 16-byte copies: every thread's loads are in flight at once.
      for (int idx = tid; idx < kBN * vec_per_row; idx += kThreads) {
        const int jj = idx / vec_per_row, c = idx % vec_per_row;
        T16* kd = Ks + jj * L.ldk + c * 8;
        T16* vd = Vs + jj * L.ldk + c * 8;
        if (slot_s[jj] >= 0) {
          __pipeline_memcpy_async(kd, kc + slot_s[jj] * k_slot + g * k_nb1 + c * 16, 16);
          __pipeline_memcpy_async(vd, vc + slot_s[jj] * v_slot + g * v_nb1 + c * 16, 16);
        } else {
          *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
        }
      }
      __pipeline_commit();
      __pipeline_wait_prior(0);
      __syncthreads();

      // S rows [16 warp, +16) = Q K^T.
      {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kBN / 16];
#pragma unroll
        for (int n = 0; n < kBN / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
        for (int k = 0; k < hd / 16; ++k) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T16, wmma::row_major> a;
          wmma::load_matrix_sync(a, Qs + 16 * warp * L.ldq + 16 * k, L.ldq);
#pragma unroll
          for (int n = 0; n < kBN / 16; ++n) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T16, wmma::col_major> b;
            wmma::load_matrix_sync(b, Ks + 16 * n * L.ldk + 16 * k, L.ldk);
            wmma::mma_sync(acc[n], a, b, acc[n]);
          }
        }
#pragma unroll
        for (int n = 0; n < kBN / 16; ++n)
          wmma::store_matrix_sync(Ss + 16 * warp * L.lds + 16 * n, acc[n], L.lds, wmma::mem_row_major);
      }
      __syncwarp();

      // Online softmax of the warp's 16 rows; rescale their O rows.
      for (int ii = 0; ii < 16; ++ii) {
        const int i = 16 * warp + ii;
        const bool row_in = seq_s[i] == s_cur;
        float sv[kBN / 32];
#pragma unroll
        for (int e = 0; e < kBN / 32; ++e) {
          const int c = lane + 32 * e, j = j0 + c;
          const bool vis = row_in && j < kv_hi && j >= lo_s[i] && j < hi_s[i];
          sv[e] = vis ? Ss[i * L.lds + c] + mask_bias(meta, r0 + i, j) : -INFINITY;
        }
        const float m_old = m_s[i];
        float m_tile = sv[0];
#pragma unroll
        for (int e = 1; e < kBN / 32; ++e) m_tile = fmaxf(m_tile, sv[e]);
        const float m_new = fmaxf(m_old, warp_max(m_tile));
        float alpha = 1.0f, psum = 0.0f;
#pragma unroll
        for (int e = 0; e < kBN / 32; ++e) {
          const float p = m_new == -INFINITY ? 0.0f : expf(sv[e] - m_new);
          psum += p;
          Ps[i * L.ldp + lane + 32 * e] = to16<T16>(p);
        }
        psum = warp_sum(psum);
        if (m_new != -INFINITY) alpha = expf(m_old - m_new);  // m_old = -inf gives 0
        for (int d = lane; d < hd; d += kWarpSize) Os[i * L.ldo + d] *= alpha;
        __syncwarp();
        if (lane == 0) {
          m_s[i] = m_new;
          l_s[i] = l_s[i] * alpha + psum;
        }
      }
      __syncwarp();

      // O rows [16 warp, +16) += P V.
      for (int n = 0; n < hd / 16; ++n) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        float* optr = Os + 16 * warp * L.ldo + 16 * n;
        wmma::load_matrix_sync(acc, optr, L.ldo, wmma::mem_row_major);
#pragma unroll
        for (int k = 0; k < kBN / 16; ++k) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T16, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T16, wmma::row_major> b;
          wmma::load_matrix_sync(a, Ps + 16 * warp * L.ldp + 16 * k, L.ldp);
          wmma::load_matrix_sync(b, Vs + 16 * k * L.ldk + 16 * n, L.ldk);
          wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(optr, acc, L.ldo, wmma::mem_row_major);
      }
      __syncthreads();  // K/V tiles are reloaded next
    }
  }

  for (int idx = tid; idx < kBM * hd; idx += kThreads) {
    const int i = idx / hd, d = idx % hd;
    const int64_t r = r0 + i;
    if (r >= T) continue;
    const float l = l_s[i];
    out.row_as<float>(r * n_head + h)[d] = l > 0.0f ? Os[i * L.ldo + d] / l : 0.0f;
  }
}

template <class T16, int kBM, int kBN>
void launch_tiles(const AttentionArgs& a, cudaStream_t stream, int max_hd) {
  const int hd = int(a.q.ne[0]);
  const Layout L = make_layout<kBM, kBN>(hd);
  allow_dynamic_smem(flash_prefill_kernel<T16, kBM, kBN>, int(make_layout<kBM, kBN>(max_hd).bytes));  // per device
  const int64_t T = a.q.ne[2], n_head = a.q.ne[1];
  const int gqa = int(n_head / a.kv.k.ne[1]);
  const dim3 grid(unsigned((T + kBM - 1) / kBM), unsigned(n_head));
  flash_prefill_kernel<T16, kBM, kBN><<<grid, kBM / 16 * kWarpSize, L.bytes, stream>>>(
      row_view(a.q), static_cast<const char*>(a.kv.k.data), a.kv.k.nb[1], a.kv.k.nb[2],
      static_cast<const char*>(a.kv.v.data), a.kv.v.nb[1], a.kv.v.nb[2], make_meta(a), T, n_head, gqa, hd,
      a.scale, row_view(a.out));
  TANDEM_CUDA_CHECK_LAUNCH();
}

template <class T16>
void launch_typed(const AttentionArgs& a, cudaStream_t stream) {
  if (a.q.ne[0] <= kWideHeadDim) return launch_tiles<T16, 64, 64>(a, stream, kWideHeadDim);
  launch_tiles<T16, 32, 32>(a, stream, kMaxHeadDim);
}

}  // namespace

bool attention_prefill_supported(const AttentionArgs& a) {
  const int64_t hd = a.q.ne[0];
  const bool types = (a.kv.k.type == DType::BF16 || a.kv.k.type == DType::F16) && a.kv.v.type == a.kv.k.type;
  const bool aligned = (reinterpret_cast<uintptr_t>(a.kv.k.data) & 15) == 0 &&
                       (reinterpret_cast<uintptr_t>(a.kv.v.data) & 15) == 0 && a.kv.k.nb[1] % 16 == 0 &&
                       a.kv.v.nb[1] % 16 == 0 && a.kv.k.nb[2] % 16 == 0 && a.kv.v.nb[2] % 16 == 0;
  const int max_hd = g_flash_hd512.on() ? kMaxHeadDim : kWideHeadDim;
  return types && aligned && a.kv.v.ne[0] == hd && hd % 16 == 0 && hd <= max_hd && a.q.ne[1] <= 65535;
}

void set_flash_hd512(std::optional<bool> on) {
  g_flash_hd512.set(on);
}

void launch_attention_prefill(const AttentionArgs& a, cudaStream_t stream) {
  check(attention_prefill_supported(a), "CUDA prefill attention: unsupported shapes or cache dtypes");
  if (a.q.ne[2] == 0) return;
  if (a.kv.k.type == DType::BF16) {
    launch_typed<__nv_bfloat16>(a, stream);
  } else {
    launch_typed<__half>(a, stream);
  }
}

}  // namespace tandem::cuda
