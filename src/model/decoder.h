// The internal interface every architecture implements: a forward pass over one batch, written as calls into
// Ops, reading and writing the paged KV cache. A session (src/runtime/session.cpp) prepares the per-step
// inputs as device tensors, plans the scratch memory once, and calls forward() for each batch.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/hparams.h"

namespace tandem {

// Write the residual-stream input of `layer` (0 = embeddings, n_layer = output of the last layer before the
// final norm) for every row of the batch into dst, an F32 {n_embd, T} view (rows may be strided: the taps of
// one row can sit side by side, [tap 0 | tap 1 | ...], as DFlash's feature fusion wants them).
struct LayerTap {
  int layer = 0;
  Tensor dst;
};

// Per-step inputs, all device tensors of the compute device. T = number of batch rows.
struct ForwardInputs {
  int64_t n_rows = 0;                  // T
  const Tensor* tokens = nullptr;      // I32 {T}, or null when embeddings are given
  const Tensor* embeddings = nullptr;  // F32 {n_embd, T}
  Tensor positions;                    // I32 {T}
  Tensor slot_mapping;                 // I32 {T}: physical KV slot each row's K/V is stored in
  AttentionBatch attention;            // positions / seq_slot / block tables / seq_lens of this batch
  int64_t n_out = 0;                   // rows that want logits
  Tensor out_rows;                     // I32 {n_out}: their row indices, increasing
  bool out_rows_all = false;           // out_rows is 0..T-1 (no gather needed)
  Tensor logits;                       // F32 {n_vocab, n_out}
  std::span<const LayerTap> taps;
};

// Scratch memory of an architecture, planned once for the largest batch; opaque to the session.
class ForwardScratch {
 public:
  virtual ~ForwardScratch() = default;
};

// Dimensions of one layer's K/V (for the session's KV storage).
struct KvLayerShape {
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  int64_t n_kv_head = 0;
};

class DecoderModel {
 public:
  virtual ~DecoderModel() = default;
  virtual const ModelHparams& hparams() const = 0;
  virtual std::vector<KvLayerShape> kv_layer_shapes() const = 0;

  // Allocates scratch on `device` for batches of up to max_rows rows of which up to max_out want logits, and
  // raises the bounds in `plan` this model's ops need (matmul widths, heads, vocab).
  virtual std::unique_ptr<ForwardScratch> plan_scratch(Device& device, int64_t max_rows, int64_t max_out,
                                                       WorkspacePlan& plan) const = 0;

  // One forward pass: embeds the rows, runs every layer (storing each row's K/V at its slot, attending over
  // the cache), and writes logits of the out rows. kv has one view per layer.
  virtual void forward(Stream& stream, Ops& ops, const ForwardInputs& in, std::span<const KvLayerView> kv,
                       ForwardScratch& scratch) const = 0;
};

// Architectures tandem can load, for messages: "llama, qwen3".
std::string supported_architectures();

// Reads hparams and weights of file's architecture. The weights are views into file (which must outlive the
// model). Throws Error for an unknown architecture (naming the supported ones), a missing key or tensor, or a
// tensor of the wrong shape or type.
std::unique_ptr<DecoderModel> load_decoder_model(const gguf::GgufFile& file, DeviceId device);

}  // namespace tandem
