// What both drafters (speculative_draft_model.cpp, speculative_dflash.cpp) need from the sampling side: how
// sure a greedy draft is (for --draft-p-min), and the sampling parameters a drafter draws its proposals with.
#pragma once

#include <cstdint>
#include <span>

#include "tandem/sampling.h"

namespace tandem {

// The largest softmax probability of a row of logits.
double top_probability(std::span<const float> logits);

// The target's parameters without the penalties (they belong to the target's history), on a random stream of
// the drafter's own: seed ^ stream_salt. The same filters and temperature keep the draft distribution q close
// to the target's p; any q stays lossless (the acceptance test corrects for it).
SamplingParams draft_sampling(const SamplingParams& target, uint64_t stream_salt);

}  // namespace tandem
