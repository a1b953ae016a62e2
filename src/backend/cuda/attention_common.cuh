// What every attention kernel needs to know about one query row: its sequence, and the range [lo, hi) of cache
// positions it may see (backend.h, AttentionBatch), plus the cache slot of a position.
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
  int mask;  // MaskKind
  int sliding_window;
  int block_size;
};

inline AttnMeta make_meta(const AttentionArgs& a) {
  return AttnMeta{a.positions, a.seq_slot,      a.block_tables,   a.max_blocks_per_seq,
                  a.seq_lens,  a.block_end,     a.kv_begin,       int(a.mask),
                  a.sliding_window, a.kv.block_size};
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
  }
  int lo = 0;
  if (m.sliding_window > 0) lo = max(lo, p - m.sliding_window + 1);
  if (m.kv_begin) lo = max(lo, m.kv_begin[r]);
  rr.lo = lo;
  rr.hi = max(hi, lo);
  return rr;
}

// Physical slot of cache position j of sequence s.
__device__ __forceinline__ int64_t cache_slot(const AttnMeta& m, int s, int j) {
  const int phys = m.block_tables[int64_t(s) * m.max_blocks_per_seq + j / m.block_size];
  return int64_t(phys) * m.block_size + j % m.block_size;
}

}  // namespace tandem::cuda
