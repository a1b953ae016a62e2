// Speculative decoding flags of `tandem generate` and `tandem bench` (--draft, --spec, --draft-max,
// --draft-min, --draft-p-min), their checks, and the generate path that runs tandem::SpeculativeDecoder
// (tandem/speculative.h) instead of the plain Generator.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/speculative.h"

namespace tandem::cli {

struct SpecOptions {
  std::string draft;      // --draft FILE
  std::string spec;       // --spec dflash|draft; empty = from the drafter's architecture
  int draft_max = 8;      // --draft-max
  int draft_min = 0;      // --draft-min
  float draft_p_min = 0;  // --draft-p-min
  bool enabled() const { return !draft.empty(); }
};

void add_spec_options(CLI::App* cmd, SpecOptions* o);

// Checks the flags (named in the message) without reading any file; SpeculativeParams from them.
SpeculativeParams check_spec_options(const SpecOptions& o);

// The drafter kind: --spec when given, else "dflash" for a file whose architecture is dflash and "draft" for
// any other. Throws Error when --spec contradicts the file or names no kind.
std::string spec_kind(const SpecOptions& o, const std::string& draft_arch);

struct SpecRun {
  std::vector<std::vector<int32_t>> tokens;  // per prompt
  SpeculativeStats stats;
  double seconds = 0;  // generation, prefill included
};

// Loads the drafter (unsplit, on `device` with `threads`) and generates with it for target sessions of
// n_ctx positions: one sequence per prompt.
SpecRun run_speculative(const SpecOptions& o, const std::shared_ptr<Model>& target, const std::string& device,
                        int threads, int n_ctx, const std::vector<std::vector<int32_t>>& prompts,
                        int n_predict, const std::vector<SamplingParams>& sampling,
                        const std::vector<int32_t>& stop_ids);

}  // namespace tandem::cli
