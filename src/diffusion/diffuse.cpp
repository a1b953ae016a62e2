// The multi-block driver of canvas diffusion (GGUF-ARCH-FACTS D.7): blocks of canvas_length tokens, each
// denoised by the EB loop (eb_sampler.h) over the prompt plus the blocks kept before it.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>

#include "core/error.h"
#include "diffusion/eb_reduce.h"
#include "diffusion/eb_sampler.h"
#include "tandem/diffusion.h"

namespace tandem {

size_t diffusion_keep_length(std::span<const int32_t> canvas, std::span<const int32_t> eog_ids,
                             int32_t repeat_run) {
  size_t keep = canvas.size();
  for (size_t i = 0; i < canvas.size(); ++i)
    if (std::find(eog_ids.begin(), eog_ids.end(), canvas[i]) != eog_ids.end()) {
      keep = i;
      break;
    }
  if (repeat_run <= 1) return keep;
  // A unit of s tokens (s = 1, 2) starting at i that occurs repeat_run times in a row: keep one copy of it.
  const size_t run = size_t(repeat_run);
  for (size_t i = 0; i < keep; ++i) {
    for (size_t s = 1; s <= 2; ++s) {
      if (i + run * s > keep) continue;
      bool loop = true;
      for (size_t j = i + s; j < i + run * s && loop; ++j) loop = canvas[j] == canvas[j - s];
      if (loop) return i + s;
    }
  }
  return keep;
}

DiffusionResult diffuse(CanvasSource& source, std::span<const int32_t> prompt, const DiffusionParams& params,
                        const DiffusionStepCallback& on_step) {
  const CanvasModelInfo& info = source.info();
  check(info.canvas_length > 0 && info.n_vocab > 0, "diffusion: the canvas source reports canvas_length " +
                                                        std::to_string(info.canvas_length) + " and n_vocab " +
                                                        std::to_string(info.n_vocab) + " (both must be > 0)");
  check_eb_params(params.eb);
  check(params.n_predict >= 1,
        "diffusion: the number of tokens to generate must be >= 1, got " + std::to_string(params.n_predict));
  check(params.n_blocks >= 0,
        "diffusion: the number of blocks must be >= 0 (0 = from the tokens wanted), got " +
            std::to_string(params.n_blocks));
  check(params.repeat_run >= 0,
        "diffusion: repeat_run must be >= 0, got " + std::to_string(params.repeat_run));
  check(!prompt.empty(), "diffusion: the prompt is empty");
  check(params.max_prefix <= 0 || int64_t(prompt.size()) <= params.max_prefix,
        "diffusion: the prompt has " + std::to_string(prompt.size()) + " tokens, more than the " +
            std::to_string(params.max_prefix) + " positions the canvas model holds before its canvas");
  for (int32_t t : prompt)
    check(t >= 0 && t < info.n_vocab,
          "diffusion: prompt token " + std::to_string(t) + " is outside the vocabulary");

  const int32_t C = info.canvas_length;
  const int32_t n_blocks = params.n_blocks > 0 ? params.n_blocks : (params.n_predict + C - 1) / C;
  std::function<void(const std::string&)> log = params.log;
  if (!log) log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  diffusion::EbReducer reducer(params.gpu_sample_reduce, info.n_vocab, C, log);

  using Clock = std::chrono::steady_clock;
  DiffusionResult result;
  std::vector<int32_t> prefix(prompt.begin(), prompt.end());
  for (int32_t b = 0; b < n_blocks; ++b) {
    if (params.max_prefix > 0 && int64_t(prefix.size()) > params.max_prefix) {
      log("diffusion: stopping after " + std::to_string(b) + " blocks: the next would start after " +
          std::to_string(prefix.size()) + " tokens, more than the model holds (" +
          std::to_string(params.max_prefix) + ")");
      break;
    }
    DiffusionBlockStats stats;
    const auto t0 = Clock::now();
    source.begin_block(prefix);
    const auto t1 = Clock::now();
    // The same seed every block (D.7): blocks differ by their prefix only.
    diffusion::EbBlockRun run = diffusion::run_eb_block(source, reducer, params.eb, b, on_step);
    stats.begin_seconds = std::chrono::duration<double>(t1 - t0).count();
    stats.denoise_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
    stats.steps = run.steps;
    stats.converged = run.converged;
    result.total_steps += run.steps;
    result.device_reduce = result.device_reduce || run.device_reduce;
    const size_t keep = diffusion_keep_length(run.canvas, params.eog_ids, params.repeat_run);
    stats.kept = int32_t(keep);
    stats.trimmed = keep < run.canvas.size();
    result.tokens.insert(result.tokens.end(), run.canvas.begin(), run.canvas.begin() + std::ptrdiff_t(keep));
    result.blocks.push_back(stats);
    if (stats.trimmed) break;
    prefix.insert(prefix.end(), run.canvas.begin(), run.canvas.end());
  }
  return result;
}

}  // namespace tandem
