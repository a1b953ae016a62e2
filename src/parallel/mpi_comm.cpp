// Comms for ranks in separate processes (process_world.h), compiled only when CMake found MPI.
//   CPU ranks: collectives over MPI on host memory. The all-reduce gathers every rank's x and sums it in rank
//   order, ((x_0 + x_1) + x_2) + ..., like the in-process cpu comm: every process gets the same bits, so the
//   processes sample the same tokens, and a split over processes equals one over threads.
//   CUDA ranks: NCCL, its unique id broadcast from rank 0 over MPI (ncclCommInitRank); MPI carries nothing
//   else.
// A rank that fails does not tell the others; tools/tandem/main.cpp ends the job with MPI_Abort instead.
#include <mpi.h>

#include <climits>
#include <string>
#include <vector>

#include "parallel/comm_checks.h"
#include "parallel/process_world.h"

namespace tandem {
namespace {

void check_mpi(const char* op, int rc) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string("MPI ") + op + " failed: " + std::string(text, size_t(len)));
}

int mpi_count(const char* op, size_t n) {
  check(n <= size_t(INT_MAX),
        std::string(op) + ": " + std::to_string(n) + " elements are more than one MPI call takes");
  return int(n);
}

class MpiCpuComm final : public Comm {
 public:
  MpiCpuComm(Device& device, int rank, int size) : device_(device), rank_(rank), size_(size) {}

  const char* kind() const override { return "mpi"; }
  int n_ranks() const override { return size_; }

  void reserve(size_t bytes) override {
    if (bytes <= reserved_) return;
    gathered_.resize(size_t(size_) * ((bytes + sizeof(float) - 1) / sizeof(float)));
    reserved_ = bytes;
  }

  void all_reduce_sum(int rank, Stream& stream, const Tensor& x) override {
    const char* op = "all_reduce_sum";
    begin(op, rank, stream, x.nbytes());
    check_arg(parallel::check_comm_tensor(op, rank, "x", x, device_.id()));
    check(x.type == DType::F32, std::string(op) + ": x must be F32, got " + dtype_name(x.type));
    const size_t n = size_t(x.nelements());
    float* v = static_cast<float*>(x.data);
    check_mpi(op, MPI_Allgather(v, mpi_count(op, n), MPI_FLOAT, gathered_.data(), mpi_count(op, n), MPI_FLOAT,
                                MPI_COMM_WORLD));
    for (size_t i = 0; i < n; ++i) {
      float s = gathered_[i];
      for (int r = 1; r < size_; ++r) s += gathered_[size_t(r) * n + i];
      v[i] = s;
    }
  }

  void all_gather(int rank, Stream& stream, const Tensor& send, const Tensor& recv) override {
    const char* op = "all_gather";
    const size_t bytes = send.nbytes();
    begin(op, rank, stream, 0);
    check_arg(parallel::check_comm_tensor(op, rank, "send", send, device_.id()));
    check_arg(parallel::check_comm_tensor(op, rank, "recv", recv, device_.id()));
    check_arg(parallel::check_comm_gather(op, rank, send, recv, size_));
    check_mpi(op, MPI_Allgather(send.data, mpi_count(op, bytes), MPI_BYTE, recv.data, mpi_count(op, bytes),
                                MPI_BYTE, MPI_COMM_WORLD));
  }

  void broadcast(int rank, Stream& stream, const Tensor& x, int root) override {
    const char* op = "broadcast";
    begin(op, rank, stream, 0);
    check_arg(parallel::check_comm_tensor(op, rank, "x", x, device_.id()));
    check(root >= 0 && root < size_, std::string(op) + ": root " + std::to_string(root) +
                                         " is out of range (" + std::to_string(size_) + " ranks)");
    check_mpi(op, MPI_Bcast(x.data, mpi_count(op, x.nbytes()), MPI_BYTE, root, MPI_COMM_WORLD));
  }

  void barrier(int rank, Stream& stream) override {
    begin("barrier", rank, stream, 0);
    check_mpi("barrier", MPI_Barrier(MPI_COMM_WORLD));
  }

  void abort() override { abort_process_world(1); }

 private:
  // This process holds exactly one rank; its work on the CPU device is done when an op returns, but a stream
  // is synchronised anyway so that the comm never reads memory an op still writes.
  void begin(const char* op, int rank, Stream& stream, size_t bytes) {
    check(rank == rank_, std::string(op) + ": this process is rank " + std::to_string(rank_) +
                             " of the job; it cannot run a collective for rank " + std::to_string(rank));
    check_arg(parallel::check_comm_stream(op, rank, stream, device_.id()));
    check_arg(parallel::check_comm_reserved(op, bytes, reserved_));
    stream.synchronize();
  }
  static void check_arg(const std::string& message) {
    if (!message.empty()) throw Error(message);
  }

  Device& device_;
  const int rank_, size_;
  size_t reserved_ = 0;
  std::vector<float> gathered_;  // every rank's x, rank-major (all_reduce_sum)
};

}  // namespace

std::unique_ptr<Comm> create_process_comm(Device& device) {
  const ProcessWorld& w = process_world();
  if (device.id().kind == DeviceKind::CPU) return std::make_unique<MpiCpuComm>(device, w.rank, w.size);
#if defined(TANDEM_HAVE_NCCL)
  NcclUniqueId id{};
  if (w.rank == 0) id = nccl_unique_id();
  check_mpi("broadcast of the NCCL unique id",
            MPI_Bcast(id.bytes.data(), int(id.bytes.size()), MPI_BYTE, 0, MPI_COMM_WORLD));
  return create_nccl_rank_comm(device, w.rank, w.size, id);
#else
  throw Error("GPU ranks in separate processes need NCCL, and this tandem was built without it");
#endif
}

}  // namespace tandem
