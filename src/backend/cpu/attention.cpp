// Attention over the paged KV cache with an online softmax.
//
// Every row sees a contiguous range [lo, hi) of its sequence's cache positions (all mask kinds, the sliding
// window and kv_begin only move the two ends). A task is (a block of consecutive rows of one sequence, a KV
// head, a subset of the query heads of that KV head's GQA group). It walks the positions its rows see in
// tiles of kTile positions aligned to multiples of kTile: each tile's K and V rows are converted to f32 once
// for all the task's rows and heads (a prompt's rows share almost all their keys), then for each row and head
// the tile's scores, the running max / sum / accumulator update (flash-attention style; no T x seq_len
// matrix) and the sum of the tile's V rows weighted by their probabilities.
//
// Batch invariance: a row's arithmetic depends only on its own range (the tiles are aligned to absolute
// positions, not to where a block starts), so its output is the same bits whichever rows share its block.
// An Explicit mask adds its bias to the scores; a tile whose scores (and all before it) are -inf is skipped,
// so exp(-inf - -inf) never happens and a row with no finite score gets 0.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_ops_impl.h"
#include "core/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_HAVE_X86 1
#endif

namespace tandem::cpu {
namespace {

constexpr int kTile = 32;
// Rows of one sequence a task takes at most: they share each converted K/V tile.
constexpr int64_t kRowBlock = 16;

// Row conversion of the cache into f32 (exact for f16 and bf16), and the two f32 products of a tile.
using ConvertFn = void (*)(const void* src, float* dst, int64_t n);
// scores[jj] = q . k[jj * n ..] for jj < m.
using DotsFn = void (*)(const float* q, const float* k, int m, int64_t n, float* scores);
// acc[0..n) += sum over jj < m of p[jj] * v[jj * n + i], jj in order (one pass over acc per 8 values).
using WeightedSumFn = void (*)(float* acc, const float* p, const float* v, int m, int64_t n);

template <class Load>
void convert_scalar(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Load::get(src, i);
}

float dot_scalar(const float* q, const float* k, int64_t n) {
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += q[i + j] * k[i + j];
  for (; i < n; ++i) s[0] += q[i] * k[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

void dots_scalar(const float* q, const float* k, int m, int64_t n, float* scores) {
  for (int jj = 0; jj < m; ++jj) scores[jj] = dot_scalar(q, k + jj * n, n);
}

void weighted_sum_scalar(float* acc, const float* p, const float* v, int m, int64_t n) {
  for (int jj = 0; jj < m; ++jj)
    for (int64_t i = 0; i < n; ++i) acc[i] += p[jj] * v[jj * n + i];
}

struct ScalarF32 {
  static float get(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
};
struct ScalarF16 {
  static float get(const void* p, int64_t i) { return fp16_to_fp32(static_cast<const uint16_t*>(p)[i]); }
};
struct ScalarBF16 {
  static float get(const void* p, int64_t i) { return bf16_to_fp32(static_cast<const uint16_t*>(p)[i]); }
};

#if TANDEM_HAVE_X86
#define TANDEM_AVX2 __attribute__((target("avx2,fma,f16c")))

TANDEM_AVX2 void convert_f16_avx2(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) dst[i] = ScalarF16::get(src, i);
}

TANDEM_AVX2 void convert_bf16_avx2(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  for (; i < n; ++i) dst[i] = ScalarBF16::get(src, i);
}

TANDEM_AVX2 float dot_avx2(const float* q, const float* k, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a0);
  a0 = _mm256_add_ps(a0, a1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += q[i] * k[i];
  return r;
}

// scores[jj] = dot(q, k + jj * n) for jj < m, four keys at a time: each key's sums are exactly dot_avx2's
// (two chains over the same values in the same order), but four keys' chains run side by side instead of one
// waiting on the FMA latency.
TANDEM_AVX2 void dots_avx2(const float* q, const float* k, int m, int64_t n, float* scores) {
  int jj = 0;
  if (n % 16 == 0) {
    for (; jj + 4 <= m; jj += 4) {
      __m256 a0[4], a1[4];
      for (int t = 0; t < 4; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
      for (int64_t i = 0; i < n; i += 16) {
        const __m256 q0 = _mm256_loadu_ps(q + i), q1 = _mm256_loadu_ps(q + i + 8);
        for (int t = 0; t < 4; ++t) {
          const float* kt = k + (jj + t) * n + i;
          a0[t] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kt), a0[t]);
          a1[t] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(kt + 8), a1[t]);
        }
      }
      for (int t = 0; t < 4; ++t) {
        const __m256 a = _mm256_add_ps(a0[t], a1[t]);
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        scores[jj + t] = _mm_cvtss_f32(s);
      }
    }
  }
  for (; jj < m; ++jj) scores[jj] = dot_avx2(q, k + jj * n, n);
}

TANDEM_AVX2 void weighted_sum_avx2(float* acc, const float* p, const float* v, int m, int64_t n) {
  // 64 values of acc at a time in 8 registers: eight independent FMA chains (one chain per 8 values would
  // wait on the FMA latency at every key). Each value still adds the keys in order, as the scalar loop does.
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m256 a[8];
    for (int c = 0; c < 8; ++c) a[c] = _mm256_loadu_ps(acc + i + 8 * c);
    for (int jj = 0; jj < m; ++jj) {
      const __m256 pj = _mm256_set1_ps(p[jj]);
      const float* vj = v + jj * n + i;
      for (int c = 0; c < 8; ++c) a[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * c), a[c]);
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(acc + i + 8 * c, a[c]);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_loadu_ps(acc + i);
    for (int jj = 0; jj < m; ++jj)
      a = _mm256_fmadd_ps(_mm256_set1_ps(p[jj]), _mm256_loadu_ps(v + jj * n + i), a);
    _mm256_storeu_ps(acc + i, a);
  }
  for (; i < n; ++i)
    for (int jj = 0; jj < m; ++jj) acc[i] += p[jj] * v[jj * n + i];
}
#endif

ConvertFn pick_convert(DType t, bool simd) {
  if (t == DType::F32)
    return
        [](const void* src, float* dst, int64_t n) { std::copy_n(static_cast<const float*>(src), n, dst); };
#if TANDEM_HAVE_X86
  if (simd) return t == DType::F16 ? convert_f16_avx2 : convert_bf16_avx2;
#endif
  (void)simd;
  return t == DType::F16 ? convert_scalar<ScalarF16> : convert_scalar<ScalarBF16>;
}

DotsFn pick_dots(bool simd) {
#if TANDEM_HAVE_X86
  if (simd) return dots_avx2;
#endif
  (void)simd;
  return dots_scalar;
}

WeightedSumFn pick_weighted_sum(bool simd) {
#if TANDEM_HAVE_X86
  if (simd) return weighted_sum_avx2;
#endif
  (void)simd;
  return weighted_sum_scalar;
}

bool is_cache_type(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

// The metadata of a batch as host pointers, and the visible range [lo, hi) of a row (backend.h,
// AttentionBatch). hi <= lo means the row sees nothing (padding rows included).
struct RowMeta {
  MaskKind mask;
  const int32_t* pos;
  const int32_t* seq;
  const int32_t* lens;
  const int32_t* block_end;
  const int32_t* kv_begin;
  int64_t mask_cols;
  int sliding_window;

  void range(int64_t r, int64_t* lo_out, int64_t* hi_out) const {
    int64_t lo = 0, hi = 0;
    const int32_t s = seq[r];
    if (s >= 0) {
      const int64_t p = pos[r], len = lens[s];
      switch (mask) {
        case MaskKind::Causal:
          hi = std::min<int64_t>(p + 1, len);
          break;
        case MaskKind::Bidirectional:
          hi = len;
          break;
        case MaskKind::Block:
          hi = std::min<int64_t>(block_end[r], len);
          break;
        case MaskKind::Explicit:
          hi = std::min<int64_t>(mask_cols, len);
          break;
      }
      if (sliding_window > 0) lo = std::max<int64_t>(lo, p - sliding_window + 1);
      if (kv_begin) lo = std::max<int64_t>(lo, kv_begin[r]);
    }
    *lo_out = lo;
    *hi_out = hi;
  }
};

}  // namespace

size_t attention_scratch_floats(int64_t n_head, int64_t head_dim) {
  // per (row, query head) of a task: accumulator, tile scores, running max and sum; per task: the tile's K
  // and V rows in f32
  return size_t(kRowBlock) * size_t(n_head) * size_t(head_dim + kTile + 2) +
         size_t(2 * kTile) * size_t(head_dim);
}

void attention(ThreadPool& pool, Workspace& ws, const Tensor& q, const KvLayerView& kv,
               const AttentionBatch& batch, float scale, const Tensor& out) {
  const char* op = "attention";
  check_f32(op, "q", q);
  check_f32(op, "out", out);
  check_on_cpu(op, "kv.k", kv.k);
  check_on_cpu(op, "kv.v", kv.v);
  TANDEM_CPU_CHECK(is_cache_type(kv.k.type) && is_cache_type(kv.v.type),
                   "attention: the cache must be f32, f16 or bf16");
  TANDEM_CPU_CHECK(kv.k.is_contiguous() && kv.v.is_contiguous(),
                   "attention: the cache tensors must be contiguous");
  const int64_t hd_k = kv.k.ne[0], n_kv = kv.k.ne[1], bs = kv.k.ne[2], n_blocks = kv.k.ne[3];
  const int64_t hd_v = kv.v.ne[0];
  TANDEM_CPU_CHECK(kv.block_size == bs && bs > 0, "attention: kv.block_size " +
                                                      std::to_string(kv.block_size) +
                                                      " must equal kv.k.ne[2] = " + std::to_string(bs));
  check_dims(op, "kv.v", kv.v, hd_v, n_kv, bs, n_blocks);
  TANDEM_CPU_CHECK(
      q.ne[0] == hd_k && q.ne[3] == 1,
      "attention: q must be {head_dim_k = " + std::to_string(hd_k) + ", n_head, T}, got " + q.shape_string());
  const int64_t n_head = q.ne[1], T = q.ne[2];
  TANDEM_CPU_CHECK(n_kv > 0 && n_head % n_kv == 0, "attention: n_head " + std::to_string(n_head) +
                                                       " must be a multiple of n_kv_head " +
                                                       std::to_string(n_kv));
  check_dims(op, "out", out, hd_v, n_head, T);
  TANDEM_CPU_CHECK(std::isfinite(scale), "attention: scale must be finite");

  check_i32_vector(op, "batch.positions", batch.positions, T);
  check_i32_vector(op, "batch.seq_slot", batch.seq_slot, T);
  check_on_cpu(op, "batch.block_tables", batch.block_tables);
  check_type(op, "batch.block_tables", batch.block_tables, DType::I32);
  TANDEM_CPU_CHECK(
      batch.block_tables.is_contiguous() && batch.block_tables.ne[2] == 1 && batch.block_tables.ne[3] == 1,
      "attention: batch.block_tables must be a contiguous {max_blocks_per_seq, n_seqs} matrix");
  const int64_t max_blocks = batch.block_tables.ne[0], n_seqs = batch.block_tables.ne[1];
  check_i32_vector(op, "batch.seq_lens", batch.seq_lens, n_seqs);
  const bool block_mask = batch.mask == MaskKind::Block;
  if (block_mask) check_i32_vector(op, "batch.block_end", batch.block_end, T);
  const bool has_begin = batch.kv_begin.data != nullptr;
  if (has_begin) check_i32_vector(op, "batch.kv_begin", batch.kv_begin, T);
  const bool explicit_mask = batch.mask == MaskKind::Explicit;
  if (explicit_mask) {
    check_f32(op, "batch.explicit_mask", batch.explicit_mask);
    TANDEM_CPU_CHECK(
        batch.explicit_mask.ne[1] == T && batch.explicit_mask.ne[2] == 1 && batch.explicit_mask.ne[3] == 1,
        "attention: batch.explicit_mask must have shape {mask_cols, n_rows = " + std::to_string(T) +
            "}, got " + batch.explicit_mask.shape_string());
  }
  TANDEM_CPU_CHECK(
      batch.mask == MaskKind::Causal || batch.mask == MaskKind::Bidirectional || block_mask || explicit_mask,
      "attention: unknown mask kind " + std::to_string(int(batch.mask)));
  TANDEM_CPU_CHECK(batch.sliding_window >= 0, "attention: sliding_window must be >= 0");

  const int32_t* pos = batch.positions.ptr<int32_t>();
  const int32_t* seq = batch.seq_slot.ptr<int32_t>();
  const int32_t* tables = batch.block_tables.ptr<int32_t>();
  const int32_t* lens = batch.seq_lens.ptr<int32_t>();
  const int32_t* block_end = block_mask ? batch.block_end.ptr<int32_t>() : nullptr;
  const int32_t* kv_begin = has_begin ? batch.kv_begin.ptr<int32_t>() : nullptr;

  RowMeta meta;
  meta.mask = batch.mask;
  meta.pos = pos;
  meta.seq = seq;
  meta.lens = lens;
  meta.block_end = block_end;
  meta.kv_begin = kv_begin;
  meta.mask_cols = explicit_mask ? batch.explicit_mask.ne[0] : 0;
  meta.sliding_window = batch.sliding_window;

  // Validate the metadata on the host: a bad index would otherwise read outside the cache. An entry may be -1
  // (a block a sliding-window layer evicted) unless a row reads it.
  for (int64_t s = 0; s < n_seqs; ++s) {
    TANDEM_CPU_CHECK(lens[s] >= 0 && lens[s] <= max_blocks * bs,
                     "attention: seq_lens[" + std::to_string(s) + "] = " + std::to_string(lens[s]) +
                         " exceeds the block table (" + std::to_string(max_blocks * bs) + " positions)");
    for (int64_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) {
      const int32_t phys = tables[s * max_blocks + b];
      TANDEM_CPU_CHECK(phys >= -1 && phys < n_blocks,
                       "attention: block_tables[" + std::to_string(s) + "][" + std::to_string(b) +
                           "] = " + std::to_string(phys) + " is not a cache block (0.." +
                           std::to_string(n_blocks - 1) + ") nor -1 (evicted)");
    }
  }
  for (int64_t r = 0; r < T; ++r) {
    TANDEM_CPU_CHECK(seq[r] < n_seqs, "attention: seq_slot[" + std::to_string(r) +
                                          "] = " + std::to_string(seq[r]) +
                                          " is not a sequence of the batch (" + std::to_string(n_seqs) + ")");
    int64_t lo = 0, hi = 0;
    meta.range(r, &lo, &hi);
    for (int64_t b = lo / bs; lo < hi && b <= (hi - 1) / bs; ++b)
      TANDEM_CPU_CHECK(tables[seq[r] * max_blocks + b] >= 0,
                       "attention: row " + std::to_string(r) + " (sequence " + std::to_string(seq[r]) +
                           ") sees positions " + std::to_string(lo) + ".." + std::to_string(hi - 1) +
                           ", but block_tables[" + std::to_string(seq[r]) + "][" + std::to_string(b) +
                           "] = -1 (an evicted block)");
  }
  if (T == 0 || n_head == 0) return;

  const int64_t group = n_head / n_kv;
  // Rows per block and the split of each GQA group: enough tasks for the threads (decode of one sequence has
  // T = 1), and blocks as long as that allows (a prompt's rows share their keys).
  const int64_t want_tasks = int64_t(pool.n_threads()) * 4;
  const int64_t row_block = std::clamp<int64_t>(T * n_kv / want_tasks, 1, kRowBlock);
  const int64_t n_row_blocks = (T + row_block - 1) / row_block;
  const int64_t splits = std::min<int64_t>(
      group, std::max<int64_t>(1, (want_tasks + n_row_blocks * n_kv - 1) / (n_row_blocks * n_kv)));
  const int64_t heads_per_task = (group + splits - 1) / splits;
  const int64_t tasks_per_kv = (group + heads_per_task - 1) / heads_per_task;

  size_t stride = 0;
  float* scratch_all =
      ws.per_thread(attention_scratch_floats(heads_per_task, std::max({hd_k, hd_v, int64_t(1)})),
                    pool.n_threads(), &stride);
  const bool simd = simd_enabled();
  const ConvertFn convert_k = pick_convert(kv.k.type, simd);
  const ConvertFn convert_v = pick_convert(kv.v.type, simd);
  const DotsFn dots = pick_dots(simd);
  const WeightedSumFn weighted_sum = pick_weighted_sum(simd);

  pool.parallel_for(n_row_blocks * n_kv * tasks_per_kv, [&](int64_t task, int tid) {
    const int64_t block = task / (n_kv * tasks_per_kv);
    const int64_t kvh = (task / tasks_per_kv) % n_kv;
    const int64_t h0 = kvh * group + (task % tasks_per_kv) * heads_per_task;
    const int64_t nh = std::min(heads_per_task, kvh * group + group - h0);
    const int64_t block_end_row = std::min(T, (block + 1) * row_block);
    auto out_row = [&](int64_t r, int64_t h) {
      return reinterpret_cast<float*>(static_cast<char*>(out.data) + h * out.nb[1] + r * out.nb[2]);
    };
    auto q_row = [&](int64_t r, int64_t h) {
      return reinterpret_cast<const float*>(static_cast<const char*>(q.data) + h * q.nb[1] + r * q.nb[2]);
    };
    float* scratch = scratch_all + size_t(tid) * stride;
    const char* kbase = static_cast<const char*>(kv.k.data) + kvh * kv.k.nb[1];
    const char* vbase = static_cast<const char*>(kv.v.data) + kvh * kv.v.nb[1];

    // The block's rows in runs of one sequence: a run shares the K/V tiles.
    for (int64_t r0 = block * row_block, r1 = r0; r0 < block_end_row; r0 = r1) {
      for (r1 = r0 + 1; r1 < block_end_row && seq[r1] == seq[r0]; ++r1) {
      }
      const int64_t nr = r1 - r0, units = nr * nh;  // unit u = (row r0 + u / nh, head h0 + u % nh)
      float* acc = scratch;                         // [units][hd_v]
      float* scores = acc + units * hd_v;           // [units][kTile]
      float* run_max = scores + units * kTile;      // [units]
      float* run_sum = run_max + units;             // [units]
      float* kf = run_sum + units;                  // [kTile][hd_k]
      float* vf = kf + kTile * hd_k;                // [kTile][hd_v]
      std::fill_n(acc, units * hd_v, 0.0f);
      std::fill_n(run_max, units, -INFINITY);
      std::fill_n(run_sum, units, 0.0f);

      int64_t lo[kRowBlock], hi[kRowBlock];
      int64_t first = INT64_MAX, last = INT64_MIN;
      for (int64_t i = 0; i < nr; ++i) {
        meta.range(r0 + i, &lo[i], &hi[i]);
        if (hi[i] > lo[i]) {
          first = std::min(first, lo[i]);
          last = std::max(last, hi[i]);
        }
      }
      const int32_t s = seq[r0];
      const int32_t* table = s >= 0 ? tables + int64_t(s) * max_blocks : nullptr;

      for (int64_t t0 = first < last ? first / kTile * kTile : 0; first < last && t0 < last; t0 += kTile) {
        const int64_t t1 = std::min(t0 + kTile, last);
        // Convert the tile's rows that some row of the run sees (others may sit in evicted blocks).
        for (int64_t j = std::max(t0, first); j < t1; ++j) {
          bool seen = false;
          for (int64_t i = 0; i < nr && !seen; ++i) seen = lo[i] <= j && j < hi[i];
          if (!seen) continue;
          const int64_t slot = int64_t(table[j / bs]) * bs + j % bs;
          convert_k(kbase + size_t(slot) * kv.k.nb[2], kf + (j - t0) * hd_k, hd_k);
          convert_v(vbase + size_t(slot) * kv.v.nb[2], vf + (j - t0) * hd_v, hd_v);
        }
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t a = std::max(t0, lo[i]), b = std::min(t1, hi[i]);
          if (a >= b) continue;
          const int n = int(b - a), off = int(a - t0);
          const float* bias =
              explicit_mask
                  ? reinterpret_cast<const float*>(static_cast<const char*>(batch.explicit_mask.data) +
                                                   (r0 + i) * batch.explicit_mask.nb[1]) +
                        a
                  : nullptr;
          for (int64_t h = 0; h < nh; ++h) {
            const int64_t u = i * nh + h;
            float* sc = scores + u * kTile;
            const float* qr = q_row(r0 + i, h0 + h);
            dots(qr, kf + off * hd_k, n, hd_k, sc);
            for (int jj = 0; jj < n; ++jj) sc[jj] *= scale;
            if (bias)
              for (int jj = 0; jj < n; ++jj) sc[jj] += bias[jj];
            float m = run_max[u];
            for (int jj = 0; jj < n; ++jj) m = std::max(m, sc[jj]);
            if (m == -INFINITY)
              continue;  // every score so far is -inf (Explicit mask): this tile adds nothing
            const float correction = std::exp(run_max[u] - m);  // 0 on the first visible tile (exp(-inf))
            float sum = run_sum[u] * correction;
            float* accu = acc + u * hd_v;
            if (correction != 1.0f)
              for (int64_t e = 0; e < hd_v; ++e) accu[e] *= correction;
            for (int jj = 0; jj < n; ++jj) {
              sc[jj] = std::exp(sc[jj] - m);
              sum += sc[jj];
            }
            run_max[u] = m;
            run_sum[u] = sum;
            weighted_sum(accu, sc, vf + off * hd_v, n, hd_v);
          }
        }
      }
      for (int64_t u = 0; u < units; ++u) {
        float* o = out_row(r0 + u / nh, h0 + u % nh);
        if (run_sum[u] == 0.0f) {  // the row sees nothing, or every score it sees is -inf
          std::fill_n(o, hd_v, 0.0f);
          continue;
        }
        const float inv = 1.0f / run_sum[u];
        for (int64_t e = 0; e < hd_v; ++e) o[e] = acc[u * hd_v + e] * inv;
      }
    }
  });
}

}  // namespace tandem::cpu
