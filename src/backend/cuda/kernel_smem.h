// A kernel's launch resources on the current device: opting it into more than 48 KB of dynamic shared memory
// (allow_dynamic_smem), and how many of its blocks the whole device holds at once (resident_blocks).
//
// Opting a kernel into more than 48 KB of dynamic shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize).
// The attribute belongs to the kernel's instance in one device's context: set once per process, it holds only on
// the device that was current then, and a launch of the same kernel on a second GPU of a split model fails with
// "invalid argument". allow_dynamic_smem sets it once per (device, kernel, size), on the current device (the
// caller's DeviceGuard), and is cheap to call before every launch.
#pragma once

#include <cstddef>

namespace tandem::cuda {

void allow_dynamic_smem(const void* kernel, int bytes);

template <class... Args>
void allow_dynamic_smem(void (*kernel)(Args...), int bytes) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// Blocks of `threads` threads and `smem` bytes of dynamic shared memory that the current device runs at once (its
// SMs x the occupancy calculator's blocks per SM): a wave. Cached per (device, kernel, threads, smem).
int resident_blocks(const void* kernel, int threads, std::size_t smem);

template <class... Args>
int resident_blocks(void (*kernel)(Args...), int threads, std::size_t smem) {
  return resident_blocks(reinterpret_cast<const void*>(kernel), threads, smem);
}

}  // namespace tandem::cuda
