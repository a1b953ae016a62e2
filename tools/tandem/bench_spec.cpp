// `tandem bench --draft FILE`: speculative decoding against autoregressive decoding of the same model, both
// greedy through the same loop (SpeculativeDecoder; --draft-max 0 is the AR baseline), on one fixed prompt:
// tokens/s of each, the speedup, the mean accepted length (tokens per target pass, the bound of the speedup)
// and the per-position acceptance.
#include <algorithm>
#include <cstdio>

#include "bench_spec.h"
#include "core/error.h"

namespace tandem::cli {

void bench_speculative(const SpecOptions& o, const std::shared_ptr<Model>& target, const std::string& device,
                       int threads, int n_gen, int reps) {
  check_spec_options(o);
  const ModelInfo& info = target->info();
  std::vector<int32_t> prompt;
  if (info.bos_id >= 0) prompt.push_back(info.bos_id);
  for (int i = 0; i < 16; ++i)
    prompt.push_back(int32_t((i * 7919 + 17) % std::max<int64_t>(info.n_vocab, 1)));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<SamplingParams> sampling = {greedy};
  const int n_ctx = int(prompt.size()) + n_gen + o.draft_max + 8;
  double ar_s = 1e30, spec_s = 1e30;
  SpeculativeStats stats;
  size_t ar_tokens = 0, spec_tokens = 0;
  for (int r = 0; r < std::max(1, reps); ++r) {
    SpecOptions ar = o;
    ar.draft_max = 0;
    ar.draft_min = 0;
    const SpecRun a = run_speculative(ar, target, device, threads, n_ctx, {prompt}, n_gen, sampling, {});
    const SpecRun s = run_speculative(o, target, device, threads, n_ctx, {prompt}, n_gen, sampling, {});
    ar_s = std::min(ar_s, a.seconds);
    spec_s = std::min(spec_s, s.seconds);
    ar_tokens = a.tokens[0].size();
    spec_tokens = s.tokens[0].size();
    stats = s.stats;
  }
  std::printf(
      "\n## Speculative decoding (--draft %s, --draft-max %d, greedy, %zu-token prompt, best of %d)\n\n",
      o.draft.c_str(), o.draft_max, prompt.size(), std::max(1, reps));
  std::printf("| mode | tokens | seconds | tokens/s |\n|---|---|---|---|\n");
  std::printf("| AR | %zu | %.3f | %.2f |\n", ar_tokens, ar_s, double(ar_tokens) / ar_s);
  std::printf("| speculative | %zu | %.3f | %.2f |\n\n", spec_tokens, spec_s, double(spec_tokens) / spec_s);
  std::printf("speedup over AR: %.3fx; mean accepted length: %.3f (the speedup bound); acceptance %.1f%%\n",
              (double(spec_tokens) / spec_s) / (double(ar_tokens) / ar_s), stats.mean_accepted_length(),
              100.0 * stats.acceptance_rate());
  std::printf("time per verify cycle: %.3f ms speculative (draft + verify, %lld cycles), %.3f ms per AR step\n",
              1e3 * spec_s / double(std::max<int64_t>(stats.cycles, 1)), (long long)stats.cycles,
              1e3 * ar_s / double(std::max<size_t>(ar_tokens, 1)));
  std::printf("per cycle: draft pass %.3f ms, verify pass %.3f ms (block of up to %d + 1 rows)\n",
              1e3 * stats.draft_seconds / double(std::max<int64_t>(stats.cycles, 1)),
              1e3 * stats.verify_seconds / double(std::max<int64_t>(stats.cycles, 1)), o.draft_max);
  std::printf("realized speedup / accepted-length bound: %.3f\n",
              ((double(spec_tokens) / spec_s) / (double(ar_tokens) / ar_s)) /
                  std::max(stats.mean_accepted_length(), 1e-9));
  std::printf("%s\n", stats.summary().c_str());
}

}  // namespace tandem::cli
