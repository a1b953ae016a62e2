// The serving scheduler's loop (src/serve/scheduler.h).
#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/dflash.h"
#include "model/model_impl.h"
#include "tokenizer/tokenizer.h"

namespace tandem::serve {

using Clock = std::chrono::steady_clock;

void Channel::push(RequestEvent e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

std::vector<RequestEvent> Channel::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  std::vector<RequestEvent> out(std::make_move_iterator(events_.begin()),
                                std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

struct Scheduler::Active {
  ServeRequest req;
  int32_t seq = -1;
  std::vector<int32_t> tokens;  // prompt then generated tokens
  int32_t n_kv = 0;             // tokens of `tokens` in the KV cache
  int32_t n_generated = 0;
  Sampler sampler;
  std::unique_ptr<tokenizer::StreamingDetokenizer> detok;
  std::string text;     // generated text so far (cut at a stop string)
  size_t released = 0;  // bytes of `text` already sent
  Clock::time_point arrived;
  Clock::time_point last_token;
  bool prefilled = false;
  bool finished = false;       // its last event is sent
  int32_t pending_token = -1;  // sampled, not yet in the KV (the next step's decode row)

  Active(ServeRequest r, Clock::time_point t) : req(std::move(r)), sampler(req.gen.sampling), arrived(t) {}
  // Positions it may occupy, with two blocks of slack for its partially filled blocks.
  int64_t reserve(int32_t block) const { return int64_t(req.prompt.size()) + req.gen.max_tokens + 2 * block; }
};

namespace {
bool canvas_model(const Model& m, CanvasModelInfo& info) {
  try {
    info = canvas_model_info(m);
    return true;
  } catch (const Error&) {
    return false;
  }
}
}  // namespace

Scheduler::Scheduler(std::shared_ptr<Model> model, SessionParams sp, SchedulerParams params,
                     std::shared_ptr<Model> draft)
    : model_(std::move(model)), params_(params), draft_model_(std::move(draft)) {
  check(params_.n_slots >= 1, "--parallel must be at least 1, got " + std::to_string(params_.n_slots));
  if (model_->has_tokenizer()) tok_ = &model_->tokenizer();
  if (canvas_model(*model_, canvas_info_)) {
    // A canvas diffusion model: no session of ours, the canvas source holds the prompt K/V.
    check(draft_model_ == nullptr, "--draft does not apply to a canvas diffusion model (" +
                                       model_->info().path + " answers through the diffusion driver)");
    CanvasOptions copt;
    canvas_max_prompt_ = copt.max_prompt;
    canvas_ = make_canvas_source(model_, copt);
    metrics_.on_step(0, 0, 0, 0);
    thread_ = std::thread([this] { loop(); });
    return;
  }
  check(params_.n_ctx >= params_.n_slots, "--ctx (" + std::to_string(params_.n_ctx) +
                                              ") must be at least --parallel (" +
                                              std::to_string(params_.n_slots) + ")");
  check(params_.n_batch >= 1, "--batch must be at least 1, got " + std::to_string(params_.n_batch));
  sp.n_ctx = params_.n_ctx;
  sp.n_seq_max = params_.n_slots;
  // A step holds one decode row per slot, so the budget is at least n_slots rows.
  params_.n_batch = std::max(params_.n_batch, params_.n_slots);
  sp.n_batch = params_.n_batch;
  sp.batch_invariant = sp.batch_invariant || params_.batch_invariant;
  // Speculating, every verify row has logits: room for a whole draft per slot (plus the rows that end a
  // prefill) in one forward pass.
  if (draft_model_)
    sp.n_logits_max = std::min(params_.n_batch, params_.n_slots * (std::max(params_.spec.draft_max, 0) + 2));
  session_ = std::make_unique<Session>(model_, sp);
  block_ = sp.block_size;
  device_sampling_ = params_.device_sampling == Toggle::On ||
                     (params_.device_sampling == Toggle::Auto && session_->output_device().kind == DeviceKind::CUDA);
  if (draft_model_) {
    params_.spec.validate();
    const bool dflash = draft_model_->info().arch == "dflash";
    SessionParams dsp;
    dsp.n_ctx = params_.n_ctx;  // holds what the target holds (the histories), block for block
    dsp.n_seq_max = params_.n_slots;
    dsp.n_batch = params_.n_batch;
    dsp.block_size = sp.block_size;
    dsp.kv_type = sp.kv_type;
    if (dflash) {
      // The drafter's cache holds the target's features at the positions the target holds, and keeps the
      // features of a step's rejected drafts until its next call: room for one more draft per slot.
      const int32_t n_draft = std::min(std::max(params_.spec.draft_max, 0),
                                       read_dflash_info(*draft_model_->impl().file).block_size - 1);
      dsp.n_ctx = params_.n_ctx + params_.n_slots * (n_draft + 2 * sp.block_size);
      // One pass drafts a block [last, mask x n_draft] for every slot, all mask rows with logits; a feature
      // injection has the target batch's rows.
      dsp.n_batch = std::max(params_.n_batch, params_.n_slots * (n_draft + 1));
      dsp.n_logits_max = std::max(1, params_.n_slots * n_draft);
      draft_session_ = std::make_unique<Session>(draft_model_, dsp);
      drafter_ = std::make_unique<DflashDrafter>(*draft_session_, *session_);
    } else {
      draft_session_ = std::make_unique<Session>(draft_model_, dsp);
      drafter_ = std::make_unique<DraftModelDrafter>(*draft_session_, session_->n_vocab());
    }
    metrics_.set_speculative(dflash ? "dflash" : "draft");
    metrics_.on_draft_kv(0, draft_session_->kv_capacity());
  }
  slots_.resize(size_t(params_.n_slots));
  metrics_.on_step(0, 0, 0, session_->kv_capacity());
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t Scheduler::slot_capacity() const {
  if (canvas_) return canvas_max_prompt_;  // the prompt and the blocks kept before a block's start
  // Less the admission slack (two blocks), so that an admitted request always fits.
  const int64_t total = session_->kv_capacity();
  return (params_.kv_unified ? total : total / params_.n_slots) - 2 * block_;
}

void Scheduler::submit(ServeRequest req) {
  check(!req.prompt.empty(), "the prompt is empty");
  const int64_t cap = slot_capacity();
  check(int64_t(req.prompt.size()) < cap, "the prompt has " + std::to_string(req.prompt.size()) +
                                              " tokens but a request's context holds " + std::to_string(cap) +
                                              " (--ctx / --parallel, or --kv-unified)");
  const int32_t n_vocab = int32_t(model_->info().n_vocab);
  for (int32_t t : req.prompt)
    check(t >= 0 && t < n_vocab, "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                     std::to_string(n_vocab) + ")");
  check(req.gen.max_tokens >= 0, "max_tokens must be >= 0");
  req.gen.sampling.validate();
  for (const std::string& s : req.gen.stop) check(!s.empty(), "a stop string is empty");
  check(req.gen.stop.empty() || tok_ != nullptr, "stop strings need the model's tokenizer");
  check(!canvas_ || req.n_logprobs < 0,
        "logprobs are not available from a canvas diffusion model (it samples whole canvases)");
  // Generation ends when the request's context is full (finish_reason "length").
  req.gen.max_tokens = int32_t(std::min<int64_t>(req.gen.max_tokens, cap - int64_t(req.prompt.size())));
  {
    std::lock_guard lock(mu_);
    if (stopping_ || int32_t(waiting_.size()) >= params_.max_queue) {
      RequestEvent e;
      e.index = req.index;
      e.rejected = true;
      e.error = stopping_ ? "the server is shutting down" : "the request queue is full";
      req.channel->push(std::move(e));
      metrics_.on_request_rejected();
      return;
    }
    waiting_.push_back({std::move(req), Clock::now()});
  }
  cv_.notify_all();
}

int64_t Scheduler::reserved_positions() const {
  int64_t r = 0;
  for (const auto& a : slots_)
    if (a) r += a->reserve(block_) - a->n_kv;  // what it may still add
  return r;
}

// Called with mu_ held: moves waiting requests into free slots while the KV can hold them (FIFO: the head
// waits for room, the others wait behind it), and rejects those that waited too long.
void Scheduler::admit(Clock::time_point now) {
  while (!waiting_.empty()) {
    Waiting& w = waiting_.front();
    if (w.req.channel->cancelled()) {  // its client left while it waited
      metrics_.on_request_done(true);
      waiting_.pop_front();
      continue;
    }
    int32_t seq = -1;
    for (size_t s = 0; s < slots_.size(); ++s)
      if (!slots_[s]) {
        seq = int32_t(s);
        break;
      }
    if (seq < 0) break;
    // Prefix sharing: the longest common prefix with the tokens already in another request's KV (at least
    // one token must remain to prefill: its logits start the generation). Forked, those cells are shared, so
    // the request needs room only for the rest.
    const std::vector<int32_t>& prompt = w.req.prompt;
    int32_t best = 0, best_seq = -1;
    for (const auto& o : slots_) {
      if (!o) continue;
      const int32_t lim = std::min<int32_t>(o->n_kv, int32_t(prompt.size()) - 1);
      int32_t l = 0;
      while (l < lim && o->tokens[size_t(l)] == prompt[size_t(l)]) ++l;
      if (l > best) {
        best = l;
        best_seq = o->seq;
      }
    }
    if (best < block_) best = 0;  // less than a block: not worth a fork
    const int64_t need = int64_t(prompt.size()) + w.req.gen.max_tokens + 2 * block_ - best;
    if (session_->kv_free_positions() - reserved_positions() < need) break;
    auto a = std::make_unique<Active>(std::move(w.req), w.since);
    waiting_.pop_front();
    a->seq = seq;
    a->tokens = a->req.prompt;
    if (tok_) a->detok = std::make_unique<tokenizer::StreamingDetokenizer>(*tok_);
    a->sampler.accept(a->req.prompt);
    session_->seq_clear(seq);
    if (drafter_) drafter_->reset(seq);
    if (best > 0) {
      session_->seq_fork(best_seq, seq, best);
      if (drafter_) drafter_->fork(best_seq, seq, best);  // DFlash: the shared positions' features
      a->n_kv = best;
      metrics_.on_prompt_tokens_reused(best);
    }
    slots_[size_t(seq)] = std::move(a);
  }
  expire_waiting(now);
}

// Called with mu_ held: drops waiting requests whose client left, and fails those that waited too long (503).
void Scheduler::expire_waiting(Clock::time_point now) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->req.channel->cancelled()) {
      metrics_.on_request_done(true);
      it = waiting_.erase(it);
    } else if (std::chrono::duration<double>(now - it->since).count() > params_.queue_timeout_s) {
      RequestEvent e;
      e.index = it->req.index;
      e.rejected = true;
      e.error = "no KV room or slot became free within " + std::to_string(int(params_.queue_timeout_s)) +
                " s; the server is overloaded, try again later";
      it->req.channel->push(std::move(e));
      metrics_.on_request_rejected();
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::loop() {
  if (canvas_) {
    canvas_loop();
    return;
  }
  while (true) {
    int queued = 0;
    {
      std::unique_lock lock(mu_);
      if (stopping_) break;
      // Cancelled requests leave before anything else: their cells are free for this step's admissions.
      for (auto& a : slots_)
        if (a && a->req.channel->cancelled()) {
          metrics_.on_request_done(true);
          release(*a);
          a.reset();
        }
      admit(Clock::now());
      queued = int(waiting_.size());
      const bool any = std::any_of(slots_.begin(), slots_.end(), [](const auto& a) { return a != nullptr; });
      if (!any) {
        note_draft_kv();
        metrics_.on_step(0, queued, session_->kv_capacity() - session_->kv_free_positions(),
                         session_->kv_capacity());
        cv_.wait_for(lock, std::chrono::milliseconds(queued ? 20 : 200));
        continue;
      }
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failed step (cannot happen with the admission reserve; a device error): every running request ends.
      for (auto& a : slots_)
        if (a) {
          RequestEvent ev;
          ev.index = a->req.index;
          ev.rejected = true;
          ev.error = std::string("generation failed: ") + e.what();
          a->req.channel->push(std::move(ev));
          release(*a);
          a.reset();
        }
    }
    int running = 0;
    for (const auto& a : slots_) running += a != nullptr;
    note_draft_kv();
    metrics_.on_step(running, queued, session_->kv_capacity() - session_->kv_free_positions(),
                     session_->kv_capacity());
  }
  // Shutting down: everyone still here ends.
  std::lock_guard lock(mu_);
  for (auto& a : slots_)
    if (a) {
      RequestEvent ev;
      ev.index = a->req.index;
      ev.rejected = true;
      ev.error = "the server is shutting down";
      a->req.channel->push(std::move(ev));
      a.reset();
    }
  for (auto& w : waiting_) {
    RequestEvent ev;
    ev.index = w.req.index;
    ev.rejected = true;
    ev.error = "the server is shutting down";
    w.req.channel->push(std::move(ev));
  }
  waiting_.clear();
}

bool Scheduler::step() {
  batch_.clear();
  int32_t budget = params_.n_batch;
  // Requests whose max_tokens is 0 finish without a forward pass.
  for (auto& a : slots_)
    if (a && a->req.gen.max_tokens == 0) finish(*a, FinishReason::Length);
  // Decode rows first: one per generating request, followed by its draft tokens when speculating.
  std::vector<Active*> gen;
  for (auto& a : slots_)
    if (a && a->prefilled) gen.push_back(a.get());
  drafts_.assign(gen.size(), {});
  if (drafter_ && !gen.empty()) {
    std::vector<int32_t> seqs, n_max;
    std::vector<const std::vector<int32_t>*> hist;
    std::vector<SamplingParams> sampling;
    // Drafts share the step's budget: each request at most an equal part of what the decode rows leave.
    const int32_t per = std::max<int32_t>(0, (budget - int32_t(gen.size())) / int32_t(gen.size()));
    for (Active* a : gen) {
      seqs.push_back(a->seq);
      hist.push_back(&a->tokens);  // its last token (pending) is not in the KV yet
      n_max.push_back(
          std::max(0, std::min({params_.spec.draft_max, per, a->req.gen.max_tokens - a->n_generated - 1})));
      sampling.push_back(a->req.gen.sampling);
    }
    drafter_->draft(seqs, hist, n_max, sampling, params_.spec.draft_p_min, drafts_);
    for (size_t k = 0; k < gen.size(); ++k) {
      Draft& d = drafts_[k];
      if (int32_t(d.tokens.size()) < params_.spec.draft_min || int32_t(d.tokens.size()) > n_max[k]) d = {};
    }
  }
  std::vector<size_t> gen_row0(gen.size());
  for (size_t k = 0; k < gen.size(); ++k) {
    Active* a = gen[k];
    gen_row0[k] = batch_.size();
    batch_.add(a->pending_token, a->n_kv, a->seq, true);
    for (size_t j = 0; j < drafts_[k].tokens.size(); ++j)
      batch_.add(drafts_[k].tokens[j], a->n_kv + 1 + int32_t(j), a->seq, true);
    budget -= 1 + int32_t(drafts_[k].tokens.size());
  }
  // Then prompt chunks, oldest request first, within the budget.
  std::vector<Active*> prefill;
  for (auto& a : slots_)
    if (a && !a->prefilled) prefill.push_back(a.get());
  std::sort(prefill.begin(), prefill.end(), [](Active* x, Active* y) { return x->arrived < y->arrived; });
  struct Chunk {
    Active* a;
    int32_t n;
    size_t last_row;
  };
  std::vector<Chunk> chunks;
  for (Active* a : prefill) {
    if (budget <= 0) break;
    const int32_t left = int32_t(a->tokens.size()) - a->n_kv;
    const int32_t n = std::min(left, budget);
    const bool last = n == left;
    for (int32_t i = 0; i < n; ++i)
      batch_.add(a->tokens[size_t(a->n_kv + i)], a->n_kv + i, a->seq, last && i + 1 == n);
    chunks.push_back({a, n, batch_.size() - 1});
    budget -= n;
  }
  if (batch_.empty()) return false;
  session_->decode(batch_);
  // DFlash injects the features of every row (prefill chunks and verify rows) into its cache; rows of drafts
  // rejected below are trimmed on its next call.
  if (drafter_) drafter_->target_decoded(batch_);
  metrics_.on_kv(session_->kv_capacity() - session_->kv_free_positions(), session_->kv_capacity());
  // The generating requests: their pending token (and drafts) are now in the KV.
  device_draws_.clear();
  for (size_t k = 0; k < gen.size(); ++k) {
    Active* a = gen[k];
    ++a->n_kv;
    if (drafter_)
      accept_draft(*a, gen_row0[k], drafts_[k]);
    else
      sample_row_or_queue(*a, gen_row0[k]);
  }
  // Requests whose prompt is now all in the KV sample their first token from its last row.
  for (const Chunk& c : chunks) {
    c.a->n_kv += c.n;
    metrics_.on_prompt_tokens(c.n);
    if (c.a->n_kv == int32_t(c.a->tokens.size())) {
      c.a->prefilled = true;
      sample_row_or_queue(*c.a, c.last_row);
    }
  }
  draw_queued_on_device();
  return true;
}

void Scheduler::sample_row_or_queue(Active& a, size_t row) {
  if (device_sampling_)
    device_draws_.push_back({&a, row});
  else
    sample_row(a, row);
}

void Scheduler::draw_queued_on_device() {
  if (device_draws_.empty()) return;
  std::vector<size_t> rows;
  std::vector<Sampler*> samplers;
  for (const DeviceDraw& d : device_draws_) {
    rows.push_back(d.row);
    samplers.push_back(&d.a->sampler);
  }
  const std::vector<int32_t> ids = session_->sample(rows, samplers);  // one uniform per non-greedy sampler
  // A request asking for logprobs still draws on the device (the same tokens as without them); its row's
  // logits come to the host for the log-softmax only.
  for (size_t i = 0; i < device_draws_.size(); ++i) {
    Active& a = *device_draws_[i].a;
    emit(a, ids[i], a.req.n_logprobs >= 0 ? session_->logits(device_draws_[i].row) : std::span<const float>{});
  }
  device_draws_.clear();
}

// Canvas diffusion: one request at a time, in arrival order (the canvas source holds one prompt's K/V).
void Scheduler::canvas_loop() {
  while (true) {
    Waiting w;
    int queued = 0;
    {
      std::unique_lock lock(mu_);
      if (stopping_) break;
      expire_waiting(Clock::now());
      if (waiting_.empty()) {
        metrics_.on_step(0, 0, 0, 0);
        cv_.wait_for(lock, std::chrono::milliseconds(200));
        continue;
      }
      w = std::move(waiting_.front());
      waiting_.pop_front();
      queued = int(waiting_.size());
    }
    metrics_.on_step(1, queued, 0, 0);
    const std::shared_ptr<Channel> channel = w.req.channel;
    const int index = w.req.index;
    try {
      run_canvas(std::move(w));
    } catch (const std::exception& e) {
      RequestEvent ev;
      ev.index = index;
      ev.rejected = true;
      ev.error = std::string("generation failed: ") + e.what();
      channel->push(std::move(ev));
    }
  }
  std::lock_guard lock(mu_);
  for (auto& w : waiting_) {
    RequestEvent ev;
    ev.index = w.req.index;
    ev.rejected = true;
    ev.error = "the server is shutting down";
    w.req.channel->push(std::move(ev));
  }
  waiting_.clear();
}

// One canvas request: a block per diffuse() call over the prompt and the blocks kept so far, each block's
// tokens emitted as they are kept; it ends at max_tokens (length), a stop string, or a block the driver cut
// (an end-of-generation token or a loop: stop).
void Scheduler::run_canvas(Waiting w) {
  Active a(std::move(w.req), w.since);
  a.tokens = a.req.prompt;
  if (tok_) a.detok = std::make_unique<tokenizer::StreamingDetokenizer>(*tok_);
  if (a.req.gen.max_tokens == 0) {
    finish(a, FinishReason::Length);
    return;
  }
  DiffusionParams dp;
  dp.eb = canvas_info_.eb_defaults;
  dp.eb.seed = uint32_t(a.req.gen.sampling.seed);  // the EB sampler's generator takes 32 bits
  dp.n_predict = canvas_info_.canvas_length;
  dp.n_blocks = 1;
  if (!a.req.gen.ignore_eos) dp.eog_ids = model_->info().eos_ids;
  dp.max_prefix = canvas_max_prompt_;
  dp.log = [](const std::string&) {};  // the fallback notes are for the CLI
  while (true) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) throw Error("the server is shutting down");
    }
    if (a.req.channel->cancelled()) {
      metrics_.on_request_done(true);
      return;
    }
    if (int64_t(a.tokens.size()) > canvas_max_prompt_) {  // no room for another block's prefix
      finish(a, FinishReason::Length);
      return;
    }
    const DiffusionResult r = diffuse(*canvas_, a.tokens, dp);
    const bool cut = r.blocks.empty() || r.blocks.back().trimmed;
    const std::vector<int32_t>& block = r.tokens;
    for (int32_t t : block)
      if (emit(a, t, {})) return;  // max_tokens or a stop string (emit appends t to a.tokens)
    if (cut) {
      finish(a, FinishReason::EndOfGeneration);
      return;
    }
  }
}

// Speculative: row0 + j holds the logits after draft token j (row0: after the pending token). The library's
// verify_draft (the same walk as SpeculativeDecoder's) emits each kept draft token and then the target's own
// (the correction at the first rejection, or a bonus after a fully accepted draft); the KV keeps every
// emitted token but the last, which is the next step's pending token.
void Scheduler::accept_draft(Active& a, size_t row0, const Draft& d) {
  bool ended = false;
  const size_t accepted = verify_draft(
      *session_, row0, d, a.sampler, [&](int32_t token, size_t, bool, std::span<const float> logits) {
        ended = emit(a, token, logits);  // accepts the token into the request's sampler
        return ended;
      },
      /*emit_logits=*/a.req.n_logprobs >= 0);
  metrics_.on_speculative(int64_t(d.tokens.size()), int64_t(accepted));
  if (ended) return;  // finished: its cells are already free
  // Rows of rejected drafts leave the KV: it keeps the history but its last token (the pending one).
  const int32_t keep = int32_t(a.tokens.size()) - 1;
  if (keep < session_->seq_len(a.seq)) session_->seq_remove(a.seq, keep);
  a.n_kv = keep;
}

// The next token of `a` from batch row `row`.
void Scheduler::sample_row(Active& a, size_t row) {
  const std::span<const float> logits = session_->logits(row);
  emit(a, a.sampler.sample(logits), logits);
}

bool Scheduler::emit(Active& a, int32_t token, std::span<const float> logits) {
  const Clock::time_point now = Clock::now();
  if (a.n_generated == 0)
    metrics_.on_first_token(std::chrono::duration<double>(now - a.arrived).count());
  else
    metrics_.on_inter_token(std::chrono::duration<double>(now - a.last_token).count());
  a.last_token = now;

  const bool eog = !a.req.gen.ignore_eos &&
                   (tok_ ? tok_->is_end_of_generation(token)
                         : std::find(model_->info().eos_ids.begin(), model_->info().eos_ids.end(), token) !=
                               model_->info().eos_ids.end());
  if (eog) {
    finish(a, FinishReason::EndOfGeneration);
    return true;
  }
  a.sampler.accept(token);
  a.tokens.push_back(token);
  a.pending_token = token;
  ++a.n_generated;
  metrics_.on_generated_token();

  RequestEvent e;
  e.index = a.req.index;
  e.token = token;
  if (a.req.n_logprobs >= 0 && !logits.empty()) {
    // log-softmax of the model's raw logits (before the sampling chain), as OpenAI reports them.
    float mx = -INFINITY;
    for (float v : logits) mx = std::max(mx, v);
    double sum = 0.0;
    for (float v : logits) sum += std::exp(double(v - mx));
    const float lse = mx + float(std::log(sum));
    e.logprob = logits[size_t(token)] - lse;
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    const size_t k = std::min<size_t>(size_t(a.req.n_logprobs), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), [&](int32_t x, int32_t y) {
      return logits[size_t(x)] > logits[size_t(y)] || (logits[size_t(x)] == logits[size_t(y)] && x < y);
    });
    for (size_t i = 0; i < k; ++i) e.top.push_back({ids[i], logits[size_t(ids[i])] - lse});
  }
  bool stopped = false;
  if (a.detok) stopped = push_text(a, a.detok->push(token), e.text);
  a.req.channel->push(std::move(e));
  if (stopped) {
    finish(a, FinishReason::Stop);
    return true;
  }
  if (a.n_generated >= a.req.gen.max_tokens) {
    finish(a, FinishReason::Length);
    return true;
  }
  return false;
}

// Appends decoded text; moves into `out` what can no longer be part of a stop string. Returns true when a
// stop string appeared (the text is cut before it).
bool Scheduler::push_text(Active& a, const std::string& piece, std::string& out) {
  a.text += piece;
  size_t cut = std::string::npos;
  for (const std::string& s : a.req.gen.stop) {
    const size_t from = a.released >= s.size() ? a.released - s.size() + 1 : 0;
    const size_t p = a.text.find(s, from);
    if (p != std::string::npos) cut = std::min(cut, p);
  }
  if (cut != std::string::npos) {
    a.text.resize(cut);
    out = a.text.substr(std::min(a.released, cut));
    a.released = a.text.size();
    return true;
  }
  // Hold back the longest tail that is a prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : a.req.gen.stop)
    for (size_t n = std::min(s.size() - 1, a.text.size()); n > hold; --n)
      if (a.text.compare(a.text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  const size_t upto = std::max(a.released, a.text.size() - hold);
  out = a.text.substr(a.released, upto - a.released);
  a.released = upto;
  return false;
}

void Scheduler::finish(Active& a, FinishReason reason) {
  RequestEvent e;
  e.index = a.req.index;
  e.finish = reason;
  if (a.detok && reason != FinishReason::Stop) {
    std::string rest;
    push_text(a, a.detok->flush(), rest);
    // Everything left is final now.
    rest += a.text.substr(a.released);
    a.released = a.text.size();
    e.text = rest;
  }
  e.n_prompt = int32_t(a.req.prompt.size());
  e.n_generated = a.n_generated;
  a.req.channel->push(std::move(e));
  metrics_.on_request_done(false);
  const int32_t seq = a.seq;
  a.finished = true;
  if (seq < 0) return;  // a canvas request holds no slot
  release(a);
  slots_[size_t(seq)].reset();
}

void Scheduler::note_draft_kv() {
  if (draft_session_)
    metrics_.on_draft_kv(draft_session_->kv_capacity() - draft_session_->kv_free_positions(),
                         draft_session_->kv_capacity());
}

void Scheduler::release(Active& a) {
  session_->seq_clear(a.seq);
  if (drafter_) drafter_->reset(a.seq);
}

}  // namespace tandem::serve
