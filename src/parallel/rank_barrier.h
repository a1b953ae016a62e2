// Host-side meeting points of the in-process comms (cpu and copy): a reusable barrier that can be aborted,
// and a board on which every rank posts its call before a collective, so that a rank with bad arguments, or
// ranks that disagree on the shape, make every rank throw the same Error instead of leaving the others
// waiting.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem::parallel {

// A barrier for a fixed number of threads, reusable (a generation counter tells one round from the next) and
// abortable: abort() wakes every waiting thread, and it and every later arrive_and_wait() throw Error.
class RankBarrier {
 public:
  explicit RankBarrier(int n_threads) : n_(n_threads) {}

  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (aborted_.load(std::memory_order_relaxed)) throw_aborted();
    const uint64_t generation = generation_.load(std::memory_order_relaxed);
    if (++waiting_ == n_) {
      waiting_ = 0;
      generation_.store(generation + 1, std::memory_order_release);
      lock.unlock();
      cv_.notify_all();
      return;
    }
    lock.unlock();
    // Spin a little before sleeping. GPU ranks only enqueue work, so they reach a collective within a few
    // microseconds of each other, while waking a thread that sleeps on a condition variable takes tens of
    // microseconds: with two all-reduces per layer (three meetings each in the copy comm) sleeping alone cost
    // a 0.6B model most of its decode speed. The spin is bounded in time, and yields, so CPU ranks that share
    // few cores with their compute threads lose little.
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicroseconds);
    for (uint32_t i = 1;; ++i) {
      if (generation_.load(std::memory_order_acquire) != generation) return;
      if (aborted_.load(std::memory_order_relaxed)) break;
      if ((i & 63) == 0) {
        if (std::chrono::steady_clock::now() >= spin_until) break;
        std::this_thread::yield();
      }
    }
    lock.lock();
    cv_.wait(lock, [&] {
      return generation_.load(std::memory_order_relaxed) != generation ||
             aborted_.load(std::memory_order_relaxed);
    });
    // A round that completed before the abort still counts: this thread is released, the next call throws.
    if (generation_.load(std::memory_order_relaxed) == generation) throw_aborted();
  }

  void abort() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted_.store(true, std::memory_order_relaxed);
    }
    cv_.notify_all();
  }

  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }

 private:
  static constexpr int kSpinMicroseconds = 50;

  [[noreturn]] static void throw_aborted() {
    throw Error("collective communication was aborted (another rank failed); this comm cannot be used again");
  }

  const int n_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int waiting_ = 0;                      // guarded by mutex_
  std::atomic<uint64_t> generation_{0};  // written under mutex_; read by spinning waiters without it
  std::atomic<bool> aborted_{false};     // written under mutex_
};

// What one rank asks for in a collective. Every rank must post the same op, bytes, dtype and root.
struct RankCall {
  const char* op = "";  // "all_reduce_sum", "all_gather", "broadcast", "barrier" (a static string)
  size_t bytes = 0;     // send bytes per rank
  DType dtype = DType::F32;
  int root = -1;        // broadcast only
  std::string error;    // non-empty: this rank's arguments are invalid (the message says why)
  void* ptr = nullptr;  // the rank's buffer that the others may read or write (x, or all_gather's recv)
  const void* ptr2 = nullptr;  // a second one (all_gather's send)
};

// The board: each rank posts its RankCall, meets the others, and gets every rank's post back. Posts are
// double buffered by call parity: a rank can post call k + 2 only after every rank has entered call k + 1,
// i.e. after every rank is done reading the posts of call k, so reading them needs no extra barrier.
class RankBoard {
 public:
  explicit RankBoard(int n_ranks)
      : n_(n_ranks),
        barrier_(n_ranks),
        calls_{std::vector<RankCall>(size_t(n_ranks)), std::vector<RankCall>(size_t(n_ranks))},
        count_(size_t(n_ranks), 0) {}

  int n_ranks() const { return n_; }
  RankBarrier& barrier() { return barrier_; }
  void abort() { barrier_.abort(); }
  bool aborted() const { return barrier_.aborted(); }

  // Posts `call` for `rank`, waits for every rank and returns all posts of this call (indexed by rank).
  // Throws the same Error on every rank when a rank posted an error or the posts disagree. `call` is moved
  // from.
  const std::vector<RankCall>& enter(int rank, RankCall& call) {
    std::vector<RankCall>& posts = calls_[count_[size_t(rank)]++ & 1];
    std::swap(posts[size_t(rank)], call);
    barrier_.arrive_and_wait();
    for (int r = 0; r < n_; ++r) {
      const RankCall& c = posts[size_t(r)];
      if (!c.error.empty()) throw Error(c.error);
    }
    const RankCall& c0 = posts[0];
    for (int r = 1; r < n_; ++r) {
      const RankCall& c = posts[size_t(r)];
      if (std::strcmp(c.op, c0.op) != 0)
        throw Error(std::string("collectives out of order: rank 0 called ") + c0.op + " while rank " +
                    std::to_string(r) + " called " + c.op +
                    " (every rank must call the same collectives in "
                    "the same order)");
      if (c.bytes != c0.bytes || c.dtype != c0.dtype)
        throw Error(std::string(c0.op) + ": rank " + std::to_string(r) + " passed " +
                    std::to_string(c.bytes) + " bytes of " + dtype_name(c.dtype) + " but rank 0 passed " +
                    std::to_string(c0.bytes) + " bytes of " + dtype_name(c0.dtype) +
                    " (every rank must pass tensors of the same shape and dtype)");
      if (c.root != c0.root)
        throw Error(std::string(c0.op) + ": rank " + std::to_string(r) + " passed root " +
                    std::to_string(c.root) + " but rank 0 passed root " + std::to_string(c0.root));
    }
    return posts;
  }

 private:
  const int n_;
  RankBarrier barrier_;
  std::vector<RankCall> calls_[2];
  std::vector<uint64_t> count_;  // calls entered, per rank (each entry written by its rank's thread only)
};

}  // namespace tandem::parallel
