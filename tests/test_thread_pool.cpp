#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

namespace tandem {
namespace {

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  for (int n_threads : {1, 2, 3, 4}) {
    ThreadPool pool(n_threads);
    EXPECT_EQ(pool.n_threads(), n_threads);
    for (int64_t n_tasks : {0, 1, 2, 7, 100, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n_tasks));
      std::atomic<int> bad_thread{0};
      pool.parallel_for(n_tasks, [&](int64_t task, int thread_id) {
        hits[size_t(task)].fetch_add(1);
        if (thread_id < 0 || thread_id >= n_threads) bad_thread.fetch_add(1);
      });
      for (int64_t t = 0; t < n_tasks; ++t) EXPECT_EQ(hits[size_t(t)].load(), 1) << "task " << t;
      EXPECT_EQ(bad_thread.load(), 0);
    }
  }
}

TEST(ThreadPool, ManySmallJobsBackToBack) {
  // A decode step issues hundreds of tiny loops: check the hand-off stays correct over many jobs.
  ThreadPool pool(3);
  int64_t total = 0;
  for (int job = 0; job < 2000; ++job) {
    std::vector<int64_t> partial(3, 0);
    pool.parallel_for(5, [&](int64_t task, int thread_id) { partial[size_t(thread_id)] += task + job; });
    total += std::accumulate(partial.begin(), partial.end(), int64_t{0});
  }
  int64_t expected = 0;
  for (int job = 0; job < 2000; ++job) expected += 10 + 5 * job;
  EXPECT_EQ(total, expected);
}

TEST(ThreadPool, SurvivesIdleSleep) {
  ThreadPool pool(2);
  std::atomic<int> count{0};
  pool.parallel_for(10, [&](int64_t, int) { count.fetch_add(1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // workers fall asleep
  pool.parallel_for(10, [&](int64_t, int) { count.fetch_add(1); });
  EXPECT_EQ(count.load(), 20);
}

TEST(ThreadPool, NestedParallelForRunsSerially) {
  ThreadPool pool(2);
  std::atomic<int> count{0};
  pool.parallel_for(4, [&](int64_t, int outer_id) {
    pool.parallel_for(3, [&](int64_t, int inner_id) {
      EXPECT_EQ(inner_id, 0);
      count.fetch_add(1);
    });
    (void)outer_id;
  });
  EXPECT_EQ(count.load(), 12);
}

TEST(ThreadPool, RethrowsTheFirstException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(50,
                                 [&](int64_t task, int) {
                                   if (task == 17) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  // The pool stays usable.
  std::atomic<int> count{0};
  pool.parallel_for(8, [&](int64_t, int) { count.fetch_add(1); });
  EXPECT_EQ(count.load(), 8);
}

}  // namespace
}  // namespace tandem
