// Device factory and cross-device copies.
#include "backend/backend.h"

#include <algorithm>

#include "backend/cpu/cpu_device.h"

namespace tandem {

std::unique_ptr<Device> create_cpu_device(int index, const DeviceOptions& options) {
  return std::make_unique<cpu::CpuDevice>(index, options);
}

std::unique_ptr<Device> create_device(DeviceId id, const DeviceOptions& options) {
  if (id.kind == DeviceKind::CPU) return create_cpu_device(id.index, options);
#if defined(TANDEM_HAVE_CUDA)
  const int n = cuda_device_count();
  check(id.index >= 0 && id.index < n,
        "device " + id.to_string() + " does not exist (" + std::to_string(n) + " CUDA devices visible)");
  return create_cuda_device(id.index, options);
#else
  throw Error("device " + id.to_string() + " is not available: this tandem was built without CUDA");
#endif
}

int device_count(DeviceKind kind) {
  if (kind == DeviceKind::CPU) return 1;
#if defined(TANDEM_HAVE_CUDA)
  return cuda_device_count();
#else
  return 0;
#endif
}

void copy_between_devices(Stream& stream, Device& dst_dev, void* dst, Device& src_dev, const void* src,
                          size_t bytes) {
  const DeviceKind dk = dst_dev.id().kind, sk = src_dev.id().kind;
  if (dk == sk) {
    src_dev.copy_to_peer(stream, dst, dst_dev, src, bytes);
  } else if (dk == DeviceKind::CPU) {
    src_dev.copy_to_host(stream, dst, src, bytes);
  } else {
    dst_dev.copy_from_host(stream, dst, src, bytes);
  }
}

int enable_peer_access(std::span<Device* const> devices) {
  std::vector<int> gpus;
  for (Device* d : devices)
    if (d->id().kind == DeviceKind::CUDA && std::find(gpus.begin(), gpus.end(), d->id().index) == gpus.end())
      gpus.push_back(d->id().index);
  if (gpus.size() < 2) return 0;
#if defined(TANDEM_HAVE_CUDA)
  return cuda_enable_peer_access(gpus);
#else
  return 0;
#endif
}

}  // namespace tandem
