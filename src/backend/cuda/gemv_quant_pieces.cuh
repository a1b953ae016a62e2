// The "pieces" of the direct quantized decode products: how a lane loads one piece of a Q8_0 / Q4_K / Q5_K row
// with 16-byte loads straight into registers, decodes it to integer words, and takes its dot products with 8-bit
// activation columns. Used by gemv_quant_direct.cu (the fused decode products) and gemv_id.cu (the routed MoE
// products); the byte picking itself is quant_pieces.h (host and device code, tested on the CPU).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/quant_pieces.h"
#include "core/dtype.h"

namespace tandem::cuda {

// What one lane decodes per step ("piece") and its loads. Q4_K / Q5_K: a 64-value sub-block pair of a
// super-block (16-byte header: d, dmin, the 12 scale bytes; 32 bytes of nibbles; Q5_K: the super-block's 32
// bytes of fifth bits). Q8_0: one 34-byte block, read as the three aligned 16-byte chunks that hold it (a row
// of K % 256 == 0 values is a multiple of 16 bytes, so the chunks never pass the row's end), the block's
// bytes shifted out of them in registers (quant_pieces.h: q8_take, k4_scales_pair).
template <DType QT>
struct Piece {
  static constexpr int kValues = QT == DType::Q8_0 ? 32 : 64;
  static constexpr int kLoads = QT == DType::Q5_K ? 5 : 3;
  uint4 v[kLoads];
};

template <DType QT>
__device__ __forceinline__ void load_piece(const uint8_t* row, int64_t p, Piece<QT>& l) {
  if constexpr (QT == DType::Q8_0) {
    const uint4* c = reinterpret_cast<const uint4*>(row + q8_window(uint32_t(p)));  // quant_pieces.h
#pragma unroll
    for (int k = 0; k < 3; ++k) l.v[k] = __ldcs(c + k);
  } else {
    constexpr int kBytes = QT == DType::Q4_K ? 144 : 176;
    constexpr int kQs = QT == DType::Q4_K ? 16 : 48;
    const uint8_t* b = row + (p / 4) * kBytes;
    l.v[0] = __ldcs(reinterpret_cast<const uint4*>(b));
    const uint4* q = reinterpret_cast<const uint4*>(b + kQs + 32 * (p % 4));
    l.v[1] = __ldcs(q);
    l.v[2] = __ldcs(q + 1);
    if constexpr (QT == DType::Q5_K) {
      const uint4* h = reinterpret_cast<const uint4*>(b + 16);
      l.v[3] = __ldcs(h);
      l.v[4] = __ldcs(h + 1);
    }
  }
}

// 32 integer products of 4 packed weights with 4 packed activations, 8 words each, in a fixed order.
__device__ __forceinline__ int dot32(const int (&w)[8], const int4& x0, const int4& x1, int& hi) {
  hi = dot4(w[7], x1.w, dot4(w[6], x1.z, dot4(w[5], x1.y, dot4(w[4], x1.x, 0))));
  return dot4(w[3], x0.w, dot4(w[2], x0.z, dot4(w[1], x0.y, dot4(w[0], x0.x, 0))));
}

// Piece p of the R rows of a warp, decoded to integer words in registers, with the float factors of its 32-value
// groups: Q8_0 one group (a = d, bias 0), Q4_K / Q5_K two (a = d * sc, bias = -dmin * m).
template <DType QT>
struct Decoded {
  static constexpr int kGroups = QT == DType::Q8_0 ? 1 : 2;
  int w[kGroups][8];
  float a[kGroups], bias[kGroups];
};

template <DType QT>
__device__ __forceinline__ void decode_piece(const Piece<QT>& l, int64_t p, Decoded<QT>& o) {
  if constexpr (QT == DType::Q8_0) {
    const uint32_t w12[12] = {l.v[0].x, l.v[0].y, l.v[0].z, l.v[0].w, l.v[1].x, l.v[1].y,
                              l.v[1].z, l.v[1].w, l.v[2].x, l.v[2].y, l.v[2].z, l.v[2].w};
    uint16_t d_bits;
    uint32_t qw[8];
    q8_take(w12, q8_offset(uint32_t(p)), d_bits, qw);  // quant_pieces.h
    o.a[0] = fp16_bits_to_float(d_bits);
    o.bias[0] = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) o.w[0][k] = int(qw[k]);
  } else {
    const int c = int(p % 4), s0 = 2 * c, s1 = 2 * c + 1;
    const float d = fp16_bits_to_float(uint16_t(l.v[0].x & 0xffffu));
    const float dmin = fp16_bits_to_float(uint16_t(l.v[0].x >> 16));
    unsigned sc0, m0, sc1, m1;  // sub-blocks s0 and s1, in registers (quant_pieces.h)
    k4_scales_pair(l.v[0].y, l.v[0].z, l.v[0].w, unsigned(c), sc0, m0, sc1, m1);
    const uint32_t q[8] = {l.v[1].x, l.v[1].y, l.v[1].z, l.v[1].w, l.v[2].x, l.v[2].y, l.v[2].z, l.v[2].w};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      uint32_t lo = q[k] & 0x0F0F0F0Fu, hi = (q[k] >> 4) & 0x0F0F0F0Fu;
      if constexpr (QT == DType::Q5_K) {
        const uint32_t h[8] = {l.v[3].x, l.v[3].y, l.v[3].z, l.v[3].w,
                               l.v[4].x, l.v[4].y, l.v[4].z, l.v[4].w};
        lo |= ((h[k] >> s0) & 0x01010101u) << 4;
        hi |= ((h[k] >> s1) & 0x01010101u) << 4;
      }
      o.w[0][k] = int(lo);
      o.w[1][k] = int(hi);
    }
    o.a[0] = d * float(sc0);
    o.bias[0] = -dmin * float(m0);
    o.a[1] = d * float(sc1);
    o.bias[1] = -dmin * float(m1);
  }
}

// One Q8_0 block's term added to a (row, column) sum: acc + d_x (a lo + a hi), lo and hi the exact integer dot
// products of values 0..15 and 16..31, a the weights' scale. Every kernel whose sums must agree bit for bit (the
// direct products, the routed ones, the tensor-core products of gemv_quant_mma.cu) adds its terms through this
// function, with the roundings spelled out so that no kernel's contraction of the expression can differ.
__device__ __forceinline__ float q8_group_term(float acc, float dx, float a, int lo, int hi) {
  return __fmaf_rn(dx, __fmaf_rn(a, float(lo), __fmul_rn(a, float(hi))), acc);
}

// Adds piece p of the warp's R rows times the NC quantized activation columns to acc, with the staged kernel's
// arithmetic per 32 values: d_x * (a * lo + a * hi) + bias * (d_x sum q_x) (Q8_0: no bias term, as before).
// The activations of a column are loaded once for all R rows (they are the same bytes); each (row, column)
// sum still takes its pieces in the same order, so the results do not depend on NC.
template <DType QT, int NC, int R>
__device__ __forceinline__ void piece_dot(const Decoded<QT> (&dw)[R], int64_t p, int64_t K, int64_t n_sub,
                                          const int8_t* xq, const float2* xds, float (&acc)[R][NC]) {
  constexpr int G = Decoded<QT>::kGroups;
#pragma unroll
  for (int col = 0; col < NC; ++col) {
    const int8_t* xv = xq + col * K + 32 * G * p;
    int4 x[G][2];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      x[g][0] = load_int4_global(xv + 32 * g);
      x[g][1] = load_int4_global(xv + 32 * g + 16);
    }
    float2 ds[G];
    if constexpr (G == 1) {
      ds[0] = xds[col * n_sub + p];
    } else {
      const float4 d4 = *reinterpret_cast<const float4*>(xds + col * n_sub + 2 * p);  // sub-blocks 2p, 2p+1
      ds[0] = make_float2(d4.x, d4.y);
      ds[1] = make_float2(d4.z, d4.w);
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int g = 0; g < G; ++g) {
        int hi;
        const int lo = dot32(dw[r].w[g], x[g][0], x[g][1], hi);
        const float a = dw[r].a[g];
        if constexpr (QT == DType::Q8_0)
          acc[r][col] = q8_group_term(acc[r][col], ds[g].x, a, lo, hi);
        else
          acc[r][col] += ds[g].x * (a * float(lo) + a * float(hi)) + dw[r].bias[g] * ds[g].y;
      }
  }
}

// A lane's walk over its pieces of the R rows wr (pieces lane, lane + 32, ..., U per row in flight): the loads of
// a round, then after_first_loads() once (the fused decode products wait there for the previous kernel, whose
// output the activations are: weights may load before it, activations not), then decode and dot products into
// acc. after_first_loads() runs also when the lane has no piece.
template <DType QT, int NC, int R, int U, class AfterFirstLoads>
__device__ __forceinline__ void accumulate_pieces(const uint8_t* const (&wr)[R], int lane, int64_t n_pieces,
                                                  int64_t K, int64_t n_sub, const int8_t* xq, const float2* xds,
                                                  float (&acc)[R][NC], AfterFirstLoads after_first_loads) {
  bool waited = false;
  for (int64_t p0 = lane; p0 < n_pieces; p0 += U * kWarpSize) {
    Piece<QT> ld[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t p = p0 + u * kWarpSize;
      if (p < n_pieces)
#pragma unroll
        for (int r = 0; r < R; ++r) load_piece<QT>(wr[r], p, ld[u][r]);
    }
    if (!waited) {
      after_first_loads();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t p = p0 + u * kWarpSize;
      if (p < n_pieces) {
        Decoded<QT> dw[R];
#pragma unroll
        for (int r = 0; r < R; ++r) decode_piece<QT>(ld[u][r], p, dw[r]);
        piece_dot<QT, NC>(dw, p, K, n_sub, xq, xds, acc);
      }
    }
  }
  if (!waited) after_first_loads();
}

}  // namespace tandem::cuda
