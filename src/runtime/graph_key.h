// Which decode steps a session may replay as a recorded CUDA graph, and the key each recording is kept under.
//
// A recording fixes every kernel argument: pointers, sizes, the attention mask's kind. Steps whose inputs live in
// the session's fixed device buffers (positions, slots, block tables, block ends, added-row indices: uploaded
// before each replay) differ only in data and can share a recording; steps that differ in an argument must not.
// The key therefore holds, besides the row counts, a "step shape" id: 0 for plain causal token rows, and one id
// per other recordable shape the session has met (a block-bidirectional draft block of a DFlash drafter; feature
// rows read in place from a device buffer — the drafter's K/V injection), remembered with the buffer's address,
// row count and stride, since those are recorded too.
//
// Not recordable (run directly): PrefixRegion masks (the decoder reads prefix_len on the host), Explicit masks,
// added rows from host memory or from a buffer another device owns (copied per step from changing addresses).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "tandem/batch.h"

namespace tandem {

struct StepShape {
  AttentionMask mask = AttentionMask::Causal;
  bool added = false;          // some row adds a row of an embedding source
  const void* source = nullptr;  // that source, read in place (only when `added`)
  int64_t source_rows = 0;
  size_t source_stride = 0;
  bool operator==(const StepShape&) const = default;
};

// The shape of rows [r0, r1) of `batch` (added_rows: the batch's per-row source row, -1 = none), or nullopt
// when such a step cannot be recorded. source_readable: every device of the session reads the batch's
// embedding source in place.
std::optional<StepShape> recordable_step_shape(const Batch& batch, std::span<const int32_t> added_rows, size_t r0,
                                               size_t r1, bool source_readable);

// Record the step shapes other than plain causal token rows too (DFlash draft blocks and feature rows). On by
// default since a GPU run compared them with direct runs (bench/BENCHMARKS.md, tenth session);
// TANDEM_RECORD_SHAPES=0 runs those steps directly, as before.
bool record_other_step_shapes();
// Tests: overrides the environment variable (nullopt: back to it). Takes effect for the next steps.
void set_record_other_step_shapes(std::optional<bool> on);

// Step shapes a session has recorded, numbered from 1 (0 = plain causal token rows) up to kMaxStepShapes.
class StepShapeIds {
 public:
  static constexpr uint32_t kMaxStepShapes = 255;
  // The id of `s`, numbering it when new; nullopt when the table is full (the step runs directly).
  std::optional<uint32_t> id_of(const StepShape& s);

 private:
  std::vector<StepShape> seen_;
};

// The key of a recording: session (32 bits), taps' generation (8), step shape id (8), rows (8), logit rows (7)
// and "every row wants logits" (1). Rows and logit rows must be < 128 (sessions record steps of <= 64 rows).
uint64_t step_graph_key(uint64_t session_id, uint32_t tap_generation, uint32_t shape_id, int64_t n_rows,
                        int64_t n_out_rows);

}  // namespace tandem
