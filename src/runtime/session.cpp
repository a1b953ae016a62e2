// tandem::Session: creation (KV groups, per-rank device state), running a planned step over the ranks of a
// (possibly split) model, and the outputs: device logits, host copies on request, device sampling, taps.
// The host planning of a step (validation, slots, attention bounds) is step_plan.cpp.
#include "tandem/session.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <string>

#include "core/error.h"
#include "core/out_of_memory.h"
#include "parallel/comm.h"
#include "runtime/session_impl.h"

namespace tandem {

DType kv_dtype(KvType t) {
  switch (t) {
    case KvType::F32:
      return DType::F32;
    case KvType::F16:
      return DType::F16;
    case KvType::BF16:
      return DType::BF16;
  }
  return DType::F16;
}

namespace {

int32_t checked_block_size(const SessionParams& p) {
  check(p.block_size >= 1 && p.block_size <= 1024,
        "KV block size must be in [1, 1024], got " + std::to_string(p.block_size));
  return p.block_size;
}

int32_t ceil_div(int64_t a, int64_t b) {
  return int32_t((a + b - 1) / b);
}

bool same_memory_space(DeviceId a, DeviceId b) {
  return a == b || (a.kind == DeviceKind::CPU && b.kind == DeviceKind::CPU);
}

// Penalties and custom chain orders need the host sampler (they read the logits there).
bool needs_host_sampler(const SamplingParams& p) {
  return p.penalties_active() || p.order != SamplingParams::default_order();
}

}  // namespace

Session::Impl::Impl(std::shared_ptr<Model> mdl, const SessionParams& p)
    : model(std::move(mdl)), params(p), m(model->impl()), mode(m.mesh.mode) {}

// (A function-try-block: an allocation the KV cache's own message does not cover is one of the working
// buffers of a forward pass, which grow with --batch; the allocator's message has the bytes asked for and
// free.)
Session::Session(std::shared_ptr<Model> model, const SessionParams& params) try {
  check(model != nullptr, "a session needs a model");
  impl_ = std::make_unique<Impl>(std::move(model), params);
  Impl& s = *impl_;
  const ModelHparams& hp = s.m.decoder().hparams();
  s.n_embd = hp.n_embd;
  s.n_embd_added = hp.n_embd_added();
  s.n_vocab = hp.n_vocab;
  s.n_token_ids = hp.n_token_ids();
  s.feature_rows = hp.n_embd_features > 0;
  s.n_layer = hp.n_layer;
  SessionParams& p = s.params;
  const int32_t bs = checked_block_size(p);
  check(p.n_ctx >= 1, "the context size (--ctx) must be at least 1, got " + std::to_string(p.n_ctx));
  check(p.n_seq_max >= 1 && p.n_seq_max <= 65536,
        "the number of sequences must be in [1, 65536], got " + std::to_string(p.n_seq_max));
  check(p.n_batch >= 1, "the batch size must be at least 1, got " + std::to_string(p.n_batch));
  check(p.n_logits_max >= 0, "n_logits_max must be >= 0");
  check(p.explicit_mask_cols >= 0, "explicit_mask_cols must be >= 0");
  if (p.n_logits_max == 0) p.n_logits_max = std::max(p.n_seq_max, 32);
  p.n_logits_max = std::min(p.n_logits_max, p.n_batch);

  // KV groups: one per distinct sliding window (0 = global layers first).
  std::map<int32_t, size_t> group_of_window;
  std::vector<int32_t> windows;
  for (const LayerHparams& l : hp.layers) windows.push_back(l.sliding_window);
  if (windows.empty()) windows.assign(size_t(hp.n_layer), 0);
  std::vector<int32_t> sorted = windows;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const int32_t ctx_blocks = ceil_div(p.n_ctx, bs);
  const int32_t reserve = ceil_div(p.n_batch, bs) + 2 * p.n_seq_max;  // non-writing rows and their copies
  s.max_blocks_per_seq = ctx_blocks + ceil_div(p.n_batch, bs) + 2;
  for (int32_t w : sorted) {
    KvGroup g;
    g.window = w;
    g.reserve_blocks = reserve;
    int32_t n_blocks = ctx_blocks + reserve;
    // A sliding group keeps per sequence its window, one batch of rollback room and the chunk being written.
    const int32_t per_seq = ceil_div(int64_t(w) + 2 * int64_t(p.n_batch), bs) + 2;
    if (w > 0 && !p.keep_full_kv && int64_t(per_seq) * p.n_seq_max < ctx_blocks) {
      g.evicts = true;
      n_blocks = per_seq * p.n_seq_max + reserve;
    }
    g.table = std::make_unique<KvCacheTable>(n_blocks, bs, s.n_table_seqs());
    g.h_block_tables.assign(size_t(s.max_blocks_per_seq) * size_t(s.n_table_seqs()), 0);
    g.h_seq_lens.assign(size_t(s.n_table_seqs()), 0);
    g.seq_slots.resize(size_t(s.n_table_seqs()));
    group_of_window[w] = s.groups.size();
    s.groups.push_back(std::move(g));
  }
  for (size_t il = 0; il < windows.size(); ++il) {
    const size_t gi = group_of_window[windows[il]];
    s.layer_group.push_back(int32_t(gi));
    s.groups[gi].layers.push_back(int32_t(il));
  }

  // The split's per-step machinery, owned by this session (session_impl.h).
  std::vector<ModelRank> model_ranks = s.m.ranks;
  if (s.mode == SplitMode::Row && s.m.row_split) {
    s.row_ops = std::make_unique<RowSplitOps>(*s.m.row_split);
    model_ranks.front().ops = s.row_ops.get();
  }
  if (s.mode == SplitMode::Tensor && model_ranks.size() > 1 && s.m.process_rank < 0) {
    std::vector<Device*> devs;
    for (const ModelRank& mr : model_ranks) devs.push_back(mr.device);
    s.comm = create_comm(devs);
    // The step's collectives are all-reduces of the residual stream, {n_embd, rows of a chunk}.
    s.comm->reserve(size_t(s.n_embd) * size_t(p.n_batch) * sizeof(float));
    Comm* comm = s.comm.get();
    s.rank_threads = std::make_unique<RankThreads>(int(devs.size()), [comm] { comm->abort(); });
  }

  for (const ModelRank& mr : model_ranks) {
    auto r = std::make_unique<RankState>(mr);
    r->batch_invariant = p.batch_invariant;
    Device& dev = r->device;
    const RankShard& shard = r->decoder.shard();
    const std::vector<KvLayerShape> shapes = r->decoder.kv_layer_shapes();
    // This rank's layers, grouped: one storage per group, views back in layer order.
    r->groups.resize(s.groups.size());
    std::vector<std::vector<KvLayerShape>> by_group(s.groups.size());
    std::vector<std::pair<size_t, size_t>> where;  // per local layer: (group, index in the group's storage)
    for (size_t k = 0; k < shapes.size(); ++k) {
      const size_t gi = size_t(s.layer_group[size_t(shard.layers.begin) + k]);
      where.emplace_back(gi, by_group[gi].size());
      by_group[gi].push_back(shapes[k]);
      r->layer_groups.push_back(int32_t(gi));
    }
    // The KV cache is this rank's largest allocation: one that cannot fit names --ctx and the bytes. Checked
    // against the device's total memory first (on a host that overcommits, a huge allocation would "succeed"
    // and fail later, page by page), then any allocation failure gets the same message.
    auto group_bytes = [&](size_t gi) {
      size_t bytes = 0;
      for (const KvLayerShape& l : by_group[gi])
        bytes += (dtype_row_bytes(kv_dtype(p.kv_type), l.head_dim_k * l.n_kv_head) +
                  dtype_row_bytes(kv_dtype(p.kv_type), l.head_dim_v * l.n_kv_head)) *
                 size_t(bs) * size_t(s.groups[gi].table->n_blocks());
      return bytes;
    };
    size_t kv_bytes = 0;
    for (size_t gi = 0; gi < s.groups.size(); ++gi) kv_bytes += group_bytes(gi);
    // A batch larger than the context also takes KV room (its rows are written before older ones go): then
    // --batch is named too (`--batch 2147483647` was reported as a --ctx problem).
    const bool big_batch = p.n_batch > p.n_ctx;
    const auto kv_error = [&](const std::string& why) {
      return Error("the KV cache for a context of " + std::to_string(p.n_ctx) + " positions (--ctx) needs " +
                   std::to_string(kv_bytes) + " bytes (" + std::to_string(kv_bytes >> 20) + " MiB) on " +
                   dev.name() +
                   (big_batch ? " with batches of " + std::to_string(p.n_batch) + " rows (--batch)" : "") +
                   ": " + why + "; use a smaller --ctx" + (big_batch ? " or --batch" : ""));
    };
    if (kv_bytes > dev.total_memory())
      throw kv_error("the device has " + std::to_string(dev.total_memory() >> 20) + " MiB in all");
    for (size_t gi = 0; gi < s.groups.size(); ++gi) {
      RankKvGroup& rg = r->groups[gi];
      if (!by_group[gi].empty()) {
        try {
          rg.storage = std::make_unique<KvStorage>(dev, by_group[gi], kv_dtype(p.kv_type),
                                                   kv_dtype(p.kv_type), s.groups[gi].table->n_blocks(), bs);
        } catch (const Error& e) {
          throw kv_error(e.what());
        }
      }
      rg.d_slots.allocate(dev, DType::I32, p.n_batch);
      rg.d_block_tables.allocate(dev, DType::I32, int64_t(s.max_blocks_per_seq) * s.n_table_seqs());
      rg.d_seq_lens.allocate(dev, DType::I32, s.n_table_seqs());
      rg.d_kv_begin.allocate(dev, DType::I32, p.n_batch);
    }
    for (const auto& [gi, idx] : where) r->kv_views.push_back(r->groups[gi].storage->layer(idx));

    WorkspacePlan plan;
    r->scratch = r->decoder.plan_scratch(dev, p.n_batch, p.n_logits_max, plan);
    plan.max_rows = std::max<int64_t>(plan.max_rows, p.n_batch);
    plan.max_seq_len = std::max<int64_t>(plan.max_seq_len, int64_t(s.max_blocks_per_seq) * bs);
    r->ops.reserve(plan);

    r->d_tokens.allocate(dev, DType::I32, p.n_batch);
    r->d_positions.allocate(dev, DType::I32, p.n_batch);
    r->d_seq_slot.allocate(dev, DType::I32, p.n_batch);
    r->d_out_rows.allocate(dev, DType::I32, p.n_logits_max);
    r->d_block_end.allocate(dev, DType::I32, p.n_batch);
    r->d_added_rows.allocate(dev, DType::I32, p.n_batch);
    if (shard.first)
      r->d_embeddings_buf = dev.allocate(size_t(s.n_embd_added) * size_t(p.n_batch) * sizeof(float));
    if (p.explicit_mask_cols > 0)
      r->d_mask_buf = dev.allocate(size_t(p.explicit_mask_cols) * size_t(p.n_batch) * sizeof(float));
    if (s.m.process_rank >= 0) {
      // Every process sends a slot of the same size in the all-gather of the logits (tensor split), or
      // receives the whole logits (layer split; the last rank's slot is the full vocabulary).
      const size_t slot_bytes = size_t(s.max_vocab_rows()) * size_t(p.n_logits_max) * sizeof(float);
      r->d_logits_buf = dev.allocate(std::max(slot_bytes, size_t(s.n_vocab) * size_t(p.n_logits_max) * 4));
      if (s.mode == SplitMode::Tensor) r->d_gather_buf = dev.allocate(slot_bytes * s.m.shards.size());
      s.m.comm->reserve(std::max(slot_bytes, size_t(s.n_embd) * size_t(p.n_batch) * sizeof(float)));
    } else if (shard.last) {
      r->d_logits_buf = dev.allocate(size_t(std::max<int64_t>(shard.vocab.size(), 1)) *
                                     size_t(p.n_logits_max) * sizeof(float));
    }
    r->done = dev.create_event();
    s.ranks.push_back(std::move(r));
  }
  RankState& out = s.output_rank();
  if ((s.mode == SplitMode::Tensor && s.ranks.size() > 1) || s.m.process_rank >= 0)
    s.d_full_logits = out.device.allocate(size_t(s.n_vocab) * size_t(p.n_logits_max) * sizeof(float));
  s.d_uniforms.allocate(out.device, DType::F32, p.n_logits_max);
  s.d_sampled.allocate(out.device, DType::I32, p.n_logits_max);
  s.tap_written = out.device.create_event();

  s.seq_count.assign(size_t(p.n_seq_max), 0);
  s.seq_base.assign(size_t(p.n_seq_max), 0);
  s.seq_next.assign(size_t(p.n_seq_max), 0);
  s.seq_writes.assign(size_t(p.n_seq_max), 1);
} catch (const OutOfMemory& e) {
  throw OutOfMemory("the working buffers for batches of " + std::to_string(params.n_batch) +
                    " rows (--batch) do not fit: " + e.what() + "; use a smaller --batch");
}

Session::~Session() = default;

const Model& Session::model() const {
  return *impl_->model;
}
const SessionParams& Session::params() const {
  return impl_->params;
}
int32_t Session::n_vocab() const {
  return int32_t(impl_->n_vocab);
}

void Session::decode(const Batch& batch) {
  impl_->decode(batch);
}

void Session::Impl::decode(const Batch& batch) {
  validate(batch);  // throws before anything changes
  const size_t n = batch.size();
  row_to_out.assign(n, -1);
  n_out = 0;
  for (size_t r = 0; r < n; ++r)
    if (batch.logits[r]) row_to_out[r] = int32_t(n_out++);
  logits_on_device = n_out <= params.n_logits_max;
  host_logits.resize(size_t(n_out) * size_t(n_vocab));
  host_valid.assign(size_t(n_out), 0);
  gathered = false;

  try {
    // Forward passes of at most n_batch rows and n_logits_max logit rows each.
    size_t r0 = 0, out0 = 0;
    while (r0 < n) {
      size_t r1 = r0, outs = 0;
      while (r1 < n && r1 - r0 < size_t(params.n_batch) &&
             (outs < size_t(params.n_logits_max) || !batch.logits[r1])) {
        outs += batch.logits[r1] ? 1 : 0;
        ++r1;
      }
      plan_chunk(batch, r0, r1);
      for (size_t gi = 0; gi < groups.size(); ++gi) {
        for (auto& r : ranks)
          if (r->groups[gi].storage)
            r->groups[gi].storage->apply_copies(r->stream, groups[gi].table->pending_copies());
        groups[gi].table->clear_pending_copies();
      }
      run_chunk(batch, r0, r1, out0);
      finish_chunk();
      out0 += outs;
      r0 = r1;
    }
    if (m.process_rank >= 0 && mode == SplitMode::Tensor && logits_on_device)
      gather_process_logits(*ranks.front(), 0, n_out);
  } catch (...) {
    rollback();  // leave the cache as it was
    row_to_out.clear();
    n_out = 0;
    throw;
  }
}

ForwardInputs Session::Impl::prepare(RankState& r, const Batch& batch, size_t r0, size_t r1, size_t out0,
                                     bool record, Tensor& tokens, Tensor& added, Tensor& added_rows,
                                     std::vector<KvGroupInputs>& kvg, std::vector<LayerTap>& taps,
                                     bool with_taps) {
  const int64_t T = int64_t(r1 - r0);
  const DeviceId dev = r.device.id();
  Device& device = r.device;
  Stream& stream = r.stream;
  const RankShard& shard = r.decoder.shard();
  const int64_t chunk_out = int64_t(h_out_rows.size());

  ForwardInputs in;
  in.n_rows = T;
  in.prefix_len = batch.mask.kind == AttentionMask::PrefixRegion ? batch.mask.prefix_len : -1;
  in.host_positions = std::span<const int32_t>(batch.positions).subspan(r0, size_t(T));
  in.positions = r.d_positions.view(T, dev);
  device.copy_from_host(stream, in.positions.data, batch.positions.data() + r0, size_t(T) * 4);
  if (shard.first) {  // only the rank that embeds needs the inputs (layer split)
    tokens = r.d_tokens.view(T, dev);
    device.copy_from_host(stream, tokens.data, h_tokens.data() + r0, size_t(T) * 4);
    in.tokens = &tokens;
    bool any_added = false;
    for (size_t i = r0; i < r1; ++i) any_added |= h_added_rows[i] >= 0;
    if (any_added) {
      const EmbeddingSource& src = batch.embedding_source;
      const size_t row_bytes = size_t(n_embd_added) * sizeof(float);
      std::vector<int32_t> rows(h_added_rows.begin() + ptrdiff_t(r0),
                                h_added_rows.begin() + ptrdiff_t(r1));  // (rare path)
      if (src.data != nullptr && same_memory_space(src.device, dev)) {
        // The source rows are read where they are: no copy.
        added = Tensor::contiguous(DType::F32, {n_embd_added, src.n_rows}, const_cast<void*>(src.data), dev);
        added.nb[1] = src.row_stride ? src.row_stride : row_bytes;
        added.nb[2] = added.nb[3] = added.nb[1] * size_t(src.n_rows);
      } else {
        // Host rows, or a device source this rank cannot read in place: the rows this chunk uses, compacted.
        for (int64_t t = 0; t < T; ++t) {
          const int32_t e = rows[size_t(t)];
          if (e < 0) continue;
          char* dst = static_cast<char*>(r.d_embeddings_buf.data()) + size_t(t) * row_bytes;
          if (src.data == nullptr) {
            device.copy_from_host(stream, dst, batch.embeddings.data() + size_t(e) * size_t(n_embd_added),
                                  row_bytes);
          } else {
            const size_t stride = src.row_stride ? src.row_stride : row_bytes;
            const char* from = static_cast<const char*>(src.data) + size_t(e) * stride;
            if (src.device.kind == DeviceKind::CPU) {
              device.copy_from_host(stream, dst, from, row_bytes);
            } else {
              check(false, "the batch's embedding_source on " + src.device.to_string() +
                               " cannot be read by the session on " + dev.to_string() +
                               "; give the rows on the model's first device or in host memory");
            }
          }
          rows[size_t(t)] = int32_t(t);
        }
        added = Tensor::contiguous(DType::F32, {n_embd_added, T}, r.d_embeddings_buf.data(), dev);
      }
      added_rows = r.d_added_rows.view(T, dev);
      device.copy_from_host(stream, added_rows.data, rows.data(), size_t(T) * 4);
      in.added = &added;
      in.added_rows = &added_rows;
    }
  }

  const Tensor seq_slot = r.d_seq_slot.view(T, dev);
  device.copy_from_host(stream, seq_slot.data, h_seq_slot.data(), size_t(T) * 4);
  Tensor block_end{};
  if (!h_block_end.empty()) {
    block_end = r.d_block_end.view(T, dev);
    device.copy_from_host(stream, block_end.data, h_block_end.data(), size_t(T) * 4);
  }
  Tensor mask{};
  const BatchMask& mk = batch.mask;
  if (mk.kind == AttentionMask::Explicit) {
    mask = Tensor::contiguous(DType::F32, {mk.mask_cols, T}, r.d_mask_buf.data(), dev);
    device.copy_from_host(stream, mask.data, mk.explicit_mask.data() + r0 * size_t(mk.mask_cols),
                          size_t(T) * size_t(mk.mask_cols) * sizeof(float));
  }
  int32_t max_len = 1;
  kvg.assign(groups.size(), KvGroupInputs{});
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    KvGroup& g = groups[gi];
    RankKvGroup& rg = r.groups[gi];
    KvGroupInputs& k = kvg[gi];
    k.slot_mapping = rg.d_slots.view(T, dev);
    device.copy_from_host(stream, k.slot_mapping.data, g.h_slots.data(), size_t(T) * 4);
    AttentionBatch& ab = k.attention;
    ab.positions = in.positions;
    ab.seq_slot = seq_slot;
    ab.block_tables = Tensor::contiguous(DType::I32, {max_blocks_per_seq, n_table_seqs()},
                                         rg.d_block_tables.buffer.data(), dev);
    device.copy_from_host(stream, ab.block_tables.data, g.h_block_tables.data(), g.h_block_tables.size() * 4);
    ab.seq_lens = rg.d_seq_lens.view(n_table_seqs(), dev);
    device.copy_from_host(stream, ab.seq_lens.data, g.h_seq_lens.data(), g.h_seq_lens.size() * 4);
    ab.sliding_window = g.window;
    switch (mk.kind) {
      case AttentionMask::Causal:
        ab.mask = MaskKind::Causal;
        break;
      case AttentionMask::BlockBidirectional:
        ab.mask = MaskKind::Block;
        ab.block_end = block_end;
        break;
      case AttentionMask::PrefixRegion:
        ab.mask = MaskKind::Block;
        ab.block_end = block_end;
        if (g.window > 0) {  // the window is in kv_begin (canvas rows' window is not relative to them)
          ab.sliding_window = 0;
          ab.kv_begin = rg.d_kv_begin.view(T, dev);
          device.copy_from_host(stream, ab.kv_begin.data, g.h_kv_begin.data(), size_t(T) * 4);
        }
        break;
      case AttentionMask::Explicit:
        ab.mask = MaskKind::Explicit;
        ab.explicit_mask = mask;
        break;
    }
    for (size_t t = 0; t < size_t(T); ++t) max_len = std::max(max_len, g.h_seq_lens[size_t(h_seq_slot[t])]);
  }
  for (KvGroupInputs& k : kvg)
    k.attention.max_seq_len = record ? max_blocks_per_seq * params.block_size : max_len;
  in.kv_groups = kvg;
  in.layer_groups = r.layer_groups;

  in.n_out = shard.last ? chunk_out : 0;
  in.out_rows_all = chunk_out == T;
  in.out_rows = r.d_out_rows.view(std::max<int64_t>(chunk_out, 1), dev);
  in.out_rows.ne[0] = chunk_out;
  if (in.n_out > 0 && !in.out_rows_all)
    device.copy_from_host(stream, in.out_rows.data, h_out_rows.data(), size_t(chunk_out) * 4);
  if (shard.last) {
    const int64_t nv = m.process_rank >= 0 && mode == SplitMode::Layer ? n_vocab : shard.vocab.size();
    const size_t col0 = logits_on_device ? out0 : 0;  // host mode: every chunk at column 0, copied at once
    char* base = static_cast<char*>(r.d_logits_buf.data()) + col0 * size_t(nv) * sizeof(float);
    in.logits = Tensor::contiguous(DType::F32, {nv, std::max<int64_t>(chunk_out, 1)}, base, dev);
    in.logits.ne[1] = chunk_out;
  }

  taps.clear();
  if (with_taps) {
    const bool direct = same_memory_space(tap_dst.device, dev);
    const size_t stage_row = tap_layers.size() * size_t(n_embd) * sizeof(float);
    for (size_t k = 0; k < tap_layers.size(); ++k) {
      const int32_t l = tap_layers[k];
      const bool mine = shard.layers.contains(l) || (l == n_layer && shard.last);
      if (!mine) continue;
      LayerTap t;
      t.layer = l;
      if (direct) {
        char* base = static_cast<char*>(tap_dst.data) + r0 * tap_dst.row_stride + k * tap_dst.tap_stride;
        t.dst = Tensor::contiguous(DType::F32, {n_embd, T}, base, dev);
        t.dst.nb[1] = tap_dst.row_stride;
      } else {
        char* base = static_cast<char*>(r.d_tap_stage.data()) + k * size_t(n_embd) * sizeof(float);
        t.dst = Tensor::contiguous(DType::F32, {n_embd, T}, base, dev);
        t.dst.nb[1] = stage_row;
      }
      t.dst.nb[2] = t.dst.nb[3] = t.dst.nb[1] * size_t(T);
      taps.push_back(t);
    }
    if (!taps.empty() && tap_dst.read) tap_dst.read->wait(stream);  // the consumer has read the last ones
  }
  in.taps = taps;
  return in;
}

namespace {

// Copies the staged taps of one rank's chunk to their destination (host memory or another device).
void flush_staged_taps(RankState& r, std::span<const LayerTap> taps, const std::vector<int32_t>& layers,
                       const TapDestination& dst, int64_t n_embd, size_t r0, int64_t T) {
  if (taps.empty() || same_memory_space(dst.device, r.device.id())) return;
  const size_t row_bytes = size_t(n_embd) * sizeof(float);
  for (const LayerTap& t : taps) {
    const size_t k = size_t(std::find(layers.begin(), layers.end(), t.layer) - layers.begin());
    char* to = static_cast<char*>(dst.data) + r0 * dst.row_stride + k * dst.tap_stride;
    if (dst.device.kind == DeviceKind::CPU) {
      r.device.copy_2d(r.stream, to, dst.row_stride, t.dst.data, t.dst.nb[1], row_bytes, size_t(T),
                       CopyKind::DeviceToHost);
    } else {  // another GPU of the split (peer access is on between a model's devices): gathered there
      r.device.copy_2d(r.stream, to, dst.row_stride, t.dst.data, t.dst.nb[1], row_bytes, size_t(T),
                       CopyKind::DeviceToDevice);
    }
  }
}

}  // namespace

void Session::Impl::copy_logit_rows(RankState& r, const void* src, Range v, size_t out0,
                                    int64_t n_rows) const {
  if (n_rows == 0) return;
  float* dst = host_logits.data() + out0 * size_t(n_vocab) + size_t(v.begin);
  if (v.size() == n_vocab) {
    r.device.copy_to_host(r.stream, dst, src, size_t(n_rows) * size_t(n_vocab) * sizeof(float));
  } else {  // a tensor-split rank's vocabulary rows: one strided copy into the full rows
    r.device.copy_2d(r.stream, dst, size_t(n_vocab) * sizeof(float), src, size_t(v.size()) * sizeof(float),
                     size_t(v.size()) * sizeof(float), size_t(n_rows), CopyKind::DeviceToHost);
  }
}

void Session::Impl::gather_process_logits(RankState& r, size_t out0, int64_t n_rows) {
  if (n_rows == 0) return;  // every process decodes the same batch, so all skip or all gather
  const size_t slot = size_t(max_vocab_rows()) * size_t(n_rows);  // floats per rank
  const DeviceId dev = r.device.id();
  const Tensor send = Tensor::contiguous(DType::F32, {int64_t(slot)}, r.d_logits_buf.data(), dev);
  const Tensor recv =
      Tensor::contiguous(DType::F32, {int64_t(slot * m.shards.size())}, r.d_gather_buf.data(), dev);
  m.comm->all_gather(m.process_rank, r.stream, send, recv);
  // Full rows on this device: every rank's slice into d_full_logits (columns out0 ..).
  for (size_t q = 0; q < m.shards.size(); ++q) {
    const Range v = m.shards[q].vocab;
    float* dst = static_cast<float*>(d_full_logits.data()) + out0 * size_t(n_vocab) + size_t(v.begin);
    r.device.copy_2d(r.stream, dst, size_t(n_vocab) * 4, static_cast<const float*>(recv.data) + q * slot,
                     size_t(v.size()) * 4, size_t(v.size()) * 4, size_t(n_rows), CopyKind::DeviceToDevice);
  }
}

void Session::Impl::run_layers_over_processes(const Batch& batch, size_t r0, size_t r1, size_t out0) {
  RankState& r = *ranks.front();
  const int me = m.process_rank, R = int(m.shards.size());
  const int64_t T = int64_t(r1 - r0), chunk_out = int64_t(h_out_rows.size());
  Tensor tokens, added, added_rows;
  std::vector<KvGroupInputs> kvg;
  std::vector<LayerTap> taps;
  ForwardInputs in = prepare(r, batch, r0, r1, out0, false, tokens, added, added_rows, kvg, taps, true);
  const Tensor hidden = r.decoder.hidden_state(*r.scratch, T);
  // Every process takes part in every collective, in the same order: a broadcast of the hidden state from
  // rank 0, then from rank 1, ..., then of the logits from the last rank. Rank k + 1 runs its layers on what
  // rank k sent; the other receivers' copies are overwritten before they are read.
  for (int k = 0; k < R - 1; ++k) {
    if (k == me) r.forward(r.stream, in);
    m.comm->broadcast(me, r.stream, hidden, k);
  }
  if (me == R - 1) r.forward(r.stream, in);
  flush_staged_taps(r, taps, tap_layers, tap_dst, n_embd, r0, T);
  if (chunk_out > 0) {
    const size_t col0 = logits_on_device ? out0 : 0;
    const Tensor all = Tensor::contiguous(DType::F32, {n_vocab * chunk_out},
                                          static_cast<float*>(r.d_logits_buf.data()) + col0 * size_t(n_vocab),
                                          r.device.id());
    m.comm->broadcast(me, r.stream, all, R - 1);
    if (!logits_on_device) {
      copy_logit_rows(r, all.data, Range{0, n_vocab}, out0, chunk_out);
      r.stream.synchronize();
      std::fill_n(host_valid.begin() + ptrdiff_t(out0), chunk_out, 1);
    }
  }
}

// A tensor split in this process: one host thread per rank runs the forward on its shard, the all-reduces
// inside (this session's comm) keep the ranks in step; rank 0 writes the taps (the residual stream is the
// same on every rank). Recorded steps are one CUDA graph over every rank's stream
// (Device::run_recorded_across): a replay is one launch, with no host thread or host meeting per step.
void Session::Impl::run_tensor_chunk(const Batch& batch, size_t r0, size_t r1, size_t out0, bool record,
                                     uint64_t graph_key) {
  const int64_t T = int64_t(r1 - r0);
  const int64_t chunk_out = int64_t(h_out_rows.size());
  struct RankStep {
    Tensor tokens, added, added_rows;
    std::vector<KvGroupInputs> kvg;
    std::vector<LayerTap> taps;
    ForwardInputs in;
  };
  std::vector<RankStep> steps(ranks.size());
  auto host_copy = [&](RankState& r) {  // more marked rows than fit on the device: to the host per chunk
    if (logits_on_device || chunk_out == 0) return;
    copy_logit_rows(r, r.d_logits_buf.data(), r.decoder.shard().vocab, out0, chunk_out);
  };
  auto prepare_rank = [&](int rank) {
    RankState& r = *ranks[size_t(rank)];
    RankStep& st = steps[size_t(rank)];
    st.in = prepare(r, batch, r0, r1, out0, record, st.tokens, st.added, st.added_rows, st.kvg, st.taps,
                    rank == 0);
    st.in.comm = comm.get();
  };

  if (!record) {
    rank_threads->run([&](int rank) {
      RankState& r = *ranks[size_t(rank)];
      prepare_rank(rank);
      r.forward(r.stream, steps[size_t(rank)].in);
      flush_staged_taps(r, steps[size_t(rank)].taps, tap_layers, tap_dst, n_embd, r0, T);
      host_copy(r);
      r.stream.synchronize();
    });
  } else {
    rank_threads->run(prepare_rank);  // the uploads, on each rank's stream (outside any recording)
    std::vector<Device*> devices;
    std::vector<Stream*> streams;
    for (size_t k = 1; k < ranks.size(); ++k) {
      devices.push_back(&ranks[k]->device);
      streams.push_back(&ranks[k]->stream);
    }
    RankState& first = *ranks.front();
    first.device.run_recorded_across(first.stream, graph_key, devices, streams, [&] {
      comm->new_epoch();  // the collectives recorded here wait on nothing recorded outside
      rank_threads->run([&](int rank) {
        RankState& r = *ranks[size_t(rank)];
        r.forward(r.stream, steps[size_t(rank)].in);
      });
    });
    comm->new_epoch();  // and later ones on nothing recorded inside (the call ended with a device barrier)
    for (auto& r : ranks) host_copy(*r);
    if (!logits_on_device)
      for (auto& r : ranks) r->stream.synchronize();
  }
  if (!logits_on_device) std::fill_n(host_valid.begin() + ptrdiff_t(out0), chunk_out, 1);
  if (!tap_layers.empty()) tap_written->record(ranks.front()->stream);
}

void Session::Impl::run_chunk(const Batch& batch, size_t r0, size_t r1, size_t out0) {
  const int64_t T = int64_t(r1 - r0);
  const int64_t chunk_out = int64_t(h_out_rows.size());

  // Ranks in other processes: this process's comm is the model's, shared by its sessions.
  std::unique_lock<std::mutex> process_lock(m.process_step_mutex, std::defer_lock);
  if (m.process_rank >= 0) process_lock.lock();
  if (m.process_rank >= 0 && mode == SplitMode::Layer) {
    run_layers_over_processes(batch, r0, r1, out0);
    return;
  }
  auto host_copy = [&](RankState& r) {  // more marked rows than fit on the device: to the host per chunk
    if (logits_on_device || chunk_out == 0) return;
    copy_logit_rows(r, r.d_logits_buf.data(), r.decoder.shard().vocab, out0, chunk_out);
  };

  // Decode-sized chunks run as recorded CUDA graphs (Device::run_recorded; a row split records its peers'
  // streams too, run_recorded_across), one per (session, step shape, rows, logit rows, tap setting) and rank:
  // every pointer is fixed, and max_seq_len is the session's capacity so that the recorded attention launch
  // covers any length. Step shapes (graph_key.h): causal token rows, and the DFlash drafter's
  // block-bidirectional draft blocks and in-place feature rows, so a speculative cycle's drafter passes replay
  // too (TANDEM_RECORD_SHAPES=0 runs them directly); rows that write no K/V are fine (their
  // scratch slots are uploaded data). CPU devices run the forward directly; so do the other masks, host-side
  // added rows (graph_key.h says why), staged taps, and MPI collectives.
  bool source_readable = batch.embedding_source.data != nullptr;
  for (const auto& r : ranks)
    source_readable &= same_memory_space(batch.embedding_source.device, r->device.id());
  std::optional<StepShape> shape =
      batch.embeddings.empty() ? recordable_step_shape(batch, h_added_rows, r0, r1, source_readable) : std::nullopt;
  // Steps recorded before graph_key.h (causal token rows, no embedding source, every row writing K/V) always;
  // the others unless TANDEM_RECORD_SHAPES=0 (graph_key.h).
  const bool newly_recordable = batch.mask.kind != AttentionMask::Causal ||
                                batch.embedding_source.data != nullptr || !batch.kv_write.empty();
  if (newly_recordable && !record_other_step_shapes()) shape.reset();
  bool staged_taps = false;
  for (const auto& r : ranks)
    staged_taps |= !tap_layers.empty() && !same_memory_space(tap_dst.device, r->device.id());
  // Over processes only NCCL collectives can be recorded (MPI ones run on the host).
  const bool comm_records = m.process_rank < 0 || (m.comm && std::string(m.comm->kind()) == "nccl");
  static std::atomic<uint64_t> next_session_id{1};  // keys never repeat, also after a session is destroyed
  std::optional<uint32_t> shape_id;
  if (ranks.front()->device.id().kind != DeviceKind::CPU && T <= 64 && shape && !staged_taps && comm_records)
    shape_id = step_shapes.id_of(*shape);
  const bool record = shape_id.has_value();
  if (record && graph_session_id == 0) graph_session_id = next_session_id++;
  const uint64_t graph_key =
      record ? step_graph_key(graph_session_id, tap_generation, *shape_id, T, chunk_out) : 0;
  auto forward = [&](RankState& r, const ForwardInputs& in) {
    if (record) {
      r.device.run_recorded(r.stream, graph_key, [&](Stream& st) { r.forward(st, in); });
    } else {
      r.forward(r.stream, in);
    }
  };

  if (mode == SplitMode::Tensor && ranks.size() > 1) {
    run_tensor_chunk(batch, r0, r1, out0, record, graph_key);
    return;
  }

  if (ranks.size() > 1) {  // layer split: rank after rank, the hidden state handed over at each boundary
    for (size_t k = 0; k < ranks.size(); ++k) {
      RankState& r = *ranks[k];
      Tensor tokens, added, added_rows;
      std::vector<KvGroupInputs> kvg;
      std::vector<LayerTap> taps;
      ForwardInputs in = prepare(r, batch, r0, r1, out0, record, tokens, added, added_rows, kvg, taps, true);
      if (k > 0) {
        RankState& prev = *ranks[k - 1];
        const Tensor src = prev.decoder.hidden_state(*prev.scratch, T);
        const Tensor dst = r.decoder.hidden_state(*r.scratch, T);
        copy_between_devices(prev.stream, r.device, dst.data, prev.device, src.data, src.nbytes());
        prev.done->record(prev.stream);
        prev.done->wait(r.stream);
      }
      forward(r, in);
      flush_staged_taps(r, taps, tap_layers, tap_dst, n_embd, r0, T);
    }
    RankState& last = *ranks.back();
    // The last rank's stream is behind every earlier rank's (the hand-overs), so this covers every tap.
    if (!tap_layers.empty()) tap_written->record(last.stream);
    host_copy(last);
    if (!logits_on_device) {
      for (auto& r : ranks) r->stream.synchronize();
      std::fill_n(host_valid.begin() + ptrdiff_t(out0), chunk_out, 1);
    }
    return;
  }

  // One rank (unsplit, split by rows, or this process's rank of a tensor split over processes).
  RankState& r = *ranks.front();
  Tensor tokens, added, added_rows;
  std::vector<KvGroupInputs> kvg;
  std::vector<LayerTap> taps;
  ForwardInputs in = prepare(r, batch, r0, r1, out0, record, tokens, added, added_rows, kvg, taps, true);
  if (mode == SplitMode::Row && record) {
    // The peers' matmuls run on this session's peer streams, ordered by events inside the body: one
    // recording on the main stream covers them; it points into every peer device's workspace.
    std::vector<Device*> peers;
    for (Device* d : m.row_split->devices())
      if (d != &r.device) peers.push_back(d);
    r.device.run_recorded_across(r.stream, graph_key, peers, {}, [&] { r.forward(r.stream, in); });
  } else {
    forward(r, in);
  }
  flush_staged_taps(r, taps, tap_layers, tap_dst, n_embd, r0, T);
  if (!taps.empty()) tap_written->record(r.stream);
  if (!logits_on_device) {
    if (m.process_rank >= 0) {  // tensor split over processes: every process's slice, then full host rows
      gather_process_logits(r, 0, chunk_out);
      r.device.copy_to_host(r.stream, host_logits.data() + out0 * size_t(n_vocab), d_full_logits.data(),
                            size_t(chunk_out) * size_t(n_vocab) * sizeof(float));
    } else {
      host_copy(r);
    }
    r.stream.synchronize();
    std::fill_n(host_valid.begin() + ptrdiff_t(out0), chunk_out, 1);
  }
}

void Session::Impl::fetch_row(int32_t o) const {
  if (host_valid[size_t(o)]) return;
  float* dst = host_logits.data() + size_t(o) * size_t(n_vocab);
  if (m.process_rank >= 0 && mode == SplitMode::Tensor) {
    RankState& r = *ranks.front();
    r.device.copy_to_host(r.stream, dst,
                          static_cast<const float*>(d_full_logits.data()) + size_t(o) * size_t(n_vocab),
                          size_t(n_vocab) * sizeof(float));
    r.stream.synchronize();
  } else if (mode == SplitMode::Tensor && ranks.size() > 1) {
    for (const auto& r : ranks) {
      const Range v = r->decoder.shard().vocab;
      r->device.copy_to_host(r->stream, dst + v.begin,
                             static_cast<const float*>(r->d_logits_buf.data()) + size_t(o) * size_t(v.size()),
                             size_t(v.size()) * sizeof(float));
    }
    for (const auto& r : ranks) r->stream.synchronize();
  } else {
    RankState& r = output_rank();
    r.device.copy_to_host(r.stream, dst,
                          static_cast<const float*>(r.d_logits_buf.data()) + size_t(o) * size_t(n_vocab),
                          size_t(n_vocab) * sizeof(float));
    r.stream.synchronize();
  }
  host_valid[size_t(o)] = 1;
}

void Session::fetch_all_logits() const {
  const Impl& s = *impl_;
  if (s.n_out == 0 || std::all_of(s.host_valid.begin(), s.host_valid.end(), [](uint8_t v) { return v != 0; }))
    return;
  if (s.m.process_rank >= 0 && s.mode == SplitMode::Tensor) {
    RankState& r = *s.ranks.front();
    r.device.copy_to_host(r.stream, s.host_logits.data(), s.d_full_logits.data(),
                          size_t(s.n_out) * size_t(s.n_vocab) * sizeof(float));
    r.stream.synchronize();
  } else if (s.mode == SplitMode::Tensor && s.ranks.size() > 1) {
    for (const auto& r : s.ranks)
      s.copy_logit_rows(*r, r->d_logits_buf.data(), r->decoder.shard().vocab, 0, s.n_out);
    for (const auto& r : s.ranks) r->stream.synchronize();
  } else {
    RankState& r = s.output_rank();
    s.copy_logit_rows(r, r.d_logits_buf.data(), Range{0, s.n_vocab}, 0, s.n_out);
    r.stream.synchronize();
  }
  std::fill(s.host_valid.begin(), s.host_valid.end(), 1);
}

std::span<const float> Session::logits(size_t row) const {
  const Impl& s = *impl_;
  const int32_t o = logits_index(row);
  s.fetch_row(o);
  return {s.host_logits.data() + size_t(o) * size_t(s.n_vocab), size_t(s.n_vocab)};
}

int32_t Session::logits_index(size_t row) const {
  const Impl& s = *impl_;
  check(row < s.row_to_out.size(), "row " + std::to_string(row) +
                                       " is not a row of the last decoded batch (" +
                                       std::to_string(s.row_to_out.size()) + " rows)");
  const int32_t o = s.row_to_out[row];
  check(o >= 0, "row " + std::to_string(row) + " of the last batch was not marked for logits");
  return o;
}

DeviceId Session::output_device() const {
  return impl_->output_rank().device.id();
}

Tensor Session::device_logits() const {
  Impl& s = *impl_;
  check(s.logits_on_device,
        "the last batch marked " + std::to_string(s.n_out) + " rows for logits, more than n_logits_max = " +
            std::to_string(s.params.n_logits_max) + ": its logits were copied to the host");
  RankState& out = s.output_rank();
  const int64_t n = std::max<int64_t>(s.n_out, 1);
  if (s.m.process_rank >= 0 && s.mode == SplitMode::Tensor) {
    Tensor t = Tensor::contiguous(DType::F32, {s.n_vocab, n}, s.d_full_logits.data(), out.device.id());
    t.ne[1] = s.n_out;
    return t;
  }
  if (s.mode == SplitMode::Tensor && s.ranks.size() > 1) {
    if (!s.gathered) {  // every rank's vocabulary slice into full rows on the main device
      for (size_t q = 0; q < s.ranks.size(); ++q) {
        RankState& r = *s.ranks[q];
        const Range v = r.decoder.shard().vocab;
        for (int64_t o = 0; o < s.n_out; ++o) {
          float* dst =
              static_cast<float*>(s.d_full_logits.data()) + size_t(o) * size_t(s.n_vocab) + size_t(v.begin);
          const float* src = static_cast<const float*>(r.d_logits_buf.data()) + size_t(o) * size_t(v.size());
          copy_between_devices(r.device.id().kind == DeviceKind::CPU ? out.stream : r.stream, out.device, dst,
                               r.device, src, size_t(v.size()) * sizeof(float));
        }
        if (q > 0) {
          r.done->record(r.stream);
          r.done->wait(out.stream);
        }
      }
      s.gathered = true;
    }
    Tensor t = Tensor::contiguous(DType::F32, {s.n_vocab, n}, s.d_full_logits.data(), out.device.id());
    t.ne[1] = s.n_out;
    return t;
  }
  Tensor t = Tensor::contiguous(DType::F32, {s.n_vocab, n}, out.d_logits_buf.data(), out.device.id());
  t.ne[1] = s.n_out;
  return t;
}

std::vector<int32_t> Session::sample(std::span<const size_t> rows, std::span<Sampler* const> samplers) {
  Impl& s = *impl_;
  check(rows.size() == samplers.size(), "sample: " + std::to_string(rows.size()) + " rows but " +
                                            std::to_string(samplers.size()) + " samplers");
  std::vector<int32_t> ids(rows.size(), -1);
  std::vector<size_t> on_device;  // sampler indices drawn on the device
  std::vector<float> uniforms;  // their uniforms, drawn in the callers' order (each sampler's own generator)
  for (size_t i = 0; i < rows.size(); ++i) {
    check(samplers[i] != nullptr, "sample: sampler " + std::to_string(i) + " is null");
    Sampler& sm = *samplers[i];
    logits_index(rows[i]);  // checks the row
    if (!s.logits_on_device || needs_host_sampler(sm.params())) {
      ids[i] = sm.sample(logits(rows[i]));
      continue;
    }
    on_device.push_back(i);
    uniforms.push_back(sm.params().greedy() ? 0.0f : float(sm.rng().uniform()));
  }
  if (on_device.empty()) return ids;
  check(on_device.size() <= size_t(s.params.n_logits_max), "sample: more rows than n_logits_max");
  const std::vector<size_t> order = on_device;
  const Tensor L = device_logits();
  RankState& out = s.output_rank();
  const DeviceId dev = out.device.id();
  // Rows in logits-column order; a run of consecutive columns with the same parameters is one sample_rows
  // call (a decode step of many sequences with one setting is one launch).
  std::sort(on_device.begin(), on_device.end(),
            [&](size_t a, size_t b) { return logits_index(rows[a]) < logits_index(rows[b]); });
  std::vector<float> u(on_device.size());
  for (size_t k = 0; k < on_device.size(); ++k)
    u[k] = uniforms[size_t(std::find(order.begin(), order.end(), on_device[k]) - order.begin())];
  out.device.copy_from_host(out.stream, s.d_uniforms.buffer.data(), u.data(), u.size() * 4);
  auto params_of = [&](size_t i) {
    const SamplingParams& p = samplers[i]->params();
    return SamplerParams{p.temperature, p.top_k, p.top_p, p.min_p};
  };
  auto same = [](const SamplerParams& a, const SamplerParams& b) {
    return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p;
  };
  for (size_t k0 = 0; k0 < on_device.size();) {
    const SamplerParams sp = params_of(on_device[k0]);
    const int32_t col0 = logits_index(rows[on_device[k0]]);
    size_t k1 = k0 + 1;
    while (k1 < on_device.size() && logits_index(rows[on_device[k1]]) == col0 + int32_t(k1 - k0) &&
           same(params_of(on_device[k1]), sp))
      ++k1;
    const int64_t n = int64_t(k1 - k0);
    Tensor cols_view = L;
    cols_view.data = static_cast<char*>(L.data) + size_t(col0) * L.nb[1];
    cols_view.ne[1] = n;
    cols_view.nb[2] = cols_view.nb[3] = L.nb[1] * size_t(n);
    Tensor uv = s.d_uniforms.view(n, dev), ov = s.d_sampled.view(n, dev);
    uv.data = static_cast<float*>(uv.data) + k0;
    ov.data = static_cast<int32_t*>(ov.data) + k0;
    out.ops.sample_rows(out.stream, cols_view, sp, uv, ov);
    k0 = k1;
  }
  std::vector<int32_t> got(on_device.size());
  out.device.copy_to_host(out.stream, got.data(), s.d_sampled.buffer.data(), got.size() * 4);
  out.stream.synchronize();
  for (size_t k = 0; k < on_device.size(); ++k) ids[on_device[k]] = got[k];
  return ids;
}

void Session::synchronize() const {
  for (const auto& r : impl_->ranks) r->stream.synchronize();
}

int32_t Session::seq_len(int32_t seq) const {
  return impl_->groups.front().table->seq_len(seq);
}

namespace {

void check_seq_id(const Session::Impl& s, int32_t seq) {
  check(seq >= 0 && seq < s.params.n_seq_max,
        "sequence id " + std::to_string(seq) + " is out of range: this session has " +
            std::to_string(s.params.n_seq_max) + " sequence slots (0.." +
            std::to_string(s.params.n_seq_max - 1) + ")");
}

// A sliding group must still hold the window that ends at position `end` of seq.
void check_window_kept(const Session::Impl& s, int32_t seq, int32_t end, const char* what) {
  for (const KvGroup& g : s.groups) {
    if (!g.evicts) continue;
    const int32_t first = g.table->first_kept(seq);
    check(first <= std::max(0, end - g.window),
          std::string(what) + " sequence " + std::to_string(seq) + " at position " + std::to_string(end) +
              " needs positions from " + std::to_string(std::max(0, end - g.window)) +
              " of its sliding-window layers (window " + std::to_string(g.window) + "), which keep only " +
              std::to_string(first) + " on (at most --batch positions can be rolled back)");
  }
}

}  // namespace

void Session::seq_remove(int32_t seq, int32_t p0, int32_t p1) {
  Impl& s = *impl_;
  check_seq_id(s, seq);
  const KvCacheTable& t0 = *s.groups.front().table;
  t0.check_remove(seq, p0, p1);
  if (p0 < t0.seq_len(seq)) check_window_kept(s, seq, p0, "rolling back");
  for (KvGroup& g : s.groups) g.table->remove(seq, p0, p1);
}
void Session::seq_fork(int32_t src, int32_t dst, int32_t n) {
  Impl& s = *impl_;
  check_seq_id(s, src);
  check_seq_id(s, dst);
  const int32_t len = s.groups.front().table->seq_len(src);
  check(n <= len, "cannot fork " + std::to_string(n) + " positions of sequence " + std::to_string(src) +
                      ", which has " + std::to_string(len));
  check_window_kept(s, src, n < 0 ? len : n, "forking");
  for (KvGroup& g : s.groups) g.table->fork(src, dst, n);
}
void Session::seq_clear(int32_t seq) {
  check_seq_id(*impl_, seq);
  for (KvGroup& g : impl_->groups) g.table->clear(seq);
}
void Session::clear() {
  for (KvGroup& g : impl_->groups) g.table->clear_all();
}
int64_t Session::kv_free_positions() const {
  const KvGroup& g = impl_->groups.front();
  return int64_t(std::max(0, g.table->n_free_blocks() - g.reserve_blocks)) * g.table->block_size();
}
int64_t Session::kv_capacity() const {
  const KvGroup& g = impl_->groups.front();
  return int64_t(g.table->n_blocks() - g.reserve_blocks) * g.table->block_size();
}

void Session::set_taps(std::vector<int32_t> layers, const TapDestination& dst) {
  Impl& s = *impl_;
  if (layers.empty()) {
    s.tap_layers.clear();
    ++s.tap_generation;
    return;
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const int32_t l = layers[i];
    check(l >= 0 && l <= s.n_layer, "tap layer " + std::to_string(l) + " is out of range: the model has " +
                                        std::to_string(s.n_layer) + " layers (taps 0.." +
                                        std::to_string(s.n_layer) + ")");
    check(i == 0 || l > layers[i - 1], "tap layers must be ascending and distinct");
  }
  check(dst.data != nullptr, "tap destination has no memory");
  TapDestination d = dst;
  const size_t row_bytes = size_t(s.n_embd) * sizeof(float);
  if (d.tap_stride == 0) d.tap_stride = row_bytes;
  if (d.row_stride == 0) d.row_stride = d.tap_stride * layers.size();
  check(d.tap_stride >= row_bytes || layers.size() == 1,
        "tap stride is smaller than one row of hidden state");
  check(d.row_stride >= d.tap_stride * (layers.size() - 1) + row_bytes,
        "tap row stride is smaller than the taps of one row");
  // A destination the ranks cannot write directly goes through a staging buffer on each rank's device
  // (allocated here, not during a step).
  for (auto& r : s.ranks) {
    if (same_memory_space(d.device, r->device.id())) continue;
    // Host memory, or another GPU of the same kind (a layer split's taps gathered on the drafter's device).
    check(d.device.kind == DeviceKind::CPU || d.device.kind == r->device.id().kind,
          "tap destination on " + d.device.to_string() + " cannot be written from a layer on " +
              r->device.id().to_string() + "; give memory of that device or host memory");
    const size_t bytes = layers.size() * row_bytes * size_t(s.params.n_batch);
    if (r->d_tap_stage.size() < bytes) r->d_tap_stage = r->device.allocate(bytes);
  }
  s.tap_layers = std::move(layers);
  s.tap_dst = d;
  ++s.tap_generation;
}

Event* Session::taps_written() const {
  return impl_->tap_layers.empty() ? nullptr : impl_->tap_written.get();
}

}  // namespace tandem
