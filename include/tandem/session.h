// A session runs a model over batches (batch.h): it owns the paged KV cache (per KV group: the global layers
// share one table, each sliding-window size another that keeps only its window), the per-step device inputs
// and the scratch memory, planned once at creation for the largest batch, so that decoding allocates no
// device memory.
//
//   auto model = tandem::Model::load("qwen3.gguf");
//   tandem::Session session(model, {.n_ctx = 4096, .n_seq_max = 4});
//   tandem::Batch batch;
//   batch.add_sequence(prompt_ids, 0, /*seq*/ 0, /*last_logits*/ true);
//   session.decode(batch);                                       // enqueued; returns before the device is
//   done std::span<const float> logits = session.logits(batch.size() - 1);  // copies this one row to the
//   host
//
// Outputs stay on the device of the output layer: device_logits() is the step's logits there (a tensor split
// gathers the vocabulary slices onto the main device), sample() draws tokens there and copies only the ids
// back, and logits(row) copies one requested row to the host on first use. Taps (set_taps) write the input of
// chosen layers per row into a caller-owned buffer, for a drafter to read without a host round trip.
//
// Sequence operations (for parallel and speculative decoding): fork a sequence's prefix into another id
// without copying KV blocks, remove a tail of positions (rejected draft tokens), clear.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/sampling.h"

namespace tandem {

class Event;

enum class KvType { F32, F16, BF16 };

struct SessionParams {
  int32_t n_ctx = 4096;      // KV cache positions shared by all sequences (rounded up to whole blocks)
  int32_t n_seq_max = 1;     // sequence ids 0 .. n_seq_max - 1
  int32_t n_batch = 512;     // rows per forward pass; decode() splits larger batches
  int32_t n_logits_max = 0;  // logit rows per forward pass; 0 = max(n_seq_max, 32) (capped at n_batch)
  int32_t block_size = 16;   // KV positions per block
  KvType kv_type = KvType::F16;
  // > 0: batches may use AttentionMask::Explicit with up to this many columns (n_batch x this many floats of
  // device memory, allocated at creation). 0: explicit masks are refused.
  int32_t explicit_mask_cols = 0;
  // Sliding-window layers keep every position instead of their window (for tests and debugging).
  bool keep_full_kv = false;
  // Every row's outputs (logits, K/V, taps) are bit-identical to decoding that row alone: the backends run
  // their per-row kernels (matrix-vector products, split-K attention) for every batch size. Speculative
  // decoding's target needs this for greedy output token-identical to plain decoding on CUDA (its verify
  // batches would otherwise use GEMM kernels whose rounding differs from the one-row path); it costs
  // throughput on large batches (a long prompt's prefill). The CPU kernels are batch-invariant anyway.
  bool batch_invariant = false;
};

// Where taps go: row r, tap k at data + r * row_stride + k * tap_stride, n_embd floats (F32) each. `device`
// is where the memory is (a CPU device: host memory). The address is fixed until the next set_taps, so
// recorded CUDA graphs stay valid.
struct TapDestination {
  DeviceId device{};      // DeviceKind::CPU: host memory
  void* data = nullptr;   // row 0, tap 0
  size_t row_stride = 0;  // bytes from one batch row to the next; 0 = n_taps * n_embd * 4
  size_t tap_stride = 0;  // bytes from one tap to the next within a row; 0 = n_embd * 4
  // The consumer's "read" event (optional): a decode waits for it, on the device, before it overwrites the
  // taps. The consumer records it after it has read them.
  Event* read = nullptr;
  // Rows the destination holds (> 0: a decode of a larger batch is refused before anything runs); 0 = the
  // caller guarantees room for every batch.
  int64_t n_rows = 0;
};

// Threading: a session is used from one thread at a time. Sessions of one model (split or not) share its
// devices, whose streams, op workspaces and recorded graphs serve one step at a time: step them from one
// thread (as the generator and a server's scheduler do), or give each thread its own model. A split needs
// no lock of its own: each session owns its split's communicator, rank threads and row-split buffers.
class Session {
 public:
  Session(std::shared_ptr<Model> model, const SessionParams& params = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const Model& model() const;
  const SessionParams& params() const;
  int32_t n_vocab() const;

  // Enqueues the batch: stores the K/V of its writing rows, computes logits of the marked rows. Throws Error
  // for a bad batch (token or embedding row out of range, unknown sequence, a position that does not continue
  // its sequence, a mask the session cannot run) or a full cache, before changing anything. Returns before
  // the device has finished; the accessors below wait for it.
  void decode(const Batch& batch);
  // Logits (n_vocab floats) of row `row` of the last decoded batch, which must have been marked; copied to
  // the host on first use (that row only).
  std::span<const float> logits(size_t row) const;
  // Copies every marked row of the last batch to the host at once (one copy per rank), for callers that read
  // them all (perplexity): the logits(row) calls that follow copy nothing.
  void fetch_all_logits() const;
  // The last batch's logits on the output device: F32 {n_vocab, n_out}, column i = the i-th marked row (see
  // logits_index). Valid until the next decode. A batch with more marked rows than n_logits_max keeps its
  // logits on the host only (Error here).
  Tensor device_logits() const;
  // The column of device_logits() holding row `row` of the last batch.
  int32_t logits_index(size_t row) const;
  DeviceId output_device() const;
  // Samples one token for each of `rows` (marked rows of the last batch) with samplers[i] (its parameters and
  // its generator: one uniform per non-greedy row, as Sampler::sample draws it) on the output device with
  // Ops::sample_rows; only the ids cross to the host. Rows whose sampler uses penalties or a custom chain
  // order are sampled on the host from logits(row). The samplers do not record the tokens (call accept).
  std::vector<int32_t> sample(std::span<const size_t> rows, std::span<Sampler* const> samplers);
  // Blocks until the last decode has finished on every device.
  void synchronize() const;

  int32_t seq_len(int32_t seq) const;
  // Removes positions [p0, p1) of seq (p1 < 0: to the end); only a tail can be removed.
  void seq_remove(int32_t seq, int32_t p0, int32_t p1 = -1);
  // dst becomes the first n positions of src (all when n < 0), sharing src's KV blocks.
  void seq_fork(int32_t src, int32_t dst, int32_t n = -1);
  void seq_clear(int32_t seq);
  void clear();
  // Free KV positions (whole free blocks times block size).
  int64_t kv_free_positions() const;
  int64_t kv_capacity() const;

  // Taps the input of `layers` (ascending, each in 0 .. n_layer; n_layer = the last layer's output) on every
  // following decode; an empty list turns taps off. dst must hold the rows of every batch decoded while taps
  // are set. A destination on the device that runs a layer is written there by the forward; host memory or
  // another device is written through a staging copy (the fallback).
  void set_taps(std::vector<int32_t> layers, const TapDestination& dst);
  // Recorded after the taps of each decode are written (on the stream of the device that wrote the last tap);
  // a consumer's stream waits on it. Null when taps are off. Taps into host memory are complete after
  // synchronize().
  Event* taps_written() const;

  struct Impl;
  Impl& impl() const { return *impl_; }  // internals, for tests (src/runtime/session_impl.h)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
