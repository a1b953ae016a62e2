// tandem::Generator: the per-request autoregressive loop over a Session (include/tandem/generator.h).
//
// A step is three parts, so that a later device path can enqueue one batch while the host prepares the next:
// prepare_batch (the rows: prompts of new requests, one token of every running one), decode_batch (the
// forward, the logits hook, the forks of shared prompts) and sample_batch (one token per request with a row,
// through sample_row, then the end-of-generation / stop / length checks and the stream events).
#include "tandem/generator.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/error.h"
#include "eval/non_finite.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

// The length of the longest tail of `text` that is a proper prefix of `stop` (text that may still become
// the stop string).
size_t partial_stop_tail(const std::string& text, const std::string& stop) {
  for (size_t n = std::min(text.size(), stop.size() - 1); n > 0; --n)
    if (text.compare(text.size() - n, n, stop, 0, n) == 0) return n;
  return 0;
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::None:
      return "none";
    case FinishReason::Length:
      return "length";
    case FinishReason::EndOfGeneration:
      return "eog";
    case FinishReason::Stop:
      return "stop";
  }
  return "?";
}

struct Generator::Request {
  Request(int id_, std::vector<int32_t> prompt_, GenerationParams params_, StreamCallback on_token_,
          int share_of_)
      : id(id_),
        prompt(std::move(prompt_)),
        params(std::move(params_)),
        on_token(std::move(on_token_)),
        sampler(params.sampling),
        share_of(share_of_) {}

  int id;
  std::vector<int32_t> prompt;
  GenerationParams params;
  StreamCallback on_token;
  Sampler sampler;
  int share_of;  // >= 0: the request whose sequence decodes this request's prompt (then forked)
  std::unique_ptr<tokenizer::StreamingDetokenizer> detok;
  bool prefilled = false;   // the prompt is in the KV cache
  size_t prompt_row = 0;    // the step that decodes the prompt: the batch row of its last token
  int32_t next_token = -1;  // the last kept token, decoded by the next step
  std::string held;         // decoded text not released yet (could be the start of a stop string)
  Clock::time_point t_prefilled{};
  GenerationResult result;
};

Generator::Generator(Session& session, GeneratorParams params)
    : session_(session), params_(std::move(params)) {
  const Model& model = session_.model();
  if (params_.use_tokenizer && model.has_tokenizer()) tok_ = &model.tokenizer();
  eos_ids_ = model.info().eos_ids;
  seq_owner_.assign(size_t(session_.params().n_seq_max), -1);
}

Generator::~Generator() = default;

Generator::Request& Generator::request(int id) const {
  check(id >= 0 && size_t(id) < requests_.size(), "request " + std::to_string(id) +
                                                      " does not exist (the generator has " +
                                                      std::to_string(requests_.size()) + " requests)");
  return *requests_[size_t(id)];
}

const GenerationResult& Generator::result(int id) const {
  return request(id).result;
}

bool Generator::done() const {
  return running_.empty();
}
int Generator::n_running() const {
  return int(running_.size());
}
int Generator::n_requests() const {
  return int(requests_.size());
}

int32_t Generator::free_seq() const {
  for (size_t s = 0; s < seq_owner_.size(); ++s)
    if (seq_owner_[s] < 0) return int32_t(s);
  return -1;
}

void Generator::check_request(const std::vector<int32_t>& prompt, const GenerationParams& params,
                              int n) const {
  check(!prompt.empty(), "the prompt is empty: a request needs at least one prompt token");
  const int32_t n_ctx = session_.params().n_ctx;
  check(int64_t(prompt.size()) <= n_ctx, "the prompt has " + std::to_string(prompt.size()) +
                                             " tokens but the context holds " + std::to_string(n_ctx));
  const int32_t n_vocab = session_.n_vocab();
  for (size_t i = 0; i < prompt.size(); ++i)
    check(prompt[i] >= 0 && prompt[i] < n_vocab,
          "token id " + std::to_string(prompt[i]) + " is out of range: the vocabulary has " +
              std::to_string(n_vocab) + " tokens (0.." + std::to_string(n_vocab - 1) + ")");
  check(params.max_tokens >= 0, "max_tokens must be >= 0 (the number of tokens to generate), got " +
                                    std::to_string(params.max_tokens));
  params.sampling.validate();
  for (size_t i = 0; i < params.stop.size(); ++i)
    check(!params.stop[i].empty(), "stop string " + std::to_string(i) + " is empty");
  if (!params.stop.empty() && !tok_) {
    std::string why = "the generator was created with use_tokenizer = false";
    if (params_.use_tokenizer) {
      try {
        (void)session_.model().tokenizer();
      } catch (const Error& e) {
        why = std::string("this model's cannot be used: ") + e.what();
      }
    }
    throw Error("stop strings need the model's tokenizer, and " + why);
  }
  const int64_t n_free = std::count(seq_owner_.begin(), seq_owner_.end(), -1);
  const std::string n_seq = std::to_string(seq_owner_.size());
  if (n == 1)
    check(n_free >= 1, "all " + n_seq + " sequences of the session (SessionParams::n_seq_max = " + n_seq +
                           ") hold unfinished requests: make the session with a larger n_seq_max, or add the "
                           "request when one has finished");
  else
    check(n_free >= n, std::to_string(n) + " requests need " + std::to_string(n) + " free sequences, but " +
                           std::to_string(n_free) + " of the session's " + n_seq +
                           " (SessionParams::n_seq_max) are free");
}

int Generator::enqueue(std::vector<int32_t> prompt, GenerationParams params, StreamCallback on_token,
                       int share_of) {
  const int id = int(requests_.size());
  auto req =
      std::make_unique<Request>(id, std::move(prompt), std::move(params), std::move(on_token), share_of);
  const int32_t seq = free_seq();
  req->result.seq = seq;
  req->result.n_prompt_tokens = int32_t(req->prompt.size());
  req->sampler.accept(req->prompt);  // the prompt counts for the penalties
  if (tok_) req->detok = std::make_unique<tokenizer::StreamingDetokenizer>(*tok_);
  session_.seq_clear(seq);
  seq_owner_[size_t(seq)] = id;
  requests_.push_back(std::move(req));
  running_.push_back(id);
  return id;
}

int Generator::add_request(std::vector<int32_t> prompt, GenerationParams params, StreamCallback on_token) {
  check_request(prompt, params, 1);
  return enqueue(std::move(prompt), std::move(params), std::move(on_token), -1);
}

std::vector<int> Generator::add_shared_prompt_requests(std::vector<int32_t> prompt, int n,
                                                       GenerationParams params, StreamCallback on_token) {
  check(n >= 1, "add_shared_prompt_requests needs at least 1 request, got " + std::to_string(n));
  check_request(prompt, params, n);
  std::vector<int> ids;
  const uint64_t seed = params.sampling.seed;
  for (int i = 0; i < n; ++i) {
    GenerationParams p = params;
    p.sampling.seed = seed + uint64_t(i);
    ids.push_back(enqueue(prompt, std::move(p), on_token, i == 0 ? -1 : ids.front()));
  }
  return ids;
}

void Generator::run() {
  while (!done()) step();
}

void Generator::step() {
  if (done()) return;
  prepare_batch();
  decode_batch();
  sample_batch();
}

// A request of max_tokens 0 samples nothing: its prompt is decoded only for the logits hook. A shared prompt
// is decoded for its first request.
bool Generator::decodes_prompt(const Request& req) const {
  const Request& root = req.share_of >= 0 ? *requests_[size_t(req.share_of)] : req;
  return root.params.max_tokens > 0 || bool(params_.on_logits);
}

// The rows of this step: the next token of every running request first (in the order of adding), then the
// prompts of the new ones. Changes no request state that a failed decode would leave wrong (prompt_row is set
// again by the step that retries).
void Generator::prepare_batch() {
  step_start_ = Clock::now();
  batch_.clear();
  row_request_.clear();
  sample_rows_.clear();
  prefilled_.clear();
  for (int id : running_) {
    Request& req = *requests_[size_t(id)];
    if (!req.prefilled) continue;
    sample_rows_.push_back({id, batch_.size()});
    row_request_.push_back(id);
    batch_.add(req.next_token, session_.seq_len(req.result.seq), req.result.seq, true);
  }
  for (int id : running_) {
    Request& req = *requests_[size_t(id)];
    if (req.prefilled) continue;
    prefilled_.push_back(id);
    const bool wants_token = req.params.max_tokens > 0;
    if (req.share_of >= 0) {  // the prompt's rows are its first request's (added before it)
      if (wants_token) sample_rows_.push_back({id, requests_[size_t(req.share_of)]->prompt_row});
      continue;
    }
    if (!decodes_prompt(req)) continue;
    for (size_t j = 0; j < req.prompt.size(); ++j) {
      const bool last = j + 1 == req.prompt.size();
      row_request_.push_back(id);
      batch_.add(req.prompt[j], int32_t(j), req.result.seq, last || params_.all_prompt_logits);
    }
    req.prompt_row = batch_.size() - 1;
    if (wants_token) sample_rows_.push_back({id, req.prompt_row});
  }
}

void Generator::decode_batch() {
  if (!batch_.empty()) session_.decode(batch_);
  // A model with broken weights must not print junk: the first step's sampled rows are checked once (they
  // are read to the host for sampling anyway, or copied here once on the device-sampling path).
  if (!finite_checked_ && !sample_rows_.empty()) {
    finite_checked_ = true;
    for (const RowRef& rr : sample_rows_)
      if (!eval::all_finite(session_.logits(rr.row))) {
        const Request& req = *requests_[size_t(rr.request)];
        const Request& root = req.share_of >= 0 ? *requests_[size_t(req.share_of)] : req;
        eval::throw_non_finite(session_, root.prompt, "the first step");
      }
  }
  // From here on the step is applied.
  if (params_.on_logits && !batch_.empty()) {
    logits_rows_.clear();
    for (size_t r = 0; r < batch_.size(); ++r) {
      if (!batch_.logits[r]) continue;
      logits_rows_.push_back({row_request_[r], batch_.seq_ids[r], batch_.positions[r], session_.logits(r)});
    }
    params_.on_logits(logits_rows_);
  }
  for (int id : prefilled_) {
    Request& req = *requests_[size_t(id)];
    if (req.share_of >= 0 && req.params.max_tokens > 0)
      session_.seq_fork(requests_[size_t(req.share_of)]->result.seq, req.result.seq);
  }
  const auto now = Clock::now();
  for (int id : prefilled_) {
    Request& req = *requests_[size_t(id)];
    req.prefilled = true;
    req.t_prefilled = now;
    if (decodes_prompt(req)) req.result.prompt_seconds = seconds_between(step_start_, now);
  }
}

void Generator::sample_batch() {
  if (params_.device_sampling && !sample_rows_.empty()) {
    // One device draw for every row; only the ids come back (Session::sample).
    std::vector<size_t> rows;
    std::vector<Sampler*> samplers;
    for (const RowRef& rr : sample_rows_) {
      rows.push_back(rr.row);
      samplers.push_back(&requests_[size_t(rr.request)]->sampler);
    }
    const std::vector<int32_t> ids = session_.sample(rows, samplers);
    for (size_t i = 0; i < sample_rows_.size(); ++i)
      accept_token(*requests_[size_t(sample_rows_[i].request)], ids[i]);
  } else {
    for (const RowRef& rr : sample_rows_) {
      Request& req = *requests_[size_t(rr.request)];
      accept_token(req, sample_row(req, rr.row));
    }
  }
  for (int id : prefilled_) {
    Request& req = *requests_[size_t(id)];
    if (req.params.max_tokens == 0) finish(req, FinishReason::Length);
  }
  std::erase_if(running_, [this](int id) { return requests_[size_t(id)]->result.finished(); });
}

int32_t Generator::sample_row(Request& req, size_t row) {
  return req.sampler.sample(session_.logits(row));
}

bool Generator::is_end_of_generation(int32_t token) const {
  if (tok_) return tok_->is_end_of_generation(token);
  return std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
}

void Generator::accept_token(Request& req, int32_t token) {
  req.sampler.accept(token);
  if (!req.params.ignore_eos && is_end_of_generation(token)) {
    finish(req, FinishReason::EndOfGeneration);
    return;
  }
  req.result.tokens.push_back(token);
  std::string released;
  const bool stopped = req.detok && push_text(req, req.detok->push(token), /*final=*/false, released);
  emit(req, token, released);
  if (stopped) {
    finish(req, FinishReason::Stop);
  } else if (req.result.n_generated() >= req.params.max_tokens) {
    finish(req, FinishReason::Length);  // the last token needs no forward pass
  } else {
    req.next_token = token;
  }
}

bool Generator::push_text(Request& req, std::string_view text, bool final, std::string& released) {
  req.held += text;
  size_t stop_at = std::string::npos;
  for (const std::string& s : req.params.stop) stop_at = std::min(stop_at, req.held.find(s));
  size_t keep = 0;
  if (stop_at != std::string::npos) {
    keep = req.held.size() - stop_at;  // the stop string and whatever followed it are dropped
  } else if (!final) {
    for (const std::string& s : req.params.stop) keep = std::max(keep, partial_stop_tail(req.held, s));
  }
  released.assign(req.held, 0, req.held.size() - keep);
  req.result.text += released;
  req.held.erase(0, released.size());
  if (stop_at != std::string::npos) req.held.clear();
  return stop_at != std::string::npos;
}

void Generator::emit(Request& req, int32_t token, std::string_view text) {
  if (req.on_token) req.on_token(TokenEvent{req.id, token, text, req.result.finish});
}

void Generator::finish(Request& req, FinishReason reason) {
  std::string rest;
  if (reason != FinishReason::Stop && req.detok && push_text(req, req.detok->flush(), /*final=*/true, rest))
    reason = FinishReason::Stop;  // the last bytes completed a stop string
  req.result.finish = reason;
  req.result.generation_seconds = seconds_between(req.t_prefilled, Clock::now());
  req.next_token = -1;
  session_.seq_clear(req.result.seq);
  seq_owner_[size_t(req.result.seq)] = -1;
  emit(req, -1, rest);
}

}  // namespace tandem
