// tandem::Session: batch validation, KV slot assignment, per-step device inputs, chunking into forward
// passes, logits and hidden-state taps.
#include "tandem/session.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "core/error.h"
#include "model/model_impl.h"
#include "parallel/comm.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_storage.h"

namespace tandem {

namespace {

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

// A device buffer of n I32 values (or floats), with a view of its first m.
struct DeviceArray {
  Buffer buffer;
  DType type = DType::I32;
  int64_t capacity = 0;
  void allocate(Device& dev, DType t, int64_t n) {
    type = t;
    capacity = std::max<int64_t>(n, 1);
    buffer = dev.allocate(size_t(capacity) * 4);
  }
  Tensor view(int64_t n, DeviceId dev) const { return Tensor::contiguous(type, {n}, buffer.data(), dev); }
};

}  // namespace

// One rank's part of a session: its KV storage (its layers, or its KV heads), scratch, and the per-step
// inputs on its device. A session on an unsplit model has one.
struct RankState {
  Device& device;
  Ops& ops;
  Stream& stream;
  DecoderModel& decoder;
  std::unique_ptr<KvStorage> storage;
  std::unique_ptr<ForwardScratch> scratch;
  // Per-step inputs on the device: fixed addresses, rewritten every step.
  DeviceArray d_tokens, d_positions, d_slots, d_seq_slot, d_out_rows, d_seq_lens, d_block_tables;
  Buffer d_logits_buf;          // {this rank's vocabulary rows, n_logits_max}
  Buffer d_gather_buf;          // ranks in separate processes: every rank's d_logits_buf, rank after rank
  Buffer d_embeddings_buf;      // allocated on the first embedding batch
  std::unique_ptr<Event> done;  // layer split: the next rank's stream waits for this rank's output

  RankState(const ModelRank& r)
      : device(*r.device), ops(*r.ops), stream(r.device->default_stream()), decoder(*r.decoder) {}

  // This rank's forward of one chunk, enqueued on `st`.
  void forward(Stream& st, const ForwardInputs& in) {
    decoder.forward(st, ops, in, storage->layers(), *scratch);
  }
};

struct Session::Impl {
  std::shared_ptr<Model> model;
  SessionParams params;
  Model::Impl& m;
  SplitMode mode;
  std::vector<std::unique_ptr<RankState>> ranks;
  int64_t n_embd = 0;
  int64_t n_vocab = 0;
  int64_t n_layer = 0;

  KvCacheTable table;
  int32_t max_blocks_per_seq = 0;

  // Host staging of the per-step inputs (shared by every rank).
  std::vector<int32_t> h_slots, h_seq_lens, h_block_tables, h_out_rows, h_seq_slot;
  std::vector<int32_t> seq_count, seq_base, seq_next, seq_cursor;
  std::vector<std::vector<int32_t>> seq_slots;

  // Results of the last batch.
  std::vector<float> logits;
  std::vector<int32_t> row_to_out;

  std::vector<int32_t> tap_layers;
  TapDestination tap_dst;
  std::vector<LayerTap> taps;
  uint64_t graph_session_id = 0;  // identifies this session's recorded graphs on the device

  Impl(std::shared_ptr<Model> mdl, const SessionParams& p)
      : model(std::move(mdl)),
        params(p),
        m(model->impl()),
        mode(m.mesh.mode),
        table(blocks_for(p), checked_block_size(p), checked_seqs(p)) {}

  static int32_t checked_block_size(const SessionParams& p) {
    check(p.block_size >= 1 && p.block_size <= 1024,
          "KV block size must be in [1, 1024], got " + std::to_string(p.block_size));
    return p.block_size;
  }
  static int32_t checked_seqs(const SessionParams& p) {
    check(p.n_seq_max >= 1 && p.n_seq_max <= 65536,
          "the number of sequences must be in [1, 65536], got " + std::to_string(p.n_seq_max));
    return p.n_seq_max;
  }
  static int32_t blocks_for(const SessionParams& p) {
    check(p.n_ctx >= 1, "the context size (--ctx) must be at least 1, got " + std::to_string(p.n_ctx));
    const int32_t bs = checked_block_size(p);
    return int32_t((int64_t(p.n_ctx) + bs - 1) / bs);
  }

  void decode(const Batch& batch);
  void run_chunk(const Batch& batch, size_t r0, size_t r1, size_t out0);
  // Uploads this chunk's inputs to rank r and fills its ForwardInputs.
  ForwardInputs prepare(RankState& r, const Batch& batch, size_t r0, size_t r1, int32_t max_len, bool record,
                        Tensor& tokens, Tensor& embeddings, bool with_taps);
  // Copies n_out rows of logits holding the vocabulary rows v, {v.size(), n_out} contiguous at src on r's
  // device, into the full host rows of logits from row out0: one (strided when v is a slice) copy.
  void copy_logit_rows(RankState& r, const void* src, Range v, size_t out0, int64_t n_out);
  // Copies rank r's logits (its vocabulary rows) of n_out rows into logits at row out0.
  void fetch_logits(RankState& r, size_t out0, int64_t n_out);
  // Ranks in separate processes: gathers the other processes' vocabulary rows into logits at row out0.
  void gather_process_logits(RankState& r, size_t out0, int64_t n_out);
  // A layer split over processes: this process's layers of one chunk, the hidden state and logits handed over
  // by broadcasts.
  void run_layers_over_processes(const Batch& batch, size_t r0, size_t r1, size_t out0, int32_t max_len);
  // The most vocabulary rows any rank holds (the size of each rank's slot in d_gather_buf, per logit row).
  int64_t max_vocab_rows() const {
    int64_t n = 1;
    for (const RankShard& sh : m.shards) n = std::max(n, sh.vocab.size());
    return n;
  }
};

Session::Session(std::shared_ptr<Model> model, const SessionParams& params) {
  check(model != nullptr, "a session needs a model");
  impl_ = std::make_unique<Impl>(std::move(model), params);
  Impl& s = *impl_;
  const ModelHparams& hp = s.m.decoder().hparams();
  s.n_embd = hp.n_embd;
  s.n_vocab = hp.n_vocab;
  s.n_layer = hp.n_layer;
  SessionParams& p = s.params;
  check(p.n_batch >= 1, "the batch size must be at least 1, got " + std::to_string(p.n_batch));
  check(p.n_logits_max >= 0, "n_logits_max must be >= 0");
  if (p.n_logits_max == 0) p.n_logits_max = std::max(p.n_seq_max, 32);
  p.n_logits_max = std::min(p.n_logits_max, p.n_batch);
  s.max_blocks_per_seq = s.table.n_blocks();

  for (const ModelRank& mr : s.m.ranks) {
    auto r = std::make_unique<RankState>(mr);
    const std::vector<KvLayerShape> shapes = r->decoder.kv_layer_shapes();
    r->storage = std::make_unique<KvStorage>(r->device, shapes, kv_dtype(p.kv_type), kv_dtype(p.kv_type),
                                             s.table.n_blocks(), p.block_size);
    WorkspacePlan plan;
    r->scratch = r->decoder.plan_scratch(r->device, p.n_batch, p.n_logits_max, plan);
    plan.max_rows = std::max<int64_t>(plan.max_rows, p.n_batch);
    plan.max_seq_len = std::max<int64_t>(plan.max_seq_len, int64_t(s.table.n_blocks()) * p.block_size);
    r->ops.reserve(plan);

    Device& dev = r->device;
    r->d_tokens.allocate(dev, DType::I32, p.n_batch);
    r->d_positions.allocate(dev, DType::I32, p.n_batch);
    r->d_slots.allocate(dev, DType::I32, p.n_batch);
    r->d_seq_slot.allocate(dev, DType::I32, p.n_batch);
    r->d_out_rows.allocate(dev, DType::I32, p.n_logits_max);
    r->d_seq_lens.allocate(dev, DType::I32, p.n_seq_max);
    r->d_block_tables.allocate(dev, DType::I32, int64_t(s.max_blocks_per_seq) * p.n_seq_max);
    if (s.m.process_rank >= 0) {
      // Every process sends a slot of the same size in the all-gather of the logits (tensor split), or
      // receives the whole logits (layer split; the last rank's slot is the full vocabulary).
      const size_t slot_bytes = size_t(s.max_vocab_rows()) * size_t(p.n_logits_max) * sizeof(float);
      r->d_logits_buf = dev.allocate(slot_bytes);
      if (s.mode == SplitMode::Tensor) r->d_gather_buf = dev.allocate(slot_bytes * s.m.shards.size());
      s.m.comm->reserve(std::max(slot_bytes, size_t(s.n_embd) * size_t(p.n_batch) * sizeof(float)));
    } else if (r->decoder.shard().last) {
      r->d_logits_buf = dev.allocate(size_t(std::max<int64_t>(r->decoder.shard().vocab.size(), 1)) *
                                     size_t(p.n_logits_max) * sizeof(float));
    }
    r->done = dev.create_event();
    s.ranks.push_back(std::move(r));
  }

  s.h_block_tables.assign(size_t(s.max_blocks_per_seq) * size_t(p.n_seq_max), 0);
  s.h_seq_lens.assign(size_t(p.n_seq_max), 0);
  s.seq_count.assign(size_t(p.n_seq_max), 0);
  s.seq_base.assign(size_t(p.n_seq_max), 0);
  s.seq_next.assign(size_t(p.n_seq_max), 0);
  s.seq_cursor.assign(size_t(p.n_seq_max), 0);
  s.seq_slots.resize(size_t(p.n_seq_max));
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
  const size_t n = batch.size();
  check(n > 0, "cannot decode an empty batch");
  check(batch.seq_ids.size() == n && batch.logits.size() == n,
        "batch has " + std::to_string(n) + " positions but " + std::to_string(batch.seq_ids.size()) +
            " sequence ids and " + std::to_string(batch.logits.size()) + " logit flags");
  const bool embed = batch.tokens.empty();
  if (embed) {
    check(batch.embeddings.size() == n * size_t(n_embd),
          "batch rows need either token ids or " + std::to_string(n_embd) + " embedding values each");
  } else {
    check(batch.tokens.size() == n && batch.embeddings.empty(),
          "batch has " + std::to_string(batch.tokens.size()) + " tokens for " + std::to_string(n) +
              " positions");
  }

  // Validate every row before touching the cache.
  std::fill(seq_count.begin(), seq_count.end(), 0);
  for (int32_t s = 0; s < params.n_seq_max; ++s) seq_next[size_t(s)] = seq_base[size_t(s)] = table.seq_len(s);
  for (size_t r = 0; r < n; ++r) {
    const int32_t s = batch.seq_ids[r];
    check(s >= 0 && s < params.n_seq_max, "batch row " + std::to_string(r) + ": sequence id " +
                                              std::to_string(s) + " is out of range (this session has " +
                                              std::to_string(params.n_seq_max) + " sequences)");
    check(batch.positions[r] == seq_next[size_t(s)],
          "batch row " + std::to_string(r) + ": position " + std::to_string(batch.positions[r]) +
              " does not continue sequence " + std::to_string(s) + ", whose next position is " +
              std::to_string(seq_next[size_t(s)]));
    ++seq_next[size_t(s)];
    ++seq_count[size_t(s)];
    if (!embed) {
      const int32_t t = batch.tokens[r];
      check(t >= 0 && t < n_vocab, "token id " + std::to_string(t) + " is out of range: the vocabulary has " +
                                       std::to_string(n_vocab) + " tokens (0.." +
                                       std::to_string(n_vocab - 1) + ")");
    }
  }
  int64_t needed = 0;
  for (int32_t s = 0; s < params.n_seq_max; ++s)
    if (seq_count[size_t(s)] > 0) needed += table.blocks_needed(s, seq_count[size_t(s)]);
  check(needed <= table.n_free_blocks(), table.full_message(int32_t(std::min<int64_t>(needed, INT32_MAX))));

  // Assign KV slots (cannot fail now) and make the copies copy-on-write asked for.
  for (int32_t s = 0; s < params.n_seq_max; ++s) {
    seq_slots[size_t(s)].clear();
    seq_cursor[size_t(s)] = 0;
    if (seq_count[size_t(s)] > 0) table.append(s, seq_count[size_t(s)], seq_slots[size_t(s)]);
  }
  try {
    for (auto& r : ranks) r->storage->apply_copies(r->stream, table.pending_copies());
    table.clear_pending_copies();
    h_slots.resize(n);
    for (size_t r = 0; r < n; ++r) {
      const size_t s = size_t(batch.seq_ids[r]);
      h_slots[r] = seq_slots[s][size_t(seq_cursor[s]++)];
    }
    // Block tables change only through append: one upload per decode.
    std::fill(h_block_tables.begin(), h_block_tables.end(), 0);
    for (int32_t s = 0; s < params.n_seq_max; ++s) {
      auto bt = table.block_table(s);
      std::copy(bt.begin(), bt.end(), h_block_tables.begin() + ptrdiff_t(s) * max_blocks_per_seq);
    }
    for (auto& r : ranks)
      r->device.copy_from_host(r->stream, r->d_block_tables.buffer.data(), h_block_tables.data(),
                               h_block_tables.size() * sizeof(int32_t));

    // Outputs.
    row_to_out.assign(n, -1);
    size_t n_out = 0;
    for (size_t r = 0; r < n; ++r)
      if (batch.logits[r]) row_to_out[r] = int32_t(n_out++);
    logits.resize(n_out * size_t(n_vocab));

    // Forward passes of at most n_batch rows and n_logits_max logit rows each.
    for (int32_t s = 0; s < params.n_seq_max; ++s) h_seq_lens[size_t(s)] = seq_base[size_t(s)];
    size_t r0 = 0, out0 = 0;
    while (r0 < n) {
      size_t r1 = r0, outs = 0;
      while (r1 < n && r1 - r0 < size_t(params.n_batch) &&
             (outs < size_t(params.n_logits_max) || !batch.logits[r1])) {
        outs += batch.logits[r1] ? 1 : 0;
        ++r1;
      }
      run_chunk(batch, r0, r1, out0);
      out0 += outs;
      r0 = r1;
    }
  } catch (...) {
    // Leave the cache as it was: drop the positions this batch added.
    table.clear_pending_copies();
    for (int32_t s = 0; s < params.n_seq_max; ++s)
      if (seq_count[size_t(s)] > 0) table.remove(s, seq_base[size_t(s)]);
    row_to_out.clear();
    throw;
  }
}

ForwardInputs Session::Impl::prepare(RankState& r, const Batch& batch, size_t r0, size_t r1, int32_t max_len,
                                     bool record, Tensor& tokens, Tensor& embeddings, bool with_taps) {
  const int64_t T = int64_t(r1 - r0);
  const DeviceId dev = r.device.id();
  Device& device = r.device;
  Stream& stream = r.stream;
  const RankShard& shard = r.decoder.shard();
  const int64_t n_out = int64_t(h_out_rows.size());

  ForwardInputs in;
  in.n_rows = T;
  in.positions = r.d_positions.view(T, dev);
  in.slot_mapping = r.d_slots.view(T, dev);
  device.copy_from_host(stream, in.positions.data, batch.positions.data() + r0, size_t(T) * 4);
  device.copy_from_host(stream, in.slot_mapping.data, h_slots.data() + r0, size_t(T) * 4);
  if (shard.first) {  // only the rank that embeds needs the tokens (layer split)
    if (!batch.tokens.empty()) {
      tokens = r.d_tokens.view(T, dev);
      device.copy_from_host(stream, tokens.data, batch.tokens.data() + r0, size_t(T) * 4);
      in.tokens = &tokens;
    } else {
      const size_t bytes = size_t(n_embd) * size_t(params.n_batch) * sizeof(float);
      if (!r.d_embeddings_buf) r.d_embeddings_buf = device.allocate(bytes);
      embeddings = Tensor::contiguous(DType::F32, {n_embd, T}, r.d_embeddings_buf.data(), dev);
      device.copy_from_host(stream, embeddings.data, batch.embeddings.data() + r0 * size_t(n_embd),
                            size_t(T) * size_t(n_embd) * sizeof(float));
      in.embeddings = &embeddings;
    }
  }

  AttentionBatch& ab = in.attention;
  ab.mask = MaskKind::Causal;
  ab.positions = in.positions;
  ab.seq_slot = r.d_seq_slot.view(T, dev);
  device.copy_from_host(stream, ab.seq_slot.data, h_seq_slot.data(), size_t(T) * 4);
  ab.block_tables = Tensor::contiguous(DType::I32, {max_blocks_per_seq, params.n_seq_max},
                                       r.d_block_tables.buffer.data(), dev);
  ab.seq_lens = r.d_seq_lens.view(params.n_seq_max, dev);
  device.copy_from_host(stream, ab.seq_lens.data, h_seq_lens.data(), h_seq_lens.size() * 4);
  ab.max_seq_len = record ? int32_t(int64_t(table.n_blocks()) * params.block_size) : max_len;

  in.n_out = shard.last ? n_out : 0;
  in.out_rows_all = n_out == T;
  in.out_rows = r.d_out_rows.view(std::max<int64_t>(n_out, 1), dev);
  in.out_rows.ne[0] = n_out;
  if (in.n_out > 0 && !in.out_rows_all)
    device.copy_from_host(stream, in.out_rows.data, h_out_rows.data(), size_t(n_out) * 4);
  if (shard.last) {
    const int64_t nv = shard.vocab.size();
    in.logits = Tensor::contiguous(DType::F32, {nv, std::max<int64_t>(n_out, 1)}, r.d_logits_buf.data(), dev);
    in.logits.ne[1] = n_out;
  }
  if (with_taps) in.taps = taps;
  return in;
}

void Session::Impl::copy_logit_rows(RankState& r, const void* src, Range v, size_t out0, int64_t n_out) {
  if (n_out == 0) return;
  float* dst = logits.data() + out0 * size_t(n_vocab) + size_t(v.begin);
  if (v.size() == n_vocab) {
    r.device.copy_to_host(r.stream, dst, src, size_t(n_out) * size_t(n_vocab) * sizeof(float));
  } else {  // a tensor-split rank's vocabulary rows: one strided copy into the full rows
    r.device.copy_2d(r.stream, dst, size_t(n_vocab) * sizeof(float), src, size_t(v.size()) * sizeof(float),
                     size_t(v.size()) * sizeof(float), size_t(n_out), CopyKind::DeviceToHost);
  }
}

void Session::Impl::fetch_logits(RankState& r, size_t out0, int64_t n_out) {
  copy_logit_rows(r, r.d_logits_buf.data(), r.decoder.shard().vocab, out0, n_out);
}

void Session::Impl::gather_process_logits(RankState& r, size_t out0, int64_t n_out) {
  if (n_out == 0) return;  // every process decodes the same batch, so all skip or all gather
  const size_t slot = size_t(max_vocab_rows()) * size_t(n_out);  // floats per rank
  const DeviceId dev = r.device.id();
  const Tensor send = Tensor::contiguous(DType::F32, {int64_t(slot)}, r.d_logits_buf.data(), dev);
  const Tensor recv =
      Tensor::contiguous(DType::F32, {int64_t(slot * m.shards.size())}, r.d_gather_buf.data(), dev);
  m.comm->all_gather(m.process_rank, r.stream, send, recv);
  for (size_t q = 0; q < m.shards.size(); ++q)
    if (int(q) != m.process_rank)  // fetch_logits copied this process's rows
      copy_logit_rows(r, static_cast<const float*>(recv.data) + q * slot, m.shards[q].vocab, out0, n_out);
}

void Session::Impl::run_layers_over_processes(const Batch& batch, size_t r0, size_t r1, size_t out0,
                                              int32_t max_len) {
  RankState& r = *ranks.front();
  const int me = m.process_rank, R = int(m.shards.size());
  const int64_t T = int64_t(r1 - r0), n_out = int64_t(h_out_rows.size());
  Tensor tokens, embeddings;
  ForwardInputs in = prepare(r, batch, r0, r1, max_len, false, tokens, embeddings, true);
  const Tensor hidden = r.decoder.hidden_state(*r.scratch, T);
  // Every process takes part in every collective, in the same order: a broadcast of the hidden state from
  // rank 0, then from rank 1, ..., then of the logits from the last rank. Rank k + 1 runs its layers on what
  // rank k sent; the other receivers' copies are overwritten before they are read.
  for (int k = 0; k < R - 1; ++k) {
    if (k == me) r.forward(r.stream, in);
    m.comm->broadcast(me, r.stream, hidden, k);
  }
  if (me == R - 1) r.forward(r.stream, in);
  if (n_out > 0) {
    const Tensor all =
        Tensor::contiguous(DType::F32, {n_vocab * n_out}, r.d_logits_buf.data(), r.device.id());
    m.comm->broadcast(me, r.stream, all, R - 1);
    copy_logit_rows(r, all.data, Range{0, n_vocab}, out0, n_out);
  }
  r.stream.synchronize();
}

void Session::Impl::run_chunk(const Batch& batch, size_t r0, size_t r1, size_t out0) {
  const int64_t T = int64_t(r1 - r0);
  h_out_rows.clear();
  h_seq_slot.resize(size_t(T));
  int32_t max_len = 1;
  for (size_t r = r0; r < r1; ++r) {
    const int32_t s = batch.seq_ids[r];
    h_seq_slot[r - r0] = s;
    if (batch.logits[r]) h_out_rows.push_back(int32_t(r - r0));
    h_seq_lens[size_t(s)] = batch.positions[r] + 1;  // rows of a sequence come in position order
  }
  for (size_t r = r0; r < r1; ++r) max_len = std::max(max_len, h_seq_lens[size_t(batch.seq_ids[r])]);
  const int64_t n_out = int64_t(h_out_rows.size());

  taps.clear();
  for (size_t k = 0; k < tap_layers.size(); ++k) {
    LayerTap t;
    t.layer = tap_layers[k];
    char* base = static_cast<char*>(tap_dst.data) + r0 * tap_dst.row_stride + k * tap_dst.tap_stride;
    t.dst = Tensor::contiguous(DType::F32, {n_embd, T}, base, tap_dst.device);
    t.dst.nb[1] = tap_dst.row_stride;
    t.dst.nb[2] = t.dst.nb[3] = tap_dst.row_stride * size_t(T);
    taps.push_back(t);
  }

  if (m.process_rank >= 0 && mode == SplitMode::Layer) {
    run_layers_over_processes(batch, r0, r1, out0, max_len);
    return;
  }

  if (mode == SplitMode::Tensor && ranks.size() > 1) {
    // One host thread per rank runs the whole forward on its shard; the all-reduces inside keep the ranks in
    // step. Rank 0 writes the taps (the residual stream is the same on every rank).
    std::lock_guard<std::mutex> lock(m.run_mutex);
    m.rank_threads->run([&](int rank) {
      RankState& r = *ranks[size_t(rank)];
      Tensor tokens, embeddings;
      ForwardInputs in = prepare(r, batch, r0, r1, max_len, false, tokens, embeddings, rank == 0);
      r.forward(r.stream, in);
      fetch_logits(r, out0, n_out);
      r.stream.synchronize();
    });
    return;
  }

  // Decode-sized chunks of token rows run as recorded CUDA graphs (Device::run_recorded), one per (session,
  // rows, logit rows) and rank: every pointer is fixed, and max_seq_len is the session's capacity so that the
  // recorded attention launch covers any length. CPU devices run the forward directly; so do a row split (its
  // matmuls span several devices' streams) and a tensor split (its collectives meet on the host).
  // (A tensor split over processes could record NCCL's collectives too; it has not run on GPUs yet, so it
  // does not.)
  const bool record = ranks.front()->device.id().kind != DeviceKind::CPU && mode != SplitMode::Row &&
                      T <= 64 && tap_layers.empty() && !batch.tokens.empty() && m.process_rank < 0;
  static std::atomic<uint64_t> next_session_id{1};  // keys never repeat, also after a session is destroyed
  if (record && graph_session_id == 0) graph_session_id = next_session_id++;
  const uint64_t graph_key =
      (graph_session_id << 32) | (uint64_t(T) << 16) | (uint64_t(n_out) << 1) | uint64_t(n_out == T);
  auto forward = [&](RankState& r, const ForwardInputs& in) {
    if (record) {
      r.device.run_recorded(r.stream, graph_key, [&](Stream& st) { r.forward(st, in); });
    } else {
      r.forward(r.stream, in);
    }
  };

  if (ranks.size() > 1) {  // layer split: rank after rank, the hidden state handed over at each boundary
    std::lock_guard<std::mutex> lock(m.run_mutex);
    for (size_t k = 0; k < ranks.size(); ++k) {
      RankState& r = *ranks[k];
      Tensor tokens, embeddings;
      ForwardInputs in = prepare(r, batch, r0, r1, max_len, record, tokens, embeddings, true);
      if (k > 0) {
        RankState& prev = *ranks[k - 1];
        const Tensor src = prev.decoder.hidden_state(*prev.scratch, T);
        const Tensor dst = r.decoder.hidden_state(*r.scratch, T);
        copy_between_devices(prev.stream, r.device, dst.data, prev.device, src.data, src.nbytes());
        prev.done->record(prev.stream);
        prev.done->wait(r.stream);
      }
      forward(r, in);
    }
    RankState& last = *ranks.back();
    fetch_logits(last, out0, n_out);
    for (auto& r : ranks) r->stream.synchronize();
    return;
  }

  // One rank (unsplit, split by rows, or this process's rank of a tensor split over processes).
  RankState& r = *ranks.front();
  Tensor tokens, embeddings;
  ForwardInputs in = prepare(r, batch, r0, r1, max_len, record, tokens, embeddings, true);
  {
    std::unique_lock<std::mutex> lock(m.run_mutex, std::defer_lock);
    if (mode == SplitMode::Row) lock.lock();  // the row slices' scratch is the model's, shared by sessions
    forward(r, in);
  }
  fetch_logits(r, out0, n_out);
  if (m.process_rank >= 0) gather_process_logits(r, out0, n_out);  // tensor split over processes
  r.stream.synchronize();
}

std::span<const float> Session::logits(size_t row) const {
  const Impl& s = *impl_;
  check(row < s.row_to_out.size(), "row " + std::to_string(row) +
                                       " is not a row of the last decoded batch (" +
                                       std::to_string(s.row_to_out.size()) + " rows)");
  const int32_t o = s.row_to_out[row];
  check(o >= 0, "row " + std::to_string(row) + " of the last batch was not marked for logits");
  return {s.logits.data() + size_t(o) * size_t(s.n_vocab), size_t(s.n_vocab)};
}

int32_t Session::seq_len(int32_t seq) const {
  return impl_->table.seq_len(seq);
}
void Session::seq_remove(int32_t seq, int32_t p0, int32_t p1) {
  impl_->table.remove(seq, p0, p1);
}
void Session::seq_fork(int32_t src, int32_t dst, int32_t n) {
  impl_->table.fork(src, dst, n);
}
void Session::seq_clear(int32_t seq) {
  impl_->table.clear(seq);
}
void Session::clear() {
  impl_->table.clear_all();
}
int64_t Session::kv_free_positions() const {
  return int64_t(impl_->table.n_free_blocks()) * impl_->table.block_size();
}
int64_t Session::kv_capacity() const {
  return int64_t(impl_->table.n_blocks()) * impl_->table.block_size();
}

void Session::set_taps(std::vector<int32_t> layers, const TapDestination& dst) {
  Impl& s = *impl_;
  if (layers.empty()) {
    s.tap_layers.clear();
    return;
  }
  for (int32_t l : layers)
    check(l >= 0 && l <= s.n_layer, "tap layer " + std::to_string(l) + " is out of range: the model has " +
                                        std::to_string(s.n_layer) + " layers (taps 0.." +
                                        std::to_string(s.n_layer) + ")");
  check(dst.data != nullptr, "tap destination has no memory");
  const DeviceId dev = s.ranks.front()->device.id();
  check(dst.device == dev || dst.device.kind == DeviceKind::CPU,
        "tap destination on " + dst.device.to_string() + " is not supported by a session on " +
            dev.to_string());
  check(dev.kind == DeviceKind::CPU, "taps into host memory from a GPU session are not supported yet");
  TapDestination d = dst;
  const size_t row_bytes = size_t(s.n_embd) * sizeof(float);
  if (d.tap_stride == 0) d.tap_stride = row_bytes;
  if (d.row_stride == 0) d.row_stride = d.tap_stride * layers.size();
  check(d.tap_stride >= row_bytes || layers.size() == 1,
        "tap stride is smaller than one row of hidden state");
  check(d.row_stride >= d.tap_stride * (layers.size() - 1) + row_bytes,
        "tap row stride is smaller than the taps of one row");
  s.tap_layers = std::move(layers);
  s.tap_dst = d;
}

}  // namespace tandem
