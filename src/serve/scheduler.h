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
// seed gives the same text whatever else runs (the CPU kernels give a row the same logits in any batch:
// tests/test_batch_invariance.cpp; on CUDA, SchedulerParams::batch_invariant asks the same of the GPU
// kernels).
//
// Speculative decoding (`--draft FILE`: a draft model, or a DFlash drafter, by its architecture): the
// library's Drafter (speculative.h: DraftModelDrafter or DflashDrafter, one cache sequence per slot) drafts
// for every generating request at the start of a step, all requests in one call, and the request's decode row
// becomes [pending, d1 .. dn], all with logits; the longest acceptable prefix is kept (greedy: equal to the
// target's pick; sampled: the lossless acceptance test, speculative_accept) plus one target token, and the
// rejected rows leave the KV (Session::seq_remove). Prefill chunks of other requests share the step as
// before. Every step's batch goes to Drafter::target_decoded after the target's decode (DFlash injects the
// target features of all its rows, prompt chunks included: the target's taps write them); a prefix fork is
// mirrored with Drafter::fork; a finished or cancelled request's drafter cache goes with Drafter::reset.
//
// Canvas diffusion (a model whose GGUF is a canvas model, diffusion.h): requests are answered one at a time
// through the diffusion driver, one block of canvas_length tokens per call of diffuse() over the prompt and
// the blocks kept so far (the same result as one multi-block call), each block streamed as it is kept. The
// request's seed is the EB sampler's; temperature / top-k / top-p do not apply (the EB parameters are the
// GGUF's); logprobs are refused.
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
#include "tandem/diffusion.h"
#include "tandem/generator.h"
#include "tandem/sampling.h"
#include "tandem/session.h"
#include "tandem/speculative.h"

namespace tandem::serve {

struct SchedulerParams {
  int32_t n_slots = 4;            // concurrent sequences (--parallel)
  int32_t n_ctx = 4096;           // KV positions in total (--ctx)
  bool kv_unified = false;        // one pool for all slots; else n_ctx / n_slots per slot
  int32_t n_batch = 512;          // token budget of one step (decode rows + prefill chunks)
  double queue_timeout_s = 30.0;  // a request waiting longer for a slot / KV room fails (503)
  int32_t max_queue = 1024;       // more waiting requests than this: rejected at once (503)
  // Every row's logits as if decoded alone (SessionParams::batch_invariant): what the same seed gives does
  // not depend on what else runs, also on CUDA (the CPU kernels are so anyway). Costs prefill throughput on
  // GPUs.
  bool batch_invariant = false;
  // Where the next tokens are drawn (--device-sampling): On, the rows of a step go to the output device in one
  // Session::sample call (Ops::sample_rows; only the ids cross to the host, one synchronization a step); Off,
  // each row's logits are copied to the host and drawn there by the request's Sampler (a copy, a synchronization
  // and a scan of the vocabulary per row: on a GPU with 150k-entry vocabularies and many slots, milliseconds a
  // step). Auto: On when the output device is a GPU. Requests with penalties or a custom chain order draw on the
  // host either way (Session::sample); a request asking for logprobs draws on the device too and gets its row's
  // logits copied for them. A seeded draw is reproducible within a mode, not across modes
  // (GeneratorParams::device_sampling); greedy picks are the same.
  Toggle device_sampling = Toggle::Auto;
  SpeculativeParams spec{};  // with a draft model: tokens drafted per step (draft_max), draft_min, p_min
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
  // draft: a draft model for speculative decoding (same vocabulary as model), a DFlash drafter (architecture
  // dflash, loaded with ModelParams::share_weights_from = model), or null. A canvas diffusion model is served
  // through the diffusion driver (no draft then). Throws Error for a drafter that does not fit the model
  // (vocabulary, DFlash hidden size or target layers).
  Scheduler(std::shared_ptr<Model> model, SessionParams session_params, SchedulerParams params,
            std::shared_ptr<Model> draft = nullptr);
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
  bool is_canvas() const { return canvas_ != nullptr; }
  bool is_speculative() const { return drafter_ != nullptr; }
  // Whether the next tokens are drawn on the output device (--device-sampling resolved; false for a canvas model).
  bool samples_on_device() const { return device_sampling_; }
  // Stops the loop; waiting and running requests end with Rejected.
  void stop();

 private:
  struct Active;
  struct Waiting {
    ServeRequest req;
    std::chrono::steady_clock::time_point since;
  };
  void loop();
  void admit(std::chrono::steady_clock::time_point now);
  void expire_waiting(std::chrono::steady_clock::time_point now);
  bool step();
  void sample_row(Active& a, size_t row);
  // Rows whose token is drawn on the device at the end of the step (Session::sample), in emit order.
  struct DeviceDraw {
    Active* a;
    size_t row;
  };
  std::vector<DeviceDraw> device_draws_;
  bool device_sampling_ = false;  // params_.device_sampling resolved against the output device
  // With device sampling, queues `row` for the step's one device draw (draw_queued_on_device); otherwise samples
  // it on the host now (sample_row).
  void sample_row_or_queue(Active& a, size_t row);
  void draw_queued_on_device();
  // Emits `token` (drawn from `logits`) for `a`: metrics, logprobs, text, stop strings, max_tokens; an
  // end-of-generation token finishes it instead. Returns true when the request finished.
  bool emit(Active& a, int32_t token, std::span<const float> logits);
  // Speculative: the tokens of one request's verify rows [row0, row0 + nd]; trims its rejected rows.
  void accept_draft(Active& a, size_t row0, const Draft& d);
  void canvas_loop();
  void run_canvas(Waiting w);
  void finish(Active& a, FinishReason reason);
  void release(Active& a);
  void note_draft_kv();  // the drafter's cache cells into the metrics
  bool push_text(Active& a, const std::string& piece, std::string& out);
  int64_t reserved_positions() const;

  std::shared_ptr<Model> model_;
  SchedulerParams params_;
  std::unique_ptr<Session> session_;
  int32_t block_ = 16;
  const tokenizer::Tokenizer* tok_ = nullptr;
  Metrics metrics_;

  // Speculative decoding (a draft model given).
  std::shared_ptr<Model> draft_model_;
  std::unique_ptr<Session> draft_session_;
  std::unique_ptr<Drafter> drafter_;
  std::vector<Draft> drafts_;  // per generating request of the step
  // Canvas diffusion (a canvas model given).
  std::unique_ptr<CanvasSource> canvas_;
  CanvasModelInfo canvas_info_{};
  int32_t canvas_max_prompt_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiting> waiting_;  // guarded by mu_
  bool stopping_ = false;        // guarded by mu_

  std::vector<std::unique_ptr<Active>> slots_;  // per sequence id: the request holding it, or null
  Batch batch_;
  std::thread thread_;
};

}  // namespace tandem::serve
