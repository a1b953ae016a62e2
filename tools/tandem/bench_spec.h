// `tandem bench --draft FILE` (bench_spec.cpp): speculative vs autoregressive decoding of the bench's model.
#pragma once

#include <memory>
#include <string>

#include "spec_options.h"
#include "tandem/model.h"

namespace tandem::cli {

// Prints a markdown section: AR and speculative tokens/s (best of reps), the speedup, the mean accepted
// length and the per-position acceptance. The drafter loads on `device`.
void bench_speculative(const SpecOptions& o, const std::shared_ptr<Model>& target, const std::string& device,
                       int threads, int n_gen, int reps);

}  // namespace tandem::cli
