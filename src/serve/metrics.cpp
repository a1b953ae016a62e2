// Prometheus text for the server's counters and latency histograms (src/serve/metrics.h).
#include "serve/metrics.h"

#include <chrono>
#include <cstdio>

namespace tandem::serve {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string metric(const std::string& name, const std::string& type, const std::string& help, double v) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + num(v) + "\n";
}

// Seconds, from 1 ms to 60 s.
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

void Histogram::observe(double v) {
  size_t b = 0;
  while (b < bounds_.size() && v > bounds_[b]) ++b;
  ++counts_[b];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string s = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t b = 0; b < counts_.size(); ++b) {
    cum += counts_[b];
    const std::string le = b < bounds_.size() ? num(bounds_[b]) : "+Inf";
    s += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cum) + "\n";
  }
  s += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  return s;
}

Metrics::Metrics()
    : start_s_(now_s()), window_t_(start_s_), ttft_(latency_bounds()), itl_(latency_bounds()) {}

void Metrics::on_step(int running, int queued, int64_t kv_used, int64_t kv_total) {
  std::lock_guard lock(mu_);
  running_ = running;
  queued_ = queued;
  kv_used_ = kv_used;
  kv_total_ = kv_total;
  const double t = now_s();
  if (t - window_t_ >= 1.0) {  // a rate over about one second
    tokens_per_s_ = double(generated_tokens_ - window_tokens_) / (t - window_t_);
    window_t_ = t;
    window_tokens_ = generated_tokens_;
  } else if (running == 0 && t - window_t_ >= 0.0 && generated_tokens_ == window_tokens_) {
    tokens_per_s_ = 0.0;
  }
}

void Metrics::on_kv(int64_t kv_used, int64_t kv_total) {
  std::lock_guard lock(mu_);
  kv_used_ = kv_used;
  kv_total_ = kv_total;
}
void Metrics::on_prompt_tokens(int64_t n) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += uint64_t(n);
}
void Metrics::on_prompt_tokens_reused(int64_t n) {
  std::lock_guard lock(mu_);
  prompt_tokens_reused_ += uint64_t(n);
}
void Metrics::on_generated_token() {
  std::lock_guard lock(mu_);
  ++generated_tokens_;
}
void Metrics::on_first_token(double seconds) {
  std::lock_guard lock(mu_);
  ttft_.observe(seconds);
}
void Metrics::on_inter_token(double seconds) {
  std::lock_guard lock(mu_);
  itl_.observe(seconds);
}
void Metrics::on_request_done(bool cancelled) {
  std::lock_guard lock(mu_);
  ++requests_done_;
  if (cancelled) ++requests_cancelled_;
}
void Metrics::on_request_rejected() {
  std::lock_guard lock(mu_);
  ++requests_rejected_;
}
void Metrics::on_http_request() {
  std::lock_guard lock(mu_);
  ++http_requests_;
}
void Metrics::on_speculative(int64_t drafted, int64_t accepted) {
  std::lock_guard lock(mu_);
  ++spec_cycles_;
  spec_drafted_ += uint64_t(drafted);
  spec_accepted_ += uint64_t(accepted);
}
void Metrics::set_speculative(const std::string& kind) {
  std::lock_guard lock(mu_);
  speculative_ = true;
  spec_kind_ = kind;
}
void Metrics::on_draft_kv(int64_t used, int64_t total) {
  std::lock_guard lock(mu_);
  draft_kv_used_ = used;
  draft_kv_total_ = total;
}
int64_t Metrics::kv_used() const {
  std::lock_guard lock(mu_);
  return kv_used_;
}

std::string Metrics::render() const {
  std::lock_guard lock(mu_);
  std::string s;
  s += metric("tandem_requests_running", "gauge", "Requests holding a slot.", running_);
  s += metric("tandem_requests_queued", "gauge", "Requests waiting for a slot or KV room.", queued_);
  s += metric("tandem_requests_finished_total", "counter", "Requests that ended (incl. cancelled).",
              double(requests_done_));
  s += metric("tandem_requests_cancelled_total", "counter", "Requests cancelled by a client disconnect.",
              double(requests_cancelled_));
  s += metric("tandem_requests_rejected_total", "counter", "Requests rejected with 503 (queue timeout/full).",
              double(requests_rejected_));
  s += metric("tandem_http_requests_total", "counter", "HTTP requests received.", double(http_requests_));
  s += metric("tandem_prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(prompt_tokens_));
  s += metric("tandem_prompt_tokens_reused_total", "counter",
              "Prompt tokens not prefilled: forked from another request's KV cells (prefix sharing).",
              double(prompt_tokens_reused_));
  s += metric("tandem_generated_tokens_total", "counter", "Tokens generated.", double(generated_tokens_));
  s += metric("tandem_tokens_per_second", "gauge", "Generated tokens per second over the last second.",
              tokens_per_s_);
  s += metric("tandem_kv_cells_used", "gauge", "KV cache positions in use.", double(kv_used_));
  s += metric("tandem_kv_cells_total", "gauge", "KV cache positions in total.", double(kv_total_));
  if (speculative_) {
    s += metric("tandem_speculative_verifies_total", "counter",
                "Speculative verify passes (one per generating request and step).", double(spec_cycles_));
    s += metric("tandem_speculative_drafted_total", "counter", "Draft tokens proposed.",
                double(spec_drafted_));
    s += metric("tandem_speculative_accepted_total", "counter", "Draft tokens accepted.",
                double(spec_accepted_));
    s += metric("tandem_speculative_acceptance_rate", "gauge", "Accepted / drafted draft tokens.",
                spec_drafted_ ? double(spec_accepted_) / double(spec_drafted_) : 0.0);
    s += metric("tandem_speculative_mean_accepted_length", "gauge",
                "Tokens per verify pass: (accepted + verifies) / verifies.",
                spec_cycles_ ? double(spec_accepted_ + spec_cycles_) / double(spec_cycles_) : 0.0);
    s += "# HELP tandem_speculative_drafter The drafter kind (draft: a draft model; dflash: a DFlash "
         "drafter).\n# TYPE tandem_speculative_drafter gauge\ntandem_speculative_drafter{kind=\"" +
         spec_kind_ + "\"} 1\n";
    s += metric("tandem_draft_kv_cells_used", "gauge", "Drafter cache positions in use.",
                double(draft_kv_used_));
    s += metric("tandem_draft_kv_cells_total", "gauge", "Drafter cache positions in total.",
                double(draft_kv_total_));
  }
  s += ttft_.render("tandem_time_to_first_token_seconds", "Time from arrival to the first token.");
  s += itl_.render("tandem_inter_token_latency_seconds", "Time between consecutive tokens of a request.");
  return s;
}

}  // namespace tandem::serve
