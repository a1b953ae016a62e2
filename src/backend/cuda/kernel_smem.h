// Opting a kernel into more than 48 KB of dynamic shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize).
// The attribute belongs to the kernel's instance in one device's context: set once per process, it holds only on
// the device that was current then, and a launch of the same kernel on a second GPU of a split model fails with
// "invalid argument". allow_dynamic_smem sets it once per (device, kernel, size), on the current device (the
// caller's DeviceGuard), and is cheap to call before every launch.
#pragma once

namespace tandem::cuda {

void allow_dynamic_smem(const void* kernel, int bytes);

template <class... Args>
void allow_dynamic_smem(void (*kernel)(Args...), int bytes) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace tandem::cuda
