// The internal interface every architecture implements: a forward pass over one batch, written as calls into
// Ops, reading and writing the paged KV cache. A session (src/runtime/session.cpp) prepares the per-step
// inputs as device tensors, plans the scratch memory once, and calls forward() for each batch.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "parallel/shard_rules.h"

namespace tandem {

// Write the residual-stream input of `layer` (0 = embeddings, n_layer = output of the last layer before the
// final norm) for every row of the batch into dst, an F32 {n_embd, T} view (rows may be strided: the taps of
// one row can sit side by side, [tap 0 | tap 1 | ...], as DFlash's feature fusion wants them).
struct LayerTap {
  int layer = 0;
  Tensor dst;
};

// The layers that share one KV cache table (the same sliding window) share a step's slots and attention
// metadata: one of these per KV group.
struct KvGroupInputs {
  Tensor slot_mapping;       // I32 {T}: the cache slot each row's K/V is stored in (< 0: not stored)
  AttentionBatch attention;  // positions / seq_slot / block tables / seq_lens / bounds of this group
};

// Per-step inputs, all device tensors of the compute device. T = number of batch rows.
//   input row t = (tokens[t] >= 0 ? tok_embd[tokens[t]] * hparams().embedding_scale : 0)
//               + (added_rows[t] >= 0 ? added[:, added_rows[t]] : 0)
class Comm;

struct ForwardInputs {
  int64_t n_rows = 0;                  // T
  const Tensor* tokens = nullptr;      // I32 {T} (kNoToken = none), or null when no row has a token
  const Tensor* added = nullptr;       // F32 {n_embd, n_added}: embedding rows added to the input, or null
  const Tensor* added_rows = nullptr;  // I32 {T}: row of `added` per batch row (-1 = none); with `added`
  Tensor positions;                    // I32 {T}
  std::span<const KvGroupInputs> kv_groups;
  std::span<const int32_t> layer_groups;  // per layer this rank holds: its index into kv_groups
  int64_t n_out = 0;                      // rows that want logits
  Tensor out_rows;                        // I32 {n_out}: their row indices, increasing
  bool out_rows_all = false;              // out_rows is 0..T-1 (no gather needed)
  Tensor logits;                          // F32 {n_vocab, n_out}
  std::span<const LayerTap> taps;
  // The batch's mask as the host knows it, for models whose rows differ by region (diffusion-gemma: prompt
  // rows at positions < prefix_len, canvas rows after): prefix_len of an AttentionMask::PrefixRegion batch,
  // -1 for every other mask; host_positions = this chunk's positions (the same values as `positions`).
  int32_t prefix_len = -1;
  std::span<const int32_t> host_positions;
  // Tensor split: the communicator of this step's caller (each session owns one, so sessions of one model
  // never interleave their collectives); null: the one the decoder was loaded with.
  Comm* comm = nullptr;

  const KvGroupInputs& kv_group(size_t local_layer) const {
    return kv_groups[size_t(layer_groups[local_layer])];
  }
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
  int32_t sliding_window =
      0;  // > 0: the layer reads only the last sliding_window positions (a sliding KV group)
};

class RowSplitWeights;
class DecoderModel;

// What one rank of a (possibly split) model loads and talks to. The default is the whole model on `device`.
struct DecoderLoadContext {
  DeviceId device{};
  RankShard shard;                       // what this rank holds (parallel/shard_rules.h)
  ShardRuleTable rules;                  // the architecture's shard rules (its tensors' names)
  ShardDims dims;                        // the model's dimensions the shard refers to
  Comm* comm = nullptr;                  // tensor split: all-reduce of partial sums between the ranks
  RowSplitWeights* row_split = nullptr;  // row split: where the matrices' row slices go
  const DecoderModel* borrow = nullptr;  // weights missing from the file come from this model (shared_weight)
  // Weights missing from the file are read from this model file instead (a lender split over devices, or on
  // another device, cannot hand out whole tensors; only architectures that say so use it: dflash).
  const gguf::GgufFile* borrow_file = nullptr;
};

// One rank's part of a model. Unsplit, it is the whole model. Split:
//   layer   the rank runs layers shard().layers; the first embeds, the last computes the logits; a rank that
//           is not first starts from hidden_state(), which the session fills with the previous rank's output;
//   tensor  every rank runs every layer on its heads and feed-forward rows, completing the row-parallel
//           products with comm all-reduces; its logits are its vocabulary rows shard().vocab;
//   row     one rank on the main device whose matrices are RowSplitWeights handles (run it with RowSplitOps).
class DecoderModel {
 public:
  virtual ~DecoderModel() = default;
  virtual const ModelHparams& hparams() const = 0;  // of the whole model
  virtual const RankShard& shard() const = 0;
  // One entry per layer this rank holds (its KV heads only under a tensor split).
  virtual std::vector<KvLayerShape> kv_layer_shapes() const = 0;
  // The residual stream {n_embd, n_rows} in the scratch: where a layer-split rank reads its input and leaves
  // its output.
  virtual Tensor hidden_state(ForwardScratch& scratch, int64_t n_rows) const = 0;

  // Allocates scratch on `device` for batches of up to max_rows rows of which up to max_out want logits, and
  // raises the bounds in `plan` this model's ops need (matmul widths, heads, vocab).
  virtual std::unique_ptr<ForwardScratch> plan_scratch(Device& device, int64_t max_rows, int64_t max_out,
                                                       WorkspacePlan& plan) const = 0;

  // One forward pass: embeds the rows, runs every layer (storing each row's K/V at its slot, attending over
  // the cache), and writes logits of the out rows ({shard().vocab.size(), n_out}). kv has one view per layer
  // this rank holds. Under a split only this rank's part (see above).
  virtual void forward(Stream& stream, Ops& ops, const ForwardInputs& in, std::span<const KvLayerView> kv,
                       ForwardScratch& scratch) const = 0;

  // A whole weight by GGUF name that another model on the same device may use instead of its own (token_embd,
  // output), or nullopt when this model does not offer it.
  virtual std::optional<Tensor> shared_weight(const std::string& name) const {
    (void)name;
    return std::nullopt;
  }
};

// Architectures tandem can load, for messages: "llama, qwen3".
std::string supported_architectures();

// Reads the hyperparameters of file's architecture (no weights are read; n_vocab comes from the metadata or
// token_embd's shape). Throws Error for an unknown architecture (naming the supported ones) or a bad key.
// fallback_vocab: n_vocab when neither the metadata nor token_embd gives it (a file that borrows token_embd).
ModelHparams read_model_hparams(const gguf::GgufFile& file, int64_t fallback_vocab = 0);
// The shard rules of file's architecture (each architecture declares its table next to its tensors).
ShardRuleTable shard_rules_of(const gguf::GgufFile& file);
// The rows every llama-style decoder shares (token_embd, output_norm, output, rope_freqs, attention and MLP
// projections, attn_norm, Q/K norms, ffn_norm; transformer_rules.cpp): llama / qwen3 and gemma4 add theirs.
ShardRuleTable llama_style_shard_rules();
// The dimensions a split is planned on (head counts, widths, and the block sizes of the column-cut matrices).
ShardDims shard_dims(const gguf::GgufFile& file, const ModelHparams& hp);

// Loads one rank's weights of file's architecture. The weights are views into file (which must outlive the
// model) or device copies. Throws Error for a missing key or tensor, or a tensor of the wrong shape or type.
std::unique_ptr<DecoderModel> load_decoder_model(const gguf::GgufFile& file, const ModelHparams& hp,
                                                 const DecoderLoadContext& ctx);
// The whole model on one device.
std::unique_ptr<DecoderModel> load_decoder_model(const gguf::GgufFile& file, DeviceId device);

}  // namespace tandem
