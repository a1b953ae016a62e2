// Plain greedy decoding, the reference the CPU and GPU tests compare their runs with: the prompt in one step,
// then one row per step, each step fed the previous step's argmax (tandem::argmax, the library's own greedy
// choice: the lowest index on ties).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/session.h"

namespace tandem::testing {

// n tokens of plain greedy decoding after prompt (batch_invariant: the session flag, for GPU runs compared
// with a batch-invariant speculative target).
inline std::vector<int32_t> plain_greedy(const std::shared_ptr<Model>& model,
                                         const std::vector<int32_t>& prompt, int n,
                                         bool batch_invariant = false) {
  Session session(model, {.n_ctx = 256, .batch_invariant = batch_invariant});
  Batch batch;
  batch.add_sequence(prompt, 0, 0, true);
  std::vector<int32_t> out;
  int32_t pos = int32_t(prompt.size());
  for (int i = 0; i < n; ++i) {
    session.decode(batch);
    const int32_t t = argmax(session.logits(batch.size() - 1));
    out.push_back(t);
    batch.clear();
    batch.add(t, pos++, 0, true);
  }
  return out;
}

}  // namespace tandem::testing
