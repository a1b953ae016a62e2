// The backend seam: Device, Stream, Event, Buffer and the Ops table. Model code is written only against this
// header; the CPU backend (src/backend/cpu) is the reference and the CUDA backend (src/backend/cuda)
// implements the same Ops and is tested against it.
//
// Conventions that hold for every op below:
// - Shapes are in ggml ne order (ne[0] innermost): a matrix of T rows of n values is {n, T}. Activations are
//   F32 unless a parameter says otherwise. Index tensors are I32.
// - Every Tensor argument is a view (core/tensor.h) whose data lives on this Ops' device. Unless a parameter
//   says "contiguous", a tensor may be a strided view: elements inside a row (ne[0]) must be contiguous
//   (nb[0] == element size), while rows may have any byte strides nb[1], nb[2], nb[3] (views into fused QKV,
//   a shard, a few rows of a larger buffer, ...). Outputs must not overlap inputs unless the op says
//   "in place ok".
// - Every op takes the Stream it runs on first. On CPU the op runs synchronously on the calling thread, which
//   uses the device's thread pool; on CUDA it is enqueued on the stream. Ops never allocate memory during a
//   step: each backend keeps a workspace that Ops::reserve() sizes once at plan time (see WorkspacePlan). One
//   Ops object is used by one host thread at a time.
// - Bad shapes, dtypes or devices throw tandem::Error (checked on the host, before any work is enqueued).
//   Index values inside device tensors (token ids, slots, positions) are the caller's responsibility on CUDA;
//   the CPU backend checks them and throws Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tandem {

class Device;
class Ops;

// ---- streams, events, buffers -----------------------------------------------------------------------------

// An ordered queue of work on one device. On CPU it is trivial (ops run synchronously); on CUDA it wraps a
// cudaStream_t.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual DeviceId device() const = 0;
  // Blocks the calling host thread until all work enqueued on this stream so far has finished.
  virtual void synchronize() = 0;
};

// A marker in a stream, used to order work across streams and devices without blocking the host.
class Event {
 public:
  virtual ~Event() = default;
  // Captures all work enqueued on `stream` so far.
  virtual void record(Stream& stream) = 0;
  // Makes all work enqueued on `stream` after this call wait until the recorded work has finished.
  virtual void wait(Stream& stream) = 0;
  // Blocks the host until the recorded work has finished (returns at once if never recorded).
  virtual void synchronize() = 0;
};

// An owning allocation on one device (move-only; frees on destruction). Host-side buffers
// (Device::allocate_host) report DeviceId CPU even when they belong to a CUDA device.
class Buffer {
 public:
  using Deleter = void (*)(void* data, void* context);
  Buffer() = default;
  Buffer(void* data, size_t size, DeviceId device, Deleter deleter, void* context = nullptr)
      : data_(data), size_(size), device_(device), deleter_(deleter), context_(context) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = o.data_;
      size_ = o.size_;
      device_ = o.device_;
      deleter_ = o.deleter_;
      context_ = o.context_;
      o.data_ = nullptr;
      o.size_ = 0;
      o.deleter_ = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const { return data_; }
  size_t size() const { return size_; }
  DeviceId device() const { return device_; }
  explicit operator bool() const { return data_ != nullptr; }
  void reset() {
    if (data_ && deleter_) deleter_(data_, context_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  DeviceId device_{};
  Deleter deleter_ = nullptr;
  void* context_ = nullptr;
};

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };

struct DeviceOptions {
  int n_threads = 0;  // CPU: threads of the device's pool including the caller; 0 = all hardware threads
};

// ---- attention and rope parameters ------------------------------------------------------------------------

// Which cache positions a query row may see (see AttentionBatch for the exact rule). Explicit is the general
// fallback: an additive bias per (row, position) given as a tensor.
enum class MaskKind { Causal, Bidirectional, Block, Explicit };

// NORM rotates element pairs (2i, 2i+1) (llama); NEOX rotates pairs (i, i + n_rot/2) (qwen3, gemma4, dflash).
enum class RopeMode { Norm, Neox };

// Rotary embedding, exactly as ggml computes it (GGUF-ARCH-FACTS B.4). For pair i (0 <= i < n_rot/2) at
// position p:  theta_i = p * freq_scale * freq_base^(-2i/n_rot) / ff_i   (ff_i = freq_factors[i], or 1),
//   c = cos(theta_i) * attn_factor, s = sin(theta_i) * attn_factor,
//   (x0, x1) -> (x0 c - x1 s, x0 s + x1 c)
// where (x0, x1) is the pair (2i, 2i+1) in NORM mode and (i, i + n_rot/2) in NEOX mode. Dims >= n_rot of each
// head pass through unchanged. The CPU reference computes theta in float as ggml does:
// theta_scale = powf(freq_base, -2/n_rot), theta_i = p * theta_scale^i (running float product), then / ff_i,
// then * freq_scale.
struct RopeParams {
  int n_rot = 0;  // rotated dims per head: even, 2 <= n_rot <= head_dim
  RopeMode mode = RopeMode::Norm;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  float attn_factor = 1.0f;
  const Tensor* freq_factors = nullptr;  // F32 {n_rot/2} on the device, or null; theta_i is DIVIDED by it
};

// One layer of the paged KV cache. k = {head_dim_k, n_kv_head, block_size, n_blocks},
// v = {head_dim_v, n_kv_head, block_size, n_blocks}, both contiguous, dtype F32, F16 or BF16 (k and v may
// differ). The physical slot of (physical block b, offset o) is b * block_size + o; slot s holds
// k[:, :, s % bs, s / bs].
struct KvLayerView {
  Tensor k;
  Tensor v;
  int block_size = 0;
};

// Metadata of one batch for attention. All tensors are I32 on the device, so a CUDA graph stays valid when
// only their contents change. n_rows = T of the batch (q's ne[2]).
//   positions    {n_rows}: cache position p of each query row (its own K/V were stored at p by kv_store).
//   seq_slot     {n_rows}: sequence s of each row (index into block_tables / seq_lens); s < 0 marks a padding
//                row, whose output is set to 0.
//   block_tables {max_blocks_per_seq, n_seqs} contiguous: logical block -> physical block of each sequence.
//                Cache position j of sequence s lives in slot block_tables[s][j / bs] * bs + j % bs.
//   seq_lens     {n_seqs}: number of cached positions of each sequence, after this batch's kv_store.
//   block_end    {n_rows}: Block mask only (else may be empty, data == nullptr).
//   kv_begin     {n_rows}: optional (data == nullptr when absent): positions j < kv_begin[r] are hidden.
//   explicit_mask F32 {mask_cols, n_rows}: Explicit mask only (else ignored; data may be null; `mask` is
//                the kind, hence the name). Rows may be strided by nb[1] (nb[0] == 4). An ADDITIVE bias: row
//                r's score of position j is scale * q . K_j + explicit_mask[j, r]; a bias of -INFINITY hides
//                the position (finite values or -inf only).
// Cache position j (0 <= j < seq_lens[s]) is visible to row r (sequence s, position p) when
//   Causal:        j <= p
//   Bidirectional: always (every cached position of the sequence)
//   Block:         j < block_end[r]  (causal prefix + bidirectional trailing block: rows of the
//                  trailing block get block_end = end of the block, prefix rows get p + 1)
//   Explicit:      j < mask_cols, and its score gets the bias explicit_mask[j, r] (-inf hides it)
// and, in addition, j > p - sliding_window when sliding_window > 0, and j >= kv_begin[r] when kv_begin is
// given (for windows that are not relative to the row's own position, e.g. diffusion-gemma canvas rows on
// sliding layers see only prompt positions >= P - n_swa + 1). So every row sees a contiguous range [lo, hi)
// of its sequence's positions (for Explicit, minus the positions whose bias is -inf). A row that sees no
// position, or whose every visible score is -inf, gets output 0 (never NaN).
// Evicted blocks: a sliding-window layer may free the blocks that lie wholly before every row's window; their
// block_tables entries are -1. An entry of a block that some row reads (one holding a position of that row's
// [lo, hi)) must be a cache block 0..n_blocks-1; the other entries of blocks b < ceil(seq_lens[s] / bs)
// must be a cache block or -1. The kernels read only the entries of blocks inside the visible ranges (the CPU
// backend checks all of this and throws Error).
struct AttentionBatch {
  MaskKind mask = MaskKind::Causal;
  Tensor positions;
  Tensor seq_slot;
  Tensor block_tables;
  Tensor seq_lens;
  Tensor block_end;
  Tensor kv_begin;
  Tensor explicit_mask;
  int sliding_window = 0;  // 0 = none
  int max_seq_len = 0;     // upper bound of seq_lens in this batch (scratch sizing / kernel choice); > 0
};

// The device-side sampling chain of sample_rows. Tokens are ranked by descending logit, ties by lower token
// id. Per row, in this order (llama.cpp's default order):
//   1. temperature <= 0: greedy, out = first index of the maximum logit; nothing else applies.
//   2. top_k > 0: keep the top_k best-ranked tokens.
//   3. top_p < 1: with p_i = softmax of the kept logits (temperature 1), keep the smallest best-ranked prefix
//      whose probability sum is >= top_p (at least one token).
//   4. min_p > 0: keep the kept tokens with exp(logit - max logit) >= min_p (p_i >= min_p * p_max).
//   5. draw: weights w_i = exp((logit_i - max logit) / temperature) over the kept tokens, W = sum w_i;
//      walking the kept tokens in ASCENDING TOKEN ID order, return the first whose running weight sum exceeds
//      u * W, where u is the row's uniform in [0, 1); the last kept token if rounding leaves none.
// Every step keeps a best-ranked prefix, so the kept set is {v : v ranks at or above a cutoff token}. Drawing
// in id order (not rank order) means no sort is needed unless top_p is on.
struct SamplerParams {
  float temperature = 1.0f;
  int top_k = 0;       // 0 = off
  float top_p = 1.0f;  // 1 = off
  float min_p = 0.0f;  // 0 = off
};

// Upper bounds a session knows at plan time; Ops::reserve() sizes the workspace from them so that no op
// allocates during a step. Calls may use any shape within the bounds. The CPU backend grows its workspace
// when a call exceeds the reserved bounds (so unreserved use still works, at the cost of one allocation); the
// CUDA backend throws Error instead (an allocation would break CUDA graph capture). Reserving again with
// larger bounds grows; it never shrinks.
struct WorkspacePlan {
  int64_t max_rows = 1;         // largest T (rows of x in matmul, rows of any op)
  int64_t max_matmul_in = 0;    // largest ne[0] of a matmul input
  int64_t max_head_dim = 0;     // largest head_dim_k / head_dim_v of attention
  int64_t max_n_head = 0;       // largest number of query heads of attention
  int64_t max_seq_len = 0;      // largest cached length a row of attention sees
  int64_t max_vocab = 0;        // largest ne[0] of sample_rows / diffusion_sample_rows logits
  int64_t max_routed_rows = 0;  // largest k * T of matmul_id (rows x selected experts)
};

// ---- the op table -----------------------------------------------------------------------------------------

class Ops {
 public:
  virtual ~Ops() = default;

  // Sizes the workspace for every shape within plan (see WorkspacePlan).
  virtual void reserve(const WorkspacePlan& plan) = 0;

  // Batch-invariant mode (SessionParams::batch_invariant): while on, every row's result of matmul and
  // attention is bit-identical to what a one-row call would give, whatever the other rows of the call are
  // (a backend picks its per-row kernels for every row count). Speculative verification needs it: the
  // target's n+1 verify rows must give exactly the logits that plain decoding gives row by row. The CPU
  // kernels are batch-invariant already (the default does nothing).
  virtual void set_batch_invariant(bool on) { (void)on; }

  // y[o, t] = sum_i W[i, o] * x[i, t].  W {in, out} of dtype F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K or Q6_K
  // (in a multiple of the block size; W rows may be strided by nb[1]); x F32 {in, T}; y F32 {out, T}.
  // Quantized weights use an integer dot product against x quantized to 8 bits per 32 (Q8_0/Q4_0) or 256 (K
  // types) values, as ggml does: each x value is rounded to a multiple of d = max|x over its block| / 127, so
  // |y - exact product with the dequantized W| <= sum_i |W[i, o]| * d(i) / 2 (plus f32 rounding); on typical
  // data about 0.3-1% of the rms of y. F32/F16/BF16 weights are multiplied in f32 with f32 accumulation.
  virtual void matmul(Stream& s, const Tensor& W, const Tensor& x, const Tensor& y) = 0;

  // ---- fused products for decode (defaults in fused_ops.cpp are compositions of the ops here, and are the
  // reference a backend's fused kernel is tested against). A backend overrides them to do the work in one
  // launch; ForwardingOps does not forward them, so a wrapper that changes matmul (RowSplitOps) gets the
  // composition over its own matmul.
  // y[i] = W[i] x for 1..3 weights of one input x (Q/K/V): shapes as matmul, all W of one dtype.
  virtual void matmul_multi(Stream& s, std::span<const Tensor> W, const Tensor& x, std::span<const Tensor> y);
  // out = silu(W_gate x) * (W_up x), out F32 {n_ff, T}. gate and up are F32 {n_ff, T} scratch the composition
  // writes (a fused backend need not).
  virtual void matmul_swiglu(Stream& s, const Tensor& W_gate, const Tensor& W_up, const Tensor& x,
                             const Tensor& gate, const Tensor& up, const Tensor& out);
  // h = rms_norm(x, norm, eps), then matmul_multi(W, h, y) / matmul_swiglu(W_gate, W_up, h, gate, up, out):
  // the norm before Q/K/V and before gate/up. h is F32 scratch shaped as x that the composition writes (a
  // fused backend computes the norm inside the products and need not).
  virtual void norm_matmul_multi(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                                 std::span<const Tensor> W, std::span<const Tensor> y);
  virtual void norm_matmul_swiglu(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                                  const Tensor& W_gate, const Tensor& W_up, const Tensor& gate,
                                  const Tensor& up, const Tensor& out);
  // The same with GELU-tanh for silu (gemma4): rms_norm, W_gate h -> gate, W_up h -> up, gelu_mul(gate, up, out).
  virtual void norm_matmul_geglu(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                                 const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                                 const Tensor& out);
  // y = y + W x (the residual stream updated in place: add(y, W x, y)). tmp: F32 {out, T} scratch the
  // composition writes the product to (a fused backend need not). x must not overlap y.
  virtual void matmul_add(Stream& s, const Tensor& W, const Tensor& x, const Tensor& tmp, const Tensor& y);
  // A SwiGLU FFN added to the residual: norm_matmul_swiglu(x, norm, eps, h, W_gate, W_up, gate, up, act), then
  // matmul_add(W_down, act, tmp, y) (y may be x: the residual stream). A fused backend hands act to the down
  // product already in the form it reads (CUDA, quantized weights: its 8-bit activations, written by the
  // gate/up product), with the same values as the composition here.
  virtual void ffn_swiglu_add(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                              const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                              const Tensor& act, const Tensor& W_down, const Tensor& tmp, const Tensor& y);
  // The attention inputs of a layer: q and k normed per head (rms_norm with q_norm / k_norm, each skipped
  // when null), both roped (rope), v normed per head without a weight when norm_v (gemma4's V norm), then k
  // and v stored at slot_mapping (kv_store). q {hd_k, n_head, T}, k {hd_k, n_kv, T}, v {hd_v, n_kv, T}; q, k
  // (and v when norm_v) are updated in place, as the ops one at a time do.
  virtual void qk_norm_rope_store(Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor* q_norm, const Tensor* k_norm, bool norm_v, float eps,
                                  const Tensor& positions, const RopeParams& rope_params,
                                  const KvLayerView& kv, const Tensor& slot_mapping);
  // A post-normed branch added to the residual stream (gemma4's attention and FFN tails, C.6):
  //   x = (x + rms_norm(y, w, eps)) * out_scale        (the scale skipped when out_scale == 1)
  // x, y F32 of one shape {n, T}; w F32 {n}. y is scratch: the composition norms it in place, a fused backend
  // may leave it as it was.
  virtual void norm_residual_add(Stream& s, const Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                 float out_scale);
  // The tail of gemma4's mixture-of-experts FFN (C.5 steps 7-8, C.6): the experts' outputs combined, the
  // dense and the expert branches each post-normed, summed, normed again and added to the residual stream:
  //   moe = moe_combine(expert_out, weights)          (when expert_out is given; else moe holds the sum)
  //   x = (x + rms_norm(rms_norm(dense, w_dense) + rms_norm(moe, w_moe), w_out)) * out_scale
  // x, dense, moe F32 of one shape {n, T}; expert_out F32 {n, k, T}, weights F32 {k, T} (as moe_combine); the
  // norm weights F32 {n}. dense and moe are scratch (the composition writes its intermediate values into them).
  virtual void moe_residual_add(Stream& s, const Tensor& x, const Tensor& dense, const Tensor& w_dense,
                                const Tensor* expert_out, const Tensor* weights, const Tensor& moe,
                                const Tensor& w_moe, const Tensor& w_out, float eps, float out_scale);
  // gemma4's two norms of a MoE layer's input (C.5 steps 1 and 6), from one reduction of each row of x:
  //   r = rms_norm(x) * r_factor * r_scale    (the router's input: no norm weight, then a factor and a vector)
  //   h = rms_norm(x, h_norm)                 (the experts' input)
  // x, r, h F32 of one shape {n, T}; r_scale, h_norm F32 {n}. The composition: rms_norm, scale, mul, rms_norm.
  virtual void moe_input_norms(Stream& s, const Tensor& x, float eps, float r_factor, const Tensor& r_scale,
                               const Tensor& r, const Tensor& h_norm, const Tensor& h);

  // out[:, t] = table[:, ids[t]] as F32. table {n_embd, n_vocab} of any weight dtype; ids I32 {T} contiguous;
  // out F32 {n_embd, T}. ids out of [0, n_vocab) throw Error on CPU.
  virtual void get_rows(Stream& s, const Tensor& table, const Tensor& ids, const Tensor& out) = 0;

  // Token embedding plus an added embedding, in one pass:
  //   out[:, t] = (ids[t] >= 0 ? table[:, ids[t]] * scale : 0)
  //             + (added && added_ids[t] >= 0 ? added[:, added_ids[t]] : 0)
  // table {n_embd, n_vocab} of any weight dtype (as get_rows); ids I32 {T} contiguous (-1 = no token);
  // added F32 {n_embd, n_added} (rows may be strided) or null; added_ids I32 {T} contiguous (-1 = nothing
  // added; ignored when added is null); out F32 {n_embd, T}. ids >= n_vocab, ids < -1, added_ids >= n_added
  // or < -1 throw Error on CPU. A row with neither gets zeros. With scale == 1 and no added row the result
  // equals get_rows bit for bit. The arithmetic is the f32 product value * scale, then the f32 sum with the
  // added value, in that order and never fused, on every backend (so CPU and CUDA agree exactly for
  // F32/F16/BF16 tables).
  virtual void embed_rows(Stream& s, const Tensor& table, const Tensor& ids, float scale, const Tensor* added,
                          const Tensor* added_ids, const Tensor& out) = 0;

  // For every row (ne[0] values) of x: out = x / sqrt(mean(x^2) + eps) * weight. weight F32 {ne[0]} or null
  // (no weight). x, out F32 of the same shape, up to 4 dims ({head_dim, n_head, T} gives a per-head norm).
  // In place ok (out == x).
  virtual void rms_norm(Stream& s, const Tensor& x, const Tensor* weight, float eps, const Tensor& out) = 0;

  // Rotary embedding in place on x F32 {head_dim, n_head, T} (RopeParams has the formula); positions I32 {T}
  // contiguous: the position of each row t.
  virtual void rope(Stream& s, const Tensor& x, const Tensor& positions, const RopeParams& p) = 0;

  // Writes K/V rows into the cache: for each t with slot_mapping[t] >= 0, k[:, :, t] goes to physical slot
  // slot_mapping[t] of kv.k (converted to its dtype), likewise v. k F32 {hd_k, n_kv_head, T}, v F32
  // {hd_v, n_kv_head, T}; slot_mapping I32 {T} contiguous; slot_mapping[t] < 0 skips row t (padding).
  virtual void kv_store(Stream& s, const KvLayerView& kv, const Tensor& k, const Tensor& v,
                        const Tensor& slot_mapping) = 0;

  // out[:, h, r] = sum_j softmax_j(scale * q[:, h, r] . K_j) * V_j over the cache positions j visible to row
  // r (AttentionBatch), reading K/V head h / (n_head / n_kv_head) (GQA, n_head a multiple of n_kv_head; K/V
  // are never repeated in memory). q F32 {hd_k, n_head, T}; out F32 {hd_v, n_head, T}; scores in f32 with an
  // online softmax (no T x seq_len score matrix). With MaskKind::Explicit each score also gets its bias
  // (AttentionBatch::explicit_mask).
  virtual void attention(Stream& s, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch,
                         float scale, const Tensor& out) = 0;
  // attention(q, kv, batch, scale, out), then matmul_add(W_o, out_rows, tmp, y): a layer's attention and its
  // output projection added to the residual stream. out_rows is out viewed as {n_head * hd_v, T} (the same
  // memory). A fused backend hands the attention output to the product already in the form the product reads
  // (CUDA, quantized weights: its 8-bit activations, without a separate quantization launch), with the same
  // values as the composition here.
  virtual void attention_project_add(Stream& s, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch,
                                     float scale, const Tensor& out, const Tensor& out_rows, const Tensor& W_o,
                                     const Tensor& tmp, const Tensor& y);

  // out = silu(gate) * up (SwiGLU), silu(x) = x / (1 + exp(-x)). gate, up, out F32 of the same shape.
  virtual void silu_mul(Stream& s, const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // out = gelu(gate) * up (GeGLU) with the tanh approximation
  // gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). gate, up, out F32 of the same shape.
  // Both: elementwise, in place ok (out == gate or out == up).
  virtual void gelu_mul(Stream& s, const Tensor& gate, const Tensor& up, const Tensor& out) = 0;

  // out = a + b and out = a * b elementwise, F32. b has a's shape, or one row ({ne[0]}, broadcast over every
  // row of a). In place ok (out == a).
  virtual void add(Stream& s, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void mul(Stream& s, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out = x * factor, F32. In place ok.
  virtual void scale(Stream& s, const Tensor& x, float factor, const Tensor& out) = 0;
  // out = cap * tanh(x / cap) (logit soft-capping), F32, cap > 0. In place ok.
  virtual void softcap(Stream& s, const Tensor& x, float cap, const Tensor& out) = 0;
  // Every element of out (F32) = value.
  virtual void fill(Stream& s, const Tensor& out, float value) = 0;

  // out = softmax over ne[0] of every row (max-subtracted, f32). x, out F32 of the same shape. In place ok.
  virtual void softmax_rows(Stream& s, const Tensor& x, const Tensor& out) = 0;

  // Elementwise copy between tensors of the same shape: F32 <-> F16 / BF16 conversion (round to nearest
  // even), or any dtype to the same dtype (quantized rows are copied as bytes). Strided views on both sides.
  virtual void copy(Stream& s, const Tensor& src, const Tensor& dst) = 0;

  // out[t] = first index of the maximum of logits[:, t]. logits F32 {V, T}; out I32 {T} contiguous.
  virtual void argmax_rows(Stream& s, const Tensor& logits, const Tensor& out) = 0;

  // out[t] = a token drawn from row t of logits with the chain of SamplerParams and the uniform uniforms[t]
  // in [0, 1). logits F32 {V, T}; uniforms F32 {T} contiguous; out I32 {T} contiguous. Deterministic.
  virtual void sample_rows(Stream& s, const Tensor& logits, const SamplerParams& params,
                           const Tensor& uniforms, const Tensor& out) = 0;

  // The per-row reduction of the entropy-bound diffusion sampler (GGUF-ARCH-FACTS D.6 f / D.8). With
  // z = logits[:, t] * inv_temp, m = max z, e_v = exp(z_v - m), Z = sum e_v:
  //   argmax[t]  = first index of the maximum of z;
  //   entropy[t] = ln Z - (sum (z_v - m) e_v) / Z   (= -sum p ln p, natural log);
  //   sampled[t] = first v in vocab order whose running sum of e_v >= uniforms[t] * Z (V - 1 if none).
  // logits F32 {V, T}; uniforms F32 {T}; argmax, sampled I32 {T}; entropy F32 {T}; all outputs contiguous.
  virtual void diffusion_sample_rows(Stream& s, const Tensor& logits, float inv_temp, const Tensor& uniforms,
                                     const Tensor& argmax, const Tensor& entropy, const Tensor& sampled) = 0;

  // ---- mixture of experts (gemma4 MoE, GGUF-ARCH-FACTS C.5) ----
  // The router: per row t of logits F32 {n_expert, T}, p = softmax(logits[:, t]) (f32, max-subtracted);
  // ids[:, t] = the k experts of highest p, best first (ties: the lower index); weights[j, t] = p[ids[j, t]]
  // / max(sum_j p[ids[j, t]], 6.1035e-5) (renormalised over the selected experts), times expert_scale[ids[j,
  // t]] when expert_scale (F32 {n_expert}, contiguous) is given. ids I32 {k, T} contiguous, weights F32 {k,
  // T} contiguous, 1 <= k <= min(n_expert, kMaxMoeTopK). Runs on the device (no host round trip).
  static constexpr int64_t kMaxMoeTopK = 32;
  virtual void moe_route(Stream& s, const Tensor& logits, const Tensor* expert_scale, const Tensor& ids,
                         const Tensor& weights) = 0;

  // The expert matmul over routed rows: y[o, j, t] = sum_i W[i, o, e] * x[i, j', t] with e = ids[j, t] and
  // j' = j (x {in, k, T}) or 0 (x {in, 1, T}: every selected expert reads the row's one input). W {in, out,
  // n_expert} of any matmul dtype, rows contiguous, row stride nb[1] and expert stride nb[2] arbitrary (a
  // view of a fused gate_up tensor, a tensor-split slice); ids I32 {k, T} contiguous with values in [0,
  // n_expert) (checked on CPU); y F32 {out, k, T}. Only the selected experts' rows of W are read, in place
  // (never dequantised as a whole); rows routed to one expert are multiplied together (one GEMM per expert
  // over its rows). Quantized W: as matmul (x quantized to 8 bits per block on CPU; the same error bound).
  virtual void matmul_id(Stream& s, const Tensor& W, const Tensor& x, const Tensor& ids, const Tensor& y) = 0;

  // The gated expert products of a GeGLU MoE FFN: matmul_id(W_gate, x, ids, gate), matmul_id(W_up, x, ids, up),
  // then out = gelu_mul(gate, up). Shapes as matmul_id (W_gate and W_up alike); gate and up F32 {n_ff, k, T}
  // scratch the composition writes (a fused backend need not); out F32 {n_ff, k, T}, may be gate.
  virtual void matmul_id_geglu(Stream& s, const Tensor& W_gate, const Tensor& W_up, const Tensor& x,
                               const Tensor& ids, const Tensor& gate, const Tensor& up, const Tensor& out);

  // out[:, t] = sum_j weights[j, t] * y[:, j, t] (the weighted sum over a row's selected experts, j in
  // order, f32). y F32 {n, k, T}; weights F32 {k, T} contiguous; out F32 {n, T}.
  virtual void moe_combine(Stream& s, const Tensor& y, const Tensor& weights, const Tensor& out) = 0;
};

// ---- devices ----------------------------------------------------------------------------------------------

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceId id() const = 0;
  virtual std::string name() const = 0;  // e.g. "cpu:0 (2 threads, avx2+fma)", "cuda:0 NVIDIA H100 80GB HBM3"
  virtual size_t total_memory() const = 0;
  virtual size_t free_memory() const = 0;

  // Device memory of `bytes` bytes (64-byte aligned at least). Throws Error when out of memory.
  virtual Buffer allocate(size_t bytes) = 0;
  // Host memory suited for fast copies to and from this device (pinned on CUDA, plain on CPU).
  virtual Buffer allocate_host(size_t bytes) = 0;

  virtual Stream& default_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // Blocks until all work on all streams of this device has finished.
  virtual void synchronize() = 0;

  // Asynchronous copies on `stream` (the host memory must stay valid until the stream reaches the copy; on
  // CPU they are synchronous).
  virtual void copy_from_host(Stream& stream, void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(Stream& stream, void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_device_to_device(Stream& stream, void* dst, const void* src, size_t bytes) = 0;
  // Copies `height` rows of `width_bytes` bytes: row i from src + i * src_pitch to dst + i * dst_pitch
  // (scatter/gather of tensor shards). kind says which side is host memory.
  virtual void copy_2d(Stream& stream, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                       size_t width_bytes, size_t height, CopyKind kind) = 0;
  // Copies from memory of this device to memory of dst_dev, a device of the same kind (CUDA: a peer copy,
  // which the driver stages when P2P is off), ordered on `stream` (a stream of this device).
  virtual void copy_to_peer(Stream& stream, void* dst, Device& dst_dev, const void* src, size_t bytes) = 0;

  virtual Ops& ops() = 0;

  // Runs `body`, which enqueues work on `stream`, as a replay of a recording of it (a CUDA graph): the first
  // call with a key records body's work and replays it, later calls with the key only replay. The caller
  // guarantees that every call with the same key enqueues the same work on the same memory: only the contents
  // of device tensors (token ids, positions, block tables, lengths) may differ between calls. Devices without
  // recordings (the CPU) just run body. A device drops its recordings when its Ops workspace is reallocated.
  virtual void run_recorded(Stream& stream, uint64_t key, const std::function<void(Stream&)>& body) {
    (void)key;
    body(stream);
  }

  // The same for work that spans several streams (a tensor split's ranks, a row split's peers): `body`
  // enqueues on `origin` (a stream of this device) and on `joined` (streams of `devices`, possibly other
  // host threads enqueueing on them while body runs), ordering them with events; one recording covers all of
  // it and a replay is one launch on `origin`. Before and after, every stream waits for every other (on the
  // device, not the host), so work enqueued on any of them before the call happens before the body and work
  // enqueued after it sees the body's results — also when body runs directly. Events the body records are
  // therefore only meaningful within one call (see Comm::new_epoch). Recordings are dropped when the Ops
  // workspace of this device or of any of `devices` is reallocated. The default runs body directly.
  virtual void run_recorded_across(Stream& origin, uint64_t key, std::span<Device* const> devices,
                                   std::span<Stream* const> joined, const std::function<void()>& body) {
    (void)origin;
    (void)key;
    (void)devices;
    (void)joined;
    body();
  }
};

// Creates the device `id` (cpu:N, or cuda:N when built with CUDA). Throws Error for a device that does not
// exist or a CUDA device in a build without CUDA.
std::unique_ptr<Device> create_device(DeviceId id, const DeviceOptions& options = {});

// Number of devices of a kind visible to this process (CPU: 1, any cpu:N index is accepted by create_device).
int device_count(DeviceKind kind);

// Copies bytes from memory of src_dev to memory of dst_dev, ordered on `stream`: a stream of the CUDA device
// involved (of src_dev when both are CUDA devices; any stream when both are CPU devices). Same kind:
// src_dev.copy_to_peer; CPU <-> CUDA: the CUDA device's copy_to_host / copy_from_host.
void copy_between_devices(Stream& stream, Device& dst_dev, void* dst, Device& src_dev, const void* src,
                          size_t bytes);

// Lets every pair of distinct GPUs among `devices` read and write each other's memory directly where the
// hardware allows (NVLink or PCIe peer-to-peer), so copy_to_peer and kernels on peer pointers skip the host.
// Pairs that cannot are left alone (their peer copies are staged by the driver). CPU devices and a GPU listed
// twice are ignored. Returns the number of directed pairs enabled.
int enable_peer_access(std::span<Device* const> devices);

// Factories of the implementations (create_device dispatches to them). The CUDA ones are defined in
// src/backend/cuda/ and exist only when TANDEM_HAVE_CUDA is defined.
std::unique_ptr<Device> create_cpu_device(int index, const DeviceOptions& options);
#if defined(TANDEM_HAVE_CUDA)
std::unique_ptr<Device> create_cuda_device(int index, const DeviceOptions& options);
int cuda_device_count();
int cuda_enable_peer_access(const std::vector<int>& gpus);
#endif

}  // namespace tandem
