// The serving scheduler: continuous batching over one Session, driven from its own thread.
//
// Requests join and leave between steps. Each step builds one Batch (the step seam, Session::decode): one
// decode row for every request that is generating, then prompt chunks of requests still prefilling, until the
// per-step token budget (`n_batch`) is used. A prompt longer than the budget is prefilled over several steps,
// mixed with the decode rows of the others, so a long prompt never stalls the running streams.
//
// Slots: --parallel N sequences (session sequence ids 0..N-1). A request holds one from admission to its end;
// its KV positions are freed at once when it finishes or is cancelled (Session::seq_clear).
//
// Prefix sharing: at admission a request's prompt is compared with the tokens already in the KV of every
// running request; the longest common prefix (at least one block) is forked (Session::seq_fork: the blocks
// are shared, not copied), and only the rest is prefilled. A shared system prompt is thus decoded once.
//
// Admission control: a request is admitted when a slot is free and the KV can hold its prompt plus max_tokens
// beside what the running requests reserved (kv_unified: one pool of n_ctx; otherwise each slot has its own
// partition of n_ctx / N positions, and a request must fit its partition). Requests wait in FIFO order; one
// that waited longer than `queue_timeout_s` fails with Rejected (HTTP 503).
//
// Sampling: each request has its own Sampler seeded by its seed, sampled from its own logits row, so the same
// seed gives the same text whatever else runs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/metrics.h"
#include "tandem/generator.h"
#include "tandem/sampling.h"
#include "tandem/session.h"

namespace tandem::serve {

struct SchedulerParams {
  int32_t n_slots = 4;            // concurrent sequences (--parallel)
  int32_t n_ctx = 4096;           // KV positions in total (--ctx)
  bool kv_unified = false;        // one pool for all slots; else n_ctx / n_slots per slot
  int32_t n_batch = 512;          // token budget of one step (decode rows + prefill chunks)
  double queue_timeout_s = 30.0;  // a request waiting longer for a slot / KV room fails (503)
  int32_t max_queue = 1024;       // more waiting requests than this: rejected at once (503)
};

struct TopLogprob {
  int32_t token;
  float logprob;
};

// One event of a request, delivered to its channel.
struct RequestEvent {
  int index = 0;                             // the choice index (n > 1)
  int32_t token = -1;                        // the generated token; -1 on the last event
  std::string text;                          // text that became final with it
  float logprob = 0.0f;                      // log-probability of the token (when logprobs were asked for)
  std::vector<TopLogprob> top;               // the most likely alternatives (top_logprobs)
  FinishReason finish = FinishReason::None;  // on the last event
  bool rejected = false;  // the last event: the request never ran (queue timeout / full queue)
  std::string error;      // why it was rejected
  int32_t n_prompt = 0;   // on the last event: prompt tokens
  int32_t n_generated = 0;
};

// Where a request's events go: one per HTTP request (its n choices share it).
class Channel {
 public:
  void push(RequestEvent e);
  // Waits up to `timeout` for events; returns what has arrived (possibly nothing).
  std::vector<RequestEvent> pop(std::chrono::milliseconds timeout);
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;
  std::atomic<bool> cancelled_{false};
};

struct ServeRequest {
  std::vector<int32_t> prompt;
  GenerationParams gen;     // max_tokens, sampling (seed), stop, ignore_eos
  int32_t n_logprobs = -1;  // -1: none; k >= 0: the token's logprob and the k most likely
  int index = 0;
  std::shared_ptr<Channel> channel;
};

class Scheduler {
 public:
  Scheduler(std::shared_ptr<Model> model, SessionParams session_params, SchedulerParams params);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Throws tandem::Error for a request that can never run (empty prompt, longer than a slot's context, a
  // token outside the vocabulary, bad sampling parameters); otherwise queues it.
  void submit(ServeRequest req);
  // Largest prompt + generation one request can have.
  int64_t slot_capacity() const;
  const SchedulerParams& params() const { return params_; }
  Metrics& metrics() { return metrics_; }
  const Model& model() const { return *model_; }
  // Stops the loop; waiting and running requests end with Rejected.
  void stop();

 private:
  struct Active;
  void loop();
  void admit(std::chrono::steady_clock::time_point now);
  bool step();
  void sample_row(Active& a, size_t row);
  void finish(Active& a, FinishReason reason);
  void release(Active& a);
  bool push_text(Active& a, const std::string& piece, std::string& out);
  int64_t reserved_positions() const;

  std::shared_ptr<Model> model_;
  SchedulerParams params_;
  std::unique_ptr<Session> session_;
  int32_t block_ = 16;
  const tokenizer::Tokenizer* tok_ = nullptr;
  Metrics metrics_;

  std::mutex mu_;
  std::condition_variable cv_;
  struct Waiting {
    ServeRequest req;
    std::chrono::steady_clock::time_point since;
  };
  std::deque<Waiting> waiting_;  // guarded by mu_
  bool stopping_ = false;        // guarded by mu_

  std::vector<std::unique_ptr<Active>> slots_;  // per sequence id: the request holding it, or null
  Batch batch_;
  std::vector<int32_t> row_slot_;  // per batch row with logits: its slot
  std::thread thread_;
};

}  // namespace tandem::serve
