// Launch functions of the CUDA kernels: plain C++ (no CUDA syntax), so that cuda_ops.cpp and tests can call
// them. Shapes are checked by the caller (CudaOps); these functions only enqueue work on `stream` and throw
// tandem::Error when a launch fails. Tensors are views whose data is device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "backend/backend.h"
#include "core/tensor.h"

namespace tandem::cuda {

// ---- elementwise and row ops (elementwise.cu) -------------------------------------------------------------
void launch_rms_norm(const Tensor& x, const float* weight, float eps, const Tensor& out, cudaStream_t stream);
// Ops::norm_residual_add (moe == nullptr) and Ops::moe_residual_add in one launch, one block per row
// (post_norm.cu): x = (x + rms_norm(y, w_out)) * out_scale with y = dense, or y = rms_norm(dense, w_dense) +
// rms_norm(moe, w_moe), moe first written as moe_combine(expert_out, weights) when expert_out is given. Bitwise
// the composition's values (the same reductions as launch_rms_norm, the same sum as moe_combine).
void launch_post_norm_residual(const Tensor& x, const Tensor& dense, const float* w_dense, const Tensor* expert_out,
                               const float* weights, const Tensor* moe, const float* w_moe, const float* w_out,
                               float eps, float out_scale, cudaStream_t stream);
// Ops::moe_input_norms in one launch (post_norm.cu): r = rms_norm(x) * r_factor * r_scale, h = rms_norm(x,
// h_norm), bitwise the composition's.
void launch_moe_input_norms(const Tensor& x, float eps, float r_factor, const float* r_scale, const Tensor& r,
                            const float* h_norm, const Tensor& h, cudaStream_t stream);
void set_norm_regs(std::optional<bool> on);  // tests: forces TANDEM_NORM_REGS (post_norm.cu)
void set_moe_tail(std::optional<bool> on);   // tests: forces TANDEM_MOE_TAIL (post_norm.cu)
void launch_rope(const Tensor& x, const int32_t* positions, const RopeParams& p, const float* freq_factors,
                 cudaStream_t stream);
enum class GluKind { Silu, Gelu };
void launch_glu(GluKind kind, const Tensor& gate, const Tensor& up, const Tensor& out, cudaStream_t stream);
enum class BinaryKind { Add, Mul };
void launch_binary(BinaryKind kind, const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t stream);
enum class UnaryKind { Scale, Softcap, Fill };
void launch_unary(UnaryKind kind, const Tensor& x, float value, const Tensor& out, cudaStream_t stream);
void launch_softmax_rows(const Tensor& x, const Tensor& out, cudaStream_t stream);
// src and dst of the same shape: F32/F16/BF16 conversions, or the same dtype (rows copied as bytes).
void launch_copy(const Tensor& src, const Tensor& dst, cudaStream_t stream);
void launch_kv_store(const KvLayerView& kv, const Tensor& k, const Tensor& v, const int32_t* slot_mapping,
                     cudaStream_t stream);
// Ops::qk_norm_rope_store in one launch (attn_inputs.cu): q {hd_k, n_head, T} and k {hd_k, n_kv, T} normed
// per head (when q_norm / k_norm are given) and roped in place, v {hd_v, n_kv, T} normed without a weight in
// place when norm_v, k and v stored at slot_mapping.
void launch_attn_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const float* q_norm,
                        const float* k_norm, bool norm_v, float eps, const int32_t* positions, const RopeParams& p,
                        const float* freq_factors, const KvLayerView& kv, const int32_t* slot_mapping,
                        cudaStream_t stream);
// out[:, t] = table row ids[t] as F32, for any table dtype.
void launch_get_rows(const Tensor& table, const int32_t* ids, const Tensor& out, cudaStream_t stream);
// Ops::embed_rows in one launch: out[:, t] = (ids[t] >= 0 ? table row ids[t] * scale : 0)
// + (added && added_ids[t] >= 0 ? added row added_ids[t] : 0). added is F32 {n_embd, n_added} or null.
void launch_embed_rows(const Tensor& table, const int32_t* ids, float scale, const Tensor* added,
                       const int32_t* added_ids, const Tensor& out, cudaStream_t stream);

// ---- matrix-vector products for decode (gemv_dense.cu, gemv_quant.cu) -------------------------------------
// y[o, t] = sum_i W[i, o] x[i, t] for W F32/F16/BF16 {K, N} with row stride w_ld bytes, x F32 columns of x_ld
// floats, y columns of y_ld floats, t < T (any T; fastest for T <= kGemvMaxCols).
constexpr int kGemvMaxCols = 8;
void launch_gemv_dense(DType wt, const void* W, size_t w_ld, int64_t K, int64_t N, const float* x,
                       int64_t x_ld, int64_t T, float* y, int64_t y_ld, cudaStream_t stream);

// 8-bit activations for the integer dot products: per 32 values of a column, int8 q and (d, d * sum q) with
// x ~= d * q. xq is T columns of K bytes, xds T columns of K/32 float2. K must be a multiple of 32.
size_t q8_activation_bytes(int64_t K, int64_t T);  // bytes of xq + xds (each part 256-byte aligned)
// The layout of those activations in a scratch, for T columns of K values: the int8 values xq [T][K] from the
// start, then the (d, d * sum q) pairs xds [T][K / 32] from this byte offset on. Every kernel that writes or
// reads them (launch_quantize_q8, the products, the attention combine, the SwiGLU hand-over) takes it from here.
inline size_t q8_scales_offset(int64_t K, int64_t T) {
  return (size_t(K * T) + 255) & ~size_t(255);
}
void launch_quantize_q8(const float* x, int64_t x_ld, int64_t K, int64_t T, void* scratch,
                        cudaStream_t stream);
// The same after an rms_norm of each column with weights norm (F32 {K}): one block per column (T <= 8 at
// decode), x * inv * norm as rms_norm computes it, then quantized as above (Ops::norm_matmul_*: one launch
// for two).
void launch_quantize_q8_norm(const float* x, int64_t x_ld, int64_t K, int64_t T, const float* norm, float eps,
                             void* scratch, cudaStream_t stream);
// y = W x for a block-quantized W (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) against the activations quantize_q8 wrote
// into scratch. Throws Error if a row of W is too large for the shared-memory staging (K > ~40000 for Q8_0).
void launch_gemv_quant(DType wt, const void* W, size_t w_ld, int64_t K, int64_t N, const void* scratch,
                       int64_t T, float* y, int64_t y_ld, cudaStream_t stream);
bool gemv_quant_supports(DType wt, int64_t K);

// ---- fused decode products (gemv_dense.cu, gemv_quant.cu) -------------------------------------------------
// One launch for up to kGemvMaxSegs weight matrices of one input x (Q/K/V, gate/up): their rows are laid end
// to end over the grid, so x is read once per block and three small launches become one. Epilogues:
//   Store:       y_s = W_s x
//   AddResidual: y_s = r_s + W_s x  (r_s may be y_s: the residual stream updated in place)
//   SwiGlu:      two segments of equal N (gate, up); y_0 = silu(W_0 x) * (W_1 x); y_1 is not written
//   GeGlu:       as SwiGlu with gelu_tanh for silu (gemma4's FFN)
// Every column t < T (<= kGemvMaxCols per launch) is computed by the same code in the same order whatever T
// is, so row t of a T-row call equals the 1-row call on that row bit for bit (speculative verify relies on
// it).
constexpr int kGemvMaxSegs = 3;
enum class GemvEpilogue { Store, AddResidual, SwiGlu, GeGlu };
// The gated forms (two segments: gate and up rows, one output).
template <GemvEpilogue E>
inline constexpr bool kIsGlu = E == GemvEpilogue::SwiGlu || E == GemvEpilogue::GeGlu;
inline bool is_glu(GemvEpilogue e) {
  return e == GemvEpilogue::SwiGlu || e == GemvEpilogue::GeGlu;
}
struct GemvSeg {
  const void* W = nullptr;
  size_t w_ld = 0;  // bytes between rows of W
  int64_t N = 0;
  float* y = nullptr;
  int64_t y_ld = 0;          // floats between columns of y
  const float* r = nullptr;  // AddResidual only
  int64_t r_ld = 0;
};
struct GemvArgs {
  DType wt = DType::F32;
  int64_t K = 0;
  const float* x = nullptr;  // dense: F32 columns of x_ld floats (quantized: unused, the q8 scratch is read)
  int64_t x_ld = 0;
  int64_t T = 0;
  int n_seg = 0;
  GemvSeg seg[kGemvMaxSegs];
  GemvEpilogue epi = GemvEpilogue::Store;
  // Dense only: x is first rms-normed with these weights (F32 {K}): y = (W (x * norm)) / sqrt(mean(x^2) +
  // eps), the mean taken by each warp over the whole column of x it reads anyway (Ops::norm_matmul_multi).
  const float* norm = nullptr;
  float eps = 0.0f;
  // Quantized SwiGlu only (the direct kernel): the outputs (segment 0's y) also quantized to 8 bits per 32
  // values for the next product, in launch_quantize_q8's layout for K = N values and T columns, by the warp that
  // completes each group of 32 outputs (q8_count: N / 32 counters, zero before the launch and left zero).
  int8_t* q8_xq = nullptr;
  float2* q8_xds = nullptr;
  int* q8_count = nullptr;
};
// Columns t0, t0 + 1, ... of a product as a product of its own: x (read by the dense kernels), each segment's y
// and r offset by t0 columns (T unchanged: the caller says how many columns it launches).
inline GemvArgs gemv_columns(const GemvArgs& a, int64_t t0) {
  GemvArgs c = a;
  c.x = a.x ? a.x + t0 * a.x_ld : nullptr;
  for (int s = 0; s < a.n_seg; ++s) {
    c.seg[s].y = a.seg[s].y ? a.seg[s].y + t0 * a.seg[s].y_ld : nullptr;
    c.seg[s].r = a.seg[s].r ? a.seg[s].r + t0 * a.seg[s].r_ld : nullptr;
  }
  return c;
}
// Dense weights: whether the 16-byte path applies to every segment (alignment of W, rows, x; K a multiple of
// the elements per 16 bytes). The fused ops fall back to one op at a time when it does not.
bool gemv_dense_fusable(const GemvArgs& a);
void launch_gemv_dense_fused(const GemvArgs& a, cudaStream_t stream);
// Quantized weights, against the activations launch_quantize_q8 wrote into scratch (all segments one dtype).
void launch_gemv_quant_fused(const GemvArgs& a, const void* scratch, cudaStream_t stream);
// Q8_0 / Q4_K / Q5_K with 16-byte aligned rows of K % 256 == 0 values, read straight into registers
// (gemv_quant_direct.cu); the fused launch above takes this path when it applies (TANDEM_NO_QUANT_DIRECT=1
// turns it off).
bool gemv_quant_direct_supports(const GemvArgs& a);
void launch_gemv_quant_direct(const GemvArgs& a, const void* scratch, cudaStream_t stream);
// Q8_0 products of kQ8MmaMinCols or more columns (up to kQ8MmaMaxCols a launch) on the tensor cores
// (gemv_quant_mma.cu): every (row, column) sum bit for bit the direct kernel's one-column sum, the weights read
// once for all the columns. Applies where the direct kernel does (TANDEM_Q8_MMA=0 turns it off);
// launch_gemv_quant_fused takes it then. Measured on an H100 (Qwen3-8B shape, bench/BENCHMARKS.md, fourteenth
// session): 4 columns slower than the direct kernel (694 vs 798 t/s), 8 even, 16 twice as fast.
constexpr int kQ8MmaMinCols = 8;
constexpr int kQ8MmaMaxCols = 16;
bool gemv_q8_mma_applies(const GemvArgs& a);
void launch_gemv_q8_mma(const GemvArgs& a, const void* scratch, cudaStream_t stream);
void set_q8_mma(std::optional<bool> on);  // tests: forces TANDEM_Q8_MMA (nullopt: back to the environment)
// The same kernel for 17..kQ8WideMaxCols columns of a plain product (one segment, Store) that need not be
// batch-invariant, in one launch: one accumulator a warp, so each column's value does not depend on the others
// but is not the direct kernel's (on since the fifteenth session's H100 run: GpuQ8Mma and the whole GPU test
// binary with it; Qwen3-8B-shape Q8_0 decode of 32 sequences 1789 -> 2255 t/s; TANDEM_Q8_MMA_WIDE=0 turns it
// off). Past kQ8WideMaxCols (and where it does not apply) such products dequantize the weights for cuBLAS
// (CudaOps::matmul): at 64 columns that was faster (3359 t/s against 1941 with the wide kernel).
constexpr int kQ8WideMaxCols = 32;
bool gemv_q8_mma_wide_applies(const GemvArgs& a);
void launch_gemv_q8_mma_wide(const GemvArgs& a, const void* scratch, cudaStream_t stream);
void set_q8_mma_wide(std::optional<bool> on);

// ---- dequantization and conversion for the tensor-core path (dequant.cu) ----------------------------------
// n_rows rows of K values of W (any weight dtype, row stride w_ld bytes) -> bf16 (or f16 when to_f16), dense
// with row stride K elements.
void launch_dequantize_rows_16(DType wt, const void* W, size_t w_ld, int64_t K, int64_t n_rows, void* out,
                               bool to_f16, cudaStream_t stream);
// T columns of K floats (column stride x_ld) -> dense bf16 / f16 columns of K.
void launch_f32_to_16(const float* x, int64_t x_ld, int64_t K, int64_t T, void* out, bool to_f16,
                      cudaStream_t stream);

// ---- attention (attention_decode.cu, attention_prefill.cu) ------------------------------------------------
struct AttentionArgs {
  Tensor q;    // F32 {hd_k, n_head, T}
  Tensor out;  // F32 {hd_v, n_head, T}
  KvLayerView kv;
  MaskKind mask = MaskKind::Causal;
  const int32_t* positions = nullptr;
  const int32_t* seq_slot = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;
  const int32_t* block_end = nullptr;
  const int32_t* kv_begin = nullptr;
  const float* explicit_mask = nullptr;  // Explicit only: row r's biases at explicit_mask + r * mask_stride
  int64_t mask_stride = 0;               // floats between rows of explicit_mask
  int mask_cols = 0;
  int sliding_window = 0;
  int max_seq_len = 0;
  float scale = 1.0f;
};
// Split-K flash decoding: any T, any head dims; partial results go to `partials`
// (attention_decode_scratch_bytes).
constexpr int kDecodeSplit = 256;  // cache positions per split
size_t attention_decode_scratch_bytes(int64_t T, int64_t n_head, int64_t hd_v, int64_t max_seq_len);
// xq / xds (both or neither): the output also quantized to 8 bits per 32 values, launch_quantize_q8's layout
// for K = n_head * hd_v values and T rows (xq at the scratch's start, xds after align256(K * T) bytes); needs
// hd_v % 32 == 0 and a contiguous out. Ops::attention_project_add hands them to the output projection.
// counters (n_counters >= attention_decode_counters(T, n_head) ints, zero, left zero): the splits are combined
// in the split kernel by each group's last block (TANDEM_ATTN_FUSED_COMBINE), not by a second launch.
size_t attention_decode_counters(int64_t T, int64_t n_head);
void launch_attention_decode(const AttentionArgs& a, void* partials, size_t partials_bytes, cudaStream_t stream,
                             int8_t* xq = nullptr, float2* xds = nullptr, int* counters = nullptr,
                             size_t n_counters = 0);
void set_attn_fused_combine(std::optional<bool> on);  // tests: TANDEM_ATTN_FUSED_COMBINE (attention_decode.cu)
// Tensor-core flash attention for many rows (prefill); needs F16/BF16 K and V with equal head dims, a
// multiple of 16 and <= 256. attention_prefill_supported says whether it applies.
bool attention_prefill_supported(const AttentionArgs& a);
void launch_attention_prefill(const AttentionArgs& a, cudaStream_t stream);

// ---- mixture of experts (moe.cu, and the id variants of the matrix-vector kernels)
// --------------------------- Ops::moe_route: logits F32 {n_expert, T}; ids / weights dense {k, T};
// expert_scale {n_expert} or null.
void launch_moe_route(const Tensor& logits, const float* expert_scale, int32_t* ids, float* weights, int k,
                      cudaStream_t stream);
// Ops::moe_combine: y F32 {n, k, T}, weights dense {k, T}, out F32 {n, T}.
void launch_moe_combine(const Tensor& y, const float* weights, const Tensor& out, cudaStream_t stream);
// Ops::matmul_id by the f32 grouped GEMM (any number of routed rows and weight type; weights decoded tile by
// tile in f32): F32 weights, and the fallback where launch_moe_gemm_tc does not apply.
void launch_moe_gemm(const Tensor& W, const Tensor& x, const int32_t* ids, const Tensor& y,
                     cudaStream_t stream);
// Ops::matmul_id by tensor cores for many routed rows (moe_gemm_tc.cu): launch_moe_group sorts the slots
// (s = j + k t) by expert into offsets {n_expert + 1} and sorted {n_slots} (device scratch; n_expert <=
// kMoeGroupMaxExperts), then launch_moe_gemm_tc multiplies each expert's rows with its weights (F16/BF16 read
// as they are, Q8_0/Q4_0/Q4_K/Q5_K/Q6_K decoded tile by tile to bf16; activations rounded to the 16-bit
// type). moe_gemm_tc_supports: the weight type, K % 32 == 0, the expert count and 16-byte aligned 16-bit
// rows.
constexpr int64_t kMoeGroupMaxExperts = 4096;
bool moe_gemm_tc_supports(const Tensor& W);
void launch_moe_group(const int32_t* ids, int64_t n_slots, int64_t n_expert, int32_t* offsets,
                      int32_t* sorted, cudaStream_t stream);
void launch_moe_gemm_tc(const Tensor& W, const Tensor& x, const int32_t* offsets, const int32_t* sorted,
                        const Tensor& y, cudaStream_t stream);
// The same product for F16/BF16 weights with the tiles streamed by cp.async in a four-stage pipeline
// (moe_gemm_pipelined.cu; TANDEM_MOE_PIPELINE=1): bit for bit launch_moe_gemm_tc's result.
// moe_gemm_pipelined_supports: 16-bit weights, K % 32 == 0, 16-byte aligned rows of W and of the f32 x.
bool moe_gemm_pipelined_supports(const Tensor& W, const Tensor& x);
void launch_moe_gemm_pipelined(const Tensor& W, const Tensor& x, const int32_t* offsets, const int32_t* sorted,
                               const Tensor& y, cudaStream_t stream);
// Tests: forces TANDEM_MOE_PIPELINE (nullopt: back to the environment).
void set_moe_pipeline(std::optional<bool> on);
// Tests: forces TANDEM_WIDE_ROWS (elementwise.cu; nullopt: back to the environment).
void set_wide_rows(std::optional<bool> on);
// Ops::matmul_id for few routed rows: one matrix-vector product per routed row (slot s = j + k t) over only
// the selected expert's rows: W + ids[s] * w_es. x column of slot s: (s / k) * kx + (kx == 1 ? 0 : s % k);
// y column s at y + s * y_ld (y dense). Quantized: x columns quantized by launch_quantize_q8 into scratch.
void launch_gemv_quant_id(DType wt, const void* W, size_t w_ld, size_t w_es, int64_t K, int64_t N,
                          const void* scratch, const int32_t* ids, int64_t n_slots, int k, int kx, float* y,
                          int64_t y_ld, cudaStream_t stream);
// Q8_0 / Q4_K / Q5_K rows of K % 256 == 0 values, 16-byte aligned, can take a direct kernel (gemv_id.cu): on
// unless TANDEM_ID_DIRECT=0; tests set it here (nullopt: the environment again).
void set_gemv_id_direct(std::optional<bool> on);
// CudaOps::ffn_swiglu_add's q8 hand-over from the gate/up product to down (off by default: TANDEM_SWIGLU_Q8=1;
// cuda_ops.cpp says why); tests set it here (nullopt: the environment again).
void set_ffn_swiglu_q8(std::optional<bool> on);
// Tests: forces TANDEM_ROW_FUSION (gemma4's fused row-norm kernels; cuda_ops.cpp) on or off (nullopt: the
// environment's value), and TANDEM_FLASH_HD512 (the tensor-core attention for head dims 257..512;
// attention_prefill.cu).
void set_row_fusion(std::optional<bool> on);
void set_flash_hd512(std::optional<bool> on);
void set_attn_head_split(std::optional<bool> on);  // tests: TANDEM_ATTN_HEAD_SPLIT (attention_decode.cu)
int attention_head_split_for(int gqa, int64_t hd_k);  // the blocks a GQA group's heads take (1: not split)
void launch_gemv_dense_id(DType wt, const void* W, size_t w_ld, size_t w_es, int64_t K, int64_t N,
                          const float* x, int64_t x_ld, const int32_t* ids, int64_t n_slots, int k, int kx,
                          float* y, int64_t y_ld, cudaStream_t stream);
// Ops::matmul_id_geglu for few routed rows in one launch (gemv_id.cu): y column s = gelu_tanh(W_gate_e x) *
// (W_up_e x) for slot s's expert e, W_gate and W_up of one dtype with the same row and expert strides (the two
// halves of a fused gate_up tensor, or two tensors alike). Dense weights: the 16-byte path (the supports check:
// alignment, K); quantized: the direct kernel's types (Q8_0 / Q4_K / Q5_K) with x in scratch as
// launch_gemv_quant_id reads it.
bool gemv_id_geglu_supports(DType wt, const void* W_gate, const void* W_up, size_t w_ld, size_t w_es, int64_t K,
                            const float* x, int64_t x_ld);
void launch_gemv_id_geglu(DType wt, const void* W_gate, const void* W_up, size_t w_ld, size_t w_es, int64_t K,
                          int64_t N, const float* x, int64_t x_ld, const void* scratch, const int32_t* ids,
                          int64_t n_slots, int k, int kx, float* y, int64_t y_ld, cudaStream_t stream);
// Tests: forces TANDEM_ID_GEGLU (Ops::matmul_id_geglu in one launch at decode; cuda_ops.cpp) and
// TANDEM_GEGLU_EPILOGUE (Ops::norm_matmul_geglu as one fused product with the GeGlu epilogue).
void set_id_geglu(std::optional<bool> on);
void set_geglu_epilogue(std::optional<bool> on);

// ---- sampling (sampling.cu) -------------------------------------------------------------------------------
void launch_argmax_rows(const Tensor& logits, int32_t* out, cudaStream_t stream);
void launch_sample_rows(const Tensor& logits, const SamplerParams& p, const float* uniforms, int32_t* out,
                        cudaStream_t stream);
void launch_diffusion_sample_rows(const Tensor& logits, float inv_temp, const float* uniforms,
                                  int32_t* argmax, float* entropy, int32_t* sampled, cudaStream_t stream);

}  // namespace tandem::cuda
