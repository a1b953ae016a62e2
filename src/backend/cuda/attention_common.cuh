// What every attention kernel needs to know about one query row: its sequence, and the range [lo, hi) of
// cache positions it may see (backend.h, AttentionBatch), the Explicit mask's bias of a position, plus the
// cache slot of a position. Kernels read block-table entries only through cache_slot, for positions inside
// [lo, hi) (entries of evicted blocks, -1, lie outside every row's range).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/tensor_rows.h"

namespace tandem::cuda {

// Plain-old-data copy of AttentionArgs' metadata for kernels.
struct AttnMeta {
  const int32_t* positions;
  const int32_t* seq_slot;
  const int32_t* block_tables;
  int64_t max_blocks_per_seq;
  const int32_t* seq_lens;
  const int32_t* block_end;
  const int32_t* kv_begin;
  const float* explicit_mask;  // Explicit only (else null)
  int64_t mask_stride;         // floats between rows of explicit_mask
  int mask_cols;
  int mask;  // MaskKind
  int sliding_window;
  int block_size;
};

inline AttnMeta make_meta(const AttentionArgs& a) {
  AttnMeta m;
  m.positions = a.positions;
  m.seq_slot = a.seq_slot;
  m.block_tables = a.block_tables;
  m.max_blocks_per_seq = a.max_blocks_per_seq;
  m.seq_lens = a.seq_lens;
  m.block_end = a.block_end;
  m.kv_begin = a.kv_begin;
  const bool explicit_mask = a.mask == MaskKind::Explicit;
  m.explicit_mask = explicit_mask ? a.explicit_mask : nullptr;
  m.mask_stride = explicit_mask ? a.mask_stride : 0;
  m.mask_cols = explicit_mask ? a.mask_cols : 0;
  m.mask = int(a.mask);
  m.sliding_window = a.sliding_window;
  m.block_size = a.kv.block_size;
  return m;
}

struct RowRange {
  int seq;  // < 0: padding row
  int lo, hi;
};

__device__ __forceinline__ RowRange row_range(const AttnMeta& m, int64_t r) {
  RowRange rr;
  rr.seq = m.seq_slot[r];
  rr.lo = 0;
  rr.hi = 0;
  if (rr.seq < 0) return rr;
  const int p = m.positions[r];
  const int len = m.seq_lens[rr.seq];
  int hi = len;
  if (m.mask == int(MaskKind::Causal)) {
    hi = min(hi, p + 1);
  } else if (m.mask == int(MaskKind::Block)) {
    hi = min(hi, m.block_end[r]);
  } else if (m.mask == int(MaskKind::Explicit)) {
    hi = min(hi, m.mask_cols);
  }
  int lo = 0;
  if (m.sliding_window > 0) lo = max(lo, p - m.sliding_window + 1);
  if (m.kv_begin) lo = max(lo, m.kv_begin[r]);
  rr.lo = lo;
  rr.hi = max(hi, lo);
  return rr;
}

// The Explicit mask's additive bias of (row r, position j), 0 for the other mask kinds. Only for j < hi of
// row r (so j < mask_cols).
__device__ __forceinline__ float mask_bias(const AttnMeta& m, int64_t r, int j) {
  return m.explicit_mask ? m.explicit_mask[r * m.mask_stride + j] : 0.0f;
}

// Physical slot of cache position j of sequence s; -1 when j's block was evicted (block-table entry -1).
__device__ __forceinline__ int64_t cache_slot(const AttnMeta& m, int s, int j) {
  const int phys = m.block_tables[int64_t(s) * m.max_blocks_per_seq + j / m.block_size];
  return phys < 0 ? -1 : int64_t(phys) * m.block_size + j % m.block_size;
}

}  // namespace tandem::cuda
