// `tandem parallel -m MODEL.gguf [--parallel N] [--sequences M] [--prompt-min/--prompt-max] [-n N]
// [--ctx N] [--kv-unified] [--seed S]`: a llama-parallel style simulation. M requests with random prompts
// (random token ids, a shared random "system prompt" prefix of --shared tokens) go through the serving
// Scheduler in-process, N at a time; reports throughput, per-request latency (TTFT, total) and KV use.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "eval/default_model.h"
#include "flag_checks.h"
#include "serve/scheduler.h"
#include "split_options.h"
#include "tandem/model.h"
#include "tandem/session.h"

namespace tandem::cli {
namespace {

struct ParallelArgs {
  std::string model;
  int parallel = 4;
  int sequences = 16;
  int prompt_min = 8, prompt_max = 64;
  int shared = 0;
  int n_predict = 32;
  int ctx = 4096;
  int batch = 512;
  int threads = 0;
  bool kv_unified = false;
  int64_t seed = 1;
  SplitOptions split;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

void run_parallel(const ParallelArgs& a) {
  check(a.parallel >= 1, "--parallel must be at least 1, got " + std::to_string(a.parallel));
  check(a.sequences >= 1, "--sequences must be at least 1, got " + std::to_string(a.sequences));
  check(a.prompt_min >= 1 && a.prompt_max >= a.prompt_min,
        "--prompt-min must be >= 1 and <= --prompt-max, got " + std::to_string(a.prompt_min) + " and " +
            std::to_string(a.prompt_max));
  check(a.shared >= 0, "--shared must be >= 0, got " + std::to_string(a.shared));
  check(a.n_predict >= 1, "-n must be at least 1, got " + std::to_string(a.n_predict));
  check(a.ctx >= 1, "--ctx must be at least 1, got " + std::to_string(a.ctx));
  check(a.batch >= 1, "--batch must be at least 1, got " + std::to_string(a.batch));
  check_threads_flag(a.threads);
  check(a.seed >= 0, "--seed must be >= 0, got " + std::to_string(a.seed));
  check(a.kv_unified || a.ctx / a.parallel >= 64,
        "--ctx " + std::to_string(a.ctx) + " split over --parallel " + std::to_string(a.parallel) +
            " slots leaves fewer than 64 positions each; raise --ctx or use --kv-unified");
  ModelParams mp;
  mp.n_threads = a.threads;
  apply(a.split, mp);
  const auto model = Model::load(a.model.empty() ? eval::default_model_path(TANDEM_SOURCE_DIR) : a.model, mp);
  serve::SchedulerParams sp;
  sp.n_slots = a.parallel;
  sp.n_ctx = a.ctx;
  sp.kv_unified = a.kv_unified;
  sp.n_batch = a.batch;
  sp.queue_timeout_s = 1e9;  // a simulation waits
  serve::Scheduler sched(model, SessionParams{}, sp);

  std::mt19937_64 rng(uint64_t(a.seed));
  const int32_t n_vocab = int32_t(model->info().n_vocab);
  std::uniform_int_distribution<int32_t> tok(0, n_vocab - 1);
  std::uniform_int_distribution<int> len(a.prompt_min, a.prompt_max);
  std::vector<int32_t> system(size_t(a.shared));
  for (int32_t& t : system) t = tok(rng);

  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  auto channel = std::make_shared<serve::Channel>();
  size_t n_prompt_tokens = 0;
  for (int i = 0; i < a.sequences; ++i) {
    serve::ServeRequest r;
    r.prompt = system;
    const int n = len(rng);
    for (int j = 0; j < n; ++j) r.prompt.push_back(tok(rng));
    n_prompt_tokens += r.prompt.size();
    r.gen.max_tokens = a.n_predict;
    r.gen.ignore_eos = true;
    r.gen.sampling.temperature = 0.8f;
    r.gen.sampling.seed = uint64_t(a.seed) + uint64_t(i);
    r.index = i;
    r.channel = channel;
    sched.submit(std::move(r));
  }
  std::vector<double> ttft(size_t(a.sequences), -1.0), total(size_t(a.sequences), 0.0);
  int finished = 0, rejected = 0;
  size_t n_generated = 0;
  int64_t kv_peak = 0;
  while (finished < a.sequences) {
    for (const serve::RequestEvent& e : channel->pop(std::chrono::milliseconds(50))) {
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (e.rejected) {
        ++rejected;
        ++finished;
        continue;
      }
      if (e.token >= 0) {
        ++n_generated;
        if (ttft[size_t(e.index)] < 0) ttft[size_t(e.index)] = t;
      } else {
        total[size_t(e.index)] = t;
        ++finished;
      }
    }
    kv_peak = std::max(kv_peak, sched.metrics().kv_used());
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "parallel: %d sequences, %d slots, ctx %d%s, prompts %d..%d tokens (+%d shared), %d tokens each\n",
      a.sequences, a.parallel, a.ctx, a.kv_unified ? " unified" : " per-slot", a.prompt_min, a.prompt_max,
      a.shared, a.n_predict);
  std::printf("prompt tokens: %zu, generated tokens: %zu, rejected: %d\n", n_prompt_tokens, n_generated,
              rejected);
  std::printf("wall: %.3f s, throughput: %.2f tokens/s (prompt + generated), %.2f generated tokens/s\n", wall,
              double(n_prompt_tokens + n_generated) / wall, double(n_generated) / wall);
  std::printf(
      "time to first token (from start): p50 %.3f s, p99 %.3f s; request end: p50 %.3f s, p99 %.3f s\n",
      pct(ttft, 0.5), pct(ttft, 0.99), pct(total, 0.5), pct(total, 0.99));
  std::printf("KV: peak %lld positions used (sampled between steps)\n", (long long)kv_peak);
  check(rejected == 0, std::to_string(rejected) + " requests were rejected");
}

}  // namespace

void add_parallel_command(CLI::App& app) {
  auto args = std::make_shared<ParallelArgs>();
  CLI::App* cmd = app.add_subcommand("parallel", "Simulate concurrent clients through the serving scheduler");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("-m,--model", args->model, "Model file (GGUF); default: the shipped small model");
  cmd->add_option("--parallel", args->parallel, "Slots: sequences decoded together");
  cmd->add_option("--sequences", args->sequences, "Requests in total");
  cmd->add_option("--prompt-min", args->prompt_min, "Shortest random prompt (tokens)");
  cmd->add_option("--prompt-max", args->prompt_max, "Longest random prompt (tokens)");
  cmd->add_option("--shared", args->shared, "Tokens of a random prefix every prompt shares (prefix sharing)");
  cmd->add_option("-n,--n-predict", args->n_predict, "Tokens generated per request");
  cmd->add_option("-c,--ctx", args->ctx, "KV cache positions in total");
  cmd->add_flag("--kv-unified", args->kv_unified, "One KV pool for all slots");
  cmd->add_option("-b,--batch", args->batch, "Token budget of one step");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all cores)");
  cmd->add_option("--seed", args->seed, "Seed of the prompts and of the samplers");
  add_split_options(cmd, &args->split);
  cmd->callback([args]() {
    if (parse_only()) return;
    run_parallel(*args);
  });
}

}  // namespace tandem::cli
