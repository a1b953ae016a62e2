// Collective communication between the ranks of a mesh (one rank per device, one host thread per rank):
// all-reduce (sum), all-gather, broadcast and barrier, each enqueued on the calling rank's stream.
//
// Three implementations behind one interface (DESIGN.md "Mesh and comm"):
//   nccl  an in-process NCCL communicator over distinct CUDA devices (ncclCommInitAll), used when tandem was
//         built with NCCL (src/parallel/nccl_comm.cpp);
//   cpu   an in-process implementation for CPU ranks: the ranks' host threads meet at a barrier and sum each
//         other's memory directly (so every split runs in CI on cpu:N "devices");
//   copy  a copy-and-add fallback written only against Device / Ops / Event (peer copies and Ops::add), for
//         CUDA ranks when NCCL is absent or cannot be used (two ranks sharing one GPU); slower, so creating
//         it for CUDA devices prints one warning.
// Ranks in separate processes (mpirun) use the same interface with one rank per process: MPI collectives for
// CPU ranks, NCCL bootstrapped over MPI for GPU ranks (process_world.h, mpi_comm.cpp).
//
// Calling convention: every rank's host thread calls the same collectives in the same order, passing its own
// rank index and a stream of its own device. Tensors are contiguous, on the rank's device, and have the same
// shape on every rank. A collective is ordered on `stream` like an op: work enqueued on the stream afterwards
// sees the result (on CPU the call returns with the result in place).
//
// Results are deterministic and identical on every rank: the sum of an all-reduce is formed in rank order
// (((x_0 + x_1) + x_2) + ...) for cpu and copy, so ranks that start from equal inputs stay bit-identical.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"

namespace tandem {

class Comm {
 public:
  virtual ~Comm() = default;
  // "nccl", "cpu", "copy", or "mpi" (CPU ranks in separate processes).
  virtual const char* kind() const = 0;
  virtual int n_ranks() const = 0;

  // Sizes internal buffers for collectives of up to `bytes` bytes per rank (send size; all_gather's receive
  // buffer is the caller's). Call before the first collective of a new size bound: collectives never allocate
  // and throw Error when asked for more than reserved. Not collective (call once, from any thread, while no
  // collective is running).
  virtual void reserve(size_t bytes) = 0;

  // x (F32) <- sum of every rank's x, in place.
  virtual void all_reduce_sum(int rank, Stream& stream, const Tensor& x) = 0;
  // recv (n_ranks * send.nbytes() bytes, same dtype) <- rank 0's send, then rank 1's, ... (rank-major).
  virtual void all_gather(int rank, Stream& stream, const Tensor& send, const Tensor& recv) = 0;
  // x <- root's x on every rank.
  virtual void broadcast(int rank, Stream& stream, const Tensor& x, int root) = 0;
  // Returns (on CPU) / lets later work on stream start (on GPUs) only when every rank has reached it.
  virtual void barrier(int rank, Stream& stream) = 0;

  // Starts a new epoch of collectives: later collectives no longer order themselves after device work of
  // collectives from earlier epochs (e.g. the copy comm's wait for a rank's previous sum to have read its
  // scratch). The caller guarantees that ordering instead, with a device-side barrier between the ranks'
  // streams (Device::run_recorded_across does one before and after its body). Needed so that collectives
  // recorded into a CUDA graph never wait on events recorded outside it, and the reverse (CUDA forbids both).
  // Not collective: call from one thread while no collective is running.
  virtual void new_epoch() {}

  // Called when one rank fails mid-step: every rank blocked in (or later entering) a collective of this comm
  // throws Error("... aborted ...") instead of waiting forever. Thread-safe; irreversible.
  virtual void abort() = 0;
};

enum class CommKind { Auto, Nccl, Cpu, Copy };

// A communicator over devices[r] = rank r's device (the devices must outlive it). The same Device object must
// not appear twice; two Device objects of one GPU may (ranks sharing a GPU, copy comm only).
//   Auto: all CPU devices -> cpu; all CUDA -> nccl when built with NCCL and the GPUs are distinct, else copy
//         (with one warning on stderr that performance will be lower).
//   An explicit kind that cannot serve these devices throws Error saying why (nccl without NCCL in the build,
//   nccl with a GPU listed twice, cpu with a CUDA device, mixed CPU and CUDA devices for any kind).
std::unique_ptr<Comm> create_comm(std::span<Device* const> devices, CommKind kind = CommKind::Auto);

// The implementations (create_comm dispatches to them).
std::unique_ptr<Comm> create_cpu_comm(std::span<Device* const> devices);
std::unique_ptr<Comm> create_copy_comm(std::span<Device* const> devices);
#if defined(TANDEM_HAVE_NCCL)
std::unique_ptr<Comm> create_nccl_comm(std::span<Device* const> devices);
// For ranks in separate processes (process_world.h): rank 0 makes the id, every process receives it and
// creates its one rank of an n_ranks communicator on `device`.
struct NcclUniqueId {
  std::array<char, 128> bytes{};
};
NcclUniqueId nccl_unique_id();
std::unique_ptr<Comm> create_nccl_rank_comm(Device& device, int rank, int n_ranks, const NcclUniqueId& id);
#endif

}  // namespace tandem
