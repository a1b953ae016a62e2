// CPU matmul: y[o, t] = sum_i W[i, o] x[i, t] for every weight dtype.
//
// Plan of one call: (1) for quantized weights, quantize every row of x once into the workspace (8-bit blocks,
// see matmul_kernels.h); (2) split the output into tiles of R weight rows x C activation rows, one task each.
// Inside a tile, activation rows go 4 at a time and each weight row of the tile is read against those 4, so a
// weight row is decoded once per 4 activation rows and the tile's weights (about 32 KiB) stay in cache across
// the groups. With T <= C the weights are streamed from memory exactly once.
// Q8_0 weights with 8 or more activation rows on a CPU with AVX-512 VNNI take the packed path: activation
// rows packed 16 side by side, one weight row against 16 rows per kernel call (matmul_kernels_vnni.cpp), with
// the same bits as the AVX2 kernel the other calls use.
#include <algorithm>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_ops_impl.h"
#include "backend/cpu/matmul_kernels.h"

namespace tandem::cpu {

ActFormat act_format(DType weight_type) {
  switch (weight_type) {
    case DType::Q8_0:
    case DType::Q4_0:
      return ActFormat::Q8x32;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return ActFormat::Q8x256;
    default:
      return ActFormat::F32;
  }
}

size_t act_row_bytes(ActFormat f, int64_t n) {
  switch (f) {
    case ActFormat::Q8x32:
      return size_t(n / 32) * sizeof(ActQ8Block32);
    case ActFormat::Q8x256:
      return size_t(n / 256) * sizeof(ActQ8Block256);
    case ActFormat::F32:
      break;
  }
  return size_t(n) * sizeof(float);
}

namespace {

// The output in tiles of `rows` weight rows x `cols` column units (activation rows, or packed groups).
struct Tiling {
  int64_t rows, n_row_tiles, n_col_tiles;
};
Tiling tiling(size_t w_row_bytes, int64_t n_out, int64_t n_col_tiles, int n_threads) {
  int64_t R = std::max<int64_t>(1, int64_t(32768 / std::max<size_t>(w_row_bytes, 1)));
  const int64_t min_tasks = int64_t(n_threads) * 4;
  R = std::min(R, std::max<int64_t>(1, (n_out * n_col_tiles + min_tasks - 1) / min_tasks));
  return {R, (n_out + R - 1) / R, n_col_tiles};
}

// Q8_0 x T >= 8 activation rows (already quantized, act_bytes apart) on AVX-512 VNNI.
void matmul_q8_0_packed(ThreadPool& pool, Workspace& ws, const Tensor& W, const uint8_t* act,
                        size_t act_bytes, int64_t T, const Tensor& y) {
  constexpr int64_t P = kPackedRows;
  const int64_t n_in = W.ne[0], n_out = W.ne[1], n_blocks = n_in / 32, n_groups = (T + P - 1) / P;
  auto* packed =
      reinterpret_cast<ActQ8Block32x16*>(ws.packed(size_t(n_groups * n_blocks) * sizeof(ActQ8Block32x16)));
  pool.parallel_for(n_groups, [&](int64_t g, int) {
    const ActQ8Block32* rows[P];
    const int n_rows = int(std::min<int64_t>(P, T - P * g));
    for (int j = 0; j < n_rows; ++j)
      rows[j] = reinterpret_cast<const ActQ8Block32*>(act + size_t(P * g + j) * act_bytes);
    vnni::pack_q8x32x16(rows, n_rows, n_blocks, packed + g * n_blocks);
  });
  const int64_t G = 64 / P;  // groups per tile: 64 activation rows, as the other path's C
  const Tiling t = tiling(W.row_bytes(), n_out, (n_groups + G - 1) / G, pool.n_threads());
  pool.parallel_for(t.n_row_tiles * t.n_col_tiles, [&](int64_t task, int) {
    const int64_t o0 = (task % t.n_row_tiles) * t.rows, o1 = std::min(n_out, o0 + t.rows);
    const int64_t g0 = (task / t.n_row_tiles) * G, g1 = std::min(n_groups, g0 + G);
    float res[P];
    for (int64_t g = g0; g < g1; ++g) {
      const int n_rows = int(std::min<int64_t>(P, T - P * g));
      for (int64_t o = o0; o < o1; ++o) {
        vnni::dot_q8_0_x16(n_in, static_cast<const char*>(W.data) + size_t(o) * W.nb[1],
                           packed + g * n_blocks, res);
        for (int j = 0; j < n_rows; ++j) reinterpret_cast<float*>(y.row(P * g + j))[o] = res[j];
      }
    }
  });
}

}  // namespace

MatmulKernels matmul_kernels(DType weight_type) {
  const bool v = simd_enabled();
  const QuantizeActFn q32 = v ? avx2::quantize_q8x32 : scalar::quantize_q8x32;
  const QuantizeActFn q256 = v ? avx2::quantize_q8x256 : scalar::quantize_q8x256;
  switch (weight_type) {
    case DType::F32:
      return {ActFormat::F32, nullptr, v ? avx2::dot_f32 : scalar::dot_f32};
    case DType::F16:
      return {ActFormat::F32, nullptr, v ? avx2::dot_f16 : scalar::dot_f16};
    case DType::BF16:
      return {ActFormat::F32, nullptr, v ? avx2::dot_bf16 : scalar::dot_bf16};
    case DType::Q8_0:
      return {ActFormat::Q8x32, q32, v ? avx2::dot_q8_0 : scalar::dot_q8_0};
    case DType::Q4_0:
      return {ActFormat::Q8x32, q32, v ? avx2::dot_q4_0 : scalar::dot_q4_0};
    case DType::Q4_K:
      return {ActFormat::Q8x256, q256, v ? avx2::dot_q4_k : scalar::dot_q4_k};
    case DType::Q5_K:
      return {ActFormat::Q8x256, q256, v ? avx2::dot_q5_k : scalar::dot_q5_k};
    case DType::Q6_K:
      return {ActFormat::Q8x256, q256, v ? avx2::dot_q6_k : scalar::dot_q6_k};
    default:
      throw Error(std::string("matmul: weights of type ") + dtype_name(weight_type) +
                  " are not supported (f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k are)");
  }
}

void matmul(ThreadPool& pool, Workspace& ws, const Tensor& W, const Tensor& x, const Tensor& y) {
  const char* op = "matmul";
  check_on_cpu(op, "W", W);
  const MatmulKernels k = matmul_kernels(W.type);
  TANDEM_CPU_CHECK(W.ne[2] == 1 && W.ne[3] == 1,
                   "matmul: W must be a matrix {in, out}, got " + W.shape_string());
  TANDEM_CPU_CHECK(W.nb[0] == dtype_block_bytes(W.type), "matmul: W must have contiguous rows");
  const int64_t n_in = W.ne[0], n_out = W.ne[1];
  TANDEM_CPU_CHECK(n_in % dtype_block_size(W.type) == 0, "matmul: W's row length " + std::to_string(n_in) +
                                                             " is not a multiple of the " +
                                                             dtype_name(W.type) + " block size");
  check_f32(op, "x", x);
  check_f32(op, "y", y);
  TANDEM_CPU_CHECK(x.ne[0] == n_in && x.ne[2] == 1 && x.ne[3] == 1,
                   "matmul: x must be {" + std::to_string(n_in) + ", T} to match W " + W.shape_string() +
                       ", got " + x.shape_string());
  const int64_t T = x.ne[1];
  check_dims(op, "y", y, n_out, T);
  if (T == 0 || n_out == 0) return;

  // (1) activations in the kernel's format
  const size_t act_bytes = act_row_bytes(k.act, n_in);
  const uint8_t* act = nullptr;
  if (k.act != ActFormat::F32) {
    uint8_t* buf = ws.act(act_bytes * size_t(T));
    const int64_t per = items_per_task(T, pool.n_threads(), 1);
    pool.parallel_for((T + per - 1) / per, [&](int64_t task, int) {
      for (int64_t t = task * per; t < std::min(T, (task + 1) * per); ++t)
        k.quantize(reinterpret_cast<const float*>(x.row(t)), buf + size_t(t) * act_bytes, n_in);
    });
    act = buf;
  }
  if (W.type == DType::Q8_0 && T >= 8 && vnni_enabled()) {
    matmul_q8_0_packed(pool, ws, W, act, act_bytes, T, y);
    return;
  }
  auto act_row = [&](int64_t t) -> const void* {
    return act ? static_cast<const void*>(act + size_t(t) * act_bytes) : x.row(t);
  };

  // (2) tiles of R weight rows x C activation rows
  const int64_t C = 64;
  const Tiling tl = tiling(W.row_bytes(), n_out, (T + C - 1) / C, pool.n_threads());
  pool.parallel_for(tl.n_row_tiles * tl.n_col_tiles, [&](int64_t task, int) {
    const int64_t o0 = (task % tl.n_row_tiles) * tl.rows, o1 = std::min(n_out, o0 + tl.rows);
    const int64_t t0 = (task / tl.n_row_tiles) * C, t1 = std::min(T, t0 + C);
    const void* xs[kMaxDotRows];
    float res[kMaxDotRows];
    for (int64_t t = t0; t < t1; t += kMaxDotRows) {
      const int nx = int(std::min<int64_t>(kMaxDotRows, t1 - t));
      for (int j = 0; j < nx; ++j) xs[j] = act_row(t + j);
      for (int64_t o = o0; o < o1; ++o) {
        k.dot(n_in, static_cast<const char*>(W.data) + size_t(o) * W.nb[1], xs, nx, res);
        for (int j = 0; j < nx; ++j) reinterpret_cast<float*>(y.row(t + j))[o] = res[j];
      }
    }
  });
}

}  // namespace tandem::cpu
