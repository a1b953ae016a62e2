// The nccl comm: one in-process NCCL communicator per rank over distinct CUDA devices (ncclCommInitAll), each
// collective enqueued on the calling rank's stream. Compiled only when CMake found NCCL (TANDEM_HAVE_NCCL).
//
// Unlike the in-process comms, ranks do not meet on the host, so a rank whose arguments are bad cannot tell
// the others: it aborts the comm (the others' collectives then fail instead of waiting on the GPU forever)
// and throws.
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "parallel/comm.h"
#include "parallel/comm_checks.h"

namespace tandem {
namespace {

class NcclComm final : public Comm {
 public:
  // In-process: every rank of the communicator is a device of this process (ranks 0 .. devices.size() - 1).
  explicit NcclComm(std::span<Device* const> devices)
      : devices_(devices.begin(), devices.end()), n_ranks_(int(devices.size())) {
    std::vector<int> indices;
    for (Device* d : devices_) indices.push_back(d->id().index);
    for (Device* d : devices_) barrier_word_.push_back(d->allocate(sizeof(float)));
    comms_.resize(devices_.size(), nullptr);
    const ncclResult_t rc = ncclCommInitAll(comms_.data(), int(comms_.size()), indices.data());
    if (rc != ncclSuccess)
      throw Error(std::string("NCCL: creating the communicator over ") + std::to_string(indices.size()) +
                  " GPUs failed: " + ncclGetErrorString(rc));
  }

  // One rank of a communicator whose other ranks live in other processes.
  NcclComm(Device& device, int rank, int n_ranks, const NcclUniqueId& id)
      : devices_{&device}, first_rank_(rank), n_ranks_(n_ranks) {
    static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId::bytes), "NCCL's unique id is 128 bytes");
    ncclUniqueId uid;
    std::memcpy(&uid, id.bytes.data(), sizeof(uid));
    barrier_word_.push_back(device.allocate(sizeof(float)));
    comms_.resize(1, nullptr);
    cuda::DeviceGuard guard(device.id().index);
    const ncclResult_t rc = ncclCommInitRank(&comms_[0], n_ranks, uid, rank);
    if (rc != ncclSuccess)
      throw Error(std::string("NCCL: joining the communicator as rank ") + std::to_string(rank) + " of " +
                  std::to_string(n_ranks) + " failed: " + ncclGetErrorString(rc));
  }

  ~NcclComm() override {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted_) return;  // ncclCommAbort freed them
    for (ncclComm_t c : comms_)
      if (c) ncclCommDestroy(c);
  }

  const char* kind() const override { return "nccl"; }
  int n_ranks() const override { return n_ranks_; }
  void reserve(size_t bytes) override { reserved_ = std::max(reserved_, bytes); }

  void all_reduce_sum(int rank, Stream& stream, const Tensor& x) override {
    const char* op = "all_reduce_sum";
    cudaStream_t s = begin(op, rank, stream, x.nbytes());
    fail_if(parallel::check_comm_tensor(op, rank, "x", x, device_id(rank)));
    if (x.type != DType::F32)
      fail(std::string(op) + " on rank " + std::to_string(rank) + ": x must be F32, got " +
           dtype_name(x.type));
    cuda::DeviceGuard guard(device_id(rank).index);
    check_nccl(op, rank,
               ncclAllReduce(x.data, x.data, size_t(x.nelements()), ncclFloat, ncclSum, comm(rank), s));
  }

  void all_gather(int rank, Stream& stream, const Tensor& send, const Tensor& recv) override {
    const char* op = "all_gather";
    const size_t bytes = send.nbytes();
    cudaStream_t s = begin(op, rank, stream, bytes);
    fail_if(parallel::check_comm_tensor(op, rank, "send", send, device_id(rank)));
    fail_if(parallel::check_comm_tensor(op, rank, "recv", recv, device_id(rank)));
    fail_if(parallel::check_comm_gather(op, rank, send, recv, n_ranks()));
    cuda::DeviceGuard guard(device_id(rank).index);
    check_nccl(op, rank, ncclAllGather(send.data, recv.data, bytes, ncclUint8, comm(rank), s));
  }

  void broadcast(int rank, Stream& stream, const Tensor& x, int root) override {
    const char* op = "broadcast";
    cudaStream_t s = begin(op, rank, stream, x.nbytes());
    fail_if(parallel::check_comm_tensor(op, rank, "x", x, device_id(rank)));
    if (root < 0 || root >= n_ranks())
      fail(std::string(op) + " on rank " + std::to_string(rank) + ": root " + std::to_string(root) +
           " is out of range (" + std::to_string(n_ranks()) + " ranks)");
    cuda::DeviceGuard guard(device_id(rank).index);
    check_nccl(op, rank, ncclBroadcast(x.data, x.data, x.nbytes(), ncclUint8, root, comm(rank), s));
  }

  // A one-float all-reduce: no rank's later work starts before every rank has enqueued the barrier.
  void barrier(int rank, Stream& stream) override {
    cudaStream_t s = begin("barrier", rank, stream, 0);
    cuda::DeviceGuard guard(device_id(rank).index);
    void* word = barrier_word_[local(rank)].data();
    check_nccl("barrier", rank, ncclAllReduce(word, word, 1, ncclFloat, ncclSum, comm(rank), s));
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted_.exchange(true)) return;
    for (ncclComm_t& c : comms_) {
      if (c) ncclCommAbort(c);
      c = nullptr;
    }
  }

 private:
  // Ranks held by this process are first_rank_ .. first_rank_ + devices_.size() - 1.
  size_t local(int rank) const { return size_t(rank - first_rank_); }
  DeviceId device_id(int rank) const { return devices_[local(rank)]->id(); }
  ncclComm_t comm(int rank) const { return comms_[local(rank)]; }

  // Checks shared by every collective; returns the rank's cudaStream_t.
  cudaStream_t begin(const char* op, int rank, Stream& stream, size_t bytes) {
    fail_if(parallel::check_comm_rank(op, rank, n_ranks()));
    if (rank < first_rank_ || local(rank) >= devices_.size())
      fail(std::string(op) + ": rank " + std::to_string(rank) + " is not held by this process");
    if (aborted_.load())
      throw Error(
          "collective communication was aborted (another rank failed); this comm cannot be used again");
    fail_if(parallel::check_comm_stream(op, rank, stream, device_id(rank)));
    fail_if(parallel::check_comm_reserved(op, bytes, reserved_));
    return cuda::stream_of(stream, device_id(rank).index);
  }

  [[noreturn]] void fail(const std::string& message) {
    abort();
    throw Error(message);
  }
  void fail_if(const std::string& message) {
    if (!message.empty()) fail(message);
  }

  void check_nccl(const char* op, int rank, ncclResult_t rc) {
    if (rc == ncclSuccess) return;
    std::string detail;
    if (ncclComm_t c = comm(rank)) {
      const char* last = ncclGetLastError(c);
      if (last && *last) detail = std::string(" (") + last + ")";
    }
    fail(std::string("NCCL ") + op + " on rank " + std::to_string(rank) +
         " failed: " + ncclGetErrorString(rc) + detail);
  }

  std::vector<Device*> devices_;  // this process's ranks
  int first_rank_ = 0;
  int n_ranks_ = 0;  // in the whole communicator
  std::vector<ncclComm_t> comms_;
  std::vector<Buffer> barrier_word_;  // one float per rank for barrier()
  size_t reserved_ = 0;
  std::mutex abort_mutex_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<Comm> create_nccl_comm(std::span<Device* const> devices) {
  check(!devices.empty(), "nccl comm: no devices");
  std::vector<int> seen;
  for (size_t r = 0; r < devices.size(); ++r) {
    check(devices[r] != nullptr, "nccl comm: device of rank " + std::to_string(r) + " is null");
    const DeviceId id = devices[r]->id();
    check(id.kind == DeviceKind::CUDA,
          "nccl comm: rank " + std::to_string(r) + "'s device " + id.to_string() + " is not a CUDA device");
    for (int s : seen)
      check(s != id.index, "nccl comm: " + id.to_string() +
                               " is listed twice; NCCL needs one rank per GPU "
                               "(use the copy comm for ranks that share a GPU)");
    seen.push_back(id.index);
  }
  return std::make_unique<NcclComm>(devices);
}

NcclUniqueId nccl_unique_id() {
  ncclUniqueId uid;
  const ncclResult_t rc = ncclGetUniqueId(&uid);
  if (rc != ncclSuccess) throw Error(std::string("NCCL: ncclGetUniqueId failed: ") + ncclGetErrorString(rc));
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), &uid, sizeof(uid));
  return id;
}

std::unique_ptr<Comm> create_nccl_rank_comm(Device& device, int rank, int n_ranks, const NcclUniqueId& id) {
  check(device.id().kind == DeviceKind::CUDA,
        "nccl comm: " + device.id().to_string() + " is not a CUDA device");
  check(n_ranks >= 1 && rank >= 0 && rank < n_ranks,
        "nccl comm: rank " + std::to_string(rank) + " of " + std::to_string(n_ranks) + " is out of range");
  return std::make_unique<NcclComm>(device, rank, n_ranks, id);
}

}  // namespace tandem
