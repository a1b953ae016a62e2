// CPU kv_store + attention against a naive double-precision reference over the paged cache: several sequences
// of different lengths in one batch, block tables with shuffled (non-contiguous) physical blocks, GQA ratios
// 1, 2 and 4, every mask kind, a sliding window, kv_begin, padding rows, and f32 / f16 / bf16 caches. The
// StepApiMask tests cover the Explicit mask (an additive bias, -inf hides) and block tables with evicted (-1)
// blocks before a sliding window.
//
// Error bound: out is a convex combination of V rows, and the reference reads the same (converted) cache
// values, so the only differences are f32 rounding of the scores (hd_k-term dot products, relative ~1e-6) and
// of the online-softmax accumulation. |out - ref| <= 1e-5 * max|V| covers that with margin.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "core/half.h"
#include "test_cpu_ops_util.h"

namespace tandem::test {
namespace {

struct SeqSetup {
  int cached_before;  // positions already in the cache
  int new_rows;       // rows of this batch (positions cached_before .. cached_before + new_rows - 1)
};

struct AttnCase {
  MaskKind mask;
  int n_head, n_kv_head;
  DType cache_type;
  int sliding_window = 0;
  bool use_kv_begin = false;
};

float cache_value(DType t, const void* base, size_t idx) {
  switch (t) {
    case DType::F16:
      return fp16_to_fp32(static_cast<const uint16_t*>(base)[idx]);
    case DType::BF16:
      return bf16_to_fp32(static_cast<const uint16_t*>(base)[idx]);
    default:
      return static_cast<const float*>(base)[idx];
  }
}

std::string mask_name(MaskKind m) {
  return m == MaskKind::Causal ? "causal" : m == MaskKind::Bidirectional ? "bidirectional" : "block";
}

class CpuAttention : public SimdParam {};

void run_attention_case(Ops& ops, Stream& s, const AttnCase& c, uint32_t seed) {
  SCOPED_TRACE(mask_name(c.mask) + " heads=" + std::to_string(c.n_head) + "/" + std::to_string(c.n_kv_head) +
               " cache=" + dtype_name(c.cache_type) + " window=" + std::to_string(c.sliding_window) +
               (c.use_kv_begin ? " kv_begin" : ""));
  const int hd_k = 64, hd_v = 40, bs = 4;
  const std::vector<SeqSetup> seqs = {{0, 5}, {9, 1}, {3, 3}, {17, 2}};  // prefill, decode, continued chunks
  const int n_seqs = int(seqs.size());
  int max_blocks = 0, total_blocks = 0;
  for (auto& sq : seqs) {
    const int blocks = (sq.cached_before + sq.new_rows + bs - 1) / bs;
    max_blocks = std::max(max_blocks, blocks + 1);
    total_blocks += blocks;
  }
  const int n_blocks = total_blocks + 3;  // a few unused blocks
  // Physical blocks: a shuffled permutation, so no sequence's blocks are contiguous.
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<int32_t> block_tables(size_t(max_blocks * n_seqs), -1), seq_lens(static_cast<size_t>(n_seqs));
  int next = 0;
  for (int sq = 0; sq < n_seqs; ++sq) {
    seq_lens[size_t(sq)] = seqs[size_t(sq)].cached_before + seqs[size_t(sq)].new_rows;
    for (int b = 0; b < (seq_lens[size_t(sq)] + bs - 1) / bs; ++b)
      block_tables[size_t(sq * max_blocks + b)] = perm[size_t(next++)];
  }
  auto slot_of = [&](int sq, int j) { return block_tables[size_t(sq * max_blocks + j / bs)] * bs + j % bs; };

  // Cache: fill the "already cached" positions through kv_store too, then this batch's rows.
  const size_t elem = dtype_block_bytes(c.cache_type);
  std::vector<uint8_t> kbuf(size_t(hd_k) * c.n_kv_head * bs * n_blocks * elem),
      vbuf(size_t(hd_v) * c.n_kv_head * bs * n_blocks * elem);
  KvLayerView kv;
  kv.k = Tensor::contiguous(c.cache_type, {hd_k, c.n_kv_head, bs, n_blocks}, kbuf.data());
  kv.v = Tensor::contiguous(c.cache_type, {hd_v, c.n_kv_head, bs, n_blocks}, vbuf.data());
  kv.block_size = bs;
  {
    std::vector<int32_t> slots;
    for (int sq = 0; sq < n_seqs; ++sq)
      for (int j = 0; j < seqs[size_t(sq)].cached_before; ++j) slots.push_back(slot_of(sq, j));
    const int64_t n = int64_t(slots.size());
    std::vector<float> k = random_normal(size_t(hd_k * c.n_kv_head * n), seed + 1);
    std::vector<float> v = random_normal(size_t(hd_v * c.n_kv_head * n), seed + 2);
    ops.kv_store(s, kv, f32(k, {hd_k, c.n_kv_head, n}), f32(v, {hd_v, c.n_kv_head, n}), i32(slots, {n}));
  }
  // The batch: rows of every sequence, interleaved, plus one padding row.
  std::vector<int32_t> positions, seq_slot, block_end, kv_begin, slot_mapping;
  for (int r = 0;; ++r) {
    bool any = false;
    for (int sq = 0; sq < n_seqs; ++sq) {
      if (r >= seqs[size_t(sq)].new_rows) continue;
      any = true;
      const int p = seqs[size_t(sq)].cached_before + r;
      positions.push_back(p);
      seq_slot.push_back(sq);
      slot_mapping.push_back(slot_of(sq, p));
      // Block mask: the last 2 new rows of a sequence form a bidirectional block; earlier rows are causal.
      const int len = seq_lens[size_t(sq)];
      block_end.push_back(p >= len - 2 ? len : p + 1);
      kv_begin.push_back(std::max(0, p - 3 - (r % 2)));
    }
    if (!any) break;
  }
  positions.push_back(0);
  seq_slot.push_back(-1);  // padding
  slot_mapping.push_back(-1);
  block_end.push_back(0);
  kv_begin.push_back(0);
  const int64_t T = int64_t(positions.size());
  std::vector<float> knew = random_normal(size_t(hd_k * c.n_kv_head * T), seed + 3);
  std::vector<float> vnew = random_normal(size_t(hd_v * c.n_kv_head * T), seed + 4);
  ops.kv_store(s, kv, f32(knew, {hd_k, c.n_kv_head, T}), f32(vnew, {hd_v, c.n_kv_head, T}),
               i32(slot_mapping, {T}));

  std::vector<float> q = random_normal(size_t(hd_k * c.n_head * T), seed + 5);
  std::vector<float> out(size_t(hd_v * c.n_head * T), NAN);
  AttentionBatch batch;
  batch.mask = c.mask;
  batch.positions = i32(positions, {T});
  batch.seq_slot = i32(seq_slot, {T});
  batch.block_tables = i32(block_tables, {max_blocks, n_seqs});
  batch.seq_lens = i32(seq_lens, {n_seqs});
  if (c.mask == MaskKind::Block) batch.block_end = i32(block_end, {T});
  if (c.use_kv_begin) batch.kv_begin = i32(kv_begin, {T});
  batch.sliding_window = c.sliding_window;
  batch.max_seq_len = *std::max_element(seq_lens.begin(), seq_lens.end());
  const float scale = 1.0f / std::sqrt(float(hd_k));
  ops.attention(s, f32(q, {hd_k, c.n_head, T}), kv, batch, scale, f32(out, {hd_v, c.n_head, T}));

  // Naive reference: visibility straight from the rule in backend.h, K/V read through the block table.
  double vmax = 0.0;
  for (size_t i = 0; i < vbuf.size() / elem; ++i)
    vmax = std::max(vmax, std::fabs(double(cache_value(c.cache_type, vbuf.data(), i))));
  const int group = c.n_head / c.n_kv_head;
  for (int64_t r = 0; r < T; ++r) {
    for (int h = 0; h < c.n_head; ++h) {
      const float* o = out.data() + (r * c.n_head + h) * hd_v;
      const int sq = seq_slot[size_t(r)];
      std::vector<double> ref(size_t(hd_v), 0.0);
      if (sq >= 0) {
        const int p = positions[size_t(r)], kvh = h / group;
        std::vector<int> visible;
        for (int j = 0; j < seq_lens[size_t(sq)]; ++j) {
          bool ok = c.mask == MaskKind::Causal          ? j <= p
                    : c.mask == MaskKind::Bidirectional ? true
                                                        : j < block_end[size_t(r)];
          if (c.sliding_window > 0) ok = ok && j > p - c.sliding_window;
          if (c.use_kv_begin) ok = ok && j >= kv_begin[size_t(r)];
          if (ok) visible.push_back(j);
        }
        std::vector<double> w;
        double mx = -INFINITY;
        for (int j : visible) {
          const size_t base = (size_t(slot_of(sq, j)) * c.n_kv_head + kvh);
          double d = 0.0;
          for (int i = 0; i < hd_k; ++i)
            d += double(q[size_t((r * c.n_head + h) * hd_k + i)]) *
                 cache_value(c.cache_type, kbuf.data(), base * hd_k + i);
          w.push_back(d * scale);
          mx = std::max(mx, w.back());
        }
        double z = 0.0;
        for (double& x : w) z += (x = std::exp(x - mx));
        for (size_t n = 0; n < visible.size(); ++n) {
          const size_t base = (size_t(slot_of(sq, visible[n])) * c.n_kv_head + kvh);
          for (int i = 0; i < hd_v; ++i)
            ref[size_t(i)] += w[n] / z * cache_value(c.cache_type, vbuf.data(), base * hd_v + i);
        }
      }
      for (int i = 0; i < hd_v; ++i)
        ASSERT_NEAR(o[i], ref[size_t(i)], 1e-5 * vmax) << "row " << r << " head " << h << " dim " << i;
    }
  }
}

TEST_P(CpuAttention, MaskKindsGqaAndCacheTypes) {
  uint32_t seed = 1;
  for (MaskKind mask : {MaskKind::Causal, MaskKind::Bidirectional, MaskKind::Block})
    for (int ratio : {1, 2, 4}) run_attention_case(ops(), stream(), {mask, 2 * ratio, 2, DType::F32}, seed++);
  for (DType t : {DType::F16, DType::BF16})
    run_attention_case(ops(), stream(), {MaskKind::Causal, 4, 2, t}, seed++);
  run_attention_case(ops(), stream(), {MaskKind::Block, 8, 2, DType::F16}, seed++);
}

TEST_P(CpuAttention, SlidingWindowAndKvBegin) {
  uint32_t seed = 50;
  run_attention_case(ops(), stream(), {MaskKind::Causal, 4, 2, DType::F32, 4}, seed++);
  run_attention_case(ops(), stream(), {MaskKind::Causal, 4, 1, DType::F16, 3}, seed++);
  run_attention_case(ops(), stream(), {MaskKind::Bidirectional, 2, 2, DType::F32, 0, true}, seed++);
  run_attention_case(ops(), stream(), {MaskKind::Block, 4, 2, DType::F32, 5, true}, seed++);
}

TEST_P(CpuAttention, LongSequenceSpansManyTiles) {
  // One decode row over 300 cached positions (many 32-position tiles, running max changes between tiles).
  const int hd = 32, bs = 16, len = 300, n_blocks = (len + bs - 1) / bs;
  std::vector<float> kc = random_normal(size_t(hd * bs * n_blocks), 7, 3.0f),
                     vc = random_normal(size_t(hd * bs * n_blocks), 8);
  KvLayerView kv;
  kv.k = f32(kc, {hd, 1, bs, n_blocks});
  kv.v = f32(vc, {hd, 1, bs, n_blocks});
  kv.block_size = bs;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int b = 0; b < n_blocks; ++b) table[size_t(b)] = n_blocks - 1 - b;  // reversed
  std::vector<int32_t> pos = {len - 1}, slot = {0}, lens = {len};
  std::vector<float> q = random_normal(size_t(hd * 2), 9), out(size_t(hd * 2));
  AttentionBatch batch;
  batch.positions = i32(pos, {1});
  batch.seq_slot = i32(slot, {1});
  batch.block_tables = i32(table, {n_blocks, 1});
  batch.seq_lens = i32(lens, {1});
  batch.max_seq_len = len;
  ops().attention(stream(), f32(q, {hd, 2, 1}), kv, batch, 0.5f, f32(out, {hd, 2, 1}));
  for (int h = 0; h < 2; ++h) {
    std::vector<double> sc(static_cast<size_t>(len));
    double mx = -INFINITY, z = 0.0;
    for (int j = 0; j < len; ++j) {
      const int s = table[size_t(j / bs)] * bs + j % bs;
      double d = 0.0;
      for (int i = 0; i < hd; ++i) d += double(q[size_t(h * hd + i)]) * kc[size_t(s * hd + i)];
      sc[size_t(j)] = 0.5 * d;
      mx = std::max(mx, sc[size_t(j)]);
    }
    for (double& x : sc) z += (x = std::exp(x - mx));
    for (int i = 0; i < hd; ++i) {
      double ref = 0.0;
      for (int j = 0; j < len; ++j)
        ref += sc[size_t(j)] / z * vc[size_t((table[size_t(j / bs)] * bs + j % bs) * hd + i)];
      EXPECT_NEAR(out[size_t(h * hd + i)], ref, 2e-5) << "head " << h << " dim " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, CpuAttention, ::testing::Bool(), simd_name);

TEST(CpuKvStore, WritesConvertedRowsAndSkipsPadding) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const int hd = 8, n_kv = 2, bs = 4, n_blocks = 3;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    const size_t elem = dtype_block_bytes(t);
    std::vector<uint8_t> kb(size_t(hd * n_kv * bs * n_blocks) * elem, 0xAB), vb(kb.size(), 0xCD);
    KvLayerView kv{Tensor::contiguous(t, {hd, n_kv, bs, n_blocks}, kb.data()),
                   Tensor::contiguous(t, {hd, n_kv, bs, n_blocks}, vb.data()), bs};
    std::vector<float> k = random_normal(size_t(hd * n_kv * 3), 1),
                       v = random_normal(size_t(hd * n_kv * 3), 2);
    std::vector<int32_t> slots = {9, -1, 2};
    ops.kv_store(s, kv, f32(k, {hd, n_kv, 3}), f32(v, {hd, n_kv, 3}), i32(slots, {3}));
    for (int t_row : {0, 2}) {
      for (int h = 0; h < n_kv; ++h)
        for (int i = 0; i < hd; ++i) {
          const size_t at = (size_t(slots[size_t(t_row)]) * n_kv + h) * hd + i;
          const float kin = k[size_t((t_row * n_kv + h) * hd + i)],
                      vin = v[size_t((t_row * n_kv + h) * hd + i)];
          const float kexp = t == DType::F16    ? fp16_to_fp32(fp32_to_fp16(kin))
                             : t == DType::BF16 ? bf16_to_fp32(fp32_to_bf16(kin))
                                                : kin;
          const float vexp = t == DType::F16    ? fp16_to_fp32(fp32_to_fp16(vin))
                             : t == DType::BF16 ? bf16_to_fp32(fp32_to_bf16(vin))
                                                : vin;
          EXPECT_EQ(cache_value(t, kb.data(), at), kexp);
          EXPECT_EQ(cache_value(t, vb.data(), at), vexp);
        }
    }
    // Untouched slots keep their bytes (the padding row wrote nothing).
    size_t changed = 0;
    for (uint8_t b : kb) changed += b != 0xAB;
    EXPECT_LE(changed, size_t(2 * hd * n_kv) * elem);
  }
}

TEST(CpuAttentionErrors, BadMetadataIsAnError) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const int hd = 8, bs = 4, n_blocks = 2;
  std::vector<float> kc(size_t(hd * bs * n_blocks), 1.0f), vc = kc, q(size_t(hd * 2), 1.0f),
                                                           out(size_t(hd * 2));
  KvLayerView kv{f32(kc, {hd, 1, bs, n_blocks}), f32(vc, {hd, 1, bs, n_blocks}), bs};
  std::vector<int32_t> pos = {3}, slot = {0}, table = {1, 0}, lens = {5};
  AttentionBatch b;
  b.positions = i32(pos, {1});
  b.seq_slot = i32(slot, {1});
  b.block_tables = i32(table, {2, 1});
  b.seq_lens = i32(lens, {1});
  b.max_seq_len = 8;
  EXPECT_NO_THROW(ops.attention(s, f32(q, {hd, 2, 1}), kv, b, 1.0f, f32(out, {hd, 2, 1})));
  table[0] = 7;  // not a cache block
  EXPECT_THROW(ops.attention(s, f32(q, {hd, 2, 1}), kv, b, 1.0f, f32(out, {hd, 2, 1})), Error);
  table[0] = 1;
  lens[0] = 9;  // longer than the block table
  EXPECT_THROW(ops.attention(s, f32(q, {hd, 2, 1}), kv, b, 1.0f, f32(out, {hd, 2, 1})), Error);
  lens[0] = 5;
  slot[0] = 1;  // no such sequence
  EXPECT_THROW(ops.attention(s, f32(q, {hd, 2, 1}), kv, b, 1.0f, f32(out, {hd, 2, 1})), Error);
  slot[0] = 0;
  std::vector<float> q_wide(size_t(2 * hd * 2), 1.0f);
  // wrong head dim
  EXPECT_THROW(ops.attention(s, f32(q_wide, {2 * hd, 2, 1}), kv, b, 1.0f, f32(out, {hd, 2, 1})), Error);
  std::vector<float> k2(size_t(hd * 2 * bs * n_blocks), 1.0f), v2 = k2, q3(size_t(hd * 3), 1.0f),
                                                               out3(size_t(hd * 3));
  KvLayerView kv2{f32(k2, {hd, 2, bs, n_blocks}), f32(v2, {hd, 2, bs, n_blocks}), bs};
  // 3 query heads over 2 KV heads
  EXPECT_THROW(ops.attention(s, f32(q3, {hd, 3, 1}), kv2, b, 1.0f, f32(out3, {hd, 3, 1})), Error);
  b.mask = MaskKind::Block;  // Block without block_end
  EXPECT_THROW(ops.attention(s, f32(q, {hd, 2, 1}), kv, b, 1.0f, f32(out, {hd, 2, 1})), Error);
  std::vector<int32_t> bad_slots = {8};
  std::vector<float> k1(static_cast<size_t>(hd)), v1(static_cast<size_t>(hd));
  EXPECT_THROW(ops.kv_store(s, kv, f32(k1, {hd, 1, 1}), f32(v1, {hd, 1, 1}), i32(bad_slots, {1})), Error);
}

// ---- Explicit mask and evicted blocks (StepApiMask)
// ---------------------------------------------------------

// A paged cache holding every position of sequences of the given lengths, in shuffled physical blocks, filled
// with random K/V through kv_store; unused entries of the block tables are -1.
struct PagedCache {
  int bs = 4, n_kv = 2, hd_k = 64, hd_v = 40;
  DType type = DType::F32;
  int max_blocks = 0, n_blocks = 0;
  std::vector<int32_t> tables, lens;
  std::vector<uint8_t> kbuf, vbuf;
  KvLayerView kv;

  int slot(const std::vector<int32_t>& tab, int s, int j) const {
    return tab[size_t(s * max_blocks + j / bs)] * bs + j % bs;
  }
  double k_at(int slot_index, int kvh, int i) const {
    return cache_value(type, kbuf.data(),
                       (size_t(slot_index) * size_t(n_kv) + size_t(kvh)) * size_t(hd_k) + size_t(i));
  }
  double v_at(int slot_index, int kvh, int i) const {
    return cache_value(type, vbuf.data(),
                       (size_t(slot_index) * size_t(n_kv) + size_t(kvh)) * size_t(hd_v) + size_t(i));
  }
  double vmax() const {
    double m = 0.0;
    for (size_t i = 0; i < vbuf.size() / dtype_block_bytes(type); ++i)
      m = std::max(m, std::fabs(double(cache_value(type, vbuf.data(), i))));
    return m;
  }
};

PagedCache make_paged_cache(Ops& ops, Stream& s, const std::vector<int32_t>& lens, DType type, int n_kv,
                            uint32_t seed) {
  PagedCache c;
  c.type = type;
  c.n_kv = n_kv;
  c.lens = lens;
  const int n_seqs = int(lens.size());
  int total = 0;
  for (int32_t len : lens) {
    c.max_blocks = std::max(c.max_blocks, (len + c.bs - 1) / c.bs + 1);
    total += (len + c.bs - 1) / c.bs;
  }
  c.n_blocks = total + 2;
  std::vector<int32_t> perm(static_cast<size_t>(c.n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  c.tables.assign(size_t(c.max_blocks * n_seqs), -1);
  int next = 0;
  for (int sq = 0; sq < n_seqs; ++sq)
    for (int b = 0; b < (lens[size_t(sq)] + c.bs - 1) / c.bs; ++b)
      c.tables[size_t(sq * c.max_blocks + b)] = perm[size_t(next++)];
  const size_t elem = dtype_block_bytes(type);
  c.kbuf.assign(size_t(c.hd_k) * size_t(n_kv * c.bs * c.n_blocks) * elem, 0);
  c.vbuf.assign(size_t(c.hd_v) * size_t(n_kv * c.bs * c.n_blocks) * elem, 0);
  c.kv.k = Tensor::contiguous(type, {c.hd_k, n_kv, c.bs, c.n_blocks}, c.kbuf.data());
  c.kv.v = Tensor::contiguous(type, {c.hd_v, n_kv, c.bs, c.n_blocks}, c.vbuf.data());
  c.kv.block_size = c.bs;
  std::vector<int32_t> slots;
  for (int sq = 0; sq < n_seqs; ++sq)
    for (int j = 0; j < lens[size_t(sq)]; ++j) slots.push_back(c.slot(c.tables, sq, j));
  const int64_t n = int64_t(slots.size());
  std::vector<float> k = random_normal(size_t(c.hd_k * n_kv * n), seed + 1, 1.5f);
  std::vector<float> v = random_normal(size_t(c.hd_v * n_kv * n), seed + 2);
  ops.kv_store(s, c.kv, f32(k, {c.hd_k, n_kv, n}), f32(v, {c.hd_v, n_kv, n}), i32(slots, {n}));
  return c;
}

// The rows of a batch: position and sequence of each (sequence -1: padding).
struct Rows {
  std::vector<int32_t> pos, seq;
  int64_t size() const { return int64_t(pos.size()); }
};

// Naive attention in double: row r sees position j of its sequence when visible(r, j), with score
// scale * q . K_j + bias(r, j) (bias -inf hides); a row with no finite score gets 0.
template <class Visible, class Bias>
std::vector<double> naive_attention(const PagedCache& c, const std::vector<float>& q, int n_head,
                                    const Rows& rows, float scale, Visible visible, Bias bias) {
  const int64_t T = rows.size();
  const int group = n_head / c.n_kv;
  std::vector<double> ref(size_t(c.hd_v * n_head * T), 0.0);
  for (int64_t r = 0; r < T; ++r) {
    const int sq = rows.seq[size_t(r)];
    if (sq < 0) continue;
    for (int h = 0; h < n_head; ++h) {
      const int kvh = h / group;
      std::vector<std::pair<int, double>> w;
      double mx = -INFINITY;
      for (int j = 0; j < c.lens[size_t(sq)]; ++j) {
        if (!visible(r, j)) continue;
        const double b = bias(r, j);
        if (b == -INFINITY) continue;
        const int sl = c.slot(c.tables, sq, j);
        double d = 0.0;
        for (int i = 0; i < c.hd_k; ++i)
          d += double(q[size_t((r * n_head + h) * c.hd_k + i)]) * c.k_at(sl, kvh, i);
        w.emplace_back(sl, double(scale) * d + b);
        mx = std::max(mx, w.back().second);
      }
      double z = 0.0;
      for (auto& x : w) z += (x.second = std::exp(x.second - mx));
      double* o = ref.data() + (r * n_head + h) * c.hd_v;
      for (auto& [sl, e] : w)
        for (int i = 0; i < c.hd_v; ++i) o[i] += e / z * c.v_at(sl, kvh, i);
    }
  }
  return ref;
}

// An F32 {cols, T} view whose rows are `stride` floats apart; the gap after each row holds NaN (it must never
// be read).
Tensor strided_mask(std::vector<float>& storage, int64_t cols, int64_t stride, int64_t T) {
  Tensor t = f32(storage, {stride, T});
  t.ne[0] = cols;
  for (int64_t r = 0; r < T; ++r)
    for (int64_t j = cols; j < stride; ++j) storage[size_t(r * stride + j)] = NAN;
  return t;
}

// Rows of two sequences (lengths 11 and 16) interleaved, plus a padding row: prefill chunks of 5 and 3 rows.
Rows two_sequence_rows() {
  Rows rows;
  const int first[2] = {6, 13}, count[2] = {5, 3};
  for (int i = 0; i < 5; ++i)
    for (int sq = 0; sq < 2; ++sq) {
      if (i >= count[sq]) continue;
      rows.pos.push_back(first[sq] + i);
      rows.seq.push_back(sq);
      if (i == 3 && sq == 0) {
        rows.pos.push_back(0);
        rows.seq.push_back(-1);
      }
    }
  return rows;
}

struct ExplicitCase {
  DType cache;
  int n_head, n_kv;
  int sliding_window = 0;
  bool kv_begin = false;
};

void run_explicit_case(const ExplicitCase& ec, uint32_t seed) {
  SCOPED_TRACE(std::string("cache ") + dtype_name(ec.cache) + " heads " + std::to_string(ec.n_head) + "/" +
               std::to_string(ec.n_kv) + " window " + std::to_string(ec.sliding_window) +
               (ec.kv_begin ? " kv_begin" : ""));
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const PagedCache c = make_paged_cache(ops, s, {11, 16}, ec.cache, ec.n_kv, seed);
  const Rows rows = two_sequence_rows();
  const int64_t T = rows.size();
  const int64_t cols = 14, stride = 19;  // positions 14, 15 of the second sequence are beyond the mask
  std::vector<float> mask(size_t(stride * T));
  const Tensor mask_t = strided_mask(mask, cols, stride, T);
  std::mt19937 rng(seed + 7);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f), ub(-3.0f, 3.0f);
  const int64_t all_masked = 2;  // a row (sequence 0, position 7) whose every bias is -inf
  for (int64_t r = 0; r < T; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      float b = u01(rng) < 0.3f ? -INFINITY : ub(rng);
      if (b == 0.0f) b = 0.5f;
      mask[size_t(r * stride + j)] = r == all_masked ? -INFINITY : b;
    }
  std::vector<int32_t> kv_begin(static_cast<size_t>(T));
  for (int64_t r = 0; r < T; ++r) kv_begin[size_t(r)] = int32_t(r % 3);
  std::vector<float> q = random_normal(size_t(c.hd_k * ec.n_head * T), seed + 5);
  std::vector<float> out(size_t(c.hd_v * ec.n_head * T), NAN);
  std::vector<int32_t> pos = rows.pos, seq = rows.seq, tables = c.tables, lens = c.lens;
  AttentionBatch b;
  b.mask = MaskKind::Explicit;
  b.positions = i32(pos, {T});
  b.seq_slot = i32(seq, {T});
  b.block_tables = i32(tables, {c.max_blocks, 2});
  b.seq_lens = i32(lens, {2});
  b.explicit_mask = mask_t;
  if (ec.kv_begin) b.kv_begin = i32(kv_begin, {T});
  b.sliding_window = ec.sliding_window;
  b.max_seq_len = 16;
  const float scale = 1.0f / std::sqrt(float(c.hd_k));
  const int n_head = ec.n_head;
  for (bool simd : {true, false}) {
    SCOPED_TRACE(simd ? "avx2" : "scalar");
    cpu::set_simd_enabled(simd);
    std::fill(out.begin(), out.end(), NAN);
    ops.attention(s, f32(q, {c.hd_k, n_head, T}), c.kv, b, scale, f32(out, {c.hd_v, n_head, T}));
    cpu::set_simd_enabled(true);
    const std::vector<double> ref = naive_attention(
        c, q, n_head, rows, scale,
        [&](int64_t r, int j) {
          const int p = rows.pos[size_t(r)];
          bool ok = j < cols;
          if (ec.sliding_window > 0) ok = ok && j > p - ec.sliding_window;
          if (ec.kv_begin) ok = ok && j >= kv_begin[size_t(r)];
          return ok;
        },
        [&](int64_t r, int j) { return double(mask[size_t(r * stride + j)]); });
    const double tol = 1e-5 * c.vmax();
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], tol) << "element " << i;
    for (int64_t i = 0; i < c.hd_v * n_head; ++i)
      ASSERT_EQ(out[size_t(all_masked * c.hd_v * n_head + i)], 0.0f) << "the all -inf row must give 0";
  }
}

TEST(StepApiMask, ExplicitMatchesNaive) {
  uint32_t seed = 300;
  run_explicit_case({DType::F32, 4, 2}, seed++);
  run_explicit_case({DType::F32, 8, 2}, seed++);
  run_explicit_case({DType::F16, 4, 2}, seed++);
  run_explicit_case({DType::F16, 8, 1}, seed++);
  run_explicit_case({DType::BF16, 2, 2}, seed++);
  run_explicit_case({DType::F32, 4, 2, 5, true}, seed++);  // the window and kv_begin still apply
}

// Runs attention over the two-sequence batch with a given AttentionBatch setup; returns the output.
std::vector<float> run_two_sequence(const PagedCache& c, int n_head, const std::vector<float>& q,
                                    MaskKind mask, const Tensor* explicit_mask, int sliding_window) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const Rows rows = two_sequence_rows();
  const int64_t T = rows.size();
  std::vector<int32_t> pos = rows.pos, seq = rows.seq, tables = c.tables, lens = c.lens;
  AttentionBatch b;
  b.mask = mask;
  b.positions = i32(pos, {T});
  b.seq_slot = i32(seq, {T});
  b.block_tables = i32(tables, {c.max_blocks, 2});
  b.seq_lens = i32(lens, {2});
  if (explicit_mask) b.explicit_mask = *explicit_mask;
  b.sliding_window = sliding_window;
  b.max_seq_len = 16;
  std::vector<float> out(size_t(c.hd_v * n_head * T), NAN);
  std::vector<float> qc = q;
  ops.attention(s, f32(qc, {c.hd_k, n_head, T}), c.kv, b, 0.125f, f32(out, {c.hd_v, n_head, T}));
  return out;
}

TEST(StepApiMask, ExplicitZeroBiasEqualsBidirectional) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  for (DType t : {DType::F32, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    const PagedCache c = make_paged_cache(ops, s, {11, 16}, t, 2, 400);
    const int64_t T = two_sequence_rows().size();
    const std::vector<float> q = random_normal(size_t(c.hd_k * 4 * T), 401);
    std::vector<float> zeros(size_t(20 * T));
    const Tensor mask_t = strided_mask(zeros, 16, 20, T);
    for (int64_t r = 0; r < T; ++r)
      for (int j = 0; j < 16; ++j) zeros[size_t(r * 20 + j)] = 0.0f;
    for (int window : {0, 6}) {
      const std::vector<float> expl = run_two_sequence(c, 4, q, MaskKind::Explicit, &mask_t, window);
      const std::vector<float> bidi = run_two_sequence(c, 4, q, MaskKind::Bidirectional, nullptr, window);
      ASSERT_EQ(0, std::memcmp(expl.data(), bidi.data(), expl.size() * sizeof(float))) << "window " << window;
    }
  }
}

TEST(StepApiMask, ExplicitCausalPatternMatchesCausal) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const Rows rows = two_sequence_rows();
  const int64_t T = rows.size();
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    const PagedCache c = make_paged_cache(ops, s, {11, 16}, t, 2, 410);
    const std::vector<float> q = random_normal(size_t(c.hd_k * 8 * T), 411);
    std::vector<float> m(size_t(16 * T));
    const Tensor mask_t = f32(m, {16, T});
    for (int64_t r = 0; r < T; ++r)
      for (int j = 0; j < 16; ++j) m[size_t(r * 16 + j)] = j <= rows.pos[size_t(r)] ? 0.0f : -INFINITY;
    const std::vector<float> expl = run_two_sequence(c, 8, q, MaskKind::Explicit, &mask_t, 0);
    const std::vector<float> causal = run_two_sequence(c, 8, q, MaskKind::Causal, nullptr, 0);
    for (size_t i = 0; i < expl.size(); ++i) ASSERT_NEAR(expl[i], causal[i], 1e-6) << "element " << i;
  }
}

TEST(StepApiMask, BadExplicitMaskIsAnError) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const PagedCache c = make_paged_cache(ops, s, {11, 16}, DType::F32, 2, 420);
  const int64_t T = two_sequence_rows().size();
  const std::vector<float> q = random_normal(size_t(c.hd_k * 4 * T), 421);
  std::vector<float> m = random_normal(size_t(16 * (T + 1)), 422);
  std::vector<uint16_t> m16(m.size(), 0x3c00);
  const Tensor good = f32(m, {16, T});
  EXPECT_NO_THROW(run_two_sequence(c, 4, q, MaskKind::Explicit, &good, 0));
  const Tensor too_many_rows = f32(m, {16, T + 1});
  EXPECT_THROW(run_two_sequence(c, 4, q, MaskKind::Explicit, &too_many_rows, 0), Error);
  const Tensor three_d = f32(m, {16, T, 1, 1});
  EXPECT_NO_THROW(run_two_sequence(c, 4, q, MaskKind::Explicit, &three_d, 0));
  const Tensor split_rows = f32(m, {8, T, 2});
  EXPECT_THROW(run_two_sequence(c, 4, q, MaskKind::Explicit, &split_rows, 0), Error);
  const Tensor f16_mask = view(m16, DType::F16, {16, T});
  EXPECT_THROW(run_two_sequence(c, 4, q, MaskKind::Explicit, &f16_mask, 0), Error);
  Tensor no_data = good;
  no_data.data = nullptr;
  EXPECT_THROW(run_two_sequence(c, 4, q, MaskKind::Explicit, &no_data, 0), Error);
  EXPECT_THROW(run_two_sequence(c, 4, q, MaskKind::Explicit, nullptr, 0), Error);  // no mask at all
  Tensor on_gpu = good;
  on_gpu.device = DeviceId{DeviceKind::CUDA, 0};
  EXPECT_THROW(run_two_sequence(c, 4, q, MaskKind::Explicit, &on_gpu, 0), Error);
  // For the other kinds the tensor is ignored, even when it is not a valid mask.
  EXPECT_NO_THROW(run_two_sequence(c, 4, q, MaskKind::Causal, &f16_mask, 0));
}

// Sequence 0 (length 22) has rows at 19, 20, 21 with a window of 6: they see positions >= 14, so blocks 0..2
// (positions 0..11) lie before every row's window and may be evicted. Sequence 1 (length 9) has one decode
// row at 8, which sees positions 3..8: nothing of it can go.
TEST(StepApiMask, EvictedBlocksBeforeTheWindow) {
  Ops& ops = test_device().ops();
  Stream& s = test_device().default_stream();
  const int window = 6, n_head = 4;
  for (DType t : {DType::F32, DType::F16}) {
    for (MaskKind kind : {MaskKind::Causal, MaskKind::Explicit}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (kind == MaskKind::Explicit ? " explicit" : " causal"));
      const PagedCache c = make_paged_cache(ops, s, {22, 9}, t, 2, 430);
      Rows rows;
      rows.pos = {19, 8, 20, 21};
      rows.seq = {0, 1, 0, 0};
      const int64_t T = rows.size();
      std::vector<float> q = random_normal(size_t(c.hd_k * n_head * T), 431);
      std::vector<float> m(size_t(22 * T));
      std::mt19937 rng(432);
      std::uniform_real_distribution<float> ub(-2.0f, 2.0f);
      for (auto& x : m) {
        do x = ub(rng);
        while (x == 0.0f);
      }
      m[size_t(0 * 22 + 15)] = -INFINITY;
      std::vector<int32_t> pos = rows.pos, seq = rows.seq, lens = c.lens;
      auto run = [&](std::vector<int32_t> tables) {
        AttentionBatch b;
        b.mask = kind;
        b.positions = i32(pos, {T});
        b.seq_slot = i32(seq, {T});
        b.block_tables = i32(tables, {c.max_blocks, 2});
        b.seq_lens = i32(lens, {2});
        b.explicit_mask = f32(m, {22, T});
        b.sliding_window = window;
        b.max_seq_len = 22;
        std::vector<float> out(size_t(c.hd_v * n_head * T), NAN);
        ops.attention(s, f32(q, {c.hd_k, n_head, T}), c.kv, b, 0.125f, f32(out, {c.hd_v, n_head, T}));
        return out;
      };
      const std::vector<float> full = run(c.tables);
      std::vector<int32_t> evicted = c.tables;
      for (int blk = 0; blk < 3; ++blk) evicted[size_t(blk)] = -1;
      const std::vector<float> got = run(evicted);
      ASSERT_EQ(0, std::memcmp(full.data(), got.data(), full.size() * sizeof(float)));
      const std::vector<double> ref = naive_attention(
          c, q, n_head, rows, 0.125f,
          [&](int64_t r, int j) {
            const int p = rows.pos[size_t(r)];
            return j > p - window && (kind == MaskKind::Explicit || j <= p);
          },
          [&](int64_t r, int j) { return kind == MaskKind::Explicit ? double(m[size_t(r * 22 + j)]) : 0.0; });
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-5 * c.vmax()) << "element " << i;

      // -1 where a row reads: block 3 holds positions 12..15, of which the row at 19 sees 14 and 15.
      std::vector<int32_t> bad = evicted;
      bad[3] = -1;
      EXPECT_THROW(run(bad), Error);
      // The decode row of sequence 1 sees position 3 of its block 0.
      bad = evicted;
      bad[size_t(c.max_blocks)] = -1;
      EXPECT_THROW(run(bad), Error);
      // Anything else than -1 or a cache block is an error, read or not.
      bad = evicted;
      bad[0] = -2;
      EXPECT_THROW(run(bad), Error);
      bad[0] = c.n_blocks;
      EXPECT_THROW(run(bad), Error);
    }
  }
}

}  // namespace
}  // namespace tandem::test
