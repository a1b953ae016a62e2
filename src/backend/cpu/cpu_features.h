// Runtime choice between the AVX2/FMA kernels and the portable scalar ones.
//
// The build stays baseline x86-64: the AVX2 kernels are compiled per function with
// __attribute__((target("avx2,fma,f16c"))) and only called when this machine has those extensions. The
// environment variable TANDEM_CPU_NO_AVX2=1 forces the scalar kernels (read once, at first use); tests flip
// the switch with set_simd_enabled so both paths run in one process. The same for the AVX-512 VNNI prefill
// kernel: TANDEM_CPU_NO_VNNI=1, set_vnni_enabled.
#pragma once

namespace tandem::cpu {

// True when the CPU supports AVX2, FMA and F16C.
bool cpu_has_avx2();
// True when the AVX2 kernels are in use: the CPU has them, TANDEM_CPU_NO_AVX2 is not set to a non-zero value
// and set_simd_enabled(false) is not in effect.
bool simd_enabled();
// For tests: false forces the scalar kernels; true goes back to the default (hardware and environment).
void set_simd_enabled(bool enabled);

// True when the CPU has AVX-512 F/BW/VL and VNNI (vpdpbusd) besides AVX2.
bool cpu_has_avx512_vnni();
// True when the VNNI prefill kernel is in use: simd_enabled(), the CPU has it, TANDEM_CPU_NO_VNNI is not set
// to a non-zero value and set_vnni_enabled(false) is not in effect.
bool vnni_enabled();
// For tests: false forces the AVX2 kernels where the VNNI one would run; true goes back to the default.
void set_vnni_enabled(bool enabled);

}  // namespace tandem::cpu
