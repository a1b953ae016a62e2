// Sampling flags, run-flag checks and model loading shared by generate, chat and serve (run_options.h).
#include "run_options.h"

#include <random>

#include "eval/default_model.h"
#include "flag_checks.h"

namespace tandem::cli {

void add_sampling_flags(CLI::App* cmd, SamplingFlags* f, const char* seed_help) {
  cmd->add_option("--temp", f->temperature, "Temperature (<= 0: greedy)");
  cmd->add_option("--top-k", f->top_k, "Top-k (0: off)");
  cmd->add_option("--top-p", f->top_p, "Top-p (1: off)");
  cmd->add_option("--min-p", f->min_p, "Min-p (0: off)");
  cmd->add_option("--repeat-penalty", f->repeat_penalty, "Repetition penalty (1: off)");
  cmd->add_option("--repeat-last-n", f->repeat_last_n, "Tokens the penalties look back over (-1: all)");
  cmd->add_option("--presence-penalty", f->presence_penalty, "Presence penalty (0: off)");
  cmd->add_option("--frequency-penalty", f->frequency_penalty, "Frequency penalty (0: off)");
  cmd->add_option("--seed", f->seed, seed_help);
}

void check_sampling_flags(const SamplingFlags& f) {
  check_sampling_flags(f.top_k, f.temperature, f.top_p, f.min_p, f.seed, f.repeat_last_n, f.repeat_penalty);
}

SamplingParams sampling_params(const SamplingFlags& f) {
  SamplingParams sp;
  sp.temperature = f.temperature;
  sp.top_k = f.top_k;
  sp.top_p = f.top_p;
  sp.min_p = f.min_p;
  sp.repeat_penalty = f.repeat_penalty;
  sp.penalty_last_n = f.repeat_last_n;
  sp.presence_penalty = f.presence_penalty;
  sp.frequency_penalty = f.frequency_penalty;
  if (f.seed < 0) {
    std::random_device rd;
    sp.seed = (uint64_t(rd()) << 32) ^ rd();
  } else {
    sp.seed = uint64_t(f.seed);
  }
  return sp;
}

void check_run_flags(int ctx, int batch, int threads) {
  check(ctx >= 1, "--ctx must be at least 1, got " + std::to_string(ctx));
  check(batch >= 1, "--batch must be at least 1, got " + std::to_string(batch));
  check(threads >= 0 && threads <= ThreadPool::kMaxThreads,
        "--threads must be in [0, " + std::to_string(ThreadPool::kMaxThreads) + "] (0 = all cores), got " +
            std::to_string(threads));
}

std::string model_path_or_default(const std::string& model_flag) {
  return model_flag.empty() ? eval::default_model_path(TANDEM_SOURCE_DIR) : model_flag;
}

LoadedModel load_model(const std::string& path, int threads, const SplitOptions& split) {
  ModelParams mp;
  mp.n_threads = threads;
  LoadedModel m;
  m.mesh = apply(split, mp);
  m.model = Model::load(path, mp);
  return m;
}

}  // namespace tandem::cli
