// Perplexity of a model over a token sequence, in windows, as `tandem perplexity` reports it.
//
// Windows (models/training/train.py evaluates with exactly the same ones, so the figures can be compared):
//  - stride == 0 (default, as llama-perplexity): non-overlapping windows of ctx tokens, floor(n / ctx) of
//  them
//    (a trailing partial window is dropped). The first half of each window is context only: the scored
//    targets are the tokens at window positions ctx/2 + 1 .. ctx - 1 (ctx - 1 - ctx/2 per window), each
//    predicted from the logits of the token before it.
//  - stride > 0 (sliding window): windows of ctx tokens start every `stride` tokens; the last one ends at the
//    last token (it may be shorter). The first window scores all its targets (positions 1 .. end - 1), every
//    later one only the targets no earlier window scored (normally its last `stride` tokens).
// With replace_first_with_bos (set when the model's vocabulary adds BOS), the first token of every window is
// replaced by BOS, as llama-perplexity does; the caller tokenizes the text with BOS in front.
//
// The figure: PPL = exp(mean NLL) over all scored targets; its error is PPL * sqrt(var(NLL) / (count - 1)),
// where var(NLL) = mean(NLL^2) - mean(NLL)^2 (the standard error of the mean NLL carried through exp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "tandem/model.h"

namespace tandem::eval {

struct PerplexityWindow {
  int64_t start = 0;         // first token of the window
  int64_t first_scored = 0;  // first scored target (start < first_scored <= end)
  int64_t end = 0;           // one past the last token of the window
};

// The windows above. Throws tandem::Error for ctx < 2, stride < 0, stride > ctx - 1 (targets would be
// skipped) or fewer tokens than one window needs (n_tokens < ctx without stride, n_tokens < 2 with stride).
std::vector<PerplexityWindow> perplexity_windows(int64_t n_tokens, int32_t ctx, int32_t stride);

// Running sums of per-token negative log-likelihoods.
struct NllStats {
  double sum = 0.0;
  double sum_sq = 0.0;
  int64_t count = 0;

  void add(double nll) {
    sum += nll;
    sum_sq += nll * nll;
    ++count;
  }
  double mean() const { return count ? sum / double(count) : 0.0; }
  double ppl() const;
  double ppl_error() const;  // 0 when count < 2
};

// -log softmax(logits)[target], computed in double precision (max-shifted log-sum-exp).
double token_nll(std::span<const float> logits, int32_t target);

struct PerplexityParams {
  int32_t ctx = 512;
  int32_t stride = 0;
  int32_t n_batch = 512;  // rows per forward pass
  bool replace_first_with_bos = false;
  int32_t bos_id = -1;
};

struct PerplexityResult {
  double ppl = 0.0;
  double ppl_error = 0.0;
  double mean_nll = 0.0;
  int64_t tokens_scored = 0;
  int64_t windows = 0;
};

// Called after each window: windows done, windows in all, statistics so far.
using PerplexityProgress = std::function<void(size_t done, size_t total, const NllStats& stats)>;

// Runs the model over the windows of `tokens` (one session, one sequence, cleared between windows). Throws
// tandem::Error for bad parameters, a token id outside the vocabulary, or ctx beyond the model's context.
PerplexityResult compute_perplexity(const std::shared_ptr<Model>& model, std::span<const int32_t> tokens,
                                    const PerplexityParams& params, const PerplexityProgress& progress = {});

}  // namespace tandem::eval
