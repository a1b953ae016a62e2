// Autoregressive generation over a Session: requests (a prompt and its GenerationParams) decoded together,
// one batch per step, as a serving engine's loop does.
//
//   tandem::Session session(model, {.n_ctx = 4096, .n_seq_max = 4});
//   tandem::Generator gen(session);
//   tandem::GenerationParams gp;
//   gp.max_tokens = 64;
//   gp.stop = {"\n\n"};
//   const int id = gen.add_request(prompt_ids, gp, [](const tandem::TokenEvent& e) { print(e.text); });
//   gen.run();  // or: while (!gen.done()) gen.step();
//   const tandem::GenerationResult& r = gen.result(id);  // r.tokens, r.text, r.finish, r.prompt_seconds...
//
// Every request holds one sequence of the session (the lowest free id, from 0) while it runs; the sequence is
// cleared when the request finishes, so another request can take it. A step decodes one batch: the whole
// prompt of every request added since the last step (all prompts in one batch) and one token of every running
// request; then every request with a row samples its next token from its own Sampler (seeded per request), so
// a request's tokens do not depend on the other requests in the batch. Requests may be added between any two
// steps (continuous batching).
//
// Shared prompts: add_shared_prompt_requests() adds n requests of one prompt that is decoded once, in the
// first request's sequence, and forked into the others (Session::seq_fork: the KV blocks are shared, not
// copied); request i samples with seed + i. Their tokens equal those of n requests prefilled separately.
//
// A request finishes with
//  - FinishReason::EndOfGeneration at an end-of-generation token (the tokenizer's is_end_of_generation, or
//    ModelInfo::eos_ids when the model has no usable tokenizer), unless ignore_eos; the token is not kept;
//  - FinishReason::Stop when its text contains one of its stop strings: the text ends before the stop string,
//    and the token that completed it is the last of `tokens`;
//  - FinishReason::Length after max_tokens tokens (the last one needs no forward pass).
//
// Text: the generated tokens are detokenized incrementally (a continuation: no prefix space is removed;
// control tokens have no text). The stream callback gets one TokenEvent per kept token, with the text that
// became final with it (possibly empty: bytes of an incomplete UTF-8 character, and text that could be the
// start of a stop string, are held back until decided), then one last event (token -1) with the finish reason
// and whatever was still held back. The concatenated event texts equal GenerationResult::text.
//
// Errors: add_request throws tandem::Error for a bad request (empty prompt, a prompt longer than the context,
// a token id outside the vocabulary, no free sequence, bad sampling parameters, an empty stop string, stop
// strings without a tokenizer) and changes nothing. step() passes on the session's errors (a full KV cache);
// the batch that failed is not applied, but the generator should then be discarded.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/sampling.h"
#include "tandem/session.h"

namespace tandem {

enum class FinishReason {
  None,             // still running
  Length,           // max_tokens reached
  EndOfGeneration,  // an end-of-generation token was sampled
  Stop,             // a stop string was produced
};
// "none", "length", "eog", "stop"
const char* finish_reason_name(FinishReason reason);

// One request's settings.
struct GenerationParams {
  int32_t max_tokens = 128;         // tokens to generate, >= 0 (0: finishes at its first step)
  SamplingParams sampling{};        // the request's sampler (its seed too)
  std::vector<std::string> stop{};  // stop strings (need the model's tokenizer); none may be empty
  bool ignore_eos = false;          // do not finish at end-of-generation tokens
};

// What the stream callback gets for every kept token, and once more when the request finishes.
struct TokenEvent {
  int request = -1;                          // the id add_request returned
  int32_t token = -1;                        // the generated token; -1 for the last event of the request
  std::string_view text{};                   // text that became final with this event (may be empty)
  FinishReason finish = FinishReason::None;  // None, except on the last event
};
using StreamCallback = std::function<void(const TokenEvent& event)>;

// One decoded row whose logits were computed.
struct LogitsRow {
  int request = -1;  // the request the row belongs to (a shared prompt: the request that decoded it)
  int32_t seq = -1;  // its session sequence
  int32_t pos = -1;  // its position in the sequence
  std::span<const float> logits{};  // n_vocab floats, valid during the callback
};
// Called after every decoded batch with its rows that computed logits, in batch order.
using LogitsCallback = std::function<void(std::span<const LogitsRow> rows)>;

// The generator's settings (for all its requests).
struct GeneratorParams {
  // Use the model's tokenizer, when it has a usable one, for the text of the tokens, for stop strings and to
  // detect the end of generation. false: ids only (no text; EOG from ModelInfo::eos_ids; the tokenizer is not
  // built).
  bool use_tokenizer = true;
  // Compute the logits of every prompt row, not only the last of each prompt (for on_logits).
  bool all_prompt_logits = false;
  // Sees every decoded batch's logits (tests, parity dumps). When set, a request with max_tokens 0 still
  // decodes its prompt.
  LogitsCallback on_logits{};
  // Sample on the output device (Session::sample: Ops::sample_rows, only the ids cross to the host) instead
  // of the host Sampler. The draws differ from the host chain's in the last bits of the probabilities, so a
  // seeded run is reproducible within each mode, not across them; greedy picks are the same.
  bool device_sampling = false;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated tokens (no end-of-generation token)
  std::string text;             // their text, cut before a stop string (empty without a tokenizer)
  FinishReason finish = FinishReason::None;
  int32_t seq = -1;                 // the session sequence the request held
  int32_t n_prompt_tokens = 0;      // prompt length (a shared prompt counts for every request)
  double prompt_seconds = 0.0;      // the step that decoded its prompt, up to its logits (0: not decoded)
  double generation_seconds = 0.0;  // from then until it finished

  bool finished() const { return finish != FinishReason::None; }
  int32_t n_generated() const { return int32_t(tokens.size()); }
};

class Generator {
 public:
  // The session must outlive the generator; its sequences are the generator's while requests run on them.
  explicit Generator(Session& session, GeneratorParams params = {});
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Adds a request, decoded from the next step on; returns its id (0, 1, ... in the order of adding).
  int add_request(std::vector<int32_t> prompt, GenerationParams params, StreamCallback on_token = {});
  // n requests of one prompt, decoded once and forked (see above); request i samples with
  // params.sampling.seed + i. Returns their ids.
  std::vector<int> add_shared_prompt_requests(std::vector<int32_t> prompt, int n, GenerationParams params,
                                              StreamCallback on_token = {});

  // Decodes one batch and samples one token for every request with a row in it. Does nothing when done().
  void step();
  // step() until done().
  void run();
  // No unfinished request.
  bool done() const;
  // Unfinished requests.
  int n_running() const;
  int n_requests() const;

  // A request's tokens, text and finish so far. Throws Error for an unknown id.
  const GenerationResult& result(int request) const;
  Session& session() const { return session_; }

 private:
  struct Request;
  struct RowRef {
    int request;  // the request sampling from this row
    size_t row;   // batch row of its logits
  };

  Request& request(int id) const;
  int32_t free_seq() const;
  void check_request(const std::vector<int32_t>& prompt, const GenerationParams& params, int n) const;
  int enqueue(std::vector<int32_t> prompt, GenerationParams params, StreamCallback on_token, int share_of);

  bool decodes_prompt(const Request& req) const;
  // One step: prepare_batch -> decode_batch -> sample_batch.
  void prepare_batch();
  void decode_batch();
  void sample_batch();
  // The next token of `req` from the logits of batch row `row`; the one place a token is drawn.
  int32_t sample_row(Request& req, size_t row);
  void accept_token(Request& req, int32_t token);
  // Adds decoded text to what is held back and moves what is decided into `released` (and the result's
  // text): everything when `final`, else all but a tail that could start a stop string. Returns true when a
  // stop string was found: the text before it is released, the rest dropped.
  bool push_text(Request& req, std::string_view text, bool final, std::string& released);
  void emit(Request& req, int32_t token, std::string_view text);
  void finish(Request& req, FinishReason reason);
  bool is_end_of_generation(int32_t token) const;

  Session& session_;
  GeneratorParams params_;
  const tokenizer::Tokenizer* tok_ = nullptr;
  std::vector<int32_t> eos_ids_;
  std::vector<std::unique_ptr<Request>> requests_;
  std::vector<int> running_;      // unfinished requests, in the order of adding
  std::vector<int> seq_owner_;    // per session sequence: the request holding it, or -1
  Batch batch_;                   // the batch of the current step
  std::vector<int> row_request_;  // per row of batch_: the request it belongs to
  std::chrono::steady_clock::time_point step_start_{};
  std::vector<RowRef> sample_rows_;  // the rows of batch_ to sample, one per request
  bool finite_checked_ = false;      // the first sampled logits were checked for NaN / Inf
  std::vector<int> prefilled_;       // requests whose prompt batch_ decodes (their timing starts this step)
  std::vector<LogitsRow> logits_rows_;
};

}  // namespace tandem
