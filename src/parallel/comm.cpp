// create_comm: picks the comm implementation for a list of devices (rules in comm.h), and the argument checks
// the implementations share (comm_checks.h).
#include "parallel/comm.h"

#include <cstdio>
#include <mutex>
#include <set>

#include "parallel/comm_checks.h"

namespace tandem {

namespace parallel {

std::string check_comm_tensor(const char* op, int rank, const char* name, const Tensor& t, DeviceId device) {
  const std::string where = std::string(op) + " on rank " + std::to_string(rank) + ": " + name;
  if (t.device != device)
    return where + " lives on " + t.device.to_string() + ", but rank " + std::to_string(rank) +
           "'s device is " + device.to_string();
  if (t.data == nullptr && t.nelements() > 0) return where + " has no data (null pointer)";
  for (int i = 0; i < 4; ++i)
    if (t.ne[i] < 0) return where + " has a negative dimension " + t.shape_string();
  if (!t.is_contiguous()) return where + " must be contiguous";
  return {};
}

std::string check_comm_stream(const char* op, int rank, const Stream& stream, DeviceId device) {
  if (stream.device() == device) return {};
  return std::string(op) + " on rank " + std::to_string(rank) + ": the stream belongs to " +
         stream.device().to_string() + ", but rank " + std::to_string(rank) + "'s device is " +
         device.to_string();
}

std::string check_comm_reserved(const char* op, size_t bytes, size_t reserved) {
  if (bytes <= reserved) return {};
  return std::string(op) + ": " + std::to_string(bytes) + " bytes per rank, but the comm reserved only " +
         std::to_string(reserved) + " (call Comm::reserve with the largest size before the first collective)";
}

std::string check_comm_gather(const char* op, int rank, const Tensor& send, const Tensor& recv, int n_ranks) {
  const size_t bytes = send.nbytes();
  if (recv.type == send.type && recv.nbytes() == bytes * size_t(n_ranks)) return {};
  return std::string(op) + " on rank " + std::to_string(rank) + ": recv must hold n_ranks (" +
         std::to_string(n_ranks) + ") times send's " + std::to_string(bytes) + " bytes of " +
         dtype_name(send.type) + ", got " + std::to_string(recv.nbytes()) + " bytes of " +
         dtype_name(recv.type);
}

std::string check_comm_rank(const char* op, int rank, int n_ranks) {
  if (rank >= 0 && rank < n_ranks) return {};
  return std::string(op) + ": rank " + std::to_string(rank) + " is out of range (this comm has " +
         std::to_string(n_ranks) + " ranks); the comm is aborted";
}

std::string check_comm_f32(const char* op, int rank, const Tensor& x) {
  if (x.type == DType::F32) return {};
  return std::string(op) + " on rank " + std::to_string(rank) + ": x must be F32, got " + dtype_name(x.type);
}

std::string check_comm_root(const char* op, int rank, int root, int n_ranks) {
  if (root >= 0 && root < n_ranks) return {};
  return std::string(op) + " on rank " + std::to_string(rank) + ": root " + std::to_string(root) +
         " is out of range (" + std::to_string(n_ranks) + " ranks)";
}

}  // namespace parallel

namespace {

const char* kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::Auto:
      return "auto";
    case CommKind::Nccl:
      return "nccl";
    case CommKind::Cpu:
      return "cpu";
    case CommKind::Copy:
      return "copy";
  }
  return "?";
}

// The copy comm is much slower than NCCL on GPUs: say so once per process, with the reason.
void warn_copy_fallback(const std::string& reason) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "tandem: warning: %s; using the copy-and-add fallback for collectives, which is slower\n",
                 reason.c_str());
  });
}

}  // namespace

std::unique_ptr<Comm> create_comm(std::span<Device* const> devices, CommKind kind) {
  const std::string what = std::string("comm (") + kind_name(kind) + ")";
  check(!devices.empty(), what + ": no devices");
  std::set<const Device*> objects;
  std::set<int> gpu_indices;
  bool gpu_twice = false;
  int n_cpu = 0, n_cuda = 0;
  for (size_t r = 0; r < devices.size(); ++r) {
    const Device* d = devices[r];
    check(d != nullptr, what + ": device of rank " + std::to_string(r) + " is null");
    check(objects.insert(d).second, what + ": the same Device object is listed twice (rank " +
                                        std::to_string(r) +
                                        "); ranks that share a GPU need a Device object each");
    if (d->id().kind == DeviceKind::CPU) {
      ++n_cpu;
    } else {
      ++n_cuda;
      if (!gpu_indices.insert(d->id().index).second) gpu_twice = true;
    }
  }
  check(n_cpu == 0 || n_cuda == 0, what + ": the devices mix CPU and CUDA (" + devices[0]->id().to_string() +
                                       ", ...); a comm connects "
                                       "devices of one kind");
  const bool cpu = n_cpu > 0;
  const std::string first_dup = gpu_twice ? "a GPU is listed more than once (ranks sharing a GPU)" : "";

  switch (kind) {
    case CommKind::Cpu:
      check(cpu, what + ": the cpu comm serves CPU devices only, but rank 0 is " +
                     devices[0]->id().to_string() + " (use nccl or copy for GPUs)");
      return create_cpu_comm(devices);
    case CommKind::Copy:
      if (!cpu && devices.size() > 1) warn_copy_fallback("the copy comm was requested for CUDA devices");
      return create_copy_comm(devices);
    case CommKind::Nccl:
#if defined(TANDEM_HAVE_NCCL)
      check(!cpu, what + ": NCCL serves CUDA devices only, but rank 0 is " + devices[0]->id().to_string() +
                      " (use the cpu comm)");
      check(!gpu_twice, what + ": NCCL needs distinct GPUs, but " + first_dup + "; use the copy comm");
      return create_nccl_comm(devices);
#else
      throw Error(what +
                  ": this tandem was built without NCCL (install NCCL and rebuild with CUDA, or use the " +
                  (cpu ? "cpu" : "copy") + " comm)");
#endif
    case CommKind::Auto:
      break;
  }
  if (cpu) return create_cpu_comm(devices);
#if defined(TANDEM_HAVE_NCCL)
  if (!gpu_twice) return create_nccl_comm(devices);
  const std::string reason = "NCCL cannot serve these ranks (" + first_dup + ")";
#else
  const std::string reason = "NCCL is not available (this tandem was built without it)";
#endif
  // One rank has nothing to communicate (the copy comm's collectives are then no-ops): no warning.
  if (devices.size() > 1) warn_copy_fallback(reason);
  return create_copy_comm(devices);
}

}  // namespace tandem
