#include "backend/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "core/out_of_memory.h"

namespace tandem {

std::unique_ptr<Device> create_cuda_device(int index, const DeviceOptions& options) {
  return std::make_unique<cuda::CudaDevice>(index, options);
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: report none, and clear the sticky error state
    return 0;
  }
  return n;
}

int cuda_enable_peer_access(const std::vector<int>& gpus) {
  int enabled = 0;
  for (int a : gpus)
    for (int b : gpus) {
      if (a == b) continue;
      int can = 0;
      TANDEM_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) continue;
      cuda::DeviceGuard g(a);
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // enabled before (another model in this process): not an error
      } else {
        TANDEM_CUDA_CHECK(e);
      }
      ++enabled;
    }
  return enabled;
}

namespace cuda {
namespace {

std::string mib(size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / (1024.0 * 1024.0));
  return buf;
}

// After an allocation failed on the current device: clear CUDA's error and say how much memory is free.
std::string free_of_total() {
  cudaGetLastError();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  return mib(free_b) + " free of " + mib(total_b);
}

}  // namespace

DeviceGuard::DeviceGuard(int index) : index_(index) {
  TANDEM_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index_) TANDEM_CUDA_CHECK(cudaSetDevice(index_));
}
DeviceGuard::~DeviceGuard() {
  if (previous_ != index_ && previous_ >= 0) cudaSetDevice(previous_);
}

CudaStream::~CudaStream() {
  if (owned_ && stream_) cudaStreamDestroy(stream_);
}
void CudaStream::synchronize() {
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

cudaStream_t stream_of(Stream& s, int index) {
  auto* cs = dynamic_cast<CudaStream*>(&s);
  check(cs != nullptr && s.device() == DeviceId{DeviceKind::CUDA, index},
        "a stream of " + s.device().to_string() + " was passed to an op of cuda:" + std::to_string(index));
  return cs->get();
}

CudaEvent::CudaEvent(int device_index) : device_index_(device_index) {
  DeviceGuard g(device_index_);
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}
CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(event_);
}
void CudaEvent::record(Stream& stream) {
  auto* cs = dynamic_cast<CudaStream*>(&stream);
  check(cs != nullptr, "CUDA event: record() needs a CUDA stream");
  TANDEM_CUDA_CHECK(cudaEventRecord(event_, cs->get()));
  recorded_ = true;
}
void CudaEvent::wait(Stream& stream) {
  auto* cs = dynamic_cast<CudaStream*>(&stream);
  check(cs != nullptr, "CUDA event: wait() needs a CUDA stream");
  if (recorded_) TANDEM_CUDA_CHECK(cudaStreamWaitEvent(cs->get(), event_, 0));
}
void CudaEvent::synchronize() {
  if (recorded_) TANDEM_CUDA_CHECK(cudaEventSynchronize(event_));
}

CudaDevice::CudaDevice(int index, const DeviceOptions&) : index_(index) {
  const int n = cuda_device_count();
  check(index >= 0 && index < n, "device cuda:" + std::to_string(index) + " does not exist (" +
                                     std::to_string(n) + " CUDA devices visible)");
  DeviceGuard g(index_);
  TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&props_, index_));
  name_ = "cuda:" + std::to_string(index_) + " " + props_.name;
  cudaStream_t s = nullptr;
  const cudaError_t stream_err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (stream_err == cudaErrorMemoryAllocation)  // a GPU full before we start: say so, with the numbers
    throw OutOfMemory(name_ + ": out of device memory setting up the device (" + free_of_total() +
                      "): other processes hold this GPU's memory; free it or use another device");
  TANDEM_CUDA_CHECK(stream_err);
  stream_ = std::make_unique<CudaStream>(id(), s, true);
  ops_ = std::make_unique<CudaOps>(index_);
  const char* no_graphs = std::getenv("TANDEM_NO_GRAPHS");
  graphs_enabled_ = !(no_graphs && *no_graphs && *no_graphs != '0');
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(index_);
  cudaDeviceSynchronize();
  drop_graphs();
  ops_.reset();
  stream_.reset();
  for (int i = 0; i < 2; ++i) {
    if (staging_done_[i]) cudaEventDestroy(staging_done_[i]);
    if (staging_[i]) cudaFreeHost(staging_[i]);
  }
}

size_t CudaDevice::total_memory() const {
  DeviceGuard g(index_);
  size_t free_b = 0, total_b = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b;
}

size_t CudaDevice::free_memory() const {
  DeviceGuard g(index_);
  size_t free_b = 0, total_b = 0;
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}

Buffer CudaDevice::allocate(size_t bytes) {
  DeviceGuard g(index_);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess)
    throw OutOfMemory(name_ + ": out of device memory allocating " + mib(bytes) + " (" + free_of_total() +
                      "): use a smaller model or quantization, a shorter context, or split the model "
                      "over more GPUs");
  return Buffer(
      p, bytes, id(),
      [](void* data, void* ctx) {
        DeviceGuard guard(int(reinterpret_cast<intptr_t>(ctx)));
        cudaFree(data);
      },
      reinterpret_cast<void*>(intptr_t(index_)));
}

Buffer CudaDevice::allocate_host(size_t bytes) {
  DeviceGuard g(index_);
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(name_ + ": cannot allocate " + mib(bytes) + " of pinned host memory");
  }
  return Buffer(p, bytes, DeviceId{DeviceKind::CPU, 0}, [](void* data, void*) { cudaFreeHost(data); });
}

std::unique_ptr<Stream> CudaDevice::create_stream() {
  DeviceGuard g(index_);
  cudaStream_t s = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return std::make_unique<CudaStream>(id(), s, true);
}

std::unique_ptr<Event> CudaDevice::create_event() {
  return std::make_unique<CudaEvent>(index_);
}

void CudaDevice::synchronize() {
  DeviceGuard g(index_);
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaDevice::drop_graphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
  capture_failures_.clear();
}

cudaGraphExec_t CudaDevice::find_graph(uint64_t key, cudaStream_t s, uint64_t generation, uint64_t& tracked) {
  std::lock_guard<std::mutex> lock(graphs_mutex_);
  if (generation != tracked) {
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());  // replays in flight may still use the old graphs
    drop_graphs();
    tracked = generation;
  }
  auto it = graphs_.find(std::make_pair(key, s));
  return it == graphs_.end() ? nullptr : it->second;
}

void CudaDevice::run_recorded(Stream& stream, uint64_t key, const std::function<void(Stream&)>& body) {
  DeviceGuard g(index_);
  cudaStream_t s = stream_of(stream, index_);
  if (!graphs_enabled_) return body(stream);
  const auto id = std::make_pair(key, s);
  if (cudaGraphExec_t exec = find_graph(key, s, ops_->workspace_generation(), graphs_generation_)) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, s));
    ++graph_replays_;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(graphs_mutex_);
    if (capture_failures_[id] >= 2) return body(stream);  // this work cannot be captured: run it directly
  }
  // Relaxed: a first use of a kernel inside the body may set its attributes (cudaFuncSetAttribute).
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    body(stream);
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(s, &partial);
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = end == cudaSuccess ? cudaGraphInstantiate(&exec, graph, 0) : end;
  if (graph) cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {  // e.g. a first-use initialisation that capture does not allow: run directly
    cudaGetLastError();
    {
      std::lock_guard<std::mutex> lock(graphs_mutex_);
      ++capture_failures_[id];
    }
    return body(stream);
  }
  {
    std::lock_guard<std::mutex> lock(graphs_mutex_);
    graphs_[id] = exec;
  }
  TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, s));
}

namespace {

// A device-side barrier between `origin` and `others`: origin waits for everything enqueued on the others so
// far, then the others wait for everything on origin. Events are made per call (cheap, and a call never
// waits on an event another call re-records); destroying a recorded event is allowed before it completes.
void join_and_fork(cudaStream_t origin, int origin_device,
                   const std::vector<std::pair<cudaStream_t, int>>& others) {
  for (const auto& [st, dev] : others) {
    DeviceGuard g(dev);
    cudaEvent_t ev = nullptr;
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(cudaEventRecord(ev, st));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(origin, ev, 0));
    TANDEM_CUDA_CHECK(cudaEventDestroy(ev));
  }
  DeviceGuard g(origin_device);
  cudaEvent_t ev = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventRecord(ev, origin));
  for (const auto& [st, dev] : others) {
    DeviceGuard gd(dev);
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(st, ev, 0));
  }
  TANDEM_CUDA_CHECK(cudaEventDestroy(ev));
}

}  // namespace

void CudaDevice::run_recorded_across(Stream& origin, uint64_t key, std::span<Device* const> devices,
                                     std::span<Stream* const> joined, const std::function<void()>& body) {
  DeviceGuard g(index_);
  cudaStream_t s = stream_of(origin, index_);
  std::vector<std::pair<cudaStream_t, int>> others;
  for (Stream* st : joined) {
    const DeviceId d = st->device();
    check(d.kind == DeviceKind::CUDA,
          "run_recorded_across: a joined stream of " + d.to_string() + " is not a CUDA stream");
    others.emplace_back(stream_of(*st, d.index), d.index);
  }
  // One generation for the set of devices whose workspaces the recording points into.
  uint64_t generation = ops_->workspace_generation();
  bool all_cuda = true;
  for (Device* d : devices) {
    auto* cd = dynamic_cast<CudaDevice*>(d);
    if (!cd) {
      all_cuda = false;
      break;
    }
    generation = generation * 1000003u + cd->ops_->workspace_generation() + 1;
  }

  join_and_fork(s, index_, others);
  if (!graphs_enabled_ || !all_cuda) {
    body();
    join_and_fork(s, index_, others);
    return;
  }
  const auto id = std::make_pair(key, s);
  if (cudaGraphExec_t exec = find_graph(key, s, generation, across_generation_)) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, s));
    ++graph_replays_;
    join_and_fork(s, index_, others);
    return;
  }
  bool give_up = false;
  {
    std::lock_guard<std::mutex> lock(graphs_mutex_);
    give_up = capture_failures_[id] >= 2;
  }
  if (give_up) {
    body();
    join_and_fork(s, index_, others);
    return;
  }

  // Record: the joined streams enter the capture by waiting on an event recorded in it (fork), and leave it
  // by recording events origin waits on (join), so the whole multi-stream body is one graph on origin.
  std::vector<cudaEvent_t> events(others.size() + 1, nullptr);
  for (size_t i = 0; i < events.size(); ++i) {
    DeviceGuard gd(i == 0 ? index_ : others[i - 1].second);
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming));
  }
  auto destroy_events = [&] {
    for (cudaEvent_t ev : events)
      if (ev) cudaEventDestroy(ev);
  };
  auto join_capture = [&] {  // every joined stream back into origin (also to end a failed capture cleanly)
    for (size_t i = 0; i < others.size(); ++i) {
      DeviceGuard gd(others[i].second);
      cudaEventRecord(events[i + 1], others[i].first);
      cudaStreamWaitEvent(s, events[i + 1], 0);
    }
  };
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  cudaError_t fork = cudaEventRecord(events[0], s);
  for (size_t i = 0; i < others.size() && fork == cudaSuccess; ++i) {
    DeviceGuard gd(others[i].second);
    fork = cudaStreamWaitEvent(others[i].first, events[0], 0);
  }
  try {
    if (fork != cudaSuccess)
      throw Error(std::string("CUDA graph capture could not fork: ") + cudaGetErrorString(fork));
    body();
  } catch (...) {
    join_capture();
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(s, &partial);
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
    destroy_events();
    throw;
  }
  join_capture();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = end == cudaSuccess ? cudaGraphInstantiate(&exec, graph, 0) : end;
  if (graph) cudaGraphDestroy(graph);
  destroy_events();
  if (inst != cudaSuccess) {  // the work could not be recorded: run it directly (nothing of it ran yet)
    cudaGetLastError();
    {
      std::lock_guard<std::mutex> lock(graphs_mutex_);
      ++capture_failures_[id];
    }
    join_and_fork(s, index_, others);
    body();
    join_and_fork(s, index_, others);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(graphs_mutex_);
    graphs_[id] = exec;
  }
  TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, s));
  join_and_fork(s, index_, others);
}

void CudaDevice::staged_copy_from_host(cudaStream_t stream, void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(staging_mutex_);
  for (int i = 0; i < 2; ++i) {
    if (!staging_[i]) TANDEM_CUDA_CHECK(cudaMallocHost(&staging_[i], kStagingChunk));
    if (!staging_done_[i])
      TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_[i], cudaEventDisableTiming));
  }
  size_t done = 0;
  for (int i = 0; done < bytes; i ^= 1) {
    const size_t n = std::min(kStagingChunk, bytes - done);
    TANDEM_CUDA_CHECK(cudaEventSynchronize(staging_done_[i]));  // the GPU has pulled this buffer's last chunk
    std::memcpy(staging_[i], static_cast<const char*>(src) + done, n);
    TANDEM_CUDA_CHECK(
        cudaMemcpyAsync(static_cast<char*>(dst) + done, staging_[i], n, cudaMemcpyHostToDevice, stream));
    TANDEM_CUDA_CHECK(cudaEventRecord(staging_done_[i], stream));
    done += n;
  }
}

void CudaDevice::copy_from_host(Stream& stream, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard g(index_);
  cudaStream_t s = stream_of(stream, index_);
  cudaPointerAttributes attr{};
  const bool pinned = cudaPointerGetAttributes(&attr, src) == cudaSuccess && attr.type == cudaMemoryTypeHost;
  cudaGetLastError();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TANDEM_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  if (!pinned && bytes >= (size_t(4) << 20) && capture == cudaStreamCaptureStatusNone) {
    staged_copy_from_host(s, dst, src, bytes);
  } else {
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  }
}

void CudaDevice::copy_to_host(Stream& stream, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard g(index_);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(stream, index_)));
}

void CudaDevice::copy_device_to_device(Stream& stream, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard g(index_);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(stream, index_)));
}

void CudaDevice::copy_2d(Stream& stream, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                         size_t width_bytes, size_t height, CopyKind kind) {
  check(width_bytes <= dst_pitch && width_bytes <= src_pitch, "copy_2d: width is larger than a pitch");
  if (width_bytes == 0 || height == 0) return;
  DeviceGuard g(index_);
  const cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyDeviceToDevice;
  TANDEM_CUDA_CHECK(
      cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width_bytes, height, k, stream_of(stream, index_)));
}

void CudaDevice::copy_to_peer(Stream& stream, void* dst, Device& dst_dev, const void* src, size_t bytes) {
  check(dst_dev.id().kind == DeviceKind::CUDA,
        "copy_to_peer: a CUDA device can only copy to another CUDA device");
  if (bytes == 0) return;
  DeviceGuard g(index_);
  const int dst_index = dst_dev.id().index;
  int can_access = dst_index == index_ ? 1 : 0;
  if (!can_access) TANDEM_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, index_, dst_index));
  if (can_access) {
    // One GPU (ranks sharing it) or GPUs with peer access: a plain copy between unified addresses, which a
    // CUDA graph can record (cudaMemcpyPeerAsync cannot be captured).
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(stream, index_)));
  } else {
    TANDEM_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_index, src, index_, bytes, stream_of(stream, index_)));
  }
}

}  // namespace cuda
}  // namespace tandem
