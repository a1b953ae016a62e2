#include "parallel/rank_threads.h"

namespace tandem {

RankThreads::RankThreads(int n_ranks, std::function<void()> on_error)
    : n_ranks_(n_ranks), on_error_(std::move(on_error)) {
  for (int r = 1; r < n_ranks_; ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::fail(std::exception_ptr e) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) {
      error_ = e;
      first = true;
    }
  }
  if (first && on_error_) on_error_();
}

void RankThreads::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    try {
      (*job)(rank);
    } catch (...) {
      fail(std::current_exception());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    done_cv_.notify_all();
  }
}

void RankThreads::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_ = n_ranks_ - 1;
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  try {
    fn(0);
  } catch (...) {
    fail(std::current_exception());
  }
  std::exception_ptr e;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    e = error_;
    job_ = nullptr;
  }
  if (e) std::rethrow_exception(e);
}

}  // namespace tandem
