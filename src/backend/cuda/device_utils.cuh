// Small device-side helpers shared by the CUDA kernels: 16-bit float loads, warp and block reductions, and
// unaligned 32-bit reads from shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

constexpr int kWarpSize = 32;

__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) {
  return __uint_as_float(uint32_t(h) << 16);
}
__device__ __forceinline__ float fp16_bits_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// Round-to-nearest-even conversions to the 16-bit storage types (the CPU reference uses the same rounding).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ uint16_t float_to_fp16_bits(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

// Storage type tags: how one element of a plain (non-block) dtype is read and written.
struct F32Tag {
  using storage = float;
  static __device__ __forceinline__ float load(const float* p) { return *p; }
  static __device__ __forceinline__ void store(float* p, float v) { *p = v; }
};
struct F16Tag {
  using storage = uint16_t;
  static __device__ __forceinline__ float load(const uint16_t* p) { return fp16_bits_to_float(*p); }
  static __device__ __forceinline__ void store(uint16_t* p, float v) { *p = float_to_fp16_bits(v); }
};
struct BF16Tag {
  using storage = uint16_t;
  static __device__ __forceinline__ float load(const uint16_t* p) { return bf16_bits_to_float(*p); }
  static __device__ __forceinline__ void store(uint16_t* p, float v) { *p = float_to_bf16_bits(v); }
};

// The eight 16-bit floats of a 16-byte load, as f32.
__device__ __forceinline__ void unpack8(const uint4& v, float* out, bool f16) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (f16) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[k]));
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    } else {
      out[2 * k] = __uint_as_float(u[k] << 16);
      out[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A warp's 32 values (one per lane) quantized as one group of the 8-bit activations the quantized products read
// (launch_quantize_q8): q = round(v / d) with d = max|v| / 127, stored by each lane at *q_out, and (d, d * sum q)
// stored by lane 0 at *ds_out. Every kernel that writes those activations goes through here, so the values are
// the same bit for bit whichever kernel computes them (the products' batch invariance depends on it).
__device__ __forceinline__ void warp_quantize_q8(float v, int8_t* q_out, float2* ds_out) {
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.0f;
  const int q = amax > 0.0f ? __float2int_rn(v / d) : 0;
  *q_out = int8_t(q);
  const int sum = __reduce_add_sync(0xffffffffu, q);
  if (threadIdx.x % kWarpSize == 0) *ds_out = make_float2(d, d * float(sum));
}

// GELU with the tanh approximation, as Ops::gelu_mul defines it: one expression shared by every kernel that
// applies it (glu_kernel, the routed GeGLU products), so their values agree bit for bit.
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// The gated activation of a GLU product's epilogue: silu(g) * u (silu_mul's expression) or gelu_tanh(g) * u.
template <bool kGelu>
__device__ __forceinline__ float glu_gate(float g, float u) {
  if constexpr (kGelu) {
    return gelu_tanh(g) * u;
  } else {
    return g / (1.0f + expf(-g)) * u;
  }
}

// Sum over the whole block; every thread gets the result. scratch: >= 32 floats of shared memory. Contains
// __syncthreads, so every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int n_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int n_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// 32 bits starting at any byte address p of shared memory (reads the aligned word after it too, so the buffer
// needs 4 bytes of padding at its end).
__device__ __forceinline__ uint32_t load_u32_unaligned(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  return __funnelshift_r(w[0], w[1], unsigned(a & 3) * 8u);
}
__device__ __forceinline__ uint16_t load_u16_unaligned(const uint8_t* p) {
  return uint16_t(p[0] | (uint32_t(p[1]) << 8));
}

// 16 bytes of global memory (16-byte aligned) as one 128-bit load. A plain `int4 v = *p` whose fields are then
// used one by one is split by the compiler into four 32-bit loads (seen in the PTX of the quantized decode
// kernel: 16 loads per 64 activations instead of 4). volatile with a "memory" clobber, as pdl_wait() is: the
// load is never moved above it (activations written by the previous kernel of a PDL chain).
__device__ __forceinline__ int4 load_int4_global(const void* p) {
  int4 v;
  asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Integer dot product of 4 packed signed bytes, accumulated into c.
__device__ __forceinline__ int dot4(int a, int b, int c) {
  return __dp4a(a, b, c);
}

}  // namespace tandem::cuda
