// One warp-level tensor-core product, m16n8k16 with f32 accumulators (mma.sync), and the 32-bit shared-memory
// fragment load beside it: shared by the two tensor-core grouped GEMMs of matmul_id (moe_gemm_tc.cu,
// moe_gemm_pipelined.cu).
#pragma once

#include <cstdint>

namespace tandem::cuda {

// Two adjacent 16-bit values (the lower address in the lower half), as one fragment register.
__device__ __forceinline__ uint32_t ld32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += a b for one 16 x 8 x 16 tile: a row-major {16 rows, 16 inputs}, b column-major {16 inputs, 8 columns};
// F16 picks f16 operands, bf16 otherwise. Fragment layout (lane = 4 g + t4): a[0] = a[g][2 t4 .. +1],
// a[1] = a[g + 8][2 t4 ..], a[2] = a[g][2 t4 + 8 ..], a[3] = a[g + 8][2 t4 + 8 ..]; b[0] = b[2 t4 ..][g],
// b[1] = b[2 t4 + 8 ..][g]; c[2 h + q] = c[g + 8 h][2 t4 + q].
template <bool F16>
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, const uint32_t* b) {
  if constexpr (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

}  // namespace tandem::cuda
