// One host thread per rank (tensor split): run(fn) calls fn(rank) for every rank at once — rank 0 on the
// calling thread, the others on persistent threads (no thread start per step) — and returns when all are
// done. If a rank throws, on_error (e.g. Comm::abort, so that ranks waiting in a collective give up) is
// called and the first exception is rethrown by run() after every rank has returned.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class RankThreads {
 public:
  RankThreads(int n_ranks, std::function<void()> on_error);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int n_ranks() const { return n_ranks_; }
  void run(const std::function<void(int rank)>& fn);

 private:
  void worker(int rank);
  void fail(std::exception_ptr e);

  int n_ranks_;
  std::function<void()> on_error_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace tandem
