// The cpu comm: ranks are host threads of one process whose devices are CPU "devices" (cpu:0, cpu:1, ...), so
// every rank can read every other rank's memory. The threads meet on a RankBoard (rank_barrier.h) to exchange
// pointers, then read each other's buffers directly.
//
// all_reduce_sum: after the ranks have posted their buffers, rank r sums its chunk [c0, c1) of every rank's
// buffer, in rank order, into a shared scratch; after a barrier (every sum done, so nobody reads the buffers
// any more) each rank copies the whole scratch into its buffer. The next collective begins with a barrier, so
// the scratch is not overwritten while a slow rank still copies from it. Two barriers per collective.
#include <algorithm>
#include <cstring>
#include <vector>

#include "parallel/comm.h"
#include "parallel/comm_checks.h"
#include "parallel/rank_barrier.h"

namespace tandem {
namespace {

using parallel::RankBoard;
using parallel::RankCall;

class CpuComm final : public Comm {
 public:
  explicit CpuComm(std::span<Device* const> devices)
      : devices_(devices.begin(), devices.end()), board_(int(devices.size())) {}

  const char* kind() const override { return "cpu"; }
  int n_ranks() const override { return int(devices_.size()); }

  void reserve(size_t bytes) override {
    if (bytes <= reserved_) return;
    scratch_.resize((bytes + sizeof(float) - 1) / sizeof(float));
    reserved_ = bytes;
  }

  void all_reduce_sum(int rank, Stream& stream, const Tensor& x) override {
    const char* op = "all_reduce_sum";
    RankCall call = begin(op, rank, stream, x.type, x.nbytes());
    if (call.error.empty()) call.error = parallel::check_comm_tensor(op, rank, "x", x, device_id(rank));
    if (call.error.empty()) call.error = parallel::check_comm_f32(op, rank, x);
    call.ptr = x.data;
    const std::vector<RankCall>& posts = board_.enter(rank, call);

    const int R = n_ranks();
    const int64_t n = x.nelements();
    const int64_t c0 = n * rank / R, c1 = n * (rank + 1) / R;
    float* sum = scratch_.data();
    // Rank order, one operand at a time: ((x_0 + x_1) + x_2) + ... in float, the same on every rank.
    const float* first = static_cast<const float*>(posts[0].ptr);
    std::copy(first + c0, first + c1, sum + c0);
    for (int q = 1; q < R; ++q) {
      const float* src = static_cast<const float*>(posts[size_t(q)].ptr);
      for (int64_t i = c0; i < c1; ++i) sum[i] += src[i];
    }
    board_.barrier().arrive_and_wait();
    if (n > 0) std::memcpy(x.data, sum, size_t(n) * sizeof(float));
  }

  void all_gather(int rank, Stream& stream, const Tensor& send, const Tensor& recv) override {
    const char* op = "all_gather";
    const size_t bytes = send.nbytes();
    RankCall call = begin(op, rank, stream, send.type, bytes);
    if (call.error.empty()) call.error = parallel::check_comm_tensor(op, rank, "send", send, device_id(rank));
    if (call.error.empty()) call.error = parallel::check_comm_tensor(op, rank, "recv", recv, device_id(rank));
    if (call.error.empty()) call.error = parallel::check_comm_gather(op, rank, send, recv, n_ranks());
    call.ptr = recv.data;
    call.ptr2 = send.data;
    const std::vector<RankCall>& posts = board_.enter(rank, call);

    char* dst = static_cast<char*>(recv.data);
    for (int q = 0; q < n_ranks(); ++q)
      if (bytes) std::memmove(dst + size_t(q) * bytes, posts[size_t(q)].ptr2, bytes);
    board_.barrier().arrive_and_wait();  // nobody changes its send buffer while others still read it
  }

  void broadcast(int rank, Stream& stream, const Tensor& x, int root) override {
    const char* op = "broadcast";
    RankCall call = begin(op, rank, stream, x.type, x.nbytes());
    if (call.error.empty()) call.error = parallel::check_comm_tensor(op, rank, "x", x, device_id(rank));
    if (call.error.empty()) call.error = parallel::check_comm_root(op, rank, root, n_ranks());
    call.root = root;
    call.ptr = x.data;
    const std::vector<RankCall>& posts = board_.enter(rank, call);

    if (rank != root && x.nbytes() > 0) std::memcpy(x.data, posts[size_t(root)].ptr, x.nbytes());
    board_.barrier().arrive_and_wait();  // the root does not change x while others still read it
  }

  void barrier(int rank, Stream& stream) override {
    RankCall call = begin("barrier", rank, stream, DType::F32, 0);
    board_.enter(rank, call);
  }

  void abort() override { board_.abort(); }

 private:
  DeviceId device_id(int rank) const { return devices_[size_t(rank)]->id(); }

  // The post of a collective with the checks every collective shares; a bad rank index aborts the comm.
  RankCall begin(const char* op, int rank, Stream& stream, DType type, size_t bytes) {
    return parallel::begin_board_call(
        board_, op, rank, stream, [this](int r) { return device_id(r); }, type, bytes, reserved_);
  }

  std::vector<Device*> devices_;
  RankBoard board_;
  size_t reserved_ = 0;
  std::vector<float> scratch_;  // the sums of all_reduce_sum, reserved_ bytes
};

}  // namespace

std::unique_ptr<Comm> create_cpu_comm(std::span<Device* const> devices) {
  check(!devices.empty(), "cpu comm: no devices");
  for (size_t r = 0; r < devices.size(); ++r) {
    check(devices[r] != nullptr, "cpu comm: device of rank " + std::to_string(r) + " is null");
    check(devices[r]->id().kind == DeviceKind::CPU, "cpu comm: rank " + std::to_string(r) + "'s device " +
                                                        devices[r]->id().to_string() +
                                                        " is not a CPU device");
  }
  return std::make_unique<CpuComm>(devices);
}

}  // namespace tandem
