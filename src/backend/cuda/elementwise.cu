// Row-wise and elementwise kernels: rms_norm, rope, SwiGLU/GeGLU, add/mul, scale/softcap/fill, softmax,
// dtype copies, kv_store, get_rows and embed_rows. Each is memory-bound and small next to the matmuls; they
// are written for clarity, with one block (or warp) per row and coalesced accesses along ne[0].
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/env_switch.h"
#include "backend/cuda/quant_device.cuh"
#include "backend/cuda/row_norm.cuh"
#include "backend/cuda/tensor_rows.h"

namespace tandem::cuda {
namespace {

constexpr int kRowThreads = 256;

int threads_for_row(int64_t ne0) {
  return int(std::min<int64_t>(kRowThreads, ((ne0 + 31) / 32) * 32));
}

// TANDEM_WIDE_ROWS=1: long rows spread over several blocks (row_grid below, rms_norm_block_kernel), and long
// softmax rows to softmax_long_kernel. On since its GPU tests passed (twelfth session, H100); =0 turns it
// off. The elementwise and rms_norm arithmetic is unchanged, so those results are
// bitwise the same either way; softmax_long_kernel sums in another order (equal within rounding).
EnvSwitch g_wide_rows{"TANDEM_WIDE_ROWS", true};
// rms_norm rows go over several blocks only when there are few of them (decode): every block of a row sums the
// whole row's squares, so many rows x many blocks would multiply the bytes read.
constexpr int64_t kWideNormMaxRows = 64;

// The grid of an elementwise launch over rows of ne0 values: (column blocks, rows), a block of `threads`
// covering columns in steps of the grid's width; a column block per ~4 values a thread when wide_rows.
dim3 row_grid(int64_t ne0, int64_t rows, int threads) {
  const int64_t cols = g_wide_rows.on() ? std::min<int64_t>(1024, (ne0 + 4 * threads - 1) / (4 * threads)) : 1;
  return dim3(unsigned(std::max<int64_t>(cols, 1)), unsigned(std::min<int64_t>(rows, 65535)));
}

// ---- rms_norm: one warp per row --------------------------------------------------------------------------
__global__ void rms_norm_kernel(RowView x, const float* __restrict__ weight, float eps, RowView out) {
  pdl_trigger();  // pdl.cuh: the matrix product after it may launch and start loading its weights
  pdl_wait();
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (r >= x.n_rows()) return;
  const int lane = threadIdx.x % kWarpSize;
  const float* xr = x.row_as<const float>(r);
  float* yr = out.row_as<float>(r);
  const float inv = rms_inverse(row_sum_squares<false>(xr, x.ne0, nullptr), x.ne0, eps);
  for (int64_t i = lane; i < x.ne0; i += kWarpSize) yr[i] = weight ? xr[i] * inv * weight[i] : xr[i] * inv;
}

// ---- rms_norm of long rows (the hidden state, ne0 >= kBlockNormMin): one block per row. At decode there is one
// row: a single warp walking 4096 values took several microseconds on one SM, twice a layer on the critical
// path; 256 threads take 16 values each (row_norm.cuh: kBlockNormMin, kBlockNormThreads).
// Rows blockIdx.y, + gridDim.y, ...; with gridDim.x > 1 (wide_rows(), below) each block sums the whole row's squares (the same
// loop, so the same value in every block) and writes its own slice of kBlockNormThreads-value chunks. x may
// alias out: the sums are all taken before any block writes... only within a block, so an aliased call keeps
// gridDim.x == 1 (launch_rms_norm).
__global__ void __launch_bounds__(kBlockNormThreads)
    rms_norm_block_kernel(RowView x, const float* __restrict__ weight, float eps, RowView out) {
  __shared__ float red[32];
  pdl_trigger();  // pdl.cuh
  pdl_wait();
  for (int64_t r = blockIdx.y; r < x.n_rows(); r += gridDim.y) {
    const float* xr = x.row_as<const float>(r);
    float* yr = out.row_as<float>(r);
    const float inv = rms_inverse(row_sum_squares<true>(xr, x.ne0, red), x.ne0, eps);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < x.ne0; i += int64_t(gridDim.x) * blockDim.x)
      yr[i] = weight ? xr[i] * inv * weight[i] : xr[i] * inv;
  }
}

// ---- rope: one thread per rotated pair --------------------------------------------------------------------
__global__ void rope_kernel(RowView x, int64_t n_head, const int32_t* __restrict__ positions, int n_rot,
                            bool neox, float theta_scale, float freq_scale, float attn_factor,
                            const float* __restrict__ freq_factors, int64_t total) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int half = n_rot / 2;
  const int i = int(idx % half);
  const int64_t r = idx / half;
  const int64_t t = r / n_head;
  // theta exactly as the CPU reference (and ggml) computes it: a running float product from theta_0 = p.
  float theta = float(positions[t]);
  for (int k = 0; k < i; ++k) theta *= theta_scale;
  const float ff = freq_factors ? freq_factors[i] : 1.0f;
  theta = freq_scale * (theta / ff);
  const float c = cosf(theta) * attn_factor, s = sinf(theta) * attn_factor;
  float* xr = x.row_as<float>(r);
  const int i0 = neox ? i : 2 * i;
  const int i1 = neox ? i + half : 2 * i + 1;
  const float x0 = xr[i0], x1 = xr[i1];
  xr[i0] = x0 * c - x1 * s;
  xr[i1] = x0 * s + x1 * c;
}

// ---- gated activations ------------------------------------------------------------------------------------
// The elementwise kernels below run on a grid of (column blocks, rows): rows blockIdx.y, + gridDim.y, ...
// (TANDEM_ROWS), columns from blockIdx.x * blockDim.x in steps of gridDim.x * blockDim.x (row_grid, launch side). One block per row walked a
// 262144-logit row alone (gemma4's softcap: 266 us a token on an H100, tenth session's profile).
#define TANDEM_ROWS(r, rows) for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)
#define TANDEM_ROW_COLUMNS(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

template <GluKind K>
__global__ void glu_kernel(RowView gate, RowView up, RowView out) {
  TANDEM_ROWS(r, gate.n_rows()) {
    const float* g = gate.row_as<const float>(r);
    const float* u = up.row_as<const float>(r);
    float* o = out.row_as<float>(r);
    TANDEM_ROW_COLUMNS(i, gate.ne0) {
      const float x = g[i];
      float a;
      if constexpr (K == GluKind::Silu) {
        a = x / (1.0f + expf(-x));
      } else {
        a = gelu_tanh(x);
      }
      o[i] = a * u[i];
    }
  }
}

template <BinaryKind K>
__global__ void binary_kernel(RowView a, RowView b, bool broadcast_b, RowView out) {
  TANDEM_ROWS(r, a.n_rows()) {
    const float* pa = a.row_as<const float>(r);
    const float* pb = b.row_as<const float>(broadcast_b ? 0 : r);
    float* po = out.row_as<float>(r);
    TANDEM_ROW_COLUMNS(i, a.ne0) {
      if constexpr (K == BinaryKind::Add) {
        po[i] = pa[i] + pb[i];
      } else {
        po[i] = pa[i] * pb[i];
      }
    }
  }
}

template <UnaryKind K>
__global__ void unary_kernel(RowView x, float value, RowView out) {
  TANDEM_ROWS(r, out.n_rows()) {
    float* po = out.row_as<float>(r);
    if constexpr (K == UnaryKind::Fill) {
      TANDEM_ROW_COLUMNS(i, out.ne0) po[i] = value;
    } else {
      const float* px = x.row_as<const float>(r);
      TANDEM_ROW_COLUMNS(i, x.ne0) {
        if constexpr (K == UnaryKind::Scale) {
          po[i] = px[i] * value;
        } else {
          po[i] = value * tanhf(px[i] / value);
        }
      }
    }
  }
}

#undef TANDEM_ROW_COLUMNS
#undef TANDEM_ROWS

// ---- softmax: one block per row ---------------------------------------------------------------------------
__global__ void softmax_kernel(RowView x, RowView out) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float* px = x.row_as<const float>(r);
  float* po = out.row_as<float>(r);
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < x.ne0; i += blockDim.x) m = fmaxf(m, px[i]);
  m = block_max(m, scratch);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < x.ne0; i += blockDim.x) sum += expf(px[i] - m);
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  // x may alias out: every thread reads its own elements before writing them.
  for (int64_t i = threadIdx.x; i < x.ne0; i += blockDim.x) po[i] = expf(px[i] - m) * inv;
}

// ---- softmax of long rows (ne0 >= kLongSoftmaxMin, TANDEM_WIDE_ROWS): one 1024-thread block per row, two passes
// instead of three. Canvas self-conditioning takes softmax over 256 rows of 262144 logits a denoising step: the
// kernel above walked each 1 MB row three times with one 4-byte load in flight a thread, 256 threads a row
// (1.3 ms a step on an H100, tenth session's profile). Here pass 1 keeps each thread's running maximum and its
// sum of exponentials rescaled to it (online softmax; 16-byte loads when the rows allow), the block combines the
// pairs, and pass 2 writes exp(x - m) / sum. Sums in another order than softmax_kernel: equal within rounding.
constexpr int64_t kLongSoftmaxMin = 8192;
constexpr int kLongSoftmaxThreads = 1024;

struct MaxSum {
  float m, s;  // running maximum, sum of exp(x - m)
};
__device__ __forceinline__ MaxSum max_sum_add(MaxSum a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f;  // expf(-inf) = 0 for the first finite value
    a.m = x;
  } else {
    a.s += expf(x - a.m);  // (the caller skips -inf values: they add nothing, and -inf - -inf is NaN)
  }
  return a;
}
__device__ __forceinline__ MaxSum max_sum_merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum warp_max_sum(MaxSum a) {  // every lane gets the warp's pair
  for (int o = kWarpSize / 2; o > 0; o /= 2)
    a = max_sum_merge(a, MaxSum{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)});
  return a;
}

__global__ void __launch_bounds__(kLongSoftmaxThreads) softmax_long_kernel(RowView x, RowView out, bool vec4) {
  __shared__ MaxSum part[kLongSoftmaxThreads / kWarpSize];
  const int64_t r = blockIdx.x;
  const float* px = x.row_as<const float>(r);
  float* po = out.row_as<float>(r);
  MaxSum acc{-INFINITY, 0.0f};
  auto add = [&](float v) {
    if (v != -INFINITY) acc = max_sum_add(acc, v);
  };
  const int64_t n4 = vec4 ? x.ne0 / 4 : 0;
  const float4* px4 = reinterpret_cast<const float4*>(px);
  for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
    const float4 v = px4[i];
    add(v.x);
    add(v.y);
    add(v.z);
    add(v.w);
  }
  for (int64_t i = 4 * n4 + threadIdx.x; i < x.ne0; i += blockDim.x) add(px[i]);
  // Combine: within each warp, then the warps' pairs in warp 0; every thread reads the result.
  acc = warp_max_sum(acc);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x / kWarpSize;
    acc = warp_max_sum(lane < n_warps ? part[lane] : MaxSum{-INFINITY, 0.0f});
    if (lane == 0) part[0] = acc;
  }
  __syncthreads();
  const float m = part[0].m, inv = 1.0f / part[0].s;
  // x may alias out: every thread reads its own elements before writing them, and pass 1 ended at the barrier.
  float4* po4 = reinterpret_cast<float4*>(po);
  for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
    const float4 v = px4[i];
    po4[i] = make_float4(expf(v.x - m) * inv, expf(v.y - m) * inv, expf(v.z - m) * inv, expf(v.w - m) * inv);
  }
  for (int64_t i = 4 * n4 + threadIdx.x; i < x.ne0; i += blockDim.x) po[i] = expf(px[i] - m) * inv;
}

// ---- copies -----------------------------------------------------------------------------------------------
template <class Src, class Dst>
__global__ void convert_kernel(RowView src, RowView dst) {
  const int64_t r = blockIdx.x;
  const auto* ps = src.row_as<const typename Src::storage>(r);
  auto* pd = dst.row_as<typename Dst::storage>(r);
  for (int64_t i = threadIdx.x; i < src.ne0; i += blockDim.x) Dst::store(pd + i, Src::load(ps + i));
}

__global__ void copy_bytes_kernel(RowView src, RowView dst, size_t row_bytes) {
  const int64_t r = blockIdx.x;
  const uint8_t* ps = src.row_as<const uint8_t>(r);
  uint8_t* pd = dst.row_as<uint8_t>(r);
  for (size_t i = threadIdx.x; i < row_bytes; i += blockDim.x) pd[i] = ps[i];
}

template <class Src, class Dst>
void launch_convert(const Tensor& src, const Tensor& dst, cudaStream_t stream) {
  const RowView s = row_view(src), d = row_view(dst);
  if (s.n_rows() == 0 || s.ne0 == 0) return;
  convert_kernel<Src, Dst><<<unsigned(s.n_rows()), threads_for_row(s.ne0), 0, stream>>>(s, d);
  TANDEM_CUDA_CHECK_LAUNCH();
}

template <class Dst>
void launch_convert_from(const Tensor& src, const Tensor& dst, cudaStream_t stream) {
  switch (src.type) {
    case DType::F32:
      return launch_convert<F32Tag, Dst>(src, dst, stream);
    case DType::F16:
      return launch_convert<F16Tag, Dst>(src, dst, stream);
    case DType::BF16:
      return launch_convert<BF16Tag, Dst>(src, dst, stream);
    default:
      throw Error(std::string("CUDA copy: cannot convert from ") + dtype_name(src.type));
  }
}

// ---- kv_store: one block per (row t, kv head g) -----------------------------------------------------------
template <class Dst>
__global__ void kv_store_kernel(RowView src, const int32_t* __restrict__ slot_mapping, char* cache,
                                size_t nb1, size_t nb2, size_t nb3, int block_size) {
  const int64_t r = blockIdx.x;  // r = g + n_kv_head * t
  const int64_t t = r / src.ne1, g = r % src.ne1;
  const int32_t slot = slot_mapping[t];
  if (slot < 0) return;
  const float* ps = src.row_as<const float>(r);
  auto* pd = reinterpret_cast<typename Dst::storage*>(cache + size_t(slot % block_size) * nb2 +
                                                      size_t(slot / block_size) * nb3 + size_t(g) * nb1);
  for (int64_t i = threadIdx.x; i < src.ne0; i += blockDim.x) Dst::store(pd + i, ps[i]);
}

void store_one(const Tensor& cache, int block_size, const Tensor& src, const int32_t* slots,
               cudaStream_t stream) {
  const RowView s = row_view(src);
  if (s.n_rows() == 0) return;
  char* base = static_cast<char*>(cache.data);
  const unsigned grid = unsigned(s.n_rows());
  const int threads = threads_for_row(s.ne0);
  switch (cache.type) {
    case DType::F32:
      kv_store_kernel<F32Tag>
          <<<grid, threads, 0, stream>>>(s, slots, base, cache.nb[1], cache.nb[2], cache.nb[3], block_size);
      break;
    case DType::F16:
      kv_store_kernel<F16Tag>
          <<<grid, threads, 0, stream>>>(s, slots, base, cache.nb[1], cache.nb[2], cache.nb[3], block_size);
      break;
    case DType::BF16:
      kv_store_kernel<BF16Tag>
          <<<grid, threads, 0, stream>>>(s, slots, base, cache.nb[1], cache.nb[2], cache.nb[3], block_size);
      break;
    default:
      throw Error(std::string("CUDA kv_store: unsupported cache dtype ") + dtype_name(cache.type));
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

// ---- get_rows: one block per output column ----------------------------------------------------------------
template <class Src>
__global__ void get_rows_plain_kernel(const char* table, size_t row_stride, const int32_t* __restrict__ ids,
                                      RowView out) {
  const int64_t t = blockIdx.x;
  const auto* ps = reinterpret_cast<const typename Src::storage*>(table + size_t(ids[t]) * row_stride);
  float* po = out.row_as<float>(t);
  for (int64_t i = threadIdx.x; i < out.ne0; i += blockDim.x) po[i] = Src::load(ps + i);
}

template <DType QT>
__global__ void get_rows_quant_kernel(const char* table, size_t row_stride, const int32_t* __restrict__ ids,
                                      RowView out, int block_elems, int block_bytes) {
  const int64_t t = blockIdx.x;
  const uint8_t* row = reinterpret_cast<const uint8_t*>(table + size_t(ids[t]) * row_stride);
  float* po = out.row_as<float>(t);
  for (int64_t j8 = int64_t(threadIdx.x) * 8; j8 < out.ne0; j8 += int64_t(blockDim.x) * 8) {
    float v[8];
    dequant8<QT>(row + (j8 / block_elems) * block_bytes, int(j8 % block_elems), v);
#pragma unroll
    for (int k = 0; k < 8; ++k) po[j8 + k] = v[k];
  }
}

// ---- embed_rows: get_rows * scale + an added row, one block per output column -----------------------------
// The product and the sum are __fmul_rn / __fadd_rn: never contracted into an FMA, so the result is the CPU
// op's f32 product then f32 sum, bit for bit.
__device__ __forceinline__ float embed_combine(float v, bool has_token, float scale, const float* added,
                                               int64_t i) {
  if (!has_token) v = 0.0f;
  if (has_token && scale != 1.0f) v = __fmul_rn(v, scale);
  if (added) v = __fadd_rn(v, added[i]);
  return v;
}

template <class Src>
__global__ void embed_rows_plain_kernel(const char* table, size_t row_stride, const int32_t* __restrict__ ids,
                                        float scale, RowView added, const int32_t* __restrict__ added_ids,
                                        RowView out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const int32_t aid = added_ids ? added_ids[t] : -1;
  const auto* ps =
      reinterpret_cast<const typename Src::storage*>(table + size_t(id >= 0 ? id : 0) * row_stride);
  const float* pa = aid >= 0 ? added.row_as<const float>(aid) : nullptr;
  float* po = out.row_as<float>(t);
  for (int64_t i = threadIdx.x; i < out.ne0; i += blockDim.x)
    po[i] = embed_combine(id >= 0 ? Src::load(ps + i) : 0.0f, id >= 0, scale, pa, i);
}

template <DType QT>
__global__ void embed_rows_quant_kernel(const char* table, size_t row_stride, const int32_t* __restrict__ ids,
                                        float scale, RowView added, const int32_t* __restrict__ added_ids,
                                        RowView out, int block_elems, int block_bytes) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const int32_t aid = added_ids ? added_ids[t] : -1;
  const uint8_t* row = reinterpret_cast<const uint8_t*>(table + size_t(id >= 0 ? id : 0) * row_stride);
  const float* pa = aid >= 0 ? added.row_as<const float>(aid) : nullptr;
  float* po = out.row_as<float>(t);
  for (int64_t j8 = int64_t(threadIdx.x) * 8; j8 < out.ne0; j8 += int64_t(blockDim.x) * 8) {
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (id >= 0) dequant8<QT>(row + (j8 / block_elems) * block_bytes, int(j8 % block_elems), v);
#pragma unroll
    for (int k = 0; k < 8; ++k) po[j8 + k] = embed_combine(v[k], id >= 0, scale, pa, j8 + k);
  }
}

}  // namespace

void set_wide_rows(std::optional<bool> on) {
  g_wide_rows.set(on);
}

void launch_rms_norm(const Tensor& x, const float* weight, float eps, const Tensor& out,
                     cudaStream_t stream) {
  const RowView xv = row_view(x), ov = row_view(out);
  const int64_t rows = xv.n_rows();
  if (rows == 0) return;
  constexpr int kWarps = 8;
  if (xv.ne0 >= kBlockNormMin) {
    // Several blocks a row only when out does not alias x (a block would overwrite values another still sums).
    const bool aliased = x.data == out.data;
    const unsigned cols = g_wide_rows.on() && !aliased && rows <= kWideNormMaxRows
                              ? unsigned((xv.ne0 + 4 * kBlockNormThreads - 1) / (4 * kBlockNormThreads))
                              : 1u;
    launch_pdl(rms_norm_block_kernel, dim3(cols, unsigned(std::min<int64_t>(rows, 65535))), dim3(kBlockNormThreads), 0,
               stream, xv, weight, eps, ov);
    return;
  }
  launch_pdl(rms_norm_kernel, dim3(unsigned((rows + kWarps - 1) / kWarps)), dim3(kWarps * kWarpSize), 0, stream,
             xv, weight, eps, ov);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_rope(const Tensor& x, const int32_t* positions, const RopeParams& p, const float* freq_factors,
                 cudaStream_t stream) {
  const RowView xv = row_view(x);
  const int64_t total = xv.n_rows() * (p.n_rot / 2);
  if (total == 0) return;
  const float theta_scale = powf(p.freq_base, -2.0f / float(p.n_rot));
  constexpr int kThreads = 256;
  rope_kernel<<<unsigned((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      xv, x.ne[1], positions, p.n_rot, p.mode == RopeMode::Neox, theta_scale, p.freq_scale, p.attn_factor,
      freq_factors, total);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_glu(GluKind kind, const Tensor& gate, const Tensor& up, const Tensor& out, cudaStream_t stream) {
  const RowView g = row_view(gate), u = row_view(up), o = row_view(out);
  if (g.n_rows() == 0 || g.ne0 == 0) return;
  const int threads = threads_for_row(g.ne0);
  const dim3 grid = row_grid(g.ne0, g.n_rows(), threads);
  if (kind == GluKind::Silu) {
    glu_kernel<GluKind::Silu><<<grid, threads, 0, stream>>>(g, u, o);
  } else {
    glu_kernel<GluKind::Gelu><<<grid, threads, 0, stream>>>(g, u, o);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_binary(BinaryKind kind, const Tensor& a, const Tensor& b, const Tensor& out,
                   cudaStream_t stream) {
  const RowView av = row_view(a), bv = row_view(b), ov = row_view(out);
  if (av.n_rows() == 0 || av.ne0 == 0) return;
  const bool broadcast = bv.n_rows() == 1 && av.n_rows() > 1;
  const int threads = threads_for_row(av.ne0);
  const dim3 grid = row_grid(av.ne0, av.n_rows(), threads);
  if (kind == BinaryKind::Add) {
    binary_kernel<BinaryKind::Add><<<grid, threads, 0, stream>>>(av, bv, broadcast, ov);
  } else {
    binary_kernel<BinaryKind::Mul><<<grid, threads, 0, stream>>>(av, bv, broadcast, ov);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_unary(UnaryKind kind, const Tensor& x, float value, const Tensor& out, cudaStream_t stream) {
  const RowView xv = row_view(x), ov = row_view(out);
  if (ov.n_rows() == 0 || ov.ne0 == 0) return;
  const int threads = threads_for_row(ov.ne0);
  const dim3 grid = row_grid(ov.ne0, ov.n_rows(), threads);
  switch (kind) {
    case UnaryKind::Scale:
      unary_kernel<UnaryKind::Scale><<<grid, threads, 0, stream>>>(xv, value, ov);
      break;
    case UnaryKind::Softcap:
      unary_kernel<UnaryKind::Softcap><<<grid, threads, 0, stream>>>(xv, value, ov);
      break;
    case UnaryKind::Fill:
      unary_kernel<UnaryKind::Fill><<<grid, threads, 0, stream>>>(ov, value, ov);
      break;
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_softmax_rows(const Tensor& x, const Tensor& out, cudaStream_t stream) {
  const RowView xv = row_view(x), ov = row_view(out);
  if (xv.n_rows() == 0 || xv.ne0 == 0) return;
  if (g_wide_rows.on() && xv.ne0 >= kLongSoftmaxMin) {
    // 16-byte loads and stores when every row of both starts 16-byte aligned (row strides included).
    auto rows16 = [](const Tensor& t) {
      return aligned16(t.data) && t.nb[1] % 16 == 0 && t.nb[2] % 16 == 0 &&
             t.nb[3] % 16 == 0;
    };
    const bool vec4 = xv.ne0 % 4 == 0 && rows16(x) && rows16(out);
    softmax_long_kernel<<<unsigned(xv.n_rows()), kLongSoftmaxThreads, 0, stream>>>(xv, ov, vec4);
  } else {
    softmax_kernel<<<unsigned(xv.n_rows()), threads_for_row(xv.ne0), 0, stream>>>(xv, ov);
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_copy(const Tensor& src, const Tensor& dst, cudaStream_t stream) {
  if (src.type == dst.type && src.type != DType::F32 && src.type != DType::F16 && src.type != DType::BF16) {
    const RowView s = row_view(src), d = row_view(dst);
    if (s.n_rows() == 0) return;
    const size_t bytes = src.row_bytes();
    copy_bytes_kernel<<<unsigned(s.n_rows()), int(std::min<size_t>(256, (bytes + 31) / 32 * 32)), 0,
                        stream>>>(s, d, bytes);
    TANDEM_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (dst.type) {
    case DType::F32:
      return launch_convert_from<F32Tag>(src, dst, stream);
    case DType::F16:
      return launch_convert_from<F16Tag>(src, dst, stream);
    case DType::BF16:
      return launch_convert_from<BF16Tag>(src, dst, stream);
    default:
      throw Error(std::string("CUDA copy: cannot convert to ") + dtype_name(dst.type));
  }
}

void launch_kv_store(const KvLayerView& kv, const Tensor& k, const Tensor& v, const int32_t* slot_mapping,
                     cudaStream_t stream) {
  store_one(kv.k, kv.block_size, k, slot_mapping, stream);
  store_one(kv.v, kv.block_size, v, slot_mapping, stream);
}

void launch_get_rows(const Tensor& table, const int32_t* ids, const Tensor& out, cudaStream_t stream) {
  const RowView o = row_view(out);
  const int64_t T = o.n_rows();
  if (T == 0 || o.ne0 == 0) return;
  const char* base = static_cast<const char*>(table.data);
  const size_t stride = table.nb[1];
  const unsigned grid = unsigned(T);
  const int threads = threads_for_row(o.ne0);
  const int qthreads = threads_for_row((o.ne0 + 7) / 8);
  switch (table.type) {
    case DType::F32:
      get_rows_plain_kernel<F32Tag><<<grid, threads, 0, stream>>>(base, stride, ids, o);
      break;
    case DType::F16:
      get_rows_plain_kernel<F16Tag><<<grid, threads, 0, stream>>>(base, stride, ids, o);
      break;
    case DType::BF16:
      get_rows_plain_kernel<BF16Tag><<<grid, threads, 0, stream>>>(base, stride, ids, o);
      break;
    case DType::Q8_0:
      get_rows_quant_kernel<DType::Q8_0><<<grid, qthreads, 0, stream>>>(base, stride, ids, o, 32, 34);
      break;
    case DType::Q4_0:
      get_rows_quant_kernel<DType::Q4_0><<<grid, qthreads, 0, stream>>>(base, stride, ids, o, 32, 18);
      break;
    case DType::Q4_K:
      get_rows_quant_kernel<DType::Q4_K><<<grid, qthreads, 0, stream>>>(base, stride, ids, o, 256, 144);
      break;
    case DType::Q5_K:
      get_rows_quant_kernel<DType::Q5_K><<<grid, qthreads, 0, stream>>>(base, stride, ids, o, 256, 176);
      break;
    case DType::Q6_K:
      get_rows_quant_kernel<DType::Q6_K><<<grid, qthreads, 0, stream>>>(base, stride, ids, o, 256, 210);
      break;
    default:
      throw Error(std::string("CUDA get_rows: unsupported table dtype ") + dtype_name(table.type));
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

void launch_embed_rows(const Tensor& table, const int32_t* ids, float scale, const Tensor* added,
                       const int32_t* added_ids, const Tensor& out, cudaStream_t stream) {
  const RowView o = row_view(out);
  const int64_t T = o.n_rows();
  if (T == 0 || o.ne0 == 0) return;
  const RowView a = added ? row_view(*added) : RowView{};
  const int32_t* aids = added ? added_ids : nullptr;
  const char* base = static_cast<const char*>(table.data);
  const size_t stride = table.nb[1];
  const unsigned grid = unsigned(T);
  const int threads = threads_for_row(o.ne0);
  const int qthreads = threads_for_row((o.ne0 + 7) / 8);
  switch (table.type) {
    case DType::F32:
      embed_rows_plain_kernel<F32Tag><<<grid, threads, 0, stream>>>(base, stride, ids, scale, a, aids, o);
      break;
    case DType::F16:
      embed_rows_plain_kernel<F16Tag><<<grid, threads, 0, stream>>>(base, stride, ids, scale, a, aids, o);
      break;
    case DType::BF16:
      embed_rows_plain_kernel<BF16Tag><<<grid, threads, 0, stream>>>(base, stride, ids, scale, a, aids, o);
      break;
    case DType::Q8_0:
      embed_rows_quant_kernel<DType::Q8_0>
          <<<grid, qthreads, 0, stream>>>(base, stride, ids, scale, a, aids, o, 32, 34);
      break;
    case DType::Q4_0:
      embed_rows_quant_kernel<DType::Q4_0>
          <<<grid, qthreads, 0, stream>>>(base, stride, ids, scale, a, aids, o, 32, 18);
      break;
    case DType::Q4_K:
      embed_rows_quant_kernel<DType::Q4_K>
          <<<grid, qthreads, 0, stream>>>(base, stride, ids, scale, a, aids, o, 256, 144);
      break;
    case DType::Q5_K:
      embed_rows_quant_kernel<DType::Q5_K>
          <<<grid, qthreads, 0, stream>>>(base, stride, ids, scale, a, aids, o, 256, 176);
      break;
    case DType::Q6_K:
      embed_rows_quant_kernel<DType::Q6_K>
          <<<grid, qthreads, 0, stream>>>(base, stride, ids, scale, a, aids, o, 256, 210);
      break;
    default:
      throw Error(std::string("CUDA embed_rows: unsupported table dtype ") + dtype_name(table.type));
  }
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
