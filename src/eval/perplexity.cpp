#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "eval/non_finite.h"
#include "tandem/batch.h"
#include "tandem/session.h"

namespace tandem::eval {

std::vector<PerplexityWindow> perplexity_windows(int64_t n_tokens, int32_t ctx, int32_t stride) {
  check(ctx >= 2, "perplexity: --ctx must be at least 2 (got " + std::to_string(ctx) + ")");
  check(stride >= 0, "perplexity: --stride must not be negative (got " + std::to_string(stride) + ")");
  check(stride <= ctx - 1, "perplexity: --stride " + std::to_string(stride) + " exceeds --ctx - 1 = " +
                               std::to_string(ctx - 1) + ", so some tokens would never be scored");
  std::vector<PerplexityWindow> out;
  if (stride == 0) {
    check(n_tokens >= ctx, "perplexity: the text has " + std::to_string(n_tokens) +
                               " tokens, fewer than one window of --ctx " + std::to_string(ctx) +
                               "; use a longer text or a smaller --ctx");
    const int64_t first = ctx / 2;
    for (int64_t k = 0; k < n_tokens / ctx; ++k) {
      out.push_back({k * ctx, k * ctx + first + 1, (k + 1) * ctx});
    }
    return out;
  }
  check(n_tokens >= 2, "perplexity: the text has " + std::to_string(n_tokens) +
                           " tokens; at least 2 are needed to score one");
  int64_t scored_to = 1;  // targets below this index are scored already (token 0 has no prediction)
  for (int64_t start = 0;; start += stride) {
    const int64_t end = std::min<int64_t>(start + ctx, n_tokens);
    if (end > scored_to) {
      out.push_back({start, std::max(scored_to, start + 1), end});
      scored_to = end;
    }
    if (end == n_tokens) break;
  }
  return out;
}

double NllStats::ppl() const {
  return std::exp(mean());
}

double NllStats::ppl_error() const {
  if (count < 2) return 0.0;
  const double m = mean();
  const double var = sum_sq / double(count) - m * m;
  if (var <= 0.0) return 0.0;
  return ppl() * std::sqrt(var / double(count - 1));
}

double token_nll(std::span<const float> logits, int32_t target) {
  check(target >= 0 && size_t(target) < logits.size(), "perplexity: target token " + std::to_string(target) +
                                                           " is outside the vocabulary of " +
                                                           std::to_string(logits.size()));
  double mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, double(v));
  double s = 0.0;
  for (float v : logits) s += std::exp(double(v) - mx);
  return (mx + std::log(s)) - double(logits[size_t(target)]);
}

PerplexityResult compute_perplexity(const std::shared_ptr<Model>& model, std::span<const int32_t> tokens,
                                    const PerplexityParams& params, const PerplexityProgress& progress) {
  check(model != nullptr, "perplexity: no model");
  const ModelInfo& info = model->info();
  check(params.n_batch >= 1, "perplexity: --batch must be at least 1");
  check(info.n_ctx_train <= 0 || params.ctx <= info.n_ctx_train,
        "perplexity: --ctx " + std::to_string(params.ctx) + " exceeds the model's training context of " +
            std::to_string(info.n_ctx_train) + " tokens");
  if (params.replace_first_with_bos) {
    check(params.bos_id >= 0 && params.bos_id < info.n_vocab,
          "perplexity: the model adds BOS but has no valid BOS token id");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    check(tokens[i] >= 0 && tokens[i] < info.n_vocab,
          "perplexity: token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
              " is outside the vocabulary of " + std::to_string(info.n_vocab));
  }
  const std::vector<PerplexityWindow> windows =
      perplexity_windows(int64_t(tokens.size()), params.ctx, params.stride);

  SessionParams sp;
  sp.n_ctx = params.ctx;
  sp.n_seq_max = 1;
  sp.n_batch = std::min(params.n_batch, params.ctx);
  sp.n_logits_max = sp.n_batch;
  sp.kv_type = KvType::F32;  // the figure should reflect the weights, not a rounded cache
  Session session(model, sp);

  NllStats stats;
  Batch batch;
  std::vector<int32_t> window;
  for (size_t w = 0; w < windows.size(); ++w) {
    const PerplexityWindow& win = windows[w];
    window.assign(tokens.begin() + win.start, tokens.begin() + win.end);
    if (params.replace_first_with_bos) window[0] = params.bos_id;
    session.clear();
    const int64_t len = win.end - win.start;
    // Row r predicts window[r + 1]; rows first_scored - start - 1 .. len - 2 are scored.
    const int64_t first_row = win.first_scored - win.start - 1;
    for (int64_t r0 = 0; r0 < len; r0 += sp.n_batch) {
      const int64_t r1 = std::min<int64_t>(r0 + sp.n_batch, len);
      batch.clear();
      for (int64_t r = r0; r < r1; ++r) {
        batch.add(window[size_t(r)], int32_t(r), 0, r >= first_row && r <= len - 2);
      }
      session.decode(batch);
      session.fetch_all_logits();  // every marked row is read: one copy, not one per row
      for (int64_t r = std::max(r0, first_row); r < r1 && r <= len - 2; ++r)
        if (!all_finite(session.logits(size_t(r - r0))))
          throw_non_finite(session, window,
                           "window " + std::to_string(w + 1) + " of " + std::to_string(windows.size()));
      for (int64_t r = std::max(r0, first_row); r < r1 && r <= len - 2; ++r) {
        stats.add(token_nll(session.logits(size_t(r - r0)), window[size_t(r + 1)]));
      }
    }
    if (progress) progress(w + 1, windows.size(), stats);
  }
  check(stats.count > 0, "perplexity: no token was scored (" + std::to_string(tokens.size()) +
                             " tokens, --ctx " + std::to_string(params.ctx) +
                             "): a window scores its second half; use a larger --ctx or a longer text");
  PerplexityResult res;
  res.ppl = stats.ppl();
  res.ppl_error = stats.ppl_error();
  res.mean_nll = stats.mean();
  res.tokens_scored = stats.count;
  res.windows = int64_t(windows.size());
  return res;
}

}  // namespace tandem::eval
