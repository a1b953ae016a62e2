// CUDA kv_store + attention against the CPU ops on the same paged cache: several sequences per batch with
// shuffled (non-contiguous) physical blocks, every mask kind, sliding window, kv_begin, a padding row, GQA
// ratios 1 to 8, f32 / f16 / bf16 caches, and both kernels: split-K decoding (few rows, any head dims, contexts
// spanning several 256-position splits) and the tensor-core prefill kernel (>= 64 rows, f16/bf16, equal head
// dims), with row counts and lengths that are not multiples of its 64 x 64 tiles.
//
// Error bounds (relative L2 vs the CPU op, which computes in f32): decode kernel: f32 scores and sums, < 1e-5.
// Prefill kernel: q*scale and the probabilities P are rounded to the cache's 16-bit type before the tensor-core
// products (unit roundoff 2^-9 bf16, 2^-12 f16; out is a convex combination of V rows): < 1.5e-2 bf16,
// < 2e-3 f16.
#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

struct Seq {
  int cached_before;
  int new_rows;
};

struct Case {
  MaskKind mask;
  int n_head, n_kv_head, hd_k, hd_v;
  DType cache;
  std::vector<Seq> seqs;
  int sliding_window = 0;
  bool kv_begin = false;
  bool padding_row = false;
  double tol = 1e-5;
};

class GpuAttention : public GpuTest {
 protected:
  void run(const Case& c, uint32_t seed) {
    SCOPED_TRACE(std::string("mask ") + std::to_string(int(c.mask)) + " heads " + std::to_string(c.n_head) + "/" +
                 std::to_string(c.n_kv_head) + " hd " + std::to_string(c.hd_k) + "/" + std::to_string(c.hd_v) +
                 " cache " + dtype_name(c.cache) + " window " + std::to_string(c.sliding_window) +
                 (c.kv_begin ? " kv_begin" : "") + (c.padding_row ? " padding" : ""));
    std::mt19937 rng(seed);
    const int bs = 16;
    const int n_seqs = int(c.seqs.size());
    int max_blocks = 0, total_blocks = 0, max_len = 0;
    for (const Seq& s : c.seqs) {
      const int len = s.cached_before + s.new_rows;
      max_blocks = std::max(max_blocks, (len + bs - 1) / bs + 1);
      total_blocks += (len + bs - 1) / bs;
      max_len = std::max(max_len, len);
    }
    const int n_blocks = total_blocks + 2;
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> tables(static_cast<size_t>(max_blocks * n_seqs), 0), lens(static_cast<size_t>(n_seqs));
    int next = 0;
    for (int s = 0; s < n_seqs; ++s) {
      lens[size_t(s)] = c.seqs[size_t(s)].cached_before + c.seqs[size_t(s)].new_rows;
      for (int b = 0; b < (lens[size_t(s)] + bs - 1) / bs; ++b) tables[size_t(s * max_blocks + b)] = perm[size_t(next++)];
    }
    auto slot_of = [&](int s, int j) { return tables[size_t(s * max_blocks + j / bs)] * bs + j % bs; };

    // Fill every cached position of every sequence with one kv_store on each device.
    std::vector<int32_t> all_slots;
    for (int s = 0; s < n_seqs; ++s)
      for (int j = 0; j < lens[size_t(s)]; ++j) all_slots.push_back(slot_of(s, j));
    const int64_t n_all = int64_t(all_slots.size());
    Pair k_all = make_f32({c.hd_k, c.n_kv_head, n_all}, random_floats(size_t(c.hd_k * c.n_kv_head * n_all), rng));
    Pair v_all = make_f32({c.hd_v, c.n_kv_head, n_all}, random_floats(size_t(c.hd_v * c.n_kv_head * n_all), rng));
    Pair slots = make_i32({n_all}, all_slots);
    Pair kc = make_out(c.cache, {c.hd_k, c.n_kv_head, bs, n_blocks});
    Pair vc = make_out(c.cache, {c.hd_v, c.n_kv_head, bs, n_blocks});
    // Unused cache slots hold zeros on both sides (poisoned slots would be NaN; no row may read them).
    std::fill(kc.host.begin(), kc.host.end(), 0);
    std::fill(vc.host.begin(), vc.host.end(), 0);
    upload(kc);
    upload(vc);
    KvLayerView kv_g{kc.dev, vc.dev, bs}, kv_c{kc.cpu, vc.cpu, bs};
    gops().kv_store(gs(), kv_g, k_all.dev, v_all.dev, slots.dev);
    cops().kv_store(cs(), kv_c, k_all.cpu, v_all.cpu, slots.cpu);
    ASSERT_EQ(download(kc), kc.host);
    ASSERT_EQ(download(vc), vc.host);

    // This batch: the new rows of every sequence, plus an optional padding row in the middle.
    std::vector<int32_t> pos, seq, bend, kvb;
    for (int s = 0; s < n_seqs; ++s) {
      for (int i = 0; i < c.seqs[size_t(s)].new_rows; ++i) {
        const int p = c.seqs[size_t(s)].cached_before + i;
        pos.push_back(p);
        seq.push_back(s);
        bend.push_back(std::min(lens[size_t(s)], (p / 8 + 1) * 8));  // causal prefix + bidirectional block of 8
        kvb.push_back(p / 3);
      }
      if (c.padding_row && s == 0) {
        pos.push_back(0);
        seq.push_back(-1);
        bend.push_back(0);
        kvb.push_back(0);
      }
    }
    const int64_t T = int64_t(pos.size());
    Pair q = make_f32({c.hd_k, c.n_head, T}, random_floats(size_t(c.hd_k * c.n_head * T), rng));
    Pair out = make_out(DType::F32, {c.hd_v, c.n_head, T});
    Pair positions = make_i32({T}, pos), seq_slot = make_i32({T}, seq), block_end = make_i32({T}, bend),
         kv_begin = make_i32({T}, kvb), bt = make_i32({max_blocks, n_seqs}, tables), sl = make_i32({n_seqs}, lens);
    auto batch_for = [&](bool dev) {
      AttentionBatch b;
      b.mask = c.mask;
      b.positions = dev ? positions.dev : positions.cpu;
      b.seq_slot = dev ? seq_slot.dev : seq_slot.cpu;
      b.block_tables = dev ? bt.dev : bt.cpu;
      b.seq_lens = dev ? sl.dev : sl.cpu;
      if (c.mask == MaskKind::Block) b.block_end = dev ? block_end.dev : block_end.cpu;
      if (c.kv_begin) b.kv_begin = dev ? kv_begin.dev : kv_begin.cpu;
      b.sliding_window = c.sliding_window;
      b.max_seq_len = max_len;
      return b;
    };
    const float scale = 1.0f / std::sqrt(float(c.hd_k));
    gops().attention(gs(), q.dev, kv_g, batch_for(true), scale, out.dev);
    cops().attention(cs(), q.cpu, kv_c, batch_for(false), scale, out.cpu);
    const auto g = download_f32(out), ref = host_f32(out);
    EXPECT_LT(rel_l2(g, ref), c.tol);
    if (c.padding_row) {
      const size_t r = size_t(c.seqs[0].new_rows);  // the padding row's index
      for (int64_t i = 0; i < c.hd_v * c.n_head; ++i) ASSERT_EQ(g[r * size_t(c.hd_v * c.n_head) + size_t(i)], 0.0f);
    }
  }
};

TEST_F(GpuAttention, DecodeKernelEveryMaskAndCache) {
  uint32_t seed = 1;
  const std::vector<Seq> seqs = {{0, 5}, {9, 1}, {3, 3}, {300, 2}, {700, 1}};  // up to 3 splits of 256
  for (DType cache : {DType::F32, DType::F16, DType::BF16})
    for (MaskKind mask : {MaskKind::Causal, MaskKind::Bidirectional, MaskKind::Block})
      for (auto [nh, nkv] : {std::pair<int, int>{4, 4}, {6, 3}, {8, 2}, {8, 1}}) {
        Case c{mask, nh, nkv, 64, 40, cache, seqs};
        run(c, seed++);
      }
  Case w{MaskKind::Causal, 8, 2, 128, 128, DType::BF16, seqs};
  w.sliding_window = 100;
  run(w, seed++);
  Case b{MaskKind::Bidirectional, 8, 2, 128, 128, DType::F16, seqs};
  b.kv_begin = true;
  b.padding_row = true;
  run(b, seed++);
}

TEST_F(GpuAttention, PrefillKernelTensorCores) {
  uint32_t seed = 100;
  const std::vector<Seq> seqs = {{0, 100}, {30, 70}, {5, 1}};  // 171 rows: tiles shared by two sequences
  for (DType cache : {DType::BF16, DType::F16})
    for (MaskKind mask : {MaskKind::Causal, MaskKind::Bidirectional, MaskKind::Block})
      for (int hd : {64, 128}) {
        Case c{mask, 8, 2, hd, hd, cache, seqs};
        c.tol = cache == DType::BF16 ? 1.5e-2 : 2e-3;
        run(c, seed++);
      }
  Case w{MaskKind::Causal, 4, 4, 128, 128, DType::BF16, seqs};
  w.sliding_window = 40;
  w.tol = 1.5e-2;
  run(w, seed++);
  Case k{MaskKind::Bidirectional, 16, 2, 256, 256, DType::BF16, seqs};
  k.kv_begin = true;
  k.padding_row = true;
  k.tol = 1.5e-2;
  run(k, seed++);
}

// One small case of each kernel, for compute-sanitizer (racecheck is slow on shared-memory-heavy kernels).
TEST_F(GpuAttention, SmallCasesForSanitizer) {
  Case p{MaskKind::Block, 4, 2, 64, 64, DType::BF16, {{3, 70}, {0, 3}}};
  p.tol = 1.5e-2;
  run(p, 900);
  Case d{MaskKind::Causal, 4, 2, 64, 40, DType::F16, {{300, 2}, {0, 1}}};
  d.padding_row = true;
  run(d, 901);
}

}  // namespace
}  // namespace tandem::gpu_test
