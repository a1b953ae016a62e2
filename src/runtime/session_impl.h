// What a tandem::Session holds (session.h): the KV groups (one cache table per sliding-window size), each
// rank's device state, the host staging of one step, and the outputs of the last step. The step is planned on
// the host (step_plan.cpp: validation, KV slots, per-row attention bounds) and run on the ranks
// (session.cpp: uploads, forwards over the split, logits and taps).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/decoder.h"
#include "model/model_impl.h"
#include "parallel/comm.h"
#include "parallel/rank_threads.h"
#include "parallel/row_split.h"
#include "runtime/graph_key.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_storage.h"
#include "tandem/session.h"

namespace tandem {

// A device buffer of I32 (or F32) values, with views of its first n.
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

// The layers that share one cache table: every layer with the same sliding window (0 = global). Sequence ids
// of the table are the session's 0 .. n_seq_max - 1, then n_seq_max + s for the scratch copy of sequence s
// that its non-writing rows use during one step (forked, appended to, cleared after the step).
struct KvGroup {
  int32_t window = 0;           // 0: global layers
  std::vector<int32_t> layers;  // model layer ids
  std::unique_ptr<KvCacheTable> table;
  int32_t reserve_blocks = 0;  // blocks kept free for non-writing rows (not part of n_ctx)
  bool evicts = false;         // a sliding group that drops blocks before its window
  // Host staging of one step.
  std::vector<int32_t> h_block_tables, h_seq_lens, h_slots, h_kv_begin;
  std::vector<std::vector<int32_t>> seq_slots;  // per table sequence: slots appended this step
};

// One KV group's device arrays on one rank.
struct RankKvGroup {
  std::unique_ptr<KvStorage> storage;  // this rank's layers of the group (empty when it holds none)
  DeviceArray d_slots, d_block_tables, d_seq_lens, d_kv_begin;
};

// One rank's part of a session: its KV storage per group, scratch, and the per-step inputs on its device. A
// session on an unsplit model has one.
struct RankState {
  Device& device;
  Ops& ops;
  Stream& stream;
  DecoderModel& decoder;
  std::vector<RankKvGroup> groups;
  std::vector<KvLayerView> kv_views;  // per local layer, from the group storages
  std::vector<int32_t> layer_groups;  // per local layer: its group
  std::unique_ptr<ForwardScratch> scratch;
  // Per-step inputs on the device: fixed addresses, rewritten every step.
  DeviceArray d_tokens, d_positions, d_seq_slot, d_out_rows, d_block_end, d_added_rows;
  Buffer d_embeddings_buf;      // host embedding rows of a step, {n_embd, n_batch}
  Buffer d_mask_buf;            // explicit mask of a step, {explicit_mask_cols, n_batch}
  Buffer d_logits_buf;          // {this rank's vocabulary rows, n_logits_max}
  Buffer d_gather_buf;          // ranks in separate processes: every rank's d_logits_buf, rank after rank
  Buffer d_tap_stage;           // taps to host memory or another device: written here first
  std::unique_ptr<Event> done;  // layer split: the next rank's stream waits for this rank's output

  explicit RankState(const ModelRank& r)
      : device(*r.device), ops(*r.ops), stream(r.device->default_stream()), decoder(*r.decoder) {}

  // This rank's forward of one chunk, enqueued on `st`.
  bool batch_invariant = false;  // SessionParams::batch_invariant, set on the ops before every forward
  void forward(Stream& st, const ForwardInputs& in) {
    ops.set_batch_invariant(batch_invariant);  // the ops are the device's, shared with other sessions
    decoder.forward(st, ops, in, kv_views, *scratch);
  }
};

// The K/V cache element type of SessionParams::kv_type.
DType kv_dtype(KvType t);

struct Session::Impl {
  std::shared_ptr<Model> model;
  SessionParams params;
  Model::Impl& m;
  SplitMode mode;
  // What a split needs per step is the session's own, so sessions of one model step independently (no lock):
  // a tensor split in this process has its communicator and rank threads here, a row split its peer buffers,
  // streams and events (RowSplitOps). Only ranks in separate processes share the model's comm (SPMD: every
  // process runs the same steps in the same order) and take Model::Impl::process_step_mutex.
  std::unique_ptr<Comm> comm;
  std::unique_ptr<RankThreads> rank_threads;
  std::unique_ptr<RowSplitOps> row_ops;
  std::vector<std::unique_ptr<RankState>> ranks;
  int64_t n_embd = 0;
  int64_t n_embd_added = 0;  // width of a batch's embedding rows (ModelHparams::n_embd_added)
  int64_t n_vocab = 0;
  int64_t n_token_ids = 0;   // token ids the input accepts (ModelHparams::n_token_ids)
  bool feature_rows = false;  // embedding rows are feature rows (ModelHparams::n_embd_features > 0)
  int64_t n_layer = 0;

  std::vector<KvGroup> groups;
  std::vector<int32_t> layer_group;  // per model layer
  int32_t max_blocks_per_seq = 0;    // width of every group's block table

  // Host staging of one step (shared by every rank).
  std::vector<int32_t> h_tokens, h_added_rows, h_seq_slot, h_out_rows, h_block_end;
  std::vector<int32_t> seq_count, seq_base, seq_next;
  std::vector<uint8_t> seq_writes;  // per sequence of the batch: 1 = its rows write K/V
  std::vector<int32_t> chunk_count, chunk_first_pos, chunk_cursor, chunk_added_rows;  // plan_chunk / prepare

  // Outputs of the last batch.
  std::vector<int32_t> row_to_out;
  int64_t n_out = 0;
  bool logits_on_device = true;             // false: more marked rows than n_logits_max (host copies made)
  mutable std::vector<float> host_logits;   // {n_vocab, n_out}
  mutable std::vector<uint8_t> host_valid;  // per out row: copied to host
  mutable bool gathered = false;            // tensor split: the slices are in d_full_logits
  Buffer d_full_logits;                     // tensor split: {n_vocab, n_logits_max} on the main device
  DeviceArray d_uniforms, d_sampled;        // device sampling, on the output device

  std::vector<int32_t> tap_layers;
  TapDestination tap_dst;
  std::unique_ptr<Event> tap_written;
  uint32_t tap_generation = 0;    // part of the graph key: the taps' addresses are recorded in graphs
  uint64_t graph_session_id = 0;  // identifies this session's recorded graphs on the device
  StepShapeIds step_shapes;       // graph_key.h: the recordable step shapes met so far, by id

  Impl(std::shared_ptr<Model> mdl, const SessionParams& p);

  // step_plan.cpp: checks the whole batch before anything changes (throws Error).
  void validate(const Batch& batch);
  // step_plan.cpp: appends a chunk's rows to every group's table (forking the scratch sequences of
  // non-writing rows), fills the host staging of the chunk, and returns the table sequence of each row.
  void plan_chunk(const Batch& batch, size_t r0, size_t r1);
  // step_plan.cpp: after a chunk ran: drops the scratch sequences and what sliding groups no longer need.
  void finish_chunk();
  // step_plan.cpp: undoes the appends of a failed decode.
  void rollback();

  void decode(const Batch& batch);
  void run_chunk(const Batch& batch, size_t r0, size_t r1, size_t out0);
  void run_tensor_chunk(const Batch& batch, size_t r0, size_t r1, size_t out0, bool record,
                        uint64_t graph_key);
  ForwardInputs prepare(RankState& r, const Batch& batch, size_t r0, size_t r1, size_t out0, bool record,
                        Tensor& tokens, Tensor& added, Tensor& added_rows, std::vector<KvGroupInputs>& kvg,
                        std::vector<LayerTap>& taps, bool with_taps);
  void copy_logit_rows(RankState& r, const void* src, Range v, size_t out0, int64_t n_rows) const;
  void gather_process_logits(RankState& r, size_t out0, int64_t n_rows);
  void run_layers_over_processes(const Batch& batch, size_t r0, size_t r1, size_t out0);
  // The rank whose device holds the output (the last layer's rank; rank 0 of a tensor split).
  RankState& output_rank() const { return mode == SplitMode::Layer ? *ranks.back() : *ranks.front(); }
  void fetch_row(int32_t out) const;
  int64_t max_vocab_rows() const {
    int64_t n = 1;
    for (const RankShard& sh : m.shards) n = std::max(n, sh.vocab.size());
    return n;
  }
  int32_t n_table_seqs() const { return 2 * params.n_seq_max; }
};

}  // namespace tandem
