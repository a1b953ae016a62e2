// Autoregressive token sampling: a configurable chain of logit filters followed by one seeded draw.
//
// One Sampler per sequence. It keeps the sequence's recent tokens (for the penalties) and its own generator,
// so the tokens of a sequence depend only on its seed and its logits, never on what other sequences do.
//
// The chain (default order, as llama.cpp users expect):
//   penalties -> top-k -> top-p -> min-p -> temperature -> dist
// - penalties: over the last `penalty_last_n` accepted tokens (0 = none, -1 = all kept so far), for every
//   token t seen c > 0 times: logit /= repeat_penalty if logit > 0 else logit *= repeat_penalty; then
//   logit -= c * frequency_penalty + presence_penalty.
// - top-k: keep the k largest logits (k <= 0: off). Ties are broken by the lower token id everywhere.
// - top-p: softmax over the candidates (at the temperature reached so far in the chain), keep the smallest
//   set of most likely tokens whose probability sums to >= top_p (p >= 1: off).
// - min-p: keep tokens with p >= min_p * p_max (min_p <= 0: off).
// - temperature: logits /= temperature.
// - dist: softmax over the surviving candidates; with u uniform in [0, 1) from the sequence's Rng, the result
//   is the first survivor, in increasing token id order, at which the running sum of probabilities exceeds
//   u * (sum of all); the same draw as the device op Ops::sample_rows.
// temperature <= 0 means greedy: the chain's penalties still apply, then the largest logit wins (lowest id on
// a tie), and no random number is consumed. Every stage keeps at least one token.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/rng.h"

namespace tandem {

enum class SamplerStage { Penalties, TopK, TopP, MinP, Temperature };
const char* sampler_stage_name(SamplerStage s);

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;     // 1 = off
  float presence_penalty = 0.0f;   // 0 = off
  float frequency_penalty = 0.0f;  // 0 = off
  int32_t penalty_last_n = 64;     // window of accepted tokens the penalties look at; -1 = all, 0 = off
  uint64_t seed = 0;
  std::vector<SamplerStage> order = default_order();

  static std::vector<SamplerStage> default_order() {
    return {SamplerStage::Penalties, SamplerStage::TopK, SamplerStage::TopP, SamplerStage::MinP,
            SamplerStage::Temperature};
  }
  bool greedy() const { return temperature <= 0.0f; }
  // Whether the penalties stage changes anything (a window and a penalty that is not neutral).
  bool penalties_active() const {
    return penalty_last_n != 0 && (repeat_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f);
  }
  // Throws tandem::Error naming the first bad value (a repeat penalty <= 0, top_p or min_p outside [0, 1], a
  // NaN, a penalty window below -1, a stage listed twice, ...).
  void validate() const;
};

// A candidate token after the chain: its (filtered, scaled) logit and its final probability.
struct TokenCandidate {
  int32_t id;
  float logit;
  float p;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }

  // Picks a token from one row of n_vocab logits, drawing one uniform from the sampler's Rng unless greedy.
  // Does not record the token: call accept() with the token the caller keeps.
  int32_t sample(std::span<const float> logits);
  // Same with an explicit uniform u in [0, 1) instead of a draw (tests, and parity with Ops::sample_rows,
  // which takes its uniforms from the caller).
  int32_t sample_with_uniform(std::span<const float> logits, double u);

  // Records a token (prompt or generated) for the penalties.
  void accept(int32_t token);
  void accept(std::span<const int32_t> tokens) {
    for (int32_t t : tokens) accept(t);
  }
  // Forgets the history and restarts the generator from the seed.
  void reset();

  // The survivors of the last sample() call, in increasing token id order, with their final logits and
  // probabilities (empty after a greedy pick).
  std::span<const TokenCandidate> last_candidates() const { return cand_; }
  // The accepted tokens the penalties currently look at, oldest first.
  std::vector<int32_t> penalty_window() const;
  Rng& rng() { return rng_; }

 private:
  void apply_penalties();
  void apply_top_k();
  void apply_top_p();
  void apply_min_p();
  void sort_by_logit();
  void sort_by_id();

  SamplingParams params_;
  Rng rng_;
  std::vector<int32_t> history_;  // the last penalty window, as a ring buffer when full
  size_t history_next_ = 0;
  std::vector<TokenCandidate> cand_;  // working set, reused across calls (no allocation once warmed up)
  std::vector<int32_t> window_scratch_;
  bool sorted_by_logit_ = false;
};

// The index of the largest value, lowest index on a tie (NaN is never chosen unless all are NaN).
int32_t argmax(std::span<const float> values);

}  // namespace tandem
