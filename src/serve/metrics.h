// Server metrics, rendered as Prometheus text by GET /metrics. Written by the scheduler thread and the HTTP
// threads, read by /metrics: every field is behind one mutex (updates are a few per step).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v);
  // Prometheus text for metric `name` (cumulative buckets, sum, count).
  std::string render(const std::string& name, const std::string& help) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void on_step(int running, int queued, int64_t kv_used, int64_t kv_total);
  // KV cells after a step's decode, before its tokens reach the clients (so a client that has a token sees
  // the cells that produced it in /metrics).
  void on_kv(int64_t kv_used, int64_t kv_total);
  void on_prompt_tokens(int64_t n);
  void on_prompt_tokens_reused(int64_t n);  // forked from another request's KV (prefix sharing)
  void on_generated_token();
  void on_first_token(double seconds);  // time to first token of a request
  void on_inter_token(double seconds);
  void on_request_done(bool cancelled);
  void on_request_rejected();
  void on_http_request();
  // Speculative decoding: one request's verify of `drafted` draft tokens, `accepted` of them kept.
  void on_speculative(int64_t drafted, int64_t accepted);
  // Shows the speculative metrics; kind: "draft" (a draft model) or "dflash" (a DFlash drafter).
  void set_speculative(const std::string& kind);
  // The drafter's cache cells after a step (its own KV: the draft model's, or DFlash's injected features).
  void on_draft_kv(int64_t used, int64_t total);
  int64_t kv_used() const;
  std::string render() const;

 private:
  mutable std::mutex mu_;
  int running_ = 0, queued_ = 0;
  int64_t kv_used_ = 0, kv_total_ = 0;
  uint64_t prompt_tokens_ = 0, prompt_tokens_reused_ = 0, generated_tokens_ = 0;
  bool speculative_ = false;  // the speculative metrics are shown
  std::string spec_kind_;
  int64_t draft_kv_used_ = 0, draft_kv_total_ = 0;
  uint64_t spec_cycles_ = 0, spec_drafted_ = 0, spec_accepted_ = 0;
  uint64_t requests_done_ = 0, requests_cancelled_ = 0, requests_rejected_ = 0, http_requests_ = 0;
  double start_s_ = 0.0;
  // tokens/s over the last window: (time, generated total) at the window start
  double window_t_ = 0.0;
  uint64_t window_tokens_ = 0;
  double tokens_per_s_ = 0.0;
  Histogram ttft_, itl_;
};

}  // namespace tandem::serve
