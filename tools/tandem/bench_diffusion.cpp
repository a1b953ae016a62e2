// `tandem bench -m CANVAS_MODEL --diffusion [-p PROMPT_TOKENS] [--diffusion-steps S] [-r REPS]`: canvas
// diffusion speed (issue 17) with the library's driver on one block of a fixed prompt, for each sampling
// path:
//   host:   the canvas logits cross to the host and are reduced there (--diffusion-gpu-sample-reduce off);
//   device: the per-row reduction runs where the logits are (D.8; only on a GPU).
// Per path: PREFILL (begin_block) time, ms per denoising step (forward + self-conditioning + reduction +
// decisions: the block's denoise time / its steps, with the stop rule off so every run does S steps), and
// tokens/s of one canvas at the model's default steps (PREFILL + default steps x ms per step; S may be set
// lower with --diffusion-steps to measure faster). Best of REPS. The weight bytes per step over the
// step time is printed as an upper bound of the bandwidth used (an MoE step reads only its routed experts).
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "bench.h"
#include "bench_diffusion.h"
#include "core/error.h"

namespace tandem::cli {
namespace {

struct PathResult {
  std::string path;
  bool ran_on_device = false;
  double prefill_s = 1e30, step_s = 1e30;
  int steps = 0;
};

DiffusionParams bench_params(const CanvasSource& source, const EbParams& eb, Toggle reduce) {
  DiffusionParams p;
  p.eb = eb;
  // The stop rule never fires: every run is exactly max_steps steps.
  p.eb.stability_threshold = 1 << 30;
  p.n_predict = source.info().canvas_length;
  p.n_blocks = 1;
  p.repeat_run = 0;
  p.gpu_sample_reduce = reduce;
  p.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  return p;
}

PathResult run_path(CanvasSource& source, const std::vector<int32_t>& prompt, const EbParams& eb,
                    Toggle reduce, int reps, const char* name) {
  PathResult r;
  r.path = name;
  const DiffusionParams p = bench_params(source, eb, reduce);
  for (int i = 0; i <= reps; ++i) {  // run 0 warms up (allocations, graph recording)
    const DiffusionResult res = diffuse(source, prompt, p);
    const DiffusionBlockStats& b = res.blocks.front();
    if (i == 0) continue;
    r.ran_on_device = res.device_reduce;
    r.steps = b.steps;
    r.prefill_s = std::min(r.prefill_s, b.begin_seconds);
    r.step_s = std::min(r.step_s, b.denoise_seconds / std::max(1, b.steps));
  }
  return r;
}

// One more block on the path `reduce`, its steps after the first (PREFILL and step 0's first-use work out of
// it) in the profiler's window.
bench::ProfiledRun profile_steps(CanvasSource& source, const std::vector<int32_t>& prompt, const EbParams& eb,
                                 Toggle reduce, const std::string& path, KernelProfiler& profiler) {
  bench::ProfiledRun run;
  bench::Clock::time_point t0;
  int last = 0;
  auto on_step = [&](const DiffusionStep& st) {
    if (st.step == 0) {
      profiler.begin_window();
      t0 = bench::Clock::now();
    }
    last = st.step;
    return true;
  };
  diffuse(source, prompt, bench_params(source, eb, reduce), on_step);
  run.wall_seconds = bench::seconds_since(t0);
  run.kernels = profiler.end_window();
  run.steps = last;
  run.what = "denoising steps 2.." + std::to_string(last + 1) + " of a block, " + path;
  return run;
}

}  // namespace

void bench_diffusion(const std::shared_ptr<Model>& model, const std::string& model_path, int n_prompt,
                     int steps, std::optional<KvType> kv_type, int reps, double bw_gbs, KernelProfiler* profiler) {
  CanvasModelInfo info;
  try {
    info = canvas_model_info(*model);
  } catch (const Error& e) {
    throw Error("bench --diffusion: '" + model_path + "' cannot run canvas diffusion: " + e.what());
  }
  check(n_prompt >= 1, "bench --diffusion: -p (prompt tokens) must be >= 1, got " + std::to_string(n_prompt));
  EbParams eb = info.eb_defaults;
  const int32_t default_steps = eb.max_steps;
  if (steps > 0) eb.max_steps = steps;
  eb.seed = 1;
  check_eb_params(eb);
  std::vector<int32_t> prompt;
  for (int i = 0; i < n_prompt; ++i) prompt.push_back(int32_t((i * 7919 + 17) % std::max(info.n_vocab, 1)));

  CanvasOptions copt;
  copt.kv_type = kv_type;
  std::unique_ptr<CanvasSource> source = make_canvas_source(model, copt);
  std::vector<PathResult> results;
  results.push_back(run_path(*source, prompt, eb, Toggle::Off, std::max(1, reps), "host reduction"));
  results.push_back(run_path(*source, prompt, eb, Toggle::Auto, std::max(1, reps), "device reduction"));

  const ModelInfo& mi = model->info();
  std::printf("\n## Canvas diffusion (%s; canvas %d, prompt %d, %d steps measured, best of %d)\n\n",
              model_path.c_str(), info.canvas_length, n_prompt, eb.max_steps, std::max(1, reps));
  std::printf("source: %s\n\n", source->describe().c_str());
  std::printf(
      "| sampling | ran on | PREFILL ms | ms / step | steps/s | tokens/s (1 canvas, %d steps) | weight "
      "GB/s (upper bound) |\n|---|---|---|---|---|---|---|\n",
      default_steps);
  for (const PathResult& r : results)
    std::printf("| %s | %s | %.2f | %.3f | %.1f | %.1f | %.0f |\n", r.path.c_str(),
                r.ran_on_device ? "device" : "host", r.prefill_s * 1e3, r.step_s * 1e3, 1.0 / r.step_s,
                double(info.canvas_length) / (r.prefill_s + default_steps * r.step_s),
                double(mi.weight_bytes) / r.step_s / 1e9);
  if (results[1].ran_on_device)
    std::printf("\ndevice path speedup per step: %.2fx\n", results[0].step_s / results[1].step_s);
  else
    std::printf("\nthe device reduction did not run (logits on the host): both rows are the host path\n");

  // What one step reads at least: every weight (C canvas rows x top-k routes reach every expert of a
  // 128-expert layer with near certainty at C = 256, and the tied head reads token_embd whole), the SC table
  // (F16, n_vocab x n_embd, read by the soft-embedding matmul) and the canvas logits (written by the head,
  // read by SC and by the reduction: 3 passes of C x n_vocab F32).
  const double weights = double(mi.weight_bytes);
  const double sc_table = double(mi.n_vocab) * double(mi.n_embd) * 2.0;
  const double logits = 3.0 * double(info.canvas_length) * double(mi.n_vocab) * 4.0;
  const double per_step = weights + sc_table + logits;
  const PathResult& best = results[1].ran_on_device ? results[1] : results[0];
  std::printf(
      "\nbytes per step (all weights: every expert is read when canvas x top-k >> experts): %.2f GB = "
      "weights %.2f + SC table %.2f + canvas logits %.2f; at the "
      "%s path's %.3f ms per step that is %.0f GB/s",
      per_step / 1e9, weights / 1e9, sc_table / 1e9, logits / 1e9, best.path.c_str(), best.step_s * 1e3,
      per_step / best.step_s / 1e9);
  if (bw_gbs > 0)
    std::printf(" = %.0f%% of %.0f GB/s (floor %.3f ms per step)",
                100.0 * per_step / best.step_s / 1e9 / bw_gbs, bw_gbs, per_step / (bw_gbs * 1e9) * 1e3);
  std::printf("\n");
  if (profiler) {
    const bool dev = results[1].ran_on_device;
    bench::print_profile_markdown(
        profile_steps(*source, prompt, eb, dev ? Toggle::Auto : Toggle::Off, results[dev ? 1 : 0].path, *profiler));
  }
}

}  // namespace tandem::cli
