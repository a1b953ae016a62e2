// Attention over the paged KV cache with an online softmax.
//
// Every row sees a contiguous range [lo, hi) of its sequence's cache positions (all mask kinds, the sliding
// window and kv_begin only move the two ends), so a task walks that range in tiles of kTile positions: scores
// of the tile for each of its query heads, then the running max / sum / accumulator update (flash-attention
// style), so no T x seq_len matrix exists. A task is (row, KV head, a subset of the query heads of that KV
// head's GQA group): each K/V row is loaded once for all the task's query heads and never copied or repeated.
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

using DotKFn = float (*)(const float* q, const void* k, int64_t n);
using AxpyVFn = void (*)(float* acc, float a, const void* v, int64_t n);  // acc += a * v

template <class Load>
float dot_scalar(const float* q, const void* k, int64_t n) {
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += q[i + j] * Load::get(k, i + j);
  for (; i < n; ++i) s[0] += q[i] * Load::get(k, i);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

template <class Load>
void axpy_scalar(float* acc, float a, const void* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += a * Load::get(v, i);
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

struct VecF32 {
  TANDEM_AVX2 static __m256 load(const void* p, int64_t i) {
    return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  }
  static float get(const void* p, int64_t i) { return ScalarF32::get(p, i); }
};
struct VecF16 {
  TANDEM_AVX2 static __m256 load(const void* p, int64_t i) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  }
  static float get(const void* p, int64_t i) { return ScalarF16::get(p, i); }
};
struct VecBF16 {
  TANDEM_AVX2 static __m256 load(const void* p, int64_t i) {
    const __m256i h = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
  static float get(const void* p, int64_t i) { return ScalarBF16::get(p, i); }
};

template <class L>
TANDEM_AVX2 float dot_avx2(const float* q, const void* k, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), L::load(k, i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), L::load(k, i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), L::load(k, i), a0);
  a0 = _mm256_add_ps(a0, a1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += q[i] * L::get(k, i);
  return r;
}

template <class L>
TANDEM_AVX2 void axpy_avx2(float* acc, float a, const void* v, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(va, L::load(v, i), _mm256_loadu_ps(acc + i)));
  for (; i < n; ++i) acc[i] += a * L::get(v, i);
}
#endif

DotKFn pick_dot(DType t, bool simd) {
#if TANDEM_HAVE_X86
  if (simd)
    return t == DType::F32 ? dot_avx2<VecF32> : t == DType::F16 ? dot_avx2<VecF16> : dot_avx2<VecBF16>;
#endif
  (void)simd;
  return t == DType::F32   ? dot_scalar<ScalarF32>
         : t == DType::F16 ? dot_scalar<ScalarF16>
                           : dot_scalar<ScalarBF16>;
}

AxpyVFn pick_axpy(DType t, bool simd) {
#if TANDEM_HAVE_X86
  if (simd)
    return t == DType::F32 ? axpy_avx2<VecF32> : t == DType::F16 ? axpy_avx2<VecF16> : axpy_avx2<VecBF16>;
#endif
  (void)simd;
  return t == DType::F32   ? axpy_scalar<ScalarF32>
         : t == DType::F16 ? axpy_scalar<ScalarF16>
                           : axpy_scalar<ScalarBF16>;
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
  // per query head of a task: accumulator, tile scores, running max and sum
  return size_t(n_head) * size_t(head_dim + kTile + 2);
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
  // Split each GQA group so that there are enough tasks for the threads (decode of one sequence has T = 1).
  const int64_t want_tasks = int64_t(pool.n_threads()) * 4;
  const int64_t splits =
      std::min<int64_t>(group, std::max<int64_t>(1, (want_tasks + T * n_kv - 1) / (T * n_kv)));
  const int64_t heads_per_task = (group + splits - 1) / splits;
  const int64_t tasks_per_kv = (group + heads_per_task - 1) / heads_per_task;

  size_t stride = 0;
  float* scratch_all = ws.per_thread(attention_scratch_floats(heads_per_task, std::max(hd_v, int64_t(1))),
                                     pool.n_threads(), &stride);
  const bool simd = simd_enabled();
  const DotKFn dot = pick_dot(kv.k.type, simd);
  const AxpyVFn axpy = pick_axpy(kv.v.type, simd);

  pool.parallel_for(T * n_kv * tasks_per_kv, [&](int64_t task, int tid) {
    const int64_t r = task / (n_kv * tasks_per_kv);
    const int64_t kvh = (task / tasks_per_kv) % n_kv;
    const int64_t h0 = kvh * group + (task % tasks_per_kv) * heads_per_task;
    const int64_t nh = std::min(heads_per_task, kvh * group + group - h0);
    auto out_row = [&](int64_t h) {
      return reinterpret_cast<float*>(static_cast<char*>(out.data) + h * out.nb[1] + r * out.nb[2]);
    };
    auto q_row = [&](int64_t h) {
      return reinterpret_cast<const float*>(static_cast<const char*>(q.data) + h * q.nb[1] + r * q.nb[2]);
    };

    int64_t lo = 0, hi = 0;
    meta.range(r, &lo, &hi);
    const int32_t s = seq[r];
    if (hi <= lo) {
      for (int64_t h = h0; h < h0 + nh; ++h) std::fill_n(out_row(h), hd_v, 0.0f);
      return;
    }

    float* scratch = scratch_all + size_t(tid) * stride;
    float* acc = scratch;                  // [nh][hd_v]
    float* scores = acc + nh * hd_v;       // [nh][kTile]
    float* run_max = scores + nh * kTile;  // [nh]
    float* run_sum = run_max + nh;         // [nh]
    std::fill_n(acc, nh * hd_v, 0.0f);
    std::fill_n(run_max, nh, -INFINITY);
    std::fill_n(run_sum, nh, 0.0f);

    const int32_t* table = tables + int64_t(s) * max_blocks;
    auto slot_offset = [&](int64_t j) { return int64_t(table[j / bs]) * bs + j % bs; };
    const char* kbase = static_cast<const char*>(kv.k.data) + kvh * kv.k.nb[1];
    const char* vbase = static_cast<const char*>(kv.v.data) + kvh * kv.v.nb[1];
    const void* vrows[kTile];
    const float* bias =
        explicit_mask ? reinterpret_cast<const float*>(static_cast<const char*>(batch.explicit_mask.data) +
                                                       r * batch.explicit_mask.nb[1])
                      : nullptr;

    for (int64_t j0 = lo; j0 < hi; j0 += kTile) {
      const int n = int(std::min<int64_t>(kTile, hi - j0));
      for (int jj = 0; jj < n; ++jj) {
        const int64_t slot = slot_offset(j0 + jj);
        const void* krow = kbase + size_t(slot) * kv.k.nb[2];
        vrows[jj] = vbase + size_t(slot) * kv.v.nb[2];
        for (int64_t h = 0; h < nh; ++h) scores[h * kTile + jj] = scale * dot(q_row(h0 + h), krow, hd_k);
        if (bias)
          for (int64_t h = 0; h < nh; ++h) scores[h * kTile + jj] += bias[j0 + jj];
      }
      for (int64_t h = 0; h < nh; ++h) {
        float* sc = scores + h * kTile;
        float m = run_max[h];
        for (int jj = 0; jj < n; ++jj) m = std::max(m, sc[jj]);
        if (m == -INFINITY) {  // every score so far is -inf (Explicit mask): this tile adds nothing
          std::fill_n(sc, n, 0.0f);
          continue;
        }
        const float correction = std::exp(run_max[h] - m);  // 0 on the first visible tile (exp(-inf))
        float sum = run_sum[h] * correction;
        float* a = acc + h * hd_v;
        if (correction != 1.0f)
          for (int64_t i = 0; i < hd_v; ++i) a[i] *= correction;
        for (int jj = 0; jj < n; ++jj) {
          sc[jj] = std::exp(sc[jj] - m);
          sum += sc[jj];
        }
        run_max[h] = m;
        run_sum[h] = sum;
      }
      for (int jj = 0; jj < n; ++jj)
        for (int64_t h = 0; h < nh; ++h) axpy(acc + h * hd_v, scores[h * kTile + jj], vrows[jj], hd_v);
    }
    for (int64_t h = 0; h < nh; ++h) {
      float* o = out_row(h0 + h);
      if (run_sum[h] == 0.0f) {  // every visible score was -inf
        std::fill_n(o, hd_v, 0.0f);
        continue;
      }
      const float inv = 1.0f / run_sum[h];
      for (int64_t i = 0; i < hd_v; ++i) o[i] = acc[h * hd_v + i] * inv;
    }
  });
}

}  // namespace tandem::cpu
