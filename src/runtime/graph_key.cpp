// graph_key.h: which steps a session replays as recorded graphs, and their keys.
#include "runtime/graph_key.h"

#include "core/env_switch.h"

#include <atomic>
#include <cstdlib>

#include "core/error.h"

namespace tandem {

std::optional<StepShape> recordable_step_shape(const Batch& batch, std::span<const int32_t> added_rows, size_t r0,
                                               size_t r1, bool source_readable) {
  StepShape s;
  s.mask = batch.mask.kind;
  if (s.mask != AttentionMask::Causal && s.mask != AttentionMask::BlockBidirectional) return std::nullopt;
  for (size_t i = r0; i < r1 && i < added_rows.size(); ++i) s.added |= added_rows[i] >= 0;
  if (!s.added) return s;
  const EmbeddingSource& src = batch.embedding_source;
  if (src.data == nullptr || !source_readable) return std::nullopt;  // host rows / another device's buffer
  s.source = src.data;
  s.source_rows = src.n_rows;
  s.source_stride = src.row_stride;
  return s;
}

namespace {
// On by default since the tenth session's GPU run (tandem_gpu_tests 75/75 with it; DFlash small pair 0.99x -> 1.12x).
EnvSwitch g_record_other{"TANDEM_RECORD_SHAPES", true};
}  // namespace

bool record_other_step_shapes() {
  return g_record_other.on();
}

void set_record_other_step_shapes(std::optional<bool> on) {
  g_record_other.set(on);
}

std::optional<uint32_t> StepShapeIds::id_of(const StepShape& s) {
  if (s == StepShape{}) return 0u;
  for (size_t i = 0; i < seen_.size(); ++i)
    if (seen_[i] == s) return uint32_t(i + 1);
  if (seen_.size() >= kMaxStepShapes) return std::nullopt;
  seen_.push_back(s);
  return uint32_t(seen_.size());
}

uint64_t step_graph_key(uint64_t session_id, uint32_t tap_generation, uint32_t shape_id, int64_t n_rows,
                        int64_t n_out_rows) {
  check(n_rows >= 1 && n_rows < 128 && n_out_rows >= 0 && n_out_rows <= n_rows && shape_id <= 255 &&
            session_id < (uint64_t(1) << 32),
        "internal: a recorded step's key is out of range");
  return (session_id << 32) | (uint64_t(tap_generation & 0xffu) << 24) | (uint64_t(shape_id) << 16) |
         (uint64_t(n_rows) << 8) | (uint64_t(n_out_rows) << 1) | uint64_t(n_out_rows == n_rows);
}

}  // namespace tandem
