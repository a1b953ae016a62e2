// The hidden replay mode of `tandem diffuse` (diffuse_replay.cpp): the EB sampler over recorded logits, with
// a JSON trace of every step, for the reference check against transformers and the device-vs-host check.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "diffuse_options.h"

namespace tandem::cli {

struct ReplayOptions {
  std::string logits;  // --replay-logits FILE
  std::string device;  // --replay-device DEV (empty: host memory)
  std::string trace;   // --trace OUT.json
};

void add_replay_options(CLI::App* cmd, ReplayOptions* o);
// Runs one block over the file's logits with the --diffusion-* flags and --seed; writes the trace.
void run_replay(const ReplayOptions& r, const DiffuseOptions& o);

}  // namespace tandem::cli
