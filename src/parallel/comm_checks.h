// Argument checks shared by the comm implementations. Each returns an empty string when the argument is fine
// and otherwise a message that names the collective, the rank and what is wrong; the in-process comms post it
// on their RankBoard so that every rank throws it (a rank that threw alone would leave the others waiting).
#pragma once

#include <cstddef>
#include <string>

#include "backend/backend.h"
#include "parallel/rank_barrier.h"

namespace tandem::parallel {

// t lives on `device`, has data and is contiguous.
std::string check_comm_tensor(const char* op, int rank, const char* name, const Tensor& t, DeviceId device);
// The stream belongs to `device`.
std::string check_comm_stream(const char* op, int rank, const Stream& stream, DeviceId device);
// bytes fit in what reserve() sized.
std::string check_comm_reserved(const char* op, size_t bytes, size_t reserved);
// all_gather's recv holds n_ranks times send's bytes, of send's dtype.
std::string check_comm_gather(const char* op, int rank, const Tensor& send, const Tensor& recv, int n_ranks);
// 0 <= rank < n_ranks. A bad rank index cannot post on the board, so the comm aborts (waking the other ranks)
// and throws this message.
std::string check_comm_rank(const char* op, int rank, int n_ranks);
// x is F32 (all_reduce_sum sums floats).
std::string check_comm_f32(const char* op, int rank, const Tensor& x);
// 0 <= root < n_ranks (broadcast).
std::string check_comm_root(const char* op, int rank, int root, int n_ranks);

// The post of `rank` entering collective `op` on an in-process comm's board (cpu, copy), with the checks
// every collective makes: the stream is the rank's device's (device_of(rank), asked only for a valid rank)
// and `bytes` fit the reservation; the collective adds its own checks. A bad rank index cannot post: it
// aborts the board (waking the other ranks) and throws.
template <class DeviceOf>
RankCall begin_board_call(RankBoard& board, const char* op, int rank, const Stream& stream,
                          DeviceOf device_of, DType type, size_t bytes, size_t reserved) {
  std::string bad_rank = check_comm_rank(op, rank, board.n_ranks());
  if (!bad_rank.empty()) {
    board.abort();
    throw Error(bad_rank);
  }
  RankCall call;
  call.op = op;
  call.bytes = bytes;
  call.dtype = type;
  call.error = check_comm_stream(op, rank, stream, device_of(rank));
  if (call.error.empty()) call.error = check_comm_reserved(op, bytes, reserved);
  return call;
}

}  // namespace tandem::parallel
