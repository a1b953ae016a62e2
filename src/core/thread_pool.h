// A persistent pool of worker threads for data-parallel loops (the CPU backend's ops, quantization).
//
// parallel_for(n_tasks, fn) runs fn(task, thread_id) for every task in [0, n_tasks) and returns when all are
// done. The calling thread takes part (thread_id 0); workers have ids 1..n_threads-1, so per-thread scratch
// can be indexed by thread_id. Tasks are handed out one at a time from an atomic counter, so make them coarse
// enough (tens of microseconds) to amortise the hand-out. Idle workers spin briefly (a decode step issues
// hundreds of small loops back to back) and then sleep, so an idle pool costs no CPU.
//
// One thread at a time may call parallel_for on a pool. A parallel_for issued from inside a task runs
// serially on the calling thread. If fn throws, the remaining tasks are skipped and the first exception is
// rethrown by parallel_for.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  // n_threads counts the calling thread; 0 = std::thread::hardware_concurrency(). n_threads - 1 workers
  // start.
  // The most threads a pool takes; more is almost surely a typo (-t 100000) and is refused with an Error.
  static constexpr int kMaxThreads = 1024;
  // n_threads <= 0: one per hardware thread. Throws Error above kMaxThreads, or when the system refuses to
  // start a thread (the threads already started are stopped first).
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  template <class F>
  void parallel_for(int64_t n_tasks, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(
        n_tasks, [](void* ctx, int64_t task, int thread_id) { (*static_cast<Fn*>(ctx))(task, thread_id); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void* ctx, int64_t task, int thread_id);

  void run(int64_t n_tasks, TaskFn fn, void* ctx);
  void worker_main(int thread_id);
  void work_on_current_job(int thread_id);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;

  // The current job: written by the caller while job_open_ is false, published by job_open_ = true (and a
  // bump of generation_ to wake workers). A worker joins by incrementing active_workers_ and only then
  // checking job_open_; the caller closes the job when the tasks are exhausted and waits until
  // active_workers_ is 0. So workers that were not scheduled in time never hold the caller up (the machine
  // may be oversubscribed).
  TaskFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_tasks_ = 0;
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<uint64_t> generation_{0};  // bumped once per job; idle workers wait for a change
  alignas(64) std::atomic<bool> job_open_{false};
  alignas(64) std::atomic<int> active_workers_{0};  // workers inside the current job
  alignas(64) std::atomic<int> sleeping_{0};        // workers blocked in generation_.wait (need a notify)
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace tandem
