// The copy comm: collectives from peer copies, Ops::add and events only (backend.h), for CUDA ranks without
// NCCL (two ranks sharing one GPU, or a build without NCCL); it also runs on CPU devices, where CI tests it.
// The ranks' host threads meet on a RankBoard (rank_barrier.h) to exchange pointers; the devices' work is
// ordered by events, never by blocking the host on a stream.
//
// Copies always PUSH: a copy between devices must be enqueued on a stream of the source device
// (copy_between_devices), and each rank only owns a stream of its own device.
//
// all_reduce_sum over R ranks, n floats, rank o owning chunk [lo(o), lo(o + 1)) with lo(o) = n * o / R:
//   1. post x; meet.
//   2. rank r pushes its x chunk o into slot r of owner o's scratch (after o's previous sum has read that
//      scratch: o's scratch_free event), for every o != r; records arrive[r].
//   3. meet (every arrive recorded).
//   4. owner r waits for every arrive, sums slot 0, slot 1, ... in rank order (its own operand is its x
//      chunk) into its x chunk, records scratch_free[r], pushes the reduced chunk into every other rank's x;
//      records leave[r].
//   5. meet (every leave recorded); 6. every rank waits for every leave.
// A rank's pushes out of x come before its arrive event, so an owner writes x_q's chunk only after q has read
// it; q's later work waits for every owner's leave event.
//
// Epochs (Comm::new_epoch): scratch_free of an earlier epoch is not waited on; the caller has put a
// device-side barrier between the epochs. Every other event is recorded and waited within one call.
//
// Events recorded in call k are re-recorded in call k + 2 at the earliest (arrive and leave are double
// buffered by call parity); a rank reaches call k + 2 only after every rank has entered call k + 1, i.e. has
// finished waiting on the events of call k. scratch_free is recorded after step 3 and waited before step 3 of
// the next all-reduce, which the barrier between them orders.
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm.h"
#include "parallel/comm_checks.h"
#include "parallel/rank_barrier.h"

namespace tandem {
namespace {

using parallel::RankBoard;
using parallel::RankCall;

class CopyComm final : public Comm {
 public:
  explicit CopyComm(std::span<Device* const> devices) : board_(int(devices.size())) {
    for (Device* d : devices) {
      Rank rank;
      rank.device = d;
      for (int p = 0; p < 2; ++p) {
        rank.arrive[p] = d->create_event();
        rank.leave[p] = d->create_event();
      }
      rank.scratch_free = d->create_event();
      ranks_.push_back(std::move(rank));
    }
    call_count_.assign(ranks_.size(), 0);
  }

  const char* kind() const override { return "copy"; }
  int n_ranks() const override { return int(ranks_.size()); }

  void reserve(size_t bytes) override {
    if (bytes <= reserved_) return;
    const size_t R = ranks_.size();
    if (R > 1) {
      // Chunks of an all-reduce hold at most ceil(n / R) floats; R slots (the own one is the accumulator).
      const size_t n = (bytes + sizeof(float) - 1) / sizeof(float);
      const size_t slot = (n + R - 1) / R;
      for (Rank& rank : ranks_) {
        rank.scratch.reset();
        rank.scratch = rank.device->allocate(R * slot * sizeof(float));
      }
      slot_floats_ = slot;
    }
    reserved_ = bytes;
  }

  void all_reduce_sum(int rank, Stream& stream, const Tensor& x) override {
    const char* op = "all_reduce_sum";
    RankCall call = begin(op, rank, stream, x.type, x.nbytes());
    if (call.error.empty()) call.error = parallel::check_comm_tensor(op, rank, "x", x, device_id(rank));
    if (call.error.empty()) call.error = parallel::check_comm_f32(op, rank, x);
    call.ptr = x.data;
    const int p = parity(rank);
    const std::vector<RankCall>& posts = board_.enter(rank, call);
    const int R = n_ranks();
    if (R == 1) return;

    guarded([&] {
      const int64_t n = x.nelements();
      auto lo = [&](int o) { return n * o / R; };
      Rank& me = ranks_[size_t(rank)];
      float* x_data = static_cast<float*>(x.data);

      // 2. push chunk o of x to owner o
      for (int o = 0; o < R; ++o) {
        const int64_t len = lo(o + 1) - lo(o);
        if (o == rank || len == 0) continue;
        Rank& owner = ranks_[size_t(o)];
        if (owner.scratch_free_epoch == epoch_) owner.scratch_free->wait(stream);
        copy_between_devices(stream, *owner.device, slot(o, rank), *me.device, x_data + lo(o),
                             size_t(len) * sizeof(float));
      }
      me.arrive[p]->record(stream);
      board_.barrier().arrive_and_wait();  // 3.

      // 4. sum the own chunk in rank order, then push it to every other rank
      const int64_t c0 = lo(rank), len = lo(rank + 1) - c0;
      if (len > 0) {
        for (int q = 0; q < R; ++q)
          if (q != rank) ranks_[size_t(q)].arrive[p]->wait(stream);
        float* const mine = x_data + c0;
        float* const acc = slot(rank, rank);
        auto operand = [&](int q) { return q == rank ? mine : slot(rank, q); };
        for (int q = 1; q < R; ++q) {
          float* a = q == 1 ? operand(0) : acc;
          float* b = operand(q);
          float* out = q == R - 1 ? mine : acc;
          // Ops::add allows out == a only; a + b == b + a exactly, so swap when out is b.
          if (b == out) std::swap(a, b);
          add_floats(me, stream, a, b, out, len);
        }
        me.scratch_free->record(stream);
        me.scratch_free_epoch = epoch_;
        for (int q = 0; q < R; ++q) {
          if (q == rank) continue;
          float* dst = static_cast<float*>(posts[size_t(q)].ptr) + c0;
          copy_between_devices(stream, *ranks_[size_t(q)].device, dst, *me.device, x_data + c0,
                               size_t(len) * sizeof(float));
        }
      }
      me.leave[p]->record(stream);
      board_.barrier().arrive_and_wait();  // 5.

      // 6. later work on this rank's stream sees every owner's chunk
      for (int q = 0; q < R; ++q)
        if (q != rank && lo(q + 1) > lo(q)) ranks_[size_t(q)].leave[p]->wait(stream);
    });
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
    const int p = parity(rank);
    Rank& me = ranks_[size_t(rank)];
    if (call.error.empty()) me.arrive[p]->record(stream);  // recv may be written by others from here on
    const std::vector<RankCall>& posts = board_.enter(rank, call);

    guarded([&] {
      // Push send into slot `rank` of every rank's recv.
      for (int q = 0; q < n_ranks() && bytes > 0; ++q) {
        char* dst = static_cast<char*>(posts[size_t(q)].ptr) + size_t(rank) * bytes;
        if (q == rank) {
          if (dst != send.data) me.device->copy_device_to_device(stream, dst, send.data, bytes);
          continue;
        }
        ranks_[size_t(q)].arrive[p]->wait(stream);
        copy_between_devices(stream, *ranks_[size_t(q)].device, dst, *me.device, send.data, bytes);
      }
      me.leave[p]->record(stream);
      board_.barrier().arrive_and_wait();
      for (int q = 0; q < n_ranks(); ++q)
        if (q != rank && bytes > 0) ranks_[size_t(q)].leave[p]->wait(stream);
    });
  }

  void broadcast(int rank, Stream& stream, const Tensor& x, int root) override {
    const char* op = "broadcast";
    const size_t bytes = x.nbytes();
    RankCall call = begin(op, rank, stream, x.type, bytes);
    if (call.error.empty()) call.error = parallel::check_comm_tensor(op, rank, "x", x, device_id(rank));
    if (call.error.empty()) call.error = parallel::check_comm_root(op, rank, root, n_ranks());
    call.root = root;
    call.ptr = x.data;
    const int p = parity(rank);
    Rank& me = ranks_[size_t(rank)];
    if (call.error.empty()) me.arrive[p]->record(stream);
    const std::vector<RankCall>& posts = board_.enter(rank, call);
    if (n_ranks() == 1) return;

    guarded([&] {
      if (rank == root && bytes > 0) {
        for (int q = 0; q < n_ranks(); ++q) {
          if (q == root) continue;
          ranks_[size_t(q)].arrive[p]->wait(stream);
          copy_between_devices(stream, *ranks_[size_t(q)].device, posts[size_t(q)].ptr, *me.device, x.data,
                               bytes);
        }
        me.leave[p]->record(stream);
      }
      board_.barrier().arrive_and_wait();
      if (rank != root && bytes > 0) ranks_[size_t(root)].leave[p]->wait(stream);
    });
  }

  void barrier(int rank, Stream& stream) override {
    RankCall call = begin("barrier", rank, stream, DType::F32, 0);
    const int p = parity(rank);
    Rank& me = ranks_[size_t(rank)];
    if (call.error.empty()) me.arrive[p]->record(stream);
    board_.enter(rank, call);
    guarded([&] {
      for (int q = 0; q < n_ranks(); ++q)
        if (q != rank) ranks_[size_t(q)].arrive[p]->wait(stream);
    });
  }

  void abort() override { board_.abort(); }
  void new_epoch() override { ++epoch_; }

 private:
  struct Rank {
    Device* device = nullptr;
    std::unique_ptr<Event> arrive[2];  // recorded by this rank once its inputs are ready / it has read them
    std::unique_ptr<Event> leave[2];   // recorded by this rank after its last write into other ranks' memory
    std::unique_ptr<Event> scratch_free;  // recorded after this rank's sum has read its scratch
    // The epoch of scratch_free's last record (written by this rank's thread; read by the others after a
    // meeting, which orders it). A record from an earlier epoch is not waited on (new_epoch).
    uint64_t scratch_free_epoch = 0;
    Buffer scratch;  // n_ranks slots of slot_floats_ floats (all_reduce_sum)
  };

  DeviceId device_id(int rank) const { return ranks_[size_t(rank)].device->id(); }

  // Slot `q` of rank `owner`'s scratch: where rank q's chunk `owner` lands (the owner's own slot
  // accumulates).
  float* slot(int owner, int q) const {
    return static_cast<float*>(ranks_[size_t(owner)].scratch.data()) + size_t(q) * slot_floats_;
  }

  // out = a + b over len floats of rank's device. Shaped as rows of kAddRow floats plus a tail, because
  // elementwise ops parallelise over rows (a single row of a million floats would run on one CUDA block).
  static void add_floats(Rank& rank, Stream& stream, float* a, float* b, float* out, int64_t len) {
    constexpr int64_t kAddRow = 1024;
    const DeviceId id = rank.device->id();
    Ops& ops = rank.device->ops();
    const int64_t rows = len / kAddRow, tail = len - rows * kAddRow;
    if (rows > 0) {
      ops.add(stream, Tensor::contiguous(DType::F32, {kAddRow, rows}, a, id),
              Tensor::contiguous(DType::F32, {kAddRow, rows}, b, id),
              Tensor::contiguous(DType::F32, {kAddRow, rows}, out, id));
    }
    if (tail > 0) {
      const int64_t off = rows * kAddRow;
      ops.add(stream, Tensor::contiguous(DType::F32, {tail}, a + off, id),
              Tensor::contiguous(DType::F32, {tail}, b + off, id),
              Tensor::contiguous(DType::F32, {tail}, out + off, id));
    }
  }

  // Call parity of this rank (every rank makes the same calls, so the parities agree), then counts the call.
  int parity(int rank) { return int(call_count_[size_t(rank)]++ & 1); }

  // A failure after the ranks have met (a CUDA error, say) would leave the others waiting at the next
  // meeting: abort the comm so that they throw too, then rethrow.
  template <class F>
  void guarded(F&& body) {
    try {
      body();
    } catch (...) {
      abort();
      throw;
    }
  }

  RankCall begin(const char* op, int rank, Stream& stream, DType type, size_t bytes) {
    return parallel::begin_board_call(
        board_, op, rank, stream, [this](int r) { return device_id(r); }, type, bytes, reserved_);
  }

  std::vector<Rank> ranks_;
  RankBoard board_;
  size_t reserved_ = 0;
  size_t slot_floats_ = 0;
  std::vector<uint64_t> call_count_;  // per rank, each element written by its rank's thread only
  uint64_t epoch_ = 1;  // changed only between collectives (new_epoch); ranks read it inside them
};

}  // namespace

std::unique_ptr<Comm> create_copy_comm(std::span<Device* const> devices) {
  check(!devices.empty(), "copy comm: no devices");
  for (size_t r = 0; r < devices.size(); ++r) {
    check(devices[r] != nullptr, "copy comm: device of rank " + std::to_string(r) + " is null");
    check(devices[r]->id().kind == devices[0]->id().kind,
          "copy comm: the devices mix CPU and CUDA (rank 0 is " + devices[0]->id().to_string() + ", rank " +
              std::to_string(r) + " is " + devices[r]->id().to_string() + ")");
    for (size_t q = 0; q < r; ++q)
      check(devices[q] != devices[r], "copy comm: the same Device object is listed for ranks " +
                                          std::to_string(q) + " and " + std::to_string(r) +
                                          " (ranks that share a GPU need a Device object each)");
  }
  return std::make_unique<CopyComm>(devices);
}

}  // namespace tandem
