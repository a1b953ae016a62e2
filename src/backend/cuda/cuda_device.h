// The CUDA device: device memory, pinned host memory, streams and events over the CUDA runtime, and CudaOps.
// Every entry point first makes this device current on the calling thread, so several CudaDevice objects (one
// per GPU) can be driven from one or many threads.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"

namespace tandem::cuda {

// Makes `index` the current device of the calling thread for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int index_ = -1;
};

class CudaStream final : public Stream {
 public:
  CudaStream(DeviceId id, cudaStream_t stream, bool owned) : id_(id), stream_(stream), owned_(owned) {}
  ~CudaStream() override;
  DeviceId device() const override { return id_; }
  void synchronize() override;
  cudaStream_t get() const { return stream_; }

 private:
  DeviceId id_;
  cudaStream_t stream_ = nullptr;
  bool owned_ = false;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device_index);
  ~CudaEvent() override;
  void record(Stream& stream) override;
  void wait(Stream& stream) override;
  void synchronize() override;
  cudaEvent_t get() const { return event_; }

 private:
  int device_index_;
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

// The cudaStream_t of a Stream that must belong to CUDA device `index` (throws Error otherwise).
cudaStream_t stream_of(Stream& s, int index);

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, const DeviceOptions& options);
  ~CudaDevice() override;

  DeviceId id() const override { return {DeviceKind::CUDA, index_}; }
  std::string name() const override { return name_; }
  size_t total_memory() const override;
  size_t free_memory() const override;
  Buffer allocate(size_t bytes) override;
  Buffer allocate_host(size_t bytes) override;
  Stream& default_stream() override { return *stream_; }
  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  void synchronize() override;
  // Large copies from pageable host memory (a memory-mapped GGUF, say) go through two pinned staging buffers:
  // the host copies chunk i + 1 into one while the GPU pulls chunk i from the other, so reading the file and
  // the transfer overlap. The call returns once src has been read (src may then be freed); the device side of
  // the copy completes in stream order.
  void copy_from_host(Stream& stream, void* dst, const void* src, size_t bytes) override;
  void copy_to_host(Stream& stream, void* dst, const void* src, size_t bytes) override;
  void copy_device_to_device(Stream& stream, void* dst, const void* src, size_t bytes) override;
  void copy_2d(Stream& stream, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
               size_t width_bytes, size_t height, CopyKind kind) override;
  void copy_to_peer(Stream& stream, void* dst, Device& dst_dev, const void* src, size_t bytes) override;
  Ops& ops() override { return *ops_; }
  // CUDA graphs, one per (key, stream); dropped when the Ops workspace is reallocated. Set TANDEM_NO_GRAPHS=1
  // to run every body directly (for comparisons).
  void run_recorded(Stream& stream, uint64_t key, const std::function<void(Stream&)>& body) override;
  void run_recorded_across(Stream& origin, uint64_t key, std::span<Device* const> devices,
                           std::span<Stream* const> joined, const std::function<void()>& body) override;
  size_t recorded_graphs() const {
    std::lock_guard<std::mutex> lock(graphs_mutex_);
    return graphs_.size();
  }
  // Replays of recorded graphs so far (tests check that a step was replayed, not run directly).
  uint64_t graph_replays() const { return graph_replays_.load(); }

  int index() const { return index_; }
  const cudaDeviceProp& properties() const { return props_; }

 private:
  void staged_copy_from_host(cudaStream_t stream, void* dst, const void* src, size_t bytes);

  int index_;
  std::string name_;
  cudaDeviceProp props_{};
  std::unique_ptr<CudaStream> stream_;
  std::unique_ptr<CudaOps> ops_;

  void drop_graphs();
  // Sessions of one model may step from several host threads: the maps are guarded (lookups and inserts
  // only; a recording itself runs outside the lock, on the caller's streams).
  mutable std::mutex graphs_mutex_;
  std::map<std::pair<uint64_t, cudaStream_t>, cudaGraphExec_t> graphs_;
  std::map<std::pair<uint64_t, cudaStream_t>, int> capture_failures_;
  uint64_t graphs_generation_ = 0;
  uint64_t across_generation_ = 0;  // graphs of run_recorded_across: the ops generations of every device
  bool graphs_enabled_ = true;
  std::atomic<uint64_t> graph_replays_{0};
  // Looks up a recording; drops every recording first when `generation` moved (the workspace was
  // reallocated). Returns null when there is none.
  cudaGraphExec_t find_graph(uint64_t key, cudaStream_t s, uint64_t generation, uint64_t& tracked);

  // Pinned staging for copies from pageable memory (allocated on first use).
  static constexpr size_t kStagingChunk = size_t(32) << 20;
  std::mutex staging_mutex_;
  void* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
};

}  // namespace tandem::cuda
