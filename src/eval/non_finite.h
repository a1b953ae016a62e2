// Non-finite (NaN / Inf) logits: a model with broken weights must fail with an error, not print junk text or
// "PPL nan". The check is cheap (one pass over the rows already on the host); finding where the values first
// appear runs the tokens once more with taps on every layer, only after the check failed.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tandem/session.h"

namespace tandem::eval {

bool all_finite(std::span<const float> values);

// Runs `tokens` (at most the first 64) through a new session of the session's model with a tap on the input
// of every layer and on the last layer's output, and names the first place whose values are not finite: "the
// token embeddings", "the output of layer N" or "the output head (the last layer's output is finite)".
std::string locate_non_finite(const Session& session, std::span<const int32_t> tokens);

// The error for non-finite logits at `where` ("the first step", "window 3"): names the location when it can.
[[noreturn]] void throw_non_finite(const Session& session, std::span<const int32_t> tokens,
                                   const std::string& where);

}  // namespace tandem::eval
