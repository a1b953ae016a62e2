// A session runs a model over batches: it owns the paged KV cache (blocks shared by all its sequences), the
// per-step device inputs and the scratch memory, planned once at creation for the largest batch, so that
// decoding allocates no device memory.
//
//   auto model = tandem::Model::load("qwen3.gguf");
//   tandem::Session session(model, {.n_ctx = 4096, .n_seq_max = 4});
//   tandem::Batch batch;
//   batch.add_sequence(prompt_ids, 0, /*seq*/ 0, /*last_logits*/ true);
//   session.decode(batch);
//   std::span<const float> logits = session.logits(batch.size() - 1);
//
// Sequence operations (for parallel and speculative decoding): fork a sequence's prefix into another id
// without copying KV blocks, remove a tail of positions (rejected draft tokens), clear.
//
// Hidden-state taps (for DFlash): set_taps({l0, l1, ...}, dst) makes every decode write the input of those
// layers (the residual stream before layer l's attention norm; l = n_layer is the last layer's output) for
// every row of the batch into dst: row r, tap k at dst.data + r * dst.row_stride + k * dst.tap_stride, n_embd
// floats each.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "tandem/batch.h"
#include "tandem/model.h"

namespace tandem {

enum class KvType { F32, F16, BF16 };

struct SessionParams {
  int32_t n_ctx = 4096;      // KV cache positions shared by all sequences (rounded up to whole blocks)
  int32_t n_seq_max = 1;     // sequence ids 0 .. n_seq_max - 1
  int32_t n_batch = 512;     // rows per forward pass; decode() splits larger batches
  int32_t n_logits_max = 0;  // logit rows per forward pass; 0 = max(n_seq_max, 32) (capped at n_batch)
  int32_t block_size = 16;   // KV positions per block
  KvType kv_type = KvType::F16;
};

// Where taps go: host memory now; a device buffer later (device = that device, data = its pointer).
struct TapDestination {
  DeviceId device{};      // DeviceKind::CPU: host memory
  void* data = nullptr;   // row 0, tap 0
  size_t row_stride = 0;  // bytes from one batch row to the next; 0 = n_taps * n_embd * 4
  size_t tap_stride = 0;  // bytes from one tap to the next within a row; 0 = n_embd * 4
};

class Session {
 public:
  Session(std::shared_ptr<Model> model, const SessionParams& params = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const Model& model() const;
  const SessionParams& params() const;
  int32_t n_vocab() const;

  // Runs the batch: stores every row's K/V in its sequence and computes logits of the marked rows. Throws
  // Error for a bad batch (token id out of range, unknown sequence, a position that does not continue its
  // sequence) or a full cache, before changing anything.
  void decode(const Batch& batch);
  // Logits (n_vocab floats) of row `row` of the last decoded batch; the row must have been marked.
  std::span<const float> logits(size_t row) const;

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

  // Taps the input of `layers` (0 .. n_layer) on every following decode; an empty list turns taps off. dst
  // must hold the rows of every batch decoded while taps are set.
  void set_taps(std::vector<int32_t> layers, const TapDestination& dst);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
