// What the commands that run a model to generate text (generate, chat, serve) set up the same way: the
// sampling flags (spelled, defaulted, checked and turned into SamplingParams in one place), the checks of
// --ctx / --batch / --threads, and loading -m (default: the shipped model) with --threads and the split
// flags. These were written twice, side by side, in cmd_generate.cpp and cmd_chat.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "parallel/mesh.h"
#include "split_options.h"
#include "tandem/model.h"
#include "tandem/sampling.h"

namespace tandem::cli {

struct SamplingFlags {
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t seed = -1;  // -1: random
};

// Registers --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty,
// --frequency-penalty and --seed (described by seed_help) on cmd, storing into f.
void add_sampling_flags(CLI::App* cmd, SamplingFlags* f, const char* seed_help = "Random seed (-1: random)");
// Each flag in its range, named in the message (check_sampling_flags of flag_checks.h).
void check_sampling_flags(const SamplingFlags& f);
// The sampler's parameters; seed -1 draws a random seed.
SamplingParams sampling_params(const SamplingFlags& f);

// --ctx, --batch (>= 1) and --threads (0 .. the pool's cap), named in the messages.
void check_run_flags(int ctx, int batch, int threads);

// -m, or the shipped small model when it is empty.
std::string model_path_or_default(const std::string& model_flag);

struct LoadedModel {
  std::shared_ptr<Model> model;
  MeshSpec mesh;  // the checked split (one device without --devices)
};
// Checks the split flags (before any file is read), then loads path with `threads` CPU threads on the mesh.
LoadedModel load_model(const std::string& path, int threads, const SplitOptions& split);

}  // namespace tandem::cli
