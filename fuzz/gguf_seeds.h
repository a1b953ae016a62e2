// Small valid GGUF files built in memory with GgufWriter: the starting points of the mutation test and the
// seed corpus of the libFuzzer harness (gguf_mutation_test --write-seeds DIR).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::gguf::fuzzing {

// Several files covering every metadata type, nested arrays, general.alignment (default, 1, 64), GGUF v2 and
// v3, and tensors of several dtypes (including empty and 0-dim ones). Deterministic.
std::vector<std::vector<uint8_t>> make_gguf_seeds();

}  // namespace tandem::gguf::fuzzing
