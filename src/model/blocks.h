// The composable pieces of a decoder's forward pass, written once against Ops: the embedding (token rows
// scaled, plus added rows), a pre-norm attention block over the paged KV cache, a pre-norm SwiGLU
// feed-forward block, and the output head over the rows that want logits. The llama / qwen3 decoder
// (transformer.cpp) is exactly these four in a loop; gemma4 and dflash assemble their own layers from the
// same pieces plus their extra norms, scalars and a mixture-of-experts feed-forward in the FFN slot.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/decoder.h"

namespace tandem {

class Comm;

// What every block runs with: the stream and ops, the RMS-norm epsilon, and under a tensor split the comm
// that completes the row-parallel products (attention output, down) with an all-reduce.
struct BlockRun {
  Stream& st;
  Ops& ops;
  float eps = 1e-6f;
  Comm* comm = nullptr;
  int rank = 0;
  void reduce(const Tensor& t) const;  // all-reduce sum under a tensor split, else nothing
};

// One layer's shape on this rank (its heads / feed-forward rows under a tensor split) and its rope.
struct LayerShape {
  int64_t n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0, n_ff = 0;
  int32_t sliding_window = 0;
  float attn_scale = 1.0f;
  RopeParams rope;
};

// A layer's shape from its hparams (GGUF-ARCH-FACTS: its own heads, head dims, window, rotary dims and rope
// base); under a tensor split of `shard`, the rank's query / KV heads and feed-forward rows instead. The
// caller sets what its architecture decides: the attention scale and the rest of the rope.
LayerShape layer_shape(const LayerHparams& L, const RankShard& shard, int64_t il);

// The KV cache's shapes of the layers [begin, end) of `layers`.
std::vector<KvLayerShape> kv_layer_shapes_of(std::span<const LayerShape> layers, int64_t begin, int64_t end);

struct AttentionWeights {
  Tensor norm;  // {n_embd}
  Tensor wq, wk, wv, wo;
  std::optional<Tensor> bq, bk, bv, bo;
  std::optional<Tensor> q_norm, k_norm;  // {head_dim_k}: per-head RMS norm before rope (qwen3)
};

struct DenseFfnWeights {
  Tensor norm;  // {n_embd}
  Tensor gate, up, down;
  std::optional<Tensor> b_gate, b_up, b_down;
};

// Scratch of the blocks for T rows, each {width of the widest layer, max rows}; a layer views a prefix at its
// own width (the same addresses every step, which CUDA graphs need).
struct BlockScratch {
  Tensor h, q, k, v, attn, proj, gate, up, act;
};

// A scratch slot of a model's own beside the blocks' (dflash's gathered feature rows): {width, max_rows}.
struct ScratchSlot {
  Tensor* tensor;
  int64_t width;
};

// One forward pass's scratch for a decoder built from these blocks, in one device allocation (every slot
// 256-byte aligned, in this order): x {n_embd, max_rows} (the residual stream), the `extra` slots, the
// blocks' scratch at the widths of the widest of `layers`, and xo {n_embd, max(max_out, 1)} for the output
// head. Records in `plan` what the blocks run (rows, widest matmul input, head dim, heads); the caller adds
// its vocabulary and whatever it runs beside the blocks.
Buffer plan_block_scratch(Device& device, std::span<const LayerShape> layers, int64_t n_embd,
                          int64_t max_rows, int64_t max_out, std::span<const ScratchSlot> extra, Tensor& x,
                          BlockScratch& blocks, Tensor& xo, WorkspacePlan& plan);

// x = token rows (tok_embd[id] * scale, kNoToken: none) plus the added rows of `in` (ForwardInputs).
void embed_block(const BlockRun& run, const Tensor& tok_embd, float scale, const ForwardInputs& in,
                 const Tensor& x);

// x += Wo . attention(rope(norm(Q)), rope(norm(K)), V) of norm(x): the K/V of every row go to its slot in
// `kv` first (rows with slot < 0 store nothing), then every row attends over its visible range (group).
void attention_block(const BlockRun& run, const AttentionWeights& w, const LayerShape& shape,
                     const BlockScratch& sc, const Tensor& x, const Tensor& positions, const KvLayerView& kv,
                     const KvGroupInputs& group);

// x += down(silu(gate(h)) * up(h)), h = norm(x).
void dense_ffn_block(const BlockRun& run, const DenseFfnWeights& w, int64_t n_ff, const BlockScratch& sc,
                     const Tensor& x);

// logits of the out rows of `in`: output . norm(x[out rows]); xo {n_embd, >= n_out} is scratch.
void output_head(const BlockRun& run, const Tensor& output_norm, const Tensor& output,
                 const ForwardInputs& in, const Tensor& x, const Tensor& xo);

}  // namespace tandem
