// CUDA kv_store + attention against the CPU ops on the same paged cache: several sequences per batch with
// shuffled (non-contiguous) physical blocks, every mask kind, sliding window, kv_begin, a padding row, GQA
// ratios 1 to 8, f32 / f16 / bf16 caches, and both kernels: split-K decoding (few rows, any head dims,
// contexts spanning several 256-position splits) and the tensor-core prefill kernel (>= 64 rows, f16/bf16,
// equal head dims), with row counts and lengths that are not multiples of its 64 x 64 tiles.
//
// Explicit masks (an additive bias per row and position, -inf at ~30% of them, a row that is all -inf, a row
// whose -inf span covers a whole 256-position decode split, columns fewer than the longest sequence, rows
// strided with NaN in the gaps) go through both kernels, the decode one also in several 64-row chunks;
// evicted blocks (block-table entries -1 before every row's sliding window) through both kernels.
//
// Error bounds (relative L2 vs the CPU op, which computes in f32): decode kernel: f32 scores and sums,
// < 1e-5. Prefill kernel: q*scale and the probabilities P are rounded to the cache's 16-bit type before the
// tensor-core products (unit roundoff 2^-9 bf16, 2^-12 f16; out is a convex combination of V rows):
// < 1.5e-2 bf16, < 2e-3 f16.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/kernel_profile.h"
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
  int mask_cols = 0;        // Explicit: columns of the mask (0 = the longest sequence's length)
  int all_masked_row = -1;  // Explicit: a row whose every bias is -inf (its output must be 0)
  bool evict = false;       // block-table entries of blocks before every row's window of a sequence -> -1
  // Not F32: also Ops::attention_project_add with an output projection of this dtype (decode-sized batches):
  // bitwise the same as attention + matmul_add on the GPU, and close to the CPU's composition.
  DType project = DType::F32;
  // Non-empty: the GPU call must launch a kernel whose name contains this (counted by the kernel profiler).
  std::string expect_kernel = "";
  // Also run the decode kernel with the query heads of a group split over blocks (TANDEM_ATTN_HEAD_SPLIT) and
  // without: the same bits.
  bool head_split_bitwise = false;
  // Decode with the in-place combine (TANDEM_ATTN_FUSED_COMBINE): no combine kernel may run, and a second call
  // with another query (-q) must get its own answer (the counters left at zero), then q again the same bits.
  bool fused_combine = false;
};

class GpuAttention : public GpuTest {
 protected:
  // Ops::attention_project_add against its composition: y = residual + W_o attention(q) on the GPU both ways
  // (bitwise: the fused path's quantized attention output must be what quantize_q8 makes of it, and the
  // attention output itself must not change), and against the CPU's composition.
  void check_projection(const Case& c, Pair& q, const KvLayerView& kv_g, const KvLayerView& kv_c,
                        const AttentionBatch& b_g, const AttentionBatch& b_c, float scale,
                        const std::vector<float>& attn_ref, std::mt19937& rng) {
    SCOPED_TRACE(std::string("projection ") + dtype_name(c.project));
    const int64_t T = q.dev.ne[2], K = int64_t(c.n_head) * c.hd_v, N = 192;
    const auto w = random_floats(size_t(K * N), rng, -0.1f, 0.1f);
    std::vector<uint8_t> wq(dtype_row_bytes(c.project, K) * size_t(N));
    quant::quantize_matrix(c.project, w.data(), wq.data(), N, K, 0);
    Pair W = make(c.project, {K, N}, wq.data());
    const auto y0 = random_floats(size_t(N * T), rng);
    Pair y_fused = make_f32({N, T}, y0), y_comp = make_f32({N, T}, y0);
    Pair out1 = make_out(DType::F32, {c.hd_v, c.n_head, T}), out2 = make_out(DType::F32, {c.hd_v, c.n_head, T});
    Pair tmp = make_out(DType::F32, {N, T});
    auto rows = [&](const Tensor& t) { return Tensor::contiguous(DType::F32, {K, T}, t.data, t.device); };
    // Which kernels ran (src/backend/kernel_profile.h): the fused path launches no activation quantization,
    // the composition one (quantized weights).
    std::string why;
    std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
    ASSERT_NE(prof, nullptr) << why;
    const int64_t fused = launches_of(*gpu_, *prof, "quantize_q8", [&] {
      gops().attention_project_add(gs(), q.dev, kv_g, b_g, scale, out1.dev, rows(out1.dev), W.dev, tmp.dev,
                                   y_fused.dev);
    });
    const int64_t composed = launches_of(*gpu_, *prof, "quantize_q8", [&] {
      gops().attention(gs(), q.dev, kv_g, b_g, scale, out2.dev);
      gops().matmul_add(gs(), W.dev, rows(out2.dev), tmp.dev, y_comp.dev);
    });
    prof.reset();
    EXPECT_EQ(fused, 0);
    EXPECT_EQ(composed, c.project == DType::F16 || c.project == DType::BF16 ? 0 : 1);
    EXPECT_EQ(download_f32(out1), attn_ref) << "the attention output changed";
    const auto yf = download_f32(y_fused), yc = download_f32(y_comp);
    EXPECT_EQ(yf, yc) << "fused and composed projections differ";
    Pair out_c = make_out(DType::F32, {c.hd_v, c.n_head, T});
    cops().attention_project_add(cs(), q.cpu, kv_c, b_c, scale, out_c.cpu, rows(out_c.cpu), W.cpu, tmp.cpu,
                                 y_fused.cpu);
    EXPECT_LT(rel_l2(yf, host_f32(y_fused)), 2e-2);  // the q8 activations' rounding against the CPU's f32
  }

  void run(const Case& c, uint32_t seed) {
    SCOPED_TRACE(std::string("mask ") + std::to_string(int(c.mask)) + " heads " + std::to_string(c.n_head) +
                 "/" + std::to_string(c.n_kv_head) + " hd " + std::to_string(c.hd_k) + "/" +
                 std::to_string(c.hd_v) + " cache " + dtype_name(c.cache) + " window " +
                 std::to_string(c.sliding_window) + (c.kv_begin ? " kv_begin" : "") +
                 (c.padding_row ? " padding" : "") + (c.evict ? " evicted blocks" : ""));
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
    std::vector<int32_t> tables(static_cast<size_t>(max_blocks * n_seqs), 0),
        lens(static_cast<size_t>(n_seqs));
    int next = 0;
    for (int s = 0; s < n_seqs; ++s) {
      lens[size_t(s)] = c.seqs[size_t(s)].cached_before + c.seqs[size_t(s)].new_rows;
      for (int b = 0; b < (lens[size_t(s)] + bs - 1) / bs; ++b)
        tables[size_t(s * max_blocks + b)] = perm[size_t(next++)];
    }
    auto slot_of = [&](int s, int j) { return tables[size_t(s * max_blocks + j / bs)] * bs + j % bs; };

    // Fill every cached position of every sequence with one kv_store on each device.
    std::vector<int32_t> all_slots;
    for (int s = 0; s < n_seqs; ++s)
      for (int j = 0; j < lens[size_t(s)]; ++j) all_slots.push_back(slot_of(s, j));
    const int64_t n_all = int64_t(all_slots.size());
    Pair k_all =
        make_f32({c.hd_k, c.n_kv_head, n_all}, random_floats(size_t(c.hd_k * c.n_kv_head * n_all), rng));
    Pair v_all =
        make_f32({c.hd_v, c.n_kv_head, n_all}, random_floats(size_t(c.hd_v * c.n_kv_head * n_all), rng));
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
        // causal prefix + bidirectional block of 8
        bend.push_back(std::min(lens[size_t(s)], (p / 8 + 1) * 8));
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

    // Evicted blocks: per sequence, the blocks wholly before the lowest position any of its rows sees.
    std::vector<int32_t> bt_tables = tables;
    if (c.evict) {
      int n_evicted = 0;
      for (int s = 0; s < n_seqs; ++s) {
        int min_lo = INT32_MAX;
        for (int64_t r = 0; r < T; ++r) {
          if (seq[size_t(r)] != s) continue;
          int lo = c.sliding_window > 0 ? std::max(0, pos[size_t(r)] - c.sliding_window + 1) : 0;
          if (c.kv_begin) lo = std::max(lo, kvb[size_t(r)]);
          min_lo = std::min(min_lo, lo);
        }
        if (min_lo == INT32_MAX) continue;
        for (int b = 0; (b + 1) * bs <= min_lo; ++b, ++n_evicted) bt_tables[size_t(s * max_blocks + b)] = -1;
      }
      ASSERT_GT(n_evicted, 0) << "the case evicts nothing";
    }

    // Explicit mask: {mask_cols, T} with rows `stride` floats apart, NaN in the gaps (never read).
    const int mask_cols = c.mask_cols > 0 ? c.mask_cols : max_len;
    const int64_t stride = mask_cols + 3;
    std::vector<float> mask_host(size_t(stride * T), NAN);
    // (Other cases draw no random numbers for it, so their data stay as they were.)
    if (c.mask == MaskKind::Explicit) {
      std::uniform_real_distribution<float> u01(0.0f, 1.0f), ub(-3.0f, 3.0f);
      for (int64_t r = 0; r < T; ++r)
        for (int j = 0; j < mask_cols; ++j) {
          float b = u01(rng) < 0.3f ? -INFINITY : ub(rng);
          if (b == 0.0f) b = 0.25f;
          if (r == c.all_masked_row) b = -INFINITY;
          if (r == T - 1 && j >= 256 && j < 512) b = -INFINITY;  // a whole decode split of the last row
          mask_host[size_t(r * stride + j)] = b;
        }
    }
    Pair mask = make_f32({stride, T}, mask_host);
    Tensor mask_c = mask.cpu, mask_g = mask.dev;
    mask_c.ne[0] = mask_g.ne[0] = mask_cols;

    Pair q = make_f32({c.hd_k, c.n_head, T}, random_floats(size_t(c.hd_k * c.n_head * T), rng));
    Pair out = make_out(DType::F32, {c.hd_v, c.n_head, T});
    Pair positions = make_i32({T}, pos), seq_slot = make_i32({T}, seq), block_end = make_i32({T}, bend),
         kv_begin = make_i32({T}, kvb), bt = make_i32({max_blocks, n_seqs}, bt_tables),
         sl = make_i32({n_seqs}, lens);
    auto batch_for = [&](bool dev) {
      AttentionBatch b;
      b.mask = c.mask;
      b.positions = dev ? positions.dev : positions.cpu;
      b.seq_slot = dev ? seq_slot.dev : seq_slot.cpu;
      b.block_tables = dev ? bt.dev : bt.cpu;
      b.seq_lens = dev ? sl.dev : sl.cpu;
      if (c.mask == MaskKind::Block) b.block_end = dev ? block_end.dev : block_end.cpu;
      if (c.kv_begin) b.kv_begin = dev ? kv_begin.dev : kv_begin.cpu;
      if (c.mask == MaskKind::Explicit) b.explicit_mask = dev ? mask_g : mask_c;
      b.sliding_window = c.sliding_window;
      b.max_seq_len = max_len;
      return b;
    };
    const float scale = 1.0f / std::sqrt(float(c.hd_k));
    ForcedSwitch fused_combine(cuda::set_attn_fused_combine,  // for this case only
                               c.fused_combine ? std::optional<bool>(true) : std::nullopt);
    if (c.fused_combine) {
      std::string why;
      std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
      ASSERT_NE(prof, nullptr) << why;
      Pair o_probe = make_out(DType::F32, {c.hd_v, c.n_head, T});
      EXPECT_EQ(launches_of(*gpu_, *prof, "attention_combine",
                            [&] { gops().attention(gs(), q.dev, kv_g, batch_for(true), scale, o_probe.dev); }),
                0)
          << "the combine kernel ran although the split kernel combines";
    }
    if (c.expect_kernel.empty()) {
      gops().attention(gs(), q.dev, kv_g, batch_for(true), scale, out.dev);
    } else {
      std::string why;
      std::unique_ptr<KernelProfiler> prof = KernelProfiler::start(&why);
      ASSERT_NE(prof, nullptr) << why;
      EXPECT_GE(launches_of(*gpu_, *prof, c.expect_kernel,
                            [&] { gops().attention(gs(), q.dev, kv_g, batch_for(true), scale, out.dev); }),
                1)
          << "no " << c.expect_kernel << " kernel ran";
    }
    cops().attention(cs(), q.cpu, kv_c, batch_for(false), scale, out.cpu);
    const auto g = download_f32(out), ref = host_f32(out);
    EXPECT_LT(rel_l2(g, ref), c.tol);
    if (c.padding_row) {
      const size_t r = size_t(c.seqs[0].new_rows);  // the padding row's index
      for (int64_t i = 0; i < c.hd_v * c.n_head; ++i)
        ASSERT_EQ(g[r * size_t(c.hd_v * c.n_head) + size_t(i)], 0.0f);
    }
    if (c.mask == MaskKind::Explicit && c.all_masked_row >= 0) {
      const size_t r = size_t(c.all_masked_row);
      for (int64_t i = 0; i < c.hd_v * c.n_head; ++i) {
        ASSERT_EQ(ref[r * size_t(c.hd_v * c.n_head) + size_t(i)], 0.0f) << "CPU, all -inf row";
        ASSERT_EQ(g[r * size_t(c.hd_v * c.n_head) + size_t(i)], 0.0f) << "GPU, all -inf row";
      }
    }
    // Another query of the same shape (-q): a call with it leaves every partial result of the scratch wrong
    // for q.
    auto negated_query = [&] {
      std::vector<float> qneg = host_f32(q);
      for (float& v : qneg) v = -v;
      return make_f32({c.hd_k, c.n_head, T}, qneg);
    };
    if (c.head_split_bitwise) {
      std::vector<float> outs[2];
      Pair q2 = negated_query();
      for (int on = 0; on < 2; ++on) {
        cuda::set_attn_head_split(on == 1);
        Pair o2 = make_out(DType::F32, {c.hd_v, c.n_head, T});
        // First another query (-q) of the same shape: every partial result of the scratch then holds wrong
        // values, so a head the run below fails to write shows.
        gops().attention(gs(), q2.dev, kv_g, batch_for(true), scale, o2.dev);
        gops().attention(gs(), q.dev, kv_g, batch_for(true), scale, o2.dev);
        outs[on] = download_f32(o2);
      }
      cuda::set_attn_head_split(std::nullopt);
      EXPECT_EQ(outs[0], outs[1]) << "splitting the query heads of a group over blocks changed the output";
      EXPECT_LT(rel_l2(outs[1], ref), c.tol);
    }
    if (c.fused_combine) {  // another query, then q again: the counters were left at zero by each call
      Pair q2 = negated_query();
      Pair o2 = make_out(DType::F32, {c.hd_v, c.n_head, T}), o3 = make_out(DType::F32, {c.hd_v, c.n_head, T});
      gops().attention(gs(), q2.dev, kv_g, batch_for(true), scale, o2.dev);
      gops().attention(gs(), q.dev, kv_g, batch_for(true), scale, o3.dev);
      cops().attention(cs(), q2.cpu, kv_c, batch_for(false), scale, o2.cpu);
      EXPECT_LT(rel_l2(download_f32(o2), host_f32(o2)), c.tol) << "a second call (query -q)";
      EXPECT_EQ(download_f32(o3), g) << "the third call (q again) differs from the first";
      if (c.hd_v == 128) {  // the combine kernel's 128 threads take the splits as the split kernel's do
        cuda::set_attn_fused_combine(false);
        Pair o4 = make_out(DType::F32, {c.hd_v, c.n_head, T});
        gops().attention(gs(), q.dev, kv_g, batch_for(true), scale, o4.dev);
        cuda::set_attn_fused_combine(true);
        EXPECT_EQ(download_f32(o4), g) << "in place and by the combine kernel: other bits at hd_v 128";
      }
    }
    if (c.project != DType::F32) check_projection(c, q, kv_g, kv_c, batch_for(true), batch_for(false), scale, g, rng);
    if (c.evict) {  // the same batch over the full block tables gives the same result
      Pair bt_full = make_i32({max_blocks, n_seqs}, tables);
      Pair out_full = make_out(DType::F32, {c.hd_v, c.n_head, T});
      AttentionBatch b = batch_for(true);
      b.block_tables = bt_full.dev;
      gops().attention(gs(), q.dev, kv_g, b, scale, out_full.dev);
      EXPECT_EQ(download_f32(out_full), g);
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
  // The output pass's octet path (16-bit V, hd_v / 8 dividing the block's threads, gqa <= 8) at the head dims
  // and group sizes models use, and gqa 16 (the paired path).
  for (DType cache : {DType::F16, DType::BF16})
    for (auto [nh, nkv, hd] : {std::tuple<int, int, int>{8, 1, 64}, {16, 8, 256}, {16, 2, 512}, {16, 1, 128}}) {
      Case o{MaskKind::Causal, nh, nkv, hd, hd, cache, seqs};
      run(o, seed++);
    }
}

// The query heads of a GQA group split over blocks (TANDEM_ATTN_HEAD_SPLIT, attention_decode.cu): gemma4's global
// layers (16 heads of 512 over 2 KV heads: 4 blocks of 2 heads), groups of 8 x 256 and 8 x 128 (2 and 1 blocks),
// 16 heads a group (left whole), every cache dtype, a sliding window, a padding row, decode-sized batches with
// several splits; bit for bit the kernel with one block a group, and close to the CPU.
TEST_F(GpuAttention, DecodeHeadSplitGivesTheSameBits) {
  cuda::set_attn_head_split(true);
  EXPECT_EQ(cuda::attention_head_split_for(8, 512), 4);  // the blocks a group is split over
  EXPECT_EQ(cuda::attention_head_split_for(8, 256), 2);
  EXPECT_EQ(cuda::attention_head_split_for(8, 128), 1);
  EXPECT_EQ(cuda::attention_head_split_for(16, 128), 1);  // (> 8: the paired output pass; left whole)
  cuda::set_attn_head_split(std::nullopt);
  uint32_t seed = 5100;
  const std::vector<Seq> seqs = {{37, 1}, {300, 1}, {0, 2}, {130, 1}};
  for (DType cache : {DType::F16, DType::BF16, DType::F32})
    for (auto [nh, nkv, hd] : {std::tuple<int, int, int>{16, 2, 512}, {8, 1, 256}, {8, 1, 128}, {16, 1, 128}}) {
      Case c{MaskKind::Causal, nh, nkv, hd, hd, cache, seqs};
      c.head_split_bitwise = true;
      c.expect_kernel = "attention_split";
      run(c, seed++);
    }
  Case w{MaskKind::Causal, 16, 2, 512, 512, DType::BF16, seqs};
  w.sliding_window = 100;
  w.padding_row = true;
  w.head_split_bitwise = true;
  run(w, seed++);
}

// Longer contexts: every split length of the decode kernel (64 up to 4096 positions, 128 up to 16384, 256
// beyond) with many splits per row, rows of different lengths in one launch, and the combine over up to 67
// splits.
TEST_F(GpuAttention, ProjectionTakesTheQuantizedOutputOfDecodeAttention) {
  // Decode-sized batches (1 to 8 rows: one product launch), the quantized weight types the fused path takes
  // and one it does not (F16: composed), head dims 64 / 128 / 256, GQA, a padding row (zeros quantized).
  uint32_t seed = 300;
  for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16}) {
    Case c{MaskKind::Causal, 8, 2, 128, 128, DType::F16, {{37, 1}}};
    c.project = t;
    run(c, seed++);
    Case several{MaskKind::Causal, 4, 4, 64, 64, DType::BF16, {{5, 2}, {300, 1}, {0, 3}}};
    several.project = t;
    several.padding_row = true;
    run(several, seed++);
    Case wide{MaskKind::Causal, 4, 1, 256, 256, DType::F16, {{700, 1}}};
    wide.project = t;
    run(wide, seed++);
  }
}

TEST_F(GpuAttention, DecodeLongContextsEverySplitLength) {
  uint32_t seed = 77;
  const std::vector<std::vector<Seq>> batches = {
      {{4000, 1}, {63, 1}},              // max 4001: 63 splits of 64
      {{4095, 1}, {9000, 2}, {130, 1}},  // max 9002: 71 splits of 128
      {{17000, 1}, {16383, 1}}};         // max 17001: 67 splits of 256
  for (const auto& seqs : batches)
    for (DType cache : {DType::BF16, DType::F32}) {
      Case c{MaskKind::Causal, 8, 2, 128, 128, cache, seqs};
      c.tol = 1e-4;  // sums over up to 17k positions in another order than the CPU's
      run(c, seed++);
    }
  // The Qwen3-8B shape at 32k: 126 splits of 256 x 8 KV heads are a little more than one wave of blocks on an
  // H100 or H200, so the splits are lengthened to fit one (attention_decode.cu, fit_splits_to_waves: 336).
  for (DType cache : {DType::BF16, DType::F16}) {
    Case c{MaskKind::Causal, 32, 8, 128, 128, cache, {{32000, 1}, {31000, 1}}};
    c.tol = 1e-4;
    run(c, seed++);
  }
}

// The split decode kernel combining its splits in place (TANDEM_ATTN_FUSED_COMBINE, attention_decode.cu): every
// cache dtype, head dims 64 / 128 / 512 (gemma4's global heads, split over blocks), a padding row, a sliding
// window, the quantized output for the projection, and long contexts of up to 67 splits (the last block of a
// group reads the others' partials), against the CPU; at hd_v 128 bit for bit the combine kernel's result.
TEST_F(GpuAttention, DecodeCombinesInTheLastSplitBlock) {
  uint32_t seed = 9100;
  const std::vector<Seq> seqs = {{0, 5}, {9, 1}, {3, 3}, {300, 2}, {700, 1}};
  for (DType cache : {DType::F16, DType::BF16, DType::F32})
    for (auto [nh, nkv, hd] : {std::tuple<int, int, int>{8, 2, 128}, {16, 2, 512}, {4, 4, 64}}) {
      Case c{MaskKind::Causal, nh, nkv, hd, hd, cache, seqs};
      c.fused_combine = true;
      c.expect_kernel = "attention_split";
      c.padding_row = cache == DType::F16;
      c.sliding_window = cache == DType::BF16 ? 200 : 0;
      run(c, seed++);
    }
  // The quantized output for the projection (attention_project_add fuses only up to kGemvMaxCols = 8 rows: 4
  // and a padding row here; the first GPU run of this test gave the case above 13 rows, so the projection
  // composed and its launch count failed).
  for (int hd : {128, 512}) {  // (K = heads x hd_v <= the fixture's max_matmul_in, 4096; 512: a group of 4
                               // heads split over 2 blocks)
    Case c{MaskKind::Causal, hd == 512 ? 4 : 8, hd == 512 ? 1 : 2, hd, hd, DType::F16, {{300, 2}, {700, 1}, {9, 1}}};
    c.fused_combine = true;
    c.padding_row = true;
    c.project = DType::Q8_0;
    run(c, seed++);
  }
  Case c{MaskKind::Causal, 8, 2, 128, 128, DType::BF16, {{17000, 1}, {16383, 1}}};
  c.fused_combine = true;
  c.tol = 1e-4;
  run(c, seed++);
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
  k.expect_kernel = "flash_prefill";
  run(k, seed++);
  // Head dim 512 (gemma4's global layers, DiffusionGemma's canvas rows): the 32 x 32 tiles (off by default:
  // TANDEM_FLASH_HD512, attention_prefill.cu).
  ForcedSwitch hd512(cuda::set_flash_hd512, true);
  for (MaskKind mask : {MaskKind::Causal, MaskKind::Bidirectional, MaskKind::Explicit}) {
    Case g{mask, 16, 2, 512, 512, DType::F16, seqs};
    g.tol = 2e-3;
    g.padding_row = mask == MaskKind::Bidirectional;
    if (mask == MaskKind::Explicit) {
      g.mask_cols = 90;
      g.all_masked_row = 70;
    }
    g.expect_kernel = "flash_prefill";
    run(g, seed++);
  }
}

TEST_F(GpuAttention, ExplicitMaskDecodeSized) {
  uint32_t seed = 500;
  // T = 1 .. 4 rows (the split-K decode kernel), contexts up to 3 splits of 256, mask columns fewer than the
  // longest sequence.
  const std::vector<std::vector<Seq>> batches = {
      {{700, 1}}, {{300, 1}, {5, 1}}, {{600, 2}, {9, 1}}, {{0, 1}, {700, 1}, {3, 1}, {290, 1}}};
  for (DType cache : {DType::F32, DType::F16, DType::BF16})
    for (const auto& seqs : batches)
      for (auto [nh, nkv] : {std::pair<int, int>{4, 4}, {8, 2}}) {
        Case c{MaskKind::Explicit, nh, nkv, 64, 40, cache, seqs};
        c.mask_cols = 650;
        if (seqs.size() > 1) c.all_masked_row = 0;
        run(c, seed++);
      }
  Case w{MaskKind::Explicit, 8, 2, 128, 128, DType::BF16, {{300, 2}, {700, 1}}};
  w.sliding_window = 100;
  w.kv_begin = true;
  w.padding_row = true;
  w.all_masked_row = 1;
  run(w, seed++);
  // 170 rows on an f32 cache: the decode kernel in 64-row chunks (the mask pointer moves with the chunk).
  Case chunks{MaskKind::Explicit, 4, 2, 64, 64, DType::F32, {{0, 100}, {30, 70}}};
  chunks.mask_cols = 97;
  chunks.all_masked_row = 130;
  run(chunks, seed++);
}

TEST_F(GpuAttention, ExplicitMaskPrefillSized) {
  uint32_t seed = 600;
  const std::vector<Seq> seqs = {{0, 100}, {30, 70}, {5, 1}};  // 171 rows: the tensor-core kernel
  for (DType cache : {DType::BF16, DType::F16})
    for (int hd : {64, 128}) {
      Case c{MaskKind::Explicit, 8, 2, hd, hd, cache, seqs};
      c.tol = cache == DType::BF16 ? 1.5e-2 : 2e-3;
      c.mask_cols = 90;
      c.all_masked_row = 70;
      run(c, seed++);
    }
  Case w{MaskKind::Explicit, 4, 4, 128, 128, DType::BF16, {{300, 64}, {0, 64}}};
  w.sliding_window = 40;
  w.padding_row = true;
  w.all_masked_row = 3;
  w.tol = 1.5e-2;
  run(w, seed++);
}

TEST_F(GpuAttention, EvictedBlocksBeforeTheWindow) {
  uint32_t seed = 700;
  // Decode kernel: few rows far into their sequences.
  for (MaskKind mask : {MaskKind::Causal, MaskKind::Explicit})
    for (DType cache : {DType::F32, DType::BF16}) {
      Case d{mask, 8, 2, 64, 40, cache, {{300, 2}, {700, 1}, {40, 1}}};
      d.sliding_window = 100;
      d.evict = true;
      run(d, seed++);
    }
  // Prefill kernel: 144 rows whose windows start well after position 0.
  for (MaskKind mask : {MaskKind::Causal, MaskKind::Explicit})
    for (DType cache : {DType::BF16, DType::F16}) {
      Case p{mask, 8, 2, 128, 128, cache, {{200, 80}, {150, 64}}};
      p.sliding_window = 40;
      p.evict = true;
      p.tol = cache == DType::BF16 ? 1.5e-2 : 2e-3;
      run(p, seed++);
    }
  Case k{MaskKind::Bidirectional, 4, 2, 64, 64, DType::F16, {{100, 70}}};
  k.kv_begin = true;  // kv_begin = p / 3: the lowest row begins at 33
  k.evict = true;
  k.tol = 2e-3;
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
