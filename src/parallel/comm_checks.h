// Argument checks shared by the comm implementations. Each returns an empty string when the argument is fine
// and otherwise a message that names the collective, the rank and what is wrong; the in-process comms post it
// on their RankBoard so that every rank throws it (a rank that threw alone would leave the others waiting).
#pragma once

#include <cstddef>
#include <string>

#include "backend/backend.h"

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

}  // namespace tandem::parallel
