#include "core/thread_pool.h"

#include <chrono>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#else
#define TANDEM_CPU_RELAX() std::this_thread::yield()
#endif

namespace tandem {
namespace {

// Spin about this long before sleeping: long enough to bridge the gap between two ops of a decode step, short
// enough that a pool on a busy machine gives its cores back quickly.
constexpr auto kSpinTime = std::chrono::microseconds(200);

thread_local bool t_inside_task = false;  // a nested parallel_for runs serially

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::thread::hardware_concurrency());
  n_threads_ = n_threads < 1 ? 1 : n_threads;
  check(n_threads_ <= kMaxThreads, "cannot use " + std::to_string(n_threads_) + " threads: at most " +
                                       std::to_string(kMaxThreads) + " (this machine has " +
                                       std::to_string(std::thread::hardware_concurrency()) +
                                       " hardware threads)");
  workers_.reserve(size_t(n_threads_ - 1));
  try {
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
  } catch (const std::exception& e) {
    // The system refused a thread: stop and join the ones started, then report (a destructor does not run
    // for a constructor that throws, and destroying joinable threads would abort).
    const size_t started = workers_.size();
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    throw Error("could not start " + std::to_string(n_threads_) + " threads (" + std::to_string(started + 1) +
                " started: " + e.what() + "); use fewer threads (-t)");
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::work_on_current_job(int thread_id) {
  const bool was_inside = t_inside_task;
  t_inside_task = true;
  for (;;) {
    if (failed_.load(std::memory_order_relaxed)) break;
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= job_tasks_) break;
    try {
      job_fn_(job_ctx_, task, thread_id);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true);
    }
  }
  t_inside_task = was_inside;
}

void ThreadPool::worker_main(int thread_id) {
  uint64_t seen = 0;
  for (;;) {
    // Wait for a new job: spin first, then sleep on the generation counter.
    uint64_t gen = generation_.load(std::memory_order_acquire);
    if (gen == seen) {
      const auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
      int spins = 0;
      while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
        TANDEM_CPU_RELAX();
        if (++spins % 64 == 0 && std::chrono::steady_clock::now() > spin_until) {
          sleeping_.fetch_add(1);
          generation_.wait(seen);
          sleeping_.fetch_sub(1);
        }
      }
    }
    seen = gen;
    if (stop_.load()) return;
    active_workers_.fetch_add(1);  // seq_cst: pairs with the caller's close-then-check
    if (job_open_.load()) work_on_current_job(thread_id);
    active_workers_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* ctx) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1 || t_inside_task) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(ctx, t, 0);
    return;
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_tasks_ = n_tasks;
  error_ = nullptr;
  failed_.store(false, std::memory_order_relaxed);
  next_task_.store(0, std::memory_order_relaxed);
  job_open_.store(true);     // publishes the job data above
  generation_.fetch_add(1);  // seq_cst: pairs with the sleeping_ check below
  if (sleeping_.load() > 0) generation_.notify_all();

  work_on_current_job(0);

  // Close the job, then wait for the workers that joined it (they may still be running their last task).
  job_open_.store(false);
  for (int spins = 0; active_workers_.load() != 0; ++spins) {
    if (spins < 4096) {
      TANDEM_CPU_RELAX();
    } else {
      std::this_thread::yield();  // a joined worker may have been descheduled mid-task
    }
  }

  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace tandem
