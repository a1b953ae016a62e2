// Speculative decoding: a drafter proposes up to draft_max tokens per sequence, the target verifies all of
// them (plus the token before them) in one batch, and the longest acceptable prefix is kept.
//
//   auto target = tandem::Model::load("small.gguf"), draft = tandem::Model::load("draft.gguf");
//   tandem::Session ts(target, {.n_seq_max = 4}), ds(draft, {.n_seq_max = 4});
//   tandem::DraftModelDrafter drafter(ds);
//   tandem::SpeculativeDecoder spec(ts, drafter, {.draft_max = 8});
//   auto out = spec.generate({prompt_ids}, 64, {sampling}, eos_ids);  // one token list per prompt
//
// DFlash instead: load the dflash file with ModelParams::share_weights_from = target (it borrows token_embd
// and output), then DflashDrafter drafter(ds, ts). Give the target session batch_invariant = true for greedy
// output bit-identical to plain decoding on GPUs (session.h).
//
// Acceptance is lossless: at temperature <= 0 a draft token is kept when it equals the target's greedy pick
// (the output is token-identical to plain greedy decoding); at temperature > 0 a draft token d drawn from the
// drafter's distribution q is kept with probability min(1, p(d) / q(d)), where p is the target sampler's
// distribution (its whole chain: penalties, top-k, top-p, min-p, temperature), and a rejection draws from
// the residual max(0, p - q) normalized, so every emitted token is distributed exactly as p. Each cycle emits
// the accepted drafts plus one target token (the correction, or a bonus token when all drafts were kept).
// Rejected rows are removed from both models' KV caches (Session::seq_remove).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/sampling.h"
#include "tandem/session.h"

namespace tandem {

struct SpeculativeParams {
  int32_t draft_max = 8;     // tokens drafted per cycle (0: plain decoding through the same loop)
  int32_t draft_min = 0;     // a shorter draft is dropped and the cycle is a plain step
  float draft_p_min = 0.0f;  // drafting stops before a token whose draft probability is below this
  // Throws tandem::Error naming the flag (--draft-max, --draft-min, --draft-p-min) and the bad value.
  void validate() const;
};

// Acceptance statistics, accumulated over every generate() call of a decoder.
struct SpeculativeStats {
  int64_t cycles = 0;    // target verify passes
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // draft tokens kept
  int64_t emitted = 0;   // tokens emitted (accepted + one target token per cycle, less any cut by a stop)
  std::vector<int64_t> tried_at;     // [i]: cycles whose draft had a token at position i
  std::vector<int64_t> accepted_at;  // [i]: of those, cycles that kept it
  // Wall time in the drafter (draft(), which also waits for the feature injection of the last verify) and in
  // verification (the target's decode, the drafter's target_decoded, acceptance), per generate() loop: both
  // end at a point where the host has read results anyway, so measuring adds no synchronization.
  double draft_seconds = 0;
  double verify_seconds = 0;
  // Tokens per verify pass: (accepted + cycles) / cycles; the speedup bound of the drafter.
  double mean_accepted_length() const;
  double acceptance_rate() const;  // accepted / drafted
  // One line: cycles, drafted, accepted, mean accepted length and per-position acceptance.
  std::string summary() const;
};

// A draft for one sequence: the tokens and, at temperature > 0, the distribution each was drawn from (the
// draft sampler's candidates; empty for a greedy draft).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<std::vector<TokenCandidate>> q;
};

// Proposes tokens. history[i] is every token of sequence seqs[i] so far (prompt and emitted); its last token
// has not been decoded by the target yet. The drafter keeps its own cache in step with the histories it is
// given (they may have lost a tail since the last call: rejected drafts).
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Fills out[i] with at most n_max[i] tokens for seqs[i]. sampling[i] is the sequence's sampling (greedy
  // drafts at temperature <= 0); p_min as in SpeculativeParams.
  virtual void draft(std::span<const int32_t> seqs, std::span<const std::vector<int32_t>* const> history,
                     std::span<const int32_t> n_max, std::span<const SamplingParams> sampling, float p_min,
                     std::vector<Draft>& out) = 0;
  // Forget a sequence (its cache rows).
  virtual void reset(int32_t seq) = 0;
  // The target forked its cache (Session::seq_fork): dst's history now begins with the first n tokens of
  // src's, whose target positions [0, n) dst shares; dst's own state is dropped first. The default forgets
  // dst (a drafter that rebuilds its cache from the tokens catches up in draft()); a drafter whose cache
  // cannot be rebuilt from tokens (DFlash: it holds target features) forks its cache too.
  virtual void fork(int32_t src, int32_t dst, int32_t n) {
    (void)src;
    (void)n;
    reset(dst);
  }
  // Called by SpeculativeDecoder after every decode of the target (the prefill, each verify batch), with
  // that batch, before the next draft(): a DFlash drafter reads the target features of its rows here. The
  // default does nothing.
  virtual void target_decoded(const Batch& batch) { (void)batch; }
  // The most rows a target batch may have for this drafter (its feature buffer), 0 = any: the decoder feeds
  // the prefill in batches of at most this many rows and refuses a longer verify batch.
  virtual int32_t max_target_rows() const { return 0; }
};

// Classic speculation: a smaller model with the target's vocabulary drafts token by token (all sequences in
// one batch per step).
class DraftModelDrafter final : public Drafter {
 public:
  // The session must allow the sequence ids the decoder uses. Throws Error when the draft's vocabulary size
  // differs from n_vocab_target (when given).
  explicit DraftModelDrafter(Session& session, int64_t n_vocab_target = 0);
  void draft(std::span<const int32_t> seqs, std::span<const std::vector<int32_t>* const> history,
             std::span<const int32_t> n_max, std::span<const SamplingParams> sampling, float p_min,
             std::vector<Draft>& out) override;
  void reset(int32_t seq) override;
  void fork(int32_t src, int32_t dst, int32_t n) override;

 private:
  Session& session_;
  std::vector<std::vector<int32_t>> cached_;  // per sequence id: the tokens whose K/V the draft cache holds
  std::vector<std::unique_ptr<Sampler>> samplers_;  // per sequence id: the draft sampler (no penalties)
};

// DFlash (GGUF-ARCH-FACTS E.4): a block-diffusion drafter (a `dflash` model) that reads the target's hidden
// states at its target layers and drafts a whole block [last, mask x n] in one forward pass.
//
// Features: the target's taps write the inputs of the drafter's target layers, per batch row, into one
// buffer {n_taps * n_embd, target n_batch} on the drafter's device ([tap 0 | tap 1 | ...] per row); after
// each target decode the drafter injects K/V from the rows of that buffer (its batch names them by row
// index: EmbeddingSource), ordered by the target's "written" event and its own "read" event; the features
// never cross to the host. The host path (taps copied to host memory, rows reordered there, uploaded as
// batch embeddings) runs instead when the buffer cannot be allocated, when the drafter's device is not one
// the target's layers can write to, when the target layers are not ascending, or when the environment has
// TANDEM_DFLASH_DEVICE_FEATURES=0 (one log line says which path runs).
struct DflashDrafterParams {
  // -1: from the environment (TANDEM_DFLASH_DEVICE_FEATURES=0 turns the device path off); 0: host; 1:
  // device when possible.
  int device_features = -1;
  bool log = true;  // the one line on stderr saying which feature path runs
};

class DflashDrafter final : public Drafter {
 public:
  // draft: a session of the dflash model (its n_batch must hold a draft block of every sequence); target:
  // the target's session, whose taps the drafter sets (and keeps until it is destroyed). Throws Error when
  // the drafter's hidden size differs from the target's, a target layer is out of the target's range, or
  // the mask token is not in the vocabulary.
  DflashDrafter(Session& draft, Session& target, const DflashDrafterParams& params = {});
  ~DflashDrafter() override;
  void draft(std::span<const int32_t> seqs, std::span<const std::vector<int32_t>* const> history,
             std::span<const int32_t> n_max, std::span<const SamplingParams> sampling, float p_min,
             std::vector<Draft>& out) override;
  void reset(int32_t seq) override;
  // Forks the injected features of src's positions [0, n) (the same tokens give the same features); throws
  // Error when src's cache holds fewer than n positions.
  void fork(int32_t src, int32_t dst, int32_t n) override;
  void target_decoded(const Batch& batch) override;
  int32_t max_target_rows() const override;

  bool device_features() const;  // which path runs
  int32_t block_size() const;
  const std::vector<int32_t>& target_layers() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The target's verdict on one sequence's draft d, the one implementation SpeculativeDecoder and the server's
// scheduler share: rows row0 .. row0 + nd (nd = d.tokens.size()) of the target's last batch hold the logits
// after the token before the draft and after each draft token. Walks the draft while it is accepted (a
// greedy sampler: the draft token equals its pick; sampled: speculative_accept with the sampler's whole
// chain and its generator, d.q the draft's distributions) and calls emit(token, j, accepted, logits) for
// every token it emits, in order: the accepted drafts (j = their index), then the target's own token (the
// correction at the first rejection, j = that index; or the bonus after a fully accepted draft, j = nd).
// emit returns true to stop there (a stop token, max tokens). The sampler is not told the tokens (emit calls
// Sampler::accept when its caller keeps them). Returns the number of accepted draft tokens.
// emit_logits = false: the caller does not read the logits span (emit gets an empty one), so a greedy sampler
// without penalties takes the picks of all nd + 1 rows in one device draw (Session::sample: one launch, only the
// ids cross to the host) instead of copying each row's logits to the host and scanning them there. The tokens
// are the same: a greedy pick without penalties does not depend on the tokens accepted before it.
using VerifyEmit = std::function<bool(int32_t token, size_t j, bool accepted, std::span<const float> logits)>;
size_t verify_draft(Session& target, size_t row0, const Draft& d, Sampler& sampler, const VerifyEmit& emit,
                    bool emit_logits = true);

class SpeculativeDecoder {
 public:
  SpeculativeDecoder(Session& target, Drafter& drafter, const SpeculativeParams& params = {});
  // Generates up to n_predict tokens after each prompt (sequence ids 0 .. prompts.size() - 1, cleared first),
  // all sequences at once. sampling: one per prompt, or one for all. A sequence stops after emitting a token
  // of stop_ids. Returns the emitted tokens per prompt (the prompt not included).
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                             int32_t n_predict, std::span<const SamplingParams> sampling,
                                             std::span<const int32_t> stop_ids = {});
  const SpeculativeStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  Session& target_;
  Drafter& drafter_;
  SpeculativeParams params_;
  SpeculativeStats stats_;
};

// The lossless acceptance test for one draft token, exposed for tests. p: the target's candidates, q: the
// draft's (both with their final probabilities, any order). Accepts `draft` with probability
// min(1, p(draft) / q(draft)) (one uniform from rng); on rejection returns a token drawn (one more uniform)
// from max(0, p - q) normalized, or from p when that is all zero.
struct AcceptOutcome {
  bool accepted = false;
  int32_t token = -1;
};
AcceptOutcome speculative_accept(std::span<const TokenCandidate> p, std::span<const TokenCandidate> q,
                                 int32_t draft, Rng& rng);

}  // namespace tandem
