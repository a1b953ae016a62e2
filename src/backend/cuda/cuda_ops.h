// CudaOps: the Ops table on one CUDA device. Checks every argument on the host (same rules and messages as
// the CPU backend), then enqueues the kernels of src/backend/cuda on the op's stream. Scratch memory is one
// workspace sized by reserve(); no op allocates, so a decode step can be captured in a CUDA graph.
//
// matmul picks its path by the number of rows T of x (thresholds measured on an H100, bench/NOTES-cuda.md):
//   F32/F16/BF16 weights: T <= kDenseGemvMaxRows -> matrix-vector kernel (weights streamed once with 16-byte
//     loads, 82-91% of the copy bandwidth at T = 1); larger T -> cuBLASLt on tensor cores (x converted to the
//     weight's 16-bit type; F32 in F32): at T = 8 the matrix-vector kernel reads x 8 times per weight and is
//     3x slower than cuBLASLt, which runs T = 32 in 1.25x the T = 1 time.
//   block-quantized weights: T <= kQuantGemvMaxRows -> x quantized to 8 bits + integer-dot-product kernel;
//     larger T -> weights dequantized to bf16 in chunks of rows into the workspace, then cuBLASLt.
// attention: T >= max(kPrefillMinRows, 2 x sequences of the block table) with F16/BF16 caches -> tensor-core
// flash attention; otherwise split-K flash decoding (rows in chunks that fit the reserved workspace).
// Batch-invariant mode (set_batch_invariant) takes the matrix-vector and split-K paths for every T.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "backend/backend.h"
#include "backend/cuda/gemm_lt.h"

namespace tandem::cuda {

// Dense T <= 8 stays on the matrix-vector kernel (it was 1: cuBLASLt from T = 2) so that a row's result does
// not depend on how many rows came with it: speculative verify compares its rows with plain decode.
constexpr int64_t kDenseGemvMaxRows = 8;
constexpr int64_t kQuantGemvMaxRows = 8;
constexpr int64_t kPrefillMinRows = 64;
constexpr int64_t kDecodeRowChunk = 64;   // rows per split-K attention launch
constexpr int64_t kMoeGemvMaxSlots = 64;  // matmul_id: up to this many routed rows -> one matrix-vector
                                          // product per routed row; more -> the grouped GEMM
constexpr size_t kDequantChunkElems = 64u << 20;  // bf16 weights dequantized per cuBLASLt call (128 MiB): one
                                                  // call covers every matrix of an 8B model but its head
constexpr size_t kLtWorkspaceBytes = 32u << 20;

class CudaOps final : public Ops {
 public:
  explicit CudaOps(int device_index);
  ~CudaOps() override;

  void reserve(const WorkspacePlan& plan) override;
  void set_batch_invariant(bool on) override { batch_invariant_ = on; }
  size_t workspace_bytes() const { return ws_bytes_; }
  // Incremented whenever the workspace moves (recorded graphs that point into it become invalid).
  uint64_t workspace_generation() const { return ws_generation_; }

  void matmul(Stream&, const Tensor& W, const Tensor& x, const Tensor& y) override;
  void matmul_multi(Stream&, std::span<const Tensor> W, const Tensor& x, std::span<const Tensor> y) override;
  void matmul_swiglu(Stream&, const Tensor& W_gate, const Tensor& W_up, const Tensor& x, const Tensor& gate,
                     const Tensor& up, const Tensor& out) override;
  void norm_matmul_multi(Stream&, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                         std::span<const Tensor> W, std::span<const Tensor> y) override;
  void norm_matmul_swiglu(Stream&, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                          const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                          const Tensor& out) override;
  void norm_matmul_geglu(Stream&, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                         const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                         const Tensor& out) override;
  void matmul_add(Stream&, const Tensor& W, const Tensor& x, const Tensor& tmp, const Tensor& y) override;
  void qk_norm_rope_store(Stream&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* q_norm,
                          const Tensor* k_norm, bool norm_v, float eps, const Tensor& positions,
                          const RopeParams& rope_params, const KvLayerView& kv,
                          const Tensor& slot_mapping) override;
  void norm_residual_add(Stream&, const Tensor& x, const Tensor& y, const Tensor& w, float eps,
                         float out_scale) override;
  void moe_residual_add(Stream&, const Tensor& x, const Tensor& dense, const Tensor& w_dense,
                        const Tensor* expert_out, const Tensor* weights, const Tensor& moe, const Tensor& w_moe,
                        const Tensor& w_out, float eps, float out_scale) override;
  void moe_input_norms(Stream&, const Tensor& x, float eps, float r_factor, const Tensor& r_scale, const Tensor& r,
                       const Tensor& h_norm, const Tensor& h) override;
  void matmul_id_geglu(Stream&, const Tensor& W_gate, const Tensor& W_up, const Tensor& x, const Tensor& ids,
                       const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void get_rows(Stream&, const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void embed_rows(Stream&, const Tensor& table, const Tensor& ids, float scale, const Tensor* added,
                  const Tensor* added_ids, const Tensor& out) override;
  void rms_norm(Stream&, const Tensor& x, const Tensor* weight, float eps, const Tensor& out) override;
  void rope(Stream&, const Tensor& x, const Tensor& positions, const RopeParams& p) override;
  void kv_store(Stream&, const KvLayerView& kv, const Tensor& k, const Tensor& v,
                const Tensor& slot_mapping) override;
  void attention(Stream&, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch, float scale,
                 const Tensor& out) override;
  void attention_project_add(Stream&, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch,
                             float scale, const Tensor& out, const Tensor& out_rows, const Tensor& W_o,
                             const Tensor& tmp, const Tensor& y) override;
  void ffn_swiglu_add(Stream&, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                      const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                      const Tensor& act, const Tensor& W_down, const Tensor& tmp, const Tensor& y) override;
  void silu_mul(Stream&, const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void gelu_mul(Stream&, const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void add(Stream&, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void mul(Stream&, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void scale(Stream&, const Tensor& x, float factor, const Tensor& out) override;
  void softcap(Stream&, const Tensor& x, float cap, const Tensor& out) override;
  void fill(Stream&, const Tensor& out, float value) override;
  void softmax_rows(Stream&, const Tensor& x, const Tensor& out) override;
  void copy(Stream&, const Tensor& src, const Tensor& dst) override;
  void argmax_rows(Stream&, const Tensor& logits, const Tensor& out) override;
  void sample_rows(Stream&, const Tensor& logits, const SamplerParams& params, const Tensor& uniforms,
                   const Tensor& out) override;
  void diffusion_sample_rows(Stream&, const Tensor& logits, float inv_temp, const Tensor& uniforms,
                             const Tensor& argmax, const Tensor& entropy, const Tensor& sampled) override;
  void moe_route(Stream&, const Tensor& logits, const Tensor* expert_scale, const Tensor& ids,
                 const Tensor& weights) override;
  void matmul_id(Stream&, const Tensor& W, const Tensor& x, const Tensor& ids, const Tensor& y) override;
  void moe_combine(Stream&, const Tensor& y, const Tensor& weights, const Tensor& out) override;

 private:
  struct Regions {                  // byte offsets into the workspace
    size_t act = 0, act_bytes = 0;  // q8 or 16-bit activations of a matmul
    size_t dequant = 0, dequant_bytes = 0;
    size_t lt = 0, lt_bytes = 0;
    size_t attn = 0, attn_bytes = 0;
    size_t moe = 0, moe_bytes = 0;  // matmul_id's slots grouped by expert: offsets, then the sorted slots
    // ffn_swiglu_add: the gate/up product's outputs quantized for the down product (act is still being read
    // while they are written), and the per-32-output counters of that product (zero between launches).
    size_t act2 = 0, act2_bytes = 0;
    size_t counters = 0, counters_bytes = 0;
    size_t attn_counters = 0, attn_counters_bytes = 0;  // the decode attention's in-place combine (zero too)
    bool operator==(const Regions&) const = default;
  };
  void check_matmul(const Tensor& W, const Tensor& x, const Tensor& y) const;
  // The fused matrix-vector path of matmul_multi / _swiglu / _add: false (nothing enqueued) when it does not
  // apply (T > 8, mixed dtypes, unaligned dense rows), and the caller composes the ops instead.
  // norm (F32 {K} on this device, or null): x is rms-normed first (eps), inside the product or its activation
  // quantization.
  // x_q8 (or null): x's 8-bit image is already there (written by the producer: attention_project_add,
  // ffn_swiglu_add), for one launch of at most kGemvMaxCols columns: no quantization is launched.
  bool fused_gemv(Stream& s, std::span<const Tensor> W, const Tensor& x, std::span<const Tensor> y, int epi,
                  const Tensor* norm = nullptr, float eps = 0.0f, const void* x_q8 = nullptr);
  // attention, its decode path also writing the output's 8-bit image to q8 (the activation region) when q8 is
  // not null.
  void attention_impl(Stream& s, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch, float scale,
                      const Tensor& out, void* q8);
  char* region(size_t offset) const { return static_cast<char*>(ws_) + offset; }
  void need(size_t have, size_t want, const char* what) const;

  int index_;
  // Batch-invariant mode (Ops::set_batch_invariant): matmul runs the matrix-vector kernels for every row
  // count (in chunks of their column limit; each column's accumulation order does not depend on the other
  // columns) and attention runs split-K decoding for every row count (its splits are fixed cache ranges,
  // combined in split order, so a row's result does not depend on the batch either).
  bool batch_invariant_ = false;
  LtGemm gemm_;
  WorkspacePlan plan_{};
  Regions regions_{};
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  uint64_t ws_generation_ = 0;
};

}  // namespace tandem::cuda
