#include "backend/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/env_switch.h"
#include "backend/op_checks.h"
#include "core/out_of_memory.h"
#include "quant/quant.h"

namespace tandem::cuda {
namespace {

// matmul_id's per-expert offsets {kMoeGroupMaxExperts + 1} at the start of the moe region, 256-byte aligned.
constexpr size_t kMoeOffsetsBytes = (size_t(kMoeGroupMaxExperts + 1) * 4 + 255) / 256 * 256;

// ---- argument checks: the backends' shared rules (backend/op_checks.h) for tensors on this CUDA device
// ------
void check_on_device(const char* op, const char* name, const Tensor& t, int index) {
  op_checks::on_device(op, name, t, DeviceId{DeviceKind::CUDA, index});
}
void check_type(const char* op, const char* name, const Tensor& t, DType type) {
  op_checks::type(op, name, t, type);
}
void check_f32(const char* op, const char* name, const Tensor& t, int index) {
  op_checks::f32(op, name, t, DeviceId{DeviceKind::CUDA, index});
}
void check_i32_vector(const char* op, const char* name, const Tensor& t, int64_t n, int index) {
  op_checks::i32_vector(op, name, t, n, DeviceId{DeviceKind::CUDA, index});
}
void check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                      const Tensor& b) {
  op_checks::same_shape(op, a_name, a, b_name, b);
}
void check_dims(const char* op, const char* name, const Tensor& t, int64_t ne0, int64_t ne1, int64_t ne2 = 1,
                int64_t ne3 = 1) {
  op_checks::dims(op, name, t, ne0, ne1, ne2, ne3);
}
// A norm's eps: finite and >= 0.
void check_eps(const char* op, float eps) {
  check(eps >= 0.0f && std::isfinite(eps), std::string(op) + ": eps must be a finite value >= 0");
}
// A per-value vector of a row of n values (a norm's weights): F32 {n} on this device.
void check_row_vector(const char* op, const char* name, const Tensor& t, int64_t n, int index) {
  check_f32(op, name, t, index);
  check(t.ne[0] == n && t.nrows() == 1,
        std::string(op) + ": " + name + " must be {" + std::to_string(n) + "}, got " + t.shape_string());
}
bool is_float_type(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}
void check_cache(const char* op, const KvLayerView& kv, int index) {
  check_on_device(op, "kv.k", kv.k, index);
  check_on_device(op, "kv.v", kv.v, index);
  check(is_float_type(kv.k.type) && is_float_type(kv.v.type),
        std::string(op) + ": the cache must be f32, f16 or bf16");
  check(kv.k.is_contiguous() && kv.v.is_contiguous(),
        std::string(op) + ": the cache tensors must be contiguous");
  check(kv.block_size == kv.k.ne[2] && kv.block_size > 0, std::string(op) + ": kv.block_size " +
                                                              std::to_string(kv.block_size) +
                                                              " does not match kv.k " + kv.k.shape_string());
  check_dims(op, "kv.v", kv.v, kv.v.ne[0], kv.k.ne[1], kv.k.ne[2], kv.k.ne[3]);
}

// TANDEM_NO_FUSED=1: the fused ops run as their compositions (Ops defaults), to compare or to bisect.
EnvSwitch g_no_fused{"TANDEM_NO_FUSED", false};
bool fused_disabled() {
  return g_no_fused.on();
}

// TANDEM_ROW_FUSION=1: gemma4's fused row-norm kernels (post_norm.cu: norm_residual_add, moe_residual_add,
// moe_input_norms; attn_inputs.cu: qk_norm_rope_store's V norm). On since their GPU tests passed (twelfth
// session, H100); =0: those ops run as their compositions.
EnvSwitch g_row_fusion{"TANDEM_ROW_FUSION", true};
bool row_fusion_off() {
  return fused_disabled() || !g_row_fusion.on();
}

// TANDEM_MOE_PIPELINE=1: matmul_id's grouped GEMM for F16/BF16 experts streams its tiles with cp.async in four
// stages (moe_gemm_pipelined.cu). On since its GPU test passed (twelfth session, H100); =0 keeps moe_gemm_tc.cu.
EnvSwitch g_moe_pipeline{"TANDEM_MOE_PIPELINE", true};

// TANDEM_NO_NORM_FUSION=1: the norm as its own launch before the fused product (to compare or to bisect).
EnvSwitch g_no_norm_fusion{"TANDEM_NO_NORM_FUSION", false};
bool norm_fusion_disabled() {
  return g_no_norm_fusion.on();
}

Tensor rows_view(const Tensor& t, int dim, int64_t first, int64_t count) {
  Tensor v = t;
  v.data = static_cast<char*>(t.data) + first * int64_t(t.nb[dim]);
  v.ne[dim] = count;
  return v;
}

}  // namespace

CudaOps::CudaOps(int device_index) : index_(device_index) {}

CudaOps::~CudaOps() {
  if (ws_) {
    DeviceGuard g(index_);
    cudaDeviceSynchronize();
    cudaFree(ws_);
  }
}

void CudaOps::need(size_t have, size_t want, const char* what) const {
  check(want <= have, std::string("CUDA ops: the workspace has ") + std::to_string(have) + " bytes for " +
                          what + ", this call needs " + std::to_string(want) +
                          "; call Ops::reserve() with bounds covering it before the step");
}

void CudaOps::reserve(const WorkspacePlan& p) {
  check(p.max_rows >= 0 && p.max_matmul_in >= 0 && p.max_head_dim >= 0 && p.max_n_head >= 0 &&
            p.max_seq_len >= 0 && p.max_vocab >= 0,
        "reserve: workspace bounds must be >= 0");
  WorkspacePlan m = plan_;
  m.max_rows = std::max(m.max_rows, p.max_rows);
  m.max_matmul_in = std::max(m.max_matmul_in, p.max_matmul_in);
  m.max_head_dim = std::max(m.max_head_dim, p.max_head_dim);
  m.max_n_head = std::max(m.max_n_head, p.max_n_head);
  m.max_seq_len = std::max(m.max_seq_len, p.max_seq_len);
  m.max_vocab = std::max(m.max_vocab, p.max_vocab);
  m.max_routed_rows = std::max(m.max_routed_rows, p.max_routed_rows);

  auto al = [](size_t n) { return (n + 255) & ~size_t(255); };
  const int64_t rows = std::max<int64_t>(m.max_rows, 1);
  const int64_t k_in = (m.max_matmul_in + 255) / 256 * 256;
  Regions r;
  // (8-bit activations for up to kQ8WideMaxCols columns: what the tensor-core Q8_0 products take in one launch)
  const int64_t q8_cols = std::max<int64_t>({kQuantGemvMaxRows, kQ8MmaMaxCols, kQ8WideMaxCols});
  r.act_bytes =
      al(std::max({q8_activation_bytes(k_in, std::min<int64_t>(rows, q8_cols)),
                   size_t(k_in * rows) * 2,
                   q8_activation_bytes(k_in, std::min(m.max_routed_rows, kMoeGemvMaxSlots))}));
  r.dequant_bytes = m.max_matmul_in > 0 && rows > kQuantGemvMaxRows ? kDequantChunkElems * 2 : 0;
  r.lt_bytes = rows > kDenseGemvMaxRows ? kLtWorkspaceBytes : 0;
  r.attn_bytes = m.max_n_head > 0
                     ? al(attention_decode_scratch_bytes(std::min(rows, kDecodeRowChunk), m.max_n_head,
                                                         m.max_head_dim, std::max<int64_t>(m.max_seq_len, 1)))
                     : 0;
  r.moe_bytes =
      m.max_routed_rows > kMoeGemvMaxSlots ? kMoeOffsetsBytes + al(size_t(m.max_routed_rows) * 4) : 0;
  r.act2_bytes = m.max_matmul_in > 0 ? al(q8_activation_bytes(k_in, std::min(rows, kQuantGemvMaxRows))) : 0;
  r.counters_bytes = m.max_matmul_in > 0 ? al(size_t(k_in / 32) * sizeof(int)) : 0;
  r.attn_counters_bytes =
      m.max_n_head > 0 ? al(attention_decode_counters(std::min(rows, kDecodeRowChunk), m.max_n_head) * sizeof(int)) : 0;
  r.act = 0;
  r.dequant = r.act + r.act_bytes;
  r.lt = r.dequant + r.dequant_bytes;
  r.attn = r.lt + r.lt_bytes;
  r.moe = r.attn + r.attn_bytes;
  r.act2 = r.moe + r.moe_bytes;
  r.counters = r.act2 + r.act2_bytes;
  r.attn_counters = r.counters + r.counters_bytes;  // (right after counters: one memset zeroes both)
  const size_t total = r.attn_counters + r.attn_counters_bytes;
  plan_ = m;
  if (total > ws_bytes_) {
    DeviceGuard g(index_);
    if (ws_) {
      TANDEM_CUDA_CHECK(cudaDeviceSynchronize());  // work in flight may still use the old workspace
      TANDEM_CUDA_CHECK(cudaFree(ws_));
      ws_ = nullptr;
      ws_bytes_ = 0;
    }
    if (cudaMalloc(&ws_, total) != cudaSuccess) {
      cudaGetLastError();
      ws_ = nullptr;
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw OutOfMemory("CUDA ops: cannot allocate a workspace of " + std::to_string(total >> 20) +
                        " MiB on cuda:" + std::to_string(index_) + " (" + std::to_string(free_b >> 20) +
                        " MiB free of " + std::to_string(total_b >> 20) +
                        " MiB; lower the batch size or the context)");
    }
    ws_bytes_ = total;
    ++ws_generation_;
  } else if (!(r == regions_)) {
    ++ws_generation_;  // the regions moved inside the same buffer: recordings pointing into them are stale
  }
  if (!(r == regions_) && r.counters_bytes + r.attn_counters_bytes > 0) {  // counters start at zero (the
    DeviceGuard g(index_);                                                    // kernels leave them so)
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    TANDEM_CUDA_CHECK(
        cudaMemset(static_cast<char*>(ws_) + r.counters, 0, r.counters_bytes + r.attn_counters_bytes));
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  regions_ = r;
  gemm_.set_workspace(r.lt_bytes ? region(r.lt) : nullptr, r.lt_bytes);
}

void CudaOps::check_matmul(const Tensor& W, const Tensor& x, const Tensor& y) const {
  const char* op = "matmul";
  check_on_device(op, "W", W, index_);
  check(quant::is_convertible(W.type), std::string("matmul: W has unsupported dtype ") + dtype_name(W.type));
  check(W.ne[2] == 1 && W.ne[3] == 1, "matmul: W must be a matrix {in, out}, got " + W.shape_string());
  check(W.nb[0] == dtype_block_bytes(W.type), "matmul: W must have contiguous rows");
  const int64_t K = W.ne[0], N = W.ne[1];
  check(K % dtype_block_size(W.type) == 0, "matmul: W's row length " + std::to_string(K) +
                                               " is not a multiple of the block size of " +
                                               dtype_name(W.type));
  check_f32(op, "x", x, index_);
  check_f32(op, "y", y, index_);
  check(x.ne[0] == K && x.ne[2] == 1 && x.ne[3] == 1,
        "matmul: x must be {" + std::to_string(K) + ", T}, got " + x.shape_string());
  check_dims(op, "y", y, N, x.ne[1]);
}

void CudaOps::matmul(Stream& s, const Tensor& W, const Tensor& x, const Tensor& y) {
  check_matmul(W, x, y);
  const int64_t K = W.ne[0], N = W.ne[1];
  const int64_t T = x.ne[1];
  if (N == 0 || T == 0) return;
  DeviceGuard g(index_);
  cudaStream_t st = stream_of(s, index_);
  const float* xp = static_cast<const float*>(x.data);
  float* yp = static_cast<float*>(y.data);
  const int64_t x_ld = int64_t(x.nb[1] / 4), y_ld = int64_t(y.nb[1] / 4);
  const bool dense = is_float_type(W.type);

  if (dense && (T <= kDenseGemvMaxRows || batch_invariant_)) {
    launch_gemv_dense(W.type, W.data, W.nb[1], K, N, xp, x_ld, T, yp, y_ld, st);
    return;
  }
  // Every other path uses the workspace: the call must lie within the reserved bounds.
  check(T <= plan_.max_rows && K <= plan_.max_matmul_in,
        "matmul: x {" + std::to_string(K) + ", " + std::to_string(T) +
            "} exceeds the reserved workspace bounds (" + std::to_string(plan_.max_matmul_in) + " inputs, " +
            std::to_string(plan_.max_rows) + " rows); call Ops::reserve() with larger bounds first");
  // Q8_0 on the tensor cores takes up to kQ8MmaMaxCols columns a launch (gemv_quant_mma.cu; per column the
  // direct kernel's bits), the other matrix-vector kernels kQuantGemvMaxRows.
  GemvArgs mma;
  mma.wt = W.type;
  mma.K = K;
  mma.T = std::min<int64_t>(T, kQ8MmaMaxCols);
  mma.n_seg = 1;
  mma.seg[0].W = W.data;
  mma.seg[0].w_ld = W.nb[1];
  mma.seg[0].N = N;
  const int64_t quant_cols = !dense && gemv_q8_mma_applies(mma) ? kQ8MmaMaxCols : kQuantGemvMaxRows;
  if (!dense && !batch_invariant_ && T > quant_cols) {  // 17..kQ8WideMaxCols columns in one launch (TANDEM_Q8_MMA_WIDE)
    GemvArgs wide = mma;
    wide.T = T;
    wide.seg[0].y = yp;
    wide.seg[0].y_ld = y_ld;
    if (gemv_q8_mma_wide_applies(wide) && regions_.act_bytes >= q8_activation_bytes(K, T)) {
      void* act = region(regions_.act);
      launch_quantize_q8(xp, x_ld, K, T, act, st);
      launch_gemv_q8_mma_wide(wide, act, st);
      return;
    }
  }
  if (!dense && (T <= quant_cols || batch_invariant_) && gemv_quant_supports(W.type, K)) {
    // In chunks of quant_cols columns (what the activation region holds); per column the same quantization
    // and dot products as a one-row call.
    void* act = region(regions_.act);
    for (int64_t t0 = 0; t0 < T; t0 += quant_cols) {
      const int64_t n = std::min(quant_cols, T - t0);
      need(regions_.act_bytes, q8_activation_bytes(K, n), "8-bit activations");
      launch_quantize_q8(xp + t0 * x_ld, x_ld, K, n, act, st);
      launch_gemv_quant(W.type, W.data, W.nb[1], K, N, act, n, yp + t0 * y_ld, y_ld, st);
    }
    return;
  }
  need(regions_.lt_bytes, kLtWorkspaceBytes, "cuBLASLt");
  if (W.type == DType::F32) {
    gemm_.matmul(GemmType::F32, W.data, int64_t(W.nb[1] / 4), xp, x_ld, yp, y_ld, N, T, K, st);
    return;
  }
  const bool f16 = W.type == DType::F16;
  const GemmType gt = f16 ? GemmType::F16 : GemmType::BF16;
  need(regions_.act_bytes, size_t(K * T) * 2, "16-bit activations");
  void* x16 = region(regions_.act);
  launch_f32_to_16(xp, x_ld, K, T, x16, f16, st);
  if (dense) {
    gemm_.matmul(gt, W.data, int64_t(W.nb[1] / 2), x16, K, yp, y_ld, N, T, K, st);
    return;
  }
  need(regions_.dequant_bytes, size_t(K) * 2, "dequantized weights");
  const int64_t chunk = std::max<int64_t>(1, int64_t(regions_.dequant_bytes / 2) / K);
  void* wq = region(regions_.dequant);
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t n = std::min(chunk, N - r0);
    launch_dequantize_rows_16(W.type, static_cast<const char*>(W.data) + r0 * int64_t(W.nb[1]), W.nb[1], K, n,
                              wq, false, st);
    gemm_.matmul(GemmType::BF16, wq, K, x16, K, yp + r0, y_ld, n, T, K, st);
  }
}

namespace {
// The GemvArgs of a fused product: segments W[i] -> y[i] (AddResidual: y is also the residual it adds to), the
// epilogue, and x's norm when given (checked: F32 {K} on the device, eps finite and >= 0). False when the weights
// mix dtypes or row lengths: one launch takes one of each. (Shapes: the callers' check_matmul.)
bool fused_gemv_args(std::span<const Tensor> W, const Tensor& x, std::span<const Tensor> y, GemvEpilogue epi,
                     const Tensor* norm, float eps, int device, GemvArgs& a) {
  const int64_t K = W[0].ne[0];
  a.wt = W[0].type;
  a.K = K;
  a.x = static_cast<const float*>(x.data);
  a.x_ld = int64_t(x.nb[1] / 4);
  a.T = x.ne[1];
  a.n_seg = int(W.size());
  a.epi = epi;
  if (norm != nullptr) {
    check_f32("norm_matmul", "norm", *norm, device);
    check(norm->ne[0] == K && norm->nrows() == 1 && norm->is_contiguous(),
          "norm_matmul: the norm weights must be {" + std::to_string(K) + "}, got " + norm->shape_string());
    check_eps("norm_matmul", eps);
    a.norm = static_cast<const float*>(norm->data);
    a.eps = eps;
  }
  for (size_t i = 0; i < W.size(); ++i) {
    if (W[i].type != a.wt || W[i].ne[0] != K) return false;
    GemvSeg& g = a.seg[i];
    g.W = W[i].data;
    g.w_ld = W[i].nb[1];
    g.N = W[i].ne[1];
    g.y = static_cast<float*>(y[i].data);
    g.y_ld = int64_t(y[i].nb[1] / 4);
    if (epi == GemvEpilogue::AddResidual) {
      g.r = g.y;
      g.r_ld = g.y_ld;
    }
  }
  return true;
}
}  // namespace

bool CudaOps::fused_gemv(Stream& s, std::span<const Tensor> W, const Tensor& x, std::span<const Tensor> y,
                         int epi_int, const Tensor* norm, float eps, const void* x_q8) {
  const auto epi = GemvEpilogue(epi_int);
  check(!W.empty() && W.size() <= size_t(kGemvMaxSegs) && W.size() == y.size(),
        "matmul_multi: needs 1 to 3 weights and as many outputs");
  for (size_t i = 0; i < W.size(); ++i) check_matmul(W[i], x, y[i]);
  const int64_t K = W[0].ne[0], T = x.ne[1];
  if (T == 0) return false;
  // More columns than one launch takes: the unfused ops are faster (cuBLAS for the dense types) but round
  // differently, so a batch-invariant session (speculative verify of 8 drafted tokens + 1, prefill of several
  // sequences) keeps the fused kernels, kGemvMaxCols columns a launch: every column gets the arithmetic of a
  // one-row step (tests/gpu/test_gpu_batch_invariance.cpp).
  // (Q8_0 on the tensor cores: kQ8MmaMaxCols columns a launch, each with the direct kernel's bits.)
  GemvArgs a;
  if (!fused_gemv_args(W, x, y, epi, norm, eps, index_, a)) return false;
  GemvArgs probe = a;
  probe.T = std::min<int64_t>(T, kQ8MmaMaxCols);
  const int64_t max_cols = x_q8 == nullptr && gemv_q8_mma_applies(probe) ? kQ8MmaMaxCols : kGemvMaxCols;
  if (T > max_cols && (!batch_invariant_ || x_q8 != nullptr)) return false;
  DeviceGuard guard(index_);
  cudaStream_t st = stream_of(s, index_);
  const int64_t cols = std::min<int64_t>(T, max_cols);  // per launch
  // Columns [t0, t0 + n) of the call as a call of their own.
  auto columns = [&a](int64_t t0, int64_t n) {
    GemvArgs c = gemv_columns(a, t0);
    c.T = n;
    return c;
  };
  if (is_float_type(a.wt)) {
    if (x_q8 != nullptr) return false;
    if (!gemv_dense_fusable(columns(0, cols))) return false;
    for (int64_t t0 = 0; t0 < T; t0 += cols) launch_gemv_dense_fused(columns(t0, std::min(cols, T - t0)), st);
    return true;
  }
  if (!gemv_quant_supports(a.wt, K) || cols > plan_.max_rows || K > plan_.max_matmul_in) return false;
  if (regions_.act_bytes < q8_activation_bytes(K, cols)) return false;
  if (x_q8 != nullptr) {  // (one launch: T <= kGemvMaxCols) the producer wrote the q8 values
    GemvArgs c = columns(0, T);
    c.norm = nullptr;
    launch_gemv_quant_fused(c, x_q8, st);
    return true;
  }
  void* act = region(regions_.act);
  for (int64_t t0 = 0; t0 < T; t0 += cols) {
    GemvArgs c = columns(t0, std::min(cols, T - t0));
    if (c.norm != nullptr) {  // the norm in the activation quantization; the product reads the q8 values only
      launch_quantize_q8_norm(c.x, c.x_ld, K, c.T, c.norm, c.eps, act, st);
      c.norm = nullptr;
    } else {
      launch_quantize_q8(c.x, c.x_ld, K, c.T, act, st);  // once for every segment
    }
    launch_gemv_quant_fused(c, act, st);
  }
  return true;
}

void CudaOps::matmul_multi(Stream& s, std::span<const Tensor> W, const Tensor& x, std::span<const Tensor> y) {
  if (fused_disabled() || !fused_gemv(s, W, x, y, int(GemvEpilogue::Store))) Ops::matmul_multi(s, W, x, y);
}

void CudaOps::matmul_swiglu(Stream& s, const Tensor& W_gate, const Tensor& W_up, const Tensor& x,
                            const Tensor& gate, const Tensor& up, const Tensor& out) {
  // The kernel writes silu(gate) * up into the first segment's output: out, checked as gate's shape.
  check_f32("matmul_swiglu", "out", out, index_);
  check_same_shape("matmul_swiglu", "gate", gate, "out", out);
  check(W_gate.ne[1] == W_up.ne[1], "matmul_swiglu: W_gate and W_up must have the same number of rows");
  const Tensor W[2] = {W_gate, W_up};
  const Tensor y[2] = {out, up};
  if (fused_disabled() || !fused_gemv(s, W, x, y, int(GemvEpilogue::SwiGlu)))
    Ops::matmul_swiglu(s, W_gate, W_up, x, gate, up, out);
}

void CudaOps::norm_matmul_multi(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                                std::span<const Tensor> W, std::span<const Tensor> y) {
  if (fused_disabled() || norm_fusion_disabled() ||
      !fused_gemv(s, W, x, y, int(GemvEpilogue::Store), &norm, eps))
    Ops::norm_matmul_multi(s, x, norm, eps, h, W, y);
}

void CudaOps::norm_matmul_swiglu(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                                 const Tensor& W_gate, const Tensor& W_up, const Tensor& gate,
                                 const Tensor& up, const Tensor& out) {
  check_f32("norm_matmul_swiglu", "out", out, index_);
  check_same_shape("norm_matmul_swiglu", "gate", gate, "out", out);
  check(W_gate.ne[1] == W_up.ne[1], "norm_matmul_swiglu: W_gate and W_up must have the same number of rows");
  const Tensor W[2] = {W_gate, W_up};
  const Tensor y[2] = {out, up};
  if (fused_disabled() || norm_fusion_disabled() ||
      !fused_gemv(s, W, x, y, int(GemvEpilogue::SwiGlu), &norm, eps))
    Ops::norm_matmul_swiglu(s, x, norm, eps, h, W_gate, W_up, gate, up, out);
}

namespace {
// TANDEM_GEGLU_EPILOGUE=1: norm_matmul_geglu as one fused product with the GeGlu epilogue (gemma4's dense FFN at
// decode). On since its GPU test passed (twelfth session, H100); =0 turns it off.
EnvSwitch g_geglu_epilogue{"TANDEM_GEGLU_EPILOGUE", true};
}  // namespace

void set_geglu_epilogue(std::optional<bool> on) {
  g_geglu_epilogue.set(on);
}

void CudaOps::norm_matmul_geglu(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                                const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                                const Tensor& out) {
  check_f32("norm_matmul_geglu", "out", out, index_);
  check_same_shape("norm_matmul_geglu", "gate", gate, "out", out);
  check(W_gate.ne[1] == W_up.ne[1], "norm_matmul_geglu: W_gate and W_up must have the same number of rows");
  const Tensor W[2] = {W_gate, W_up};
  const Tensor y[2] = {out, up};
  if (!g_geglu_epilogue.on() || fused_disabled() || norm_fusion_disabled() ||
      !fused_gemv(s, W, x, y, int(GemvEpilogue::GeGlu), &norm, eps))
    Ops::norm_matmul_geglu(s, x, norm, eps, h, W_gate, W_up, gate, up, out);
}

void CudaOps::matmul_add(Stream& s, const Tensor& W, const Tensor& x, const Tensor& tmp, const Tensor& y) {
  check(x.data != y.data, "matmul_add: x and y must not overlap");
  const Tensor Ws[1] = {W};
  const Tensor ys[1] = {y};
  if (fused_disabled() || !fused_gemv(s, Ws, x, ys, int(GemvEpilogue::AddResidual)))
    Ops::matmul_add(s, W, x, tmp, y);
}

void CudaOps::get_rows(Stream& s, const Tensor& table, const Tensor& ids, const Tensor& out) {
  const char* op = "get_rows";
  check_on_device(op, "table", table, index_);
  check(quant::is_convertible(table.type),
        std::string("get_rows: unsupported table dtype ") + dtype_name(table.type));
  check(table.ne[2] == 1 && table.ne[3] == 1,
        "get_rows: table must be {n_embd, n_rows}, got " + table.shape_string());
  check(table.nb[0] == dtype_block_bytes(table.type), "get_rows: table must have contiguous rows");
  const int64_t T = ids.ne[0];
  check_i32_vector(op, "ids", ids, T, index_);
  check_f32(op, "out", out, index_);
  check_dims(op, "out", out, table.ne[0], T);
  if (!is_float_type(table.type))
    check(table.ne[0] % 8 == 0, "get_rows: quantized rows must have a multiple of 8 values");
  DeviceGuard g(index_);
  launch_get_rows(table, static_cast<const int32_t*>(ids.data), out, stream_of(s, index_));
}

void CudaOps::embed_rows(Stream& s, const Tensor& table, const Tensor& ids, float scale, const Tensor* added,
                         const Tensor* added_ids, const Tensor& out) {
  const char* op = "embed_rows";
  check_on_device(op, "table", table, index_);
  check(quant::is_convertible(table.type),
        std::string("embed_rows: unsupported table dtype ") + dtype_name(table.type));
  check(table.ne[2] == 1 && table.ne[3] == 1,
        "embed_rows: table must be {n_embd, n_rows}, got " + table.shape_string());
  check(table.nb[0] == dtype_block_bytes(table.type), "embed_rows: table must have contiguous rows");
  const int64_t n = table.ne[0], T = ids.ne[0];
  check_i32_vector(op, "ids", ids, T, index_);
  check_f32(op, "out", out, index_);
  check_dims(op, "out", out, n, T);
  if (!is_float_type(table.type))
    check(n % 8 == 0, "embed_rows: quantized rows must have a multiple of 8 values");
  if (added) {
    check_f32(op, "added", *added, index_);
    check(added->ne[0] == n && added->ne[2] == 1 && added->ne[3] == 1,
          "embed_rows: added must be {n_embd = " + std::to_string(n) + ", n_added}, got " +
              added->shape_string());
    check(added_ids != nullptr, "embed_rows: added is given, added_ids must be too");
    check_i32_vector(op, "added_ids", *added_ids, T, index_);
  }
  DeviceGuard g(index_);
  launch_embed_rows(table, static_cast<const int32_t*>(ids.data), scale, added,
                    added ? static_cast<const int32_t*>(added_ids->data) : nullptr, out,
                    stream_of(s, index_));
}

void CudaOps::rms_norm(Stream& s, const Tensor& x, const Tensor* weight, float eps, const Tensor& out) {
  const char* op = "rms_norm";
  check_f32(op, "x", x, index_);
  check_f32(op, "out", out, index_);
  check_same_shape(op, "x", x, "out", out);
  check_eps(op, eps);
  if (weight) check_row_vector(op, "weight", *weight, x.ne[0], index_);
  DeviceGuard g(index_);
  launch_rms_norm(x, weight ? static_cast<const float*>(weight->data) : nullptr, eps, out,
                  stream_of(s, index_));
}

void CudaOps::rope(Stream& s, const Tensor& x, const Tensor& positions, const RopeParams& p) {
  const char* op = "rope";
  check_f32(op, "x", x, index_);
  check(x.ne[3] == 1, "rope: x must be {head_dim, n_head, T}, got " + x.shape_string());
  check_i32_vector(op, "positions", positions, x.ne[2], index_);
  check(p.n_rot >= 2 && p.n_rot % 2 == 0 && p.n_rot <= x.ne[0],
        "rope: n_rot must be even and in [2, head_dim = " + std::to_string(x.ne[0]) + "], got " +
            std::to_string(p.n_rot));
  check(p.freq_base > 0.0f && std::isfinite(p.freq_base), "rope: freq_base must be > 0");
  const float* ff = nullptr;
  if (p.freq_factors) {
    check_f32(op, "freq_factors", *p.freq_factors, index_);
    check(p.freq_factors->ne[0] == p.n_rot / 2 && p.freq_factors->nrows() == 1,
          "rope: freq_factors must be {" + std::to_string(p.n_rot / 2) + "}, got " +
              p.freq_factors->shape_string());
    ff = static_cast<const float*>(p.freq_factors->data);
  }
  DeviceGuard g(index_);
  launch_rope(x, static_cast<const int32_t*>(positions.data), p, ff, stream_of(s, index_));
}

void CudaOps::kv_store(Stream& s, const KvLayerView& kv, const Tensor& k, const Tensor& v,
                       const Tensor& slot_mapping) {
  const char* op = "kv_store";
  check_cache(op, kv, index_);
  const int64_t n_kv = kv.k.ne[1];
  check_f32(op, "k", k, index_);
  check_f32(op, "v", v, index_);
  const int64_t T = k.ne[2];
  check_dims(op, "k", k, kv.k.ne[0], n_kv, T);
  check_dims(op, "v", v, kv.v.ne[0], n_kv, T);
  check_i32_vector(op, "slot_mapping", slot_mapping, T, index_);
  DeviceGuard g(index_);
  launch_kv_store(kv, k, v, static_cast<const int32_t*>(slot_mapping.data), stream_of(s, index_));
}

void CudaOps::qk_norm_rope_store(Stream& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor* q_norm, const Tensor* k_norm, bool norm_v, float eps,
                                 const Tensor& positions, const RopeParams& p, const KvLayerView& kv,
                                 const Tensor& slot_mapping) {
  const char* op = "qk_norm_rope_store";
  check_cache(op, kv, index_);
  check_f32(op, "q", q, index_);
  check_f32(op, "k", k, index_);
  check_f32(op, "v", v, index_);
  const int64_t hd = q.ne[0], T = q.ne[2], n_kv = kv.k.ne[1];
  check(q.ne[3] == 1, "qk_norm_rope_store: q must be {head_dim, n_head, T}, got " + q.shape_string());
  check_dims(op, "k", k, kv.k.ne[0], n_kv, T);
  check_dims(op, "v", v, kv.v.ne[0], n_kv, T);
  check(k.ne[0] == hd, "qk_norm_rope_store: q and k must have the same head dim");
  check_i32_vector(op, "positions", positions, T, index_);
  check_i32_vector(op, "slot_mapping", slot_mapping, T, index_);
  check(p.n_rot >= 2 && p.n_rot % 2 == 0 && p.n_rot <= hd,
        "qk_norm_rope_store: n_rot must be even and in [2, head_dim = " + std::to_string(hd) + "], got " +
            std::to_string(p.n_rot));
  check(p.freq_base > 0.0f && std::isfinite(p.freq_base), "qk_norm_rope_store: freq_base must be > 0");
  check_eps(op, eps);
  for (const Tensor* w : {q_norm, k_norm})
    if (w) {
      check_f32(op, "norm weight", *w, index_);
      check(w->ne[0] == hd && w->nrows() == 1, "qk_norm_rope_store: norm weights must be {" +
                                                   std::to_string(hd) + "}, got " + w->shape_string());
    }
  const float* ff = nullptr;
  if (p.freq_factors) {
    check_f32(op, "freq_factors", *p.freq_factors, index_);
    check(p.freq_factors->ne[0] == p.n_rot / 2 && p.freq_factors->nrows() == 1,
          "qk_norm_rope_store: freq_factors must be {" + std::to_string(p.n_rot / 2) + "}, got " +
              p.freq_factors->shape_string());
    ff = static_cast<const float*>(p.freq_factors->data);
  }
  // One warp per head row, as rms_norm norms rows shorter than 1024 values (row_norm.cuh: longer rows take a
  // block there, so the fused kernel would not equal it bit for bit).
  if (hd >= 1024 || v.ne[0] >= 1024 || fused_disabled() || (norm_v && row_fusion_off()))
    return Ops::qk_norm_rope_store(s, q, k, v, q_norm, k_norm, norm_v, eps, positions, p, kv, slot_mapping);
  DeviceGuard g(index_);
  launch_attn_inputs(q, k, v, q_norm ? static_cast<const float*>(q_norm->data) : nullptr,
                     k_norm ? static_cast<const float*>(k_norm->data) : nullptr, norm_v, eps,
                     static_cast<const int32_t*>(positions.data), p, ff, kv,
                     static_cast<const int32_t*>(slot_mapping.data), stream_of(s, index_));
}

void CudaOps::norm_residual_add(Stream& s, const Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                float out_scale) {
  const char* op = "norm_residual_add";
  check_f32(op, "x", x, index_);
  check_f32(op, "y", y, index_);
  check_same_shape(op, "x", x, "y", y);
  check_row_vector(op, "w", w, x.ne[0], index_);
  check_eps(op, eps);
  check(std::isfinite(out_scale), "norm_residual_add: out_scale must be finite");
  op_checks::no_alias(op, "x and y", {&x, &y});
  if (row_fusion_off()) return Ops::norm_residual_add(s, x, y, w, eps, out_scale);
  DeviceGuard g(index_);
  launch_post_norm_residual(x, y, nullptr, nullptr, nullptr, nullptr, nullptr, static_cast<const float*>(w.data),
                            eps, out_scale, stream_of(s, index_));
}

void CudaOps::moe_residual_add(Stream& s, const Tensor& x, const Tensor& dense, const Tensor& w_dense,
                               const Tensor* expert_out, const Tensor* weights, const Tensor& moe,
                               const Tensor& w_moe, const Tensor& w_out, float eps, float out_scale) {
  const char* op = "moe_residual_add";
  check((expert_out == nullptr) == (weights == nullptr),
        "moe_residual_add: give both the experts' outputs and their weights, or neither");
  if (expert_out) op_checks::moe_combine(*expert_out, *weights, moe, DeviceId{DeviceKind::CUDA, index_});
  check_f32(op, "x", x, index_);
  check_f32(op, "dense", dense, index_);
  check_f32(op, "moe", moe, index_);
  check_same_shape(op, "x", x, "dense", dense);
  check_same_shape(op, "x", x, "moe", moe);
  check_row_vector(op, "w_dense", w_dense, x.ne[0], index_);
  check_row_vector(op, "w_moe", w_moe, x.ne[0], index_);
  check_row_vector(op, "w_out", w_out, x.ne[0], index_);
  check_eps(op, eps);
  check(std::isfinite(out_scale), "moe_residual_add: out_scale must be finite");
  op_checks::no_alias(op, "x, dense and moe", {&x, &dense, &moe});
  if (row_fusion_off())
    return Ops::moe_residual_add(s, x, dense, w_dense, expert_out, weights, moe, w_moe, w_out, eps, out_scale);
  DeviceGuard g(index_);
  launch_post_norm_residual(x, dense, static_cast<const float*>(w_dense.data), expert_out,
                            weights ? static_cast<const float*>(weights->data) : nullptr, &moe,
                            static_cast<const float*>(w_moe.data), static_cast<const float*>(w_out.data), eps,
                            out_scale, stream_of(s, index_));
}

void CudaOps::moe_input_norms(Stream& s, const Tensor& x, float eps, float r_factor, const Tensor& r_scale,
                              const Tensor& r, const Tensor& h_norm, const Tensor& h) {
  const char* op = "moe_input_norms";
  check_f32(op, "x", x, index_);
  check_f32(op, "r", r, index_);
  check_f32(op, "h", h, index_);
  check_same_shape(op, "x", x, "r", r);
  check_same_shape(op, "x", x, "h", h);
  check_row_vector(op, "r_scale", r_scale, x.ne[0], index_);
  check_row_vector(op, "h_norm", h_norm, x.ne[0], index_);
  check_eps(op, eps);
  check(std::isfinite(r_factor), "moe_input_norms: r_factor must be finite");
  op_checks::no_alias(op, "x, r and h", {&x, &r, &h});
  if (row_fusion_off()) return Ops::moe_input_norms(s, x, eps, r_factor, r_scale, r, h_norm, h);
  DeviceGuard g(index_);
  launch_moe_input_norms(x, eps, r_factor, static_cast<const float*>(r_scale.data), r,
                         static_cast<const float*>(h_norm.data), h, stream_of(s, index_));
}

void CudaOps::attention(Stream& s, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch,
                        float scale, const Tensor& out) {
  attention_impl(s, q, kv, batch, scale, out, nullptr);
}

namespace {
// TANDEM_ATTN_Q8=0: attention_project_add composes attention and matmul_add (a separate quantization launch).
EnvSwitch g_attn_q8{"TANDEM_ATTN_Q8", true};
}  // namespace

void CudaOps::attention_project_add(Stream& s, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch,
                                    float scale, const Tensor& out, const Tensor& out_rows, const Tensor& W_o,
                                    const Tensor& tmp, const Tensor& y) {
  // The attention output goes to the product as q8 values written by the combine kernel when the product is
  // a quantized matrix-vector launch of at most kGemvMaxCols columns (what fused_gemv takes in one launch with
  // x_q8; every condition under which it would decline is checked here, before anything is enqueued).
  const int64_t K = out_rows.ne[0], T = out_rows.ne[1];
  const bool fuse = g_attn_q8.on() && !fused_disabled() && !is_float_type(W_o.type) && T >= 1 &&
                    T <= kGemvMaxCols && T <= plan_.max_rows && K <= plan_.max_matmul_in &&
                    gemv_quant_supports(W_o.type, K) && regions_.act_bytes >= q8_activation_bytes(K, T) &&
                    kv.v.ne[0] % 32 == 0 && out.data == out_rows.data && out.is_contiguous() &&
                    out_rows.is_contiguous() && out.nbytes() == out_rows.nbytes() && out_rows.data != y.data;
  if (!fuse) return Ops::attention_project_add(s, q, kv, batch, scale, out, out_rows, W_o, tmp, y);
  check_matmul(W_o, out_rows, y);
  attention_impl(s, q, kv, batch, scale, out, region(regions_.act));
  const Tensor Ws[1] = {W_o};
  const Tensor ys[1] = {y};
  check(fused_gemv(s, Ws, out_rows, ys, int(GemvEpilogue::AddResidual), nullptr, 0.0f, region(regions_.act)),
        "attention_project_add: the product declined after the attention wrote its q8 output");
}

namespace {
// TANDEM_SWIGLU_Q8=1: ffn_swiglu_add's gate/up product writes down's q8 activations. Off by default: measured
// slower than the separate quantization launch it saves (H100, tenth session, tg128: q8_0 232.9 vs 237.3 t/s,
// q4_k 312.0 vs 328.4): a fence and an atomic per warp at the end of the layer's largest product cost more than
// one launch of ~1.4 us. Kept, tested, for a cheaper announcement (one per block, or none: a quantizing
// epilogue over whole groups) to be measured against.
EnvSwitch g_swiglu_q8{"TANDEM_SWIGLU_Q8", false};
}  // namespace

void set_ffn_swiglu_q8(std::optional<bool> on) {
  g_swiglu_q8.set(on);
}

void set_row_fusion(std::optional<bool> on) {
  g_row_fusion.set(on);
}

void CudaOps::ffn_swiglu_add(Stream& s, const Tensor& x, const Tensor& norm, float eps, const Tensor& h,
                             const Tensor& W_gate, const Tensor& W_up, const Tensor& gate, const Tensor& up,
                             const Tensor& act, const Tensor& W_down, const Tensor& tmp, const Tensor& y) {
  // The gate/up product's SwiGLU outputs go to the down product as q8 values its direct kernel writes (the warp
  // completing each group of 32 outputs quantizes them): one launch of at most kGemvMaxCols columns each, the
  // gate/up weights on the direct kernel. Every condition is checked before anything is enqueued.
  const int64_t K = x.ne[0], T = x.ne[1], N = W_gate.ne[1];
  bool fuse = g_swiglu_q8.on() && !fused_disabled() && !norm_fusion_disabled() && T >= 1 && T <= kGemvMaxCols &&
              T <= plan_.max_rows && !is_float_type(W_gate.type) && W_up.type == W_gate.type &&
              W_gate.ne[0] == K && W_up.ne[0] == K && W_up.ne[1] == N && N % 32 == 0 &&
              K <= plan_.max_matmul_in && N <= plan_.max_matmul_in && gemv_quant_supports(W_gate.type, K) &&
              !is_float_type(W_down.type) && W_down.ne[0] == N && gemv_quant_supports(W_down.type, N) &&
              regions_.act_bytes >= q8_activation_bytes(K, T) && regions_.act2_bytes >= q8_activation_bytes(N, T) &&
              regions_.counters_bytes >= size_t(N / 32) * sizeof(int) && act.data != y.data;
  GemvArgs a;
  if (fuse) {
    check_matmul(W_gate, x, act);
    check_matmul(W_up, x, up);
    check_matmul(W_down, act, y);
    const Tensor Ws[2] = {W_gate, W_up};
    const Tensor ys[2] = {act, up};  // (SwiGlu: silu(gate) * up goes to the first segment's output)
    fuse = fused_gemv_args(Ws, x, ys, GemvEpilogue::SwiGlu, &norm, eps, index_, a) && gemv_quant_direct_supports(a);
  }
  if (!fuse) return Ops::ffn_swiglu_add(s, x, norm, eps, h, W_gate, W_up, gate, up, act, W_down, tmp, y);
  DeviceGuard guard(index_);
  cudaStream_t st = stream_of(s, index_);
  void* act_q8 = region(regions_.act);
  char* out_q8 = region(regions_.act2);
  a.q8_xq = reinterpret_cast<int8_t*>(out_q8);
  a.q8_xds = reinterpret_cast<float2*>(out_q8 + q8_scales_offset(N, T));
  a.q8_count = reinterpret_cast<int*>(region(regions_.counters));
  launch_quantize_q8_norm(a.x, a.x_ld, K, T, a.norm, a.eps, act_q8, st);
  a.norm = nullptr;  // (in the quantization; the product reads the q8 values only, as fused_gemv does)
  launch_gemv_quant_fused(a, act_q8, st);
  const Tensor Wd[1] = {W_down};
  const Tensor yd[1] = {y};
  check(fused_gemv(s, Wd, act, yd, int(GemvEpilogue::AddResidual), nullptr, 0.0f, out_q8),
        "ffn_swiglu_add: the down product declined after the gate/up product wrote its q8 output");
}

void CudaOps::attention_impl(Stream& s, const Tensor& q, const KvLayerView& kv, const AttentionBatch& batch,
                             float scale, const Tensor& out, void* q8) {
  const char* op = "attention";
  check_f32(op, "q", q, index_);
  check_f32(op, "out", out, index_);
  check_cache(op, kv, index_);
  const int64_t hd_k = kv.k.ne[0], hd_v = kv.v.ne[0], n_kv = kv.k.ne[1];
  check(q.ne[0] == hd_k && q.ne[3] == 1, "attention: q must be {head_dim_k = " + std::to_string(hd_k) +
                                             ", n_head, T}, got " + q.shape_string());
  const int64_t n_head = q.ne[1], T = q.ne[2];
  check(n_kv > 0 && n_head % n_kv == 0, "attention: n_head " + std::to_string(n_head) +
                                            " must be a multiple of n_kv_head " + std::to_string(n_kv));
  check_dims(op, "out", out, hd_v, n_head, T);
  check(std::isfinite(scale), "attention: scale must be finite");
  check_i32_vector(op, "batch.positions", batch.positions, T, index_);
  check_i32_vector(op, "batch.seq_slot", batch.seq_slot, T, index_);
  check_on_device(op, "batch.block_tables", batch.block_tables, index_);
  check_type(op, "batch.block_tables", batch.block_tables, DType::I32);
  check(batch.block_tables.is_contiguous() && batch.block_tables.ne[2] == 1 && batch.block_tables.ne[3] == 1,
        "attention: batch.block_tables must be a contiguous {max_blocks_per_seq, n_seqs} matrix");
  const int64_t n_seqs = batch.block_tables.ne[1];
  check_i32_vector(op, "batch.seq_lens", batch.seq_lens, n_seqs, index_);
  const bool block_mask = batch.mask == MaskKind::Block;
  if (block_mask) check_i32_vector(op, "batch.block_end", batch.block_end, T, index_);
  const bool has_begin = batch.kv_begin.data != nullptr;
  if (has_begin) check_i32_vector(op, "batch.kv_begin", batch.kv_begin, T, index_);
  const bool explicit_mask = batch.mask == MaskKind::Explicit;
  if (explicit_mask) {
    check_f32(op, "batch.explicit_mask", batch.explicit_mask, index_);
    check(batch.explicit_mask.ne[1] == T && batch.explicit_mask.ne[2] == 1 && batch.explicit_mask.ne[3] == 1,
          "attention: batch.explicit_mask must have shape {mask_cols, n_rows = " + std::to_string(T) +
              "}, got " + batch.explicit_mask.shape_string());
    check(batch.explicit_mask.ne[0] <= INT32_MAX, "attention: batch.explicit_mask has too many columns");
  }
  check(
      batch.mask == MaskKind::Causal || batch.mask == MaskKind::Bidirectional || block_mask || explicit_mask,
      "attention: unknown mask kind " + std::to_string(int(batch.mask)));
  check(batch.sliding_window >= 0, "attention: sliding_window must be >= 0");
  check(batch.max_seq_len > 0, "attention: batch.max_seq_len must be > 0 (an upper bound of seq_lens)");
  if (T == 0) return;
  DeviceGuard g(index_);
  cudaStream_t st = stream_of(s, index_);

  AttentionArgs a;
  a.q = q;
  a.out = out;
  a.kv = kv;
  a.mask = batch.mask;
  a.positions = static_cast<const int32_t*>(batch.positions.data);
  a.seq_slot = static_cast<const int32_t*>(batch.seq_slot.data);
  a.block_tables = static_cast<const int32_t*>(batch.block_tables.data);
  a.max_blocks_per_seq = batch.block_tables.ne[0];
  a.seq_lens = static_cast<const int32_t*>(batch.seq_lens.data);
  a.block_end = block_mask ? static_cast<const int32_t*>(batch.block_end.data) : nullptr;
  a.kv_begin = has_begin ? static_cast<const int32_t*>(batch.kv_begin.data) : nullptr;
  if (explicit_mask) {
    a.explicit_mask = static_cast<const float*>(batch.explicit_mask.data);
    a.mask_stride = int64_t(batch.explicit_mask.nb[1] / sizeof(float));
    a.mask_cols = int(batch.explicit_mask.ne[0]);
  }
  a.sliding_window = batch.sliding_window;
  a.max_seq_len = batch.max_seq_len;
  a.scale = scale;
  // The tensor-core kernel shares each K/V tile among the rows of one sequence; decode batches (one row per
  // sequence) go to split-K decoding, which handles each row's sequence in parallel.
  if (q8 == nullptr && !batch_invariant_ && T >= std::max<int64_t>(kPrefillMinRows, 2 * n_seqs) &&
      attention_prefill_supported(a)) {
    launch_attention_prefill(a, st);
    return;
  }
  // Split-K decoding, in chunks of rows that fit the reserved partials.
  // (and, where the workspace has the in-place combine's counters, whose rows they cover: whether a call
  // combines in place must not depend on its row count)
  const size_t n_counters = regions_.attn_counters_bytes / sizeof(int);
  int64_t chunk = std::min<int64_t>(T, kDecodeRowChunk);
  while (chunk > 1 &&
         (attention_decode_scratch_bytes(chunk, n_head, hd_v, a.max_seq_len) > regions_.attn_bytes ||
          (n_counters > 0 && attention_decode_counters(chunk, n_head) > n_counters)))
    chunk /= 2;
  need(regions_.attn_bytes, attention_decode_scratch_bytes(chunk, n_head, hd_v, a.max_seq_len),
       "attention partials");
  for (int64_t r0 = 0; r0 < T; r0 += chunk) {
    const int64_t n = std::min(chunk, T - r0);
    AttentionArgs c = a;
    c.q = rows_view(q, 2, r0, n);
    c.out = rows_view(out, 2, r0, n);
    c.positions = a.positions + r0;
    c.seq_slot = a.seq_slot + r0;
    if (c.block_end) c.block_end = a.block_end + r0;
    if (c.kv_begin) c.kv_begin = a.kv_begin + r0;
    if (c.explicit_mask) c.explicit_mask = a.explicit_mask + r0 * a.mask_stride;
    // The q8 image (launch_quantize_q8's layout for all T rows): this chunk's rows of xq and of xds.
    int8_t* xq = nullptr;
    float2* xds = nullptr;
    if (q8 != nullptr) {
      const int64_t K = n_head * hd_v;
      xq = static_cast<int8_t*>(q8) + r0 * K;
      xds = reinterpret_cast<float2*>(static_cast<char*>(q8) + q8_scales_offset(K, T)) + r0 * (K / 32);
    }
    launch_attention_decode(c, region(regions_.attn), regions_.attn_bytes, st, xq, xds,
                            n_counters > 0 ? reinterpret_cast<int*>(region(regions_.attn_counters)) : nullptr,
                            n_counters);
  }
}

void CudaOps::silu_mul(Stream& s, const Tensor& gate, const Tensor& up, const Tensor& out) {
  const char* op = "silu_mul";
  check_f32(op, "gate", gate, index_);
  check_f32(op, "up", up, index_);
  check_f32(op, "out", out, index_);
  check_same_shape(op, "gate", gate, "up", up);
  check_same_shape(op, "gate", gate, "out", out);
  DeviceGuard g(index_);
  launch_glu(GluKind::Silu, gate, up, out, stream_of(s, index_));
}

void CudaOps::gelu_mul(Stream& s, const Tensor& gate, const Tensor& up, const Tensor& out) {
  const char* op = "gelu_mul";
  check_f32(op, "gate", gate, index_);
  check_f32(op, "up", up, index_);
  check_f32(op, "out", out, index_);
  check_same_shape(op, "gate", gate, "up", up);
  check_same_shape(op, "gate", gate, "out", out);
  DeviceGuard g(index_);
  launch_glu(GluKind::Gelu, gate, up, out, stream_of(s, index_));
}

namespace {
void check_binary(const char* op, const Tensor& a, const Tensor& b, const Tensor& out, int index) {
  check_f32(op, "a", a, index);
  check_f32(op, "b", b, index);
  check_f32(op, "out", out, index);
  check_same_shape(op, "a", a, "out", out);
  const bool one_row = b.ne[0] == a.ne[0] && b.nrows() == 1;
  check(one_row || b.ne == a.ne, std::string(op) + ": b " + b.shape_string() + " must have a's shape " +
                                     a.shape_string() + " or be one row {" + std::to_string(a.ne[0]) + "}");
}
}  // namespace

void CudaOps::add(Stream& s, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_binary("add", a, b, out, index_);
  DeviceGuard g(index_);
  launch_binary(BinaryKind::Add, a, b, out, stream_of(s, index_));
}

void CudaOps::mul(Stream& s, const Tensor& a, const Tensor& b, const Tensor& out) {
  check_binary("mul", a, b, out, index_);
  DeviceGuard g(index_);
  launch_binary(BinaryKind::Mul, a, b, out, stream_of(s, index_));
}

void CudaOps::scale(Stream& s, const Tensor& x, float factor, const Tensor& out) {
  check_f32("scale", "x", x, index_);
  check_f32("scale", "out", out, index_);
  check_same_shape("scale", "x", x, "out", out);
  DeviceGuard g(index_);
  launch_unary(UnaryKind::Scale, x, factor, out, stream_of(s, index_));
}

void CudaOps::softcap(Stream& s, const Tensor& x, float cap, const Tensor& out) {
  check_f32("softcap", "x", x, index_);
  check_f32("softcap", "out", out, index_);
  check_same_shape("softcap", "x", x, "out", out);
  check(cap > 0.0f && std::isfinite(cap), "softcap: cap must be a finite value > 0");
  DeviceGuard g(index_);
  launch_unary(UnaryKind::Softcap, x, cap, out, stream_of(s, index_));
}

void CudaOps::fill(Stream& s, const Tensor& out, float value) {
  check_f32("fill", "out", out, index_);
  DeviceGuard g(index_);
  launch_unary(UnaryKind::Fill, out, value, out, stream_of(s, index_));
}

void CudaOps::softmax_rows(Stream& s, const Tensor& x, const Tensor& out) {
  check_f32("softmax_rows", "x", x, index_);
  check_f32("softmax_rows", "out", out, index_);
  check_same_shape("softmax_rows", "x", x, "out", out);
  DeviceGuard g(index_);
  launch_softmax_rows(x, out, stream_of(s, index_));
}

void CudaOps::copy(Stream& s, const Tensor& src, const Tensor& dst) {
  const char* op = "copy";
  check_on_device(op, "src", src, index_);
  check_on_device(op, "dst", dst, index_);
  check_same_shape(op, "src", src, "dst", dst);
  check(src.nb[0] == dtype_block_bytes(src.type) && dst.nb[0] == dtype_block_bytes(dst.type),
        "copy: rows of src and dst must be contiguous");
  check(src.type == dst.type || (is_float_type(src.type) && is_float_type(dst.type)),
        std::string("copy: cannot convert ") + dtype_name(src.type) + " to " + dtype_name(dst.type) +
            " (only f32 <-> f16/bf16, or the same dtype)");
  DeviceGuard g(index_);
  launch_copy(src, dst, stream_of(s, index_));
}

namespace {
void check_logits(const char* op, const Tensor& logits, int index) {
  check_f32(op, "logits", logits, index);
  check(logits.ne[2] == 1 && logits.ne[3] == 1 && logits.ne[0] > 0,
        std::string(op) + ": logits must be {V, T} with V > 0, got " + logits.shape_string());
  check(logits.ne[0] < (int64_t(1) << 30), std::string(op) + ": vocabulary too large");
}
}  // namespace

void CudaOps::argmax_rows(Stream& s, const Tensor& logits, const Tensor& out) {
  check_logits("argmax_rows", logits, index_);
  check_i32_vector("argmax_rows", "out", out, logits.ne[1], index_);
  DeviceGuard g(index_);
  launch_argmax_rows(logits, static_cast<int32_t*>(out.data), stream_of(s, index_));
}

void CudaOps::sample_rows(Stream& s, const Tensor& logits, const SamplerParams& params,
                          const Tensor& uniforms, const Tensor& out) {
  const char* op = "sample_rows";
  check_logits(op, logits, index_);
  const int64_t T = logits.ne[1];
  check_f32(op, "uniforms", uniforms, index_);
  check(uniforms.ne[0] == T && uniforms.nrows() == 1, "sample_rows: uniforms must be {T}");
  check_i32_vector(op, "out", out, T, index_);
  check(std::isfinite(params.temperature), "sample_rows: temperature must be finite");
  check(params.top_k >= 0, "sample_rows: top_k must be >= 0");
  check(params.top_p > 0.0f && params.top_p <= 1.0f, "sample_rows: top_p must be in (0, 1]");
  check(params.min_p >= 0.0f && params.min_p <= 1.0f, "sample_rows: min_p must be in [0, 1]");
  DeviceGuard g(index_);
  launch_sample_rows(logits, params, static_cast<const float*>(uniforms.data),
                     static_cast<int32_t*>(out.data), stream_of(s, index_));
}

void CudaOps::diffusion_sample_rows(Stream& s, const Tensor& logits, float inv_temp, const Tensor& uniforms,
                                    const Tensor& argmax, const Tensor& entropy, const Tensor& sampled) {
  const char* op = "diffusion_sample_rows";
  check_logits(op, logits, index_);
  const int64_t T = logits.ne[1];
  check_f32(op, "uniforms", uniforms, index_);
  check(uniforms.ne[0] == T && uniforms.nrows() == 1, "diffusion_sample_rows: uniforms must be {T}");
  check_i32_vector(op, "argmax", argmax, T, index_);
  check_i32_vector(op, "sampled", sampled, T, index_);
  check_f32(op, "entropy", entropy, index_);
  check(entropy.ne[0] == T && entropy.nrows() == 1, "diffusion_sample_rows: entropy must be {T}");
  check(inv_temp > 0.0f && std::isfinite(inv_temp),
        "diffusion_sample_rows: inv_temp must be a finite value > 0");
  DeviceGuard g(index_);
  launch_diffusion_sample_rows(logits, inv_temp, static_cast<const float*>(uniforms.data),
                               static_cast<int32_t*>(argmax.data), static_cast<float*>(entropy.data),
                               static_cast<int32_t*>(sampled.data), stream_of(s, index_));
}

// ---- mixture of experts
// ------------------------------------------------------------------------------------

void CudaOps::moe_route(Stream& s, const Tensor& logits, const Tensor* expert_scale, const Tensor& ids,
                        const Tensor& weights) {
  op_checks::moe_route(logits, expert_scale, ids, weights, DeviceId{DeviceKind::CUDA, index_});
  DeviceGuard g(index_);
  launch_moe_route(logits, expert_scale ? static_cast<const float*>(expert_scale->data) : nullptr,
                   static_cast<int32_t*>(ids.data), static_cast<float*>(weights.data), int(ids.ne[0]),
                   stream_of(s, index_));
}

// Few routed rows (decode): a matrix-vector product per routed row over its expert's rows only, the fast
// kernels of matmul (bytes read = the selected experts). Many (prefill): the slots grouped by expert and the
// tensor-core grouped GEMM (moe_gemm_tc.cu) for 16-bit and quantized weights within the reserved routed rows;
// otherwise (F32 weights) the f32 grouped GEMM (moe.cu).
void CudaOps::matmul_id(Stream& s, const Tensor& W, const Tensor& x, const Tensor& ids, const Tensor& y) {
  op_checks::matmul_id(W, x, ids, y, DeviceId{DeviceKind::CUDA, index_});
  const int64_t K = W.ne[0], N = W.ne[1], k = ids.ne[0], T = ids.ne[1], kx = x.ne[1];
  const int64_t n_slots = k * T;
  if (n_slots == 0 || N == 0) return;
  DeviceGuard g(index_);
  cudaStream_t st = stream_of(s, index_);
  const int32_t* id = static_cast<const int32_t*>(ids.data);
  // Input column c = t * kx + j' at x + c * x_ld floats, output column s at y + s * y_ld floats.
  const bool x_cols = kx == 1 || x.nb[2] == x.nb[1] * size_t(kx);
  const int64_t x_ld = int64_t((kx == 1 ? x.nb[2] : x.nb[1]) / 4);
  const bool y_cols = y.nb[2] == y.nb[1] * size_t(k);
  const int64_t y_ld = int64_t(y.nb[1] / 4);
  const float* xp = static_cast<const float*>(x.data);
  float* yp = static_cast<float*>(y.data);
  if (n_slots <= kMoeGemvMaxSlots && x_cols && y_cols) {
    if (is_float_type(W.type)) {
      launch_gemv_dense_id(W.type, W.data, W.nb[1], W.nb[2], K, N, xp, x_ld, id, n_slots, int(k), int(kx), yp,
                           y_ld, st);
      return;
    }
    if (gemv_quant_supports(W.type, K)) {
      const int64_t n_x = kx * T;
      need(regions_.act_bytes, q8_activation_bytes(K, n_x), "8-bit activations of matmul_id");
      void* act = region(regions_.act);
      launch_quantize_q8(xp, x_ld, K, n_x, act, st);
      launch_gemv_quant_id(W.type, W.data, W.nb[1], W.nb[2], K, N, act, id, n_slots, int(k), int(kx), yp,
                           y_ld, st);
      return;
    }
  }
  check(K % 32 == 0, "matmul_id: on CUDA the row length must be a multiple of 32, got " + std::to_string(K));
  if (moe_gemm_tc_supports(W) && n_slots <= plan_.max_routed_rows && regions_.moe_bytes > 0) {
    // Tensor cores: the slots grouped by expert on the device, then one grouped GEMM over every expert.
    int32_t* offsets = reinterpret_cast<int32_t*>(region(regions_.moe));
    int32_t* sorted = reinterpret_cast<int32_t*>(region(regions_.moe + kMoeOffsetsBytes));
    launch_moe_group(id, n_slots, W.ne[2], offsets, sorted, st);
    if (g_moe_pipeline.on() && moe_gemm_pipelined_supports(W, x)) {
      launch_moe_gemm_pipelined(W, x, offsets, sorted, y, st);
    } else {
      launch_moe_gemm_tc(W, x, offsets, sorted, y, st);
    }
    return;
  }
  launch_moe_gemm(W, x, id, y, st);
}

void set_moe_pipeline(std::optional<bool> on) {
  g_moe_pipeline.set(on);
}

namespace {
// TANDEM_ID_GEGLU=1: matmul_id_geglu's gate and up products and the GELU in one launch at decode (gemv_id.cu).
// On since its GPU test passed (twelfth session, H100); =0 turns it off.
EnvSwitch g_id_geglu{"TANDEM_ID_GEGLU", true};
}  // namespace

void set_id_geglu(std::optional<bool> on) {
  g_id_geglu.set(on);
}

void CudaOps::matmul_id_geglu(Stream& s, const Tensor& W_gate, const Tensor& W_up, const Tensor& x, const Tensor& ids,
                              const Tensor& gate, const Tensor& up, const Tensor& out) {
  // One launch where matmul_id would take its matrix-vector kernels (few routed rows) and both weights are alike
  // (the halves of a fused gate_up tensor); every condition is checked before anything is enqueued.
  const DeviceId dev{DeviceKind::CUDA, index_};
  op_checks::matmul_id(W_gate, x, ids, out, dev);
  op_checks::matmul_id(W_up, x, ids, out, dev);
  const int64_t K = W_gate.ne[0], N = W_gate.ne[1], k = ids.ne[0], T = ids.ne[1], kx = x.ne[1];
  const int64_t n_slots = k * T;
  const bool x_cols = kx == 1 || x.nb[2] == x.nb[1] * size_t(kx);
  const int64_t x_ld = int64_t((kx == 1 ? x.nb[2] : x.nb[1]) / 4);
  const bool y_cols = out.nb[2] == out.nb[1] * size_t(k);
  const float* xp = static_cast<const float*>(x.data);
  const bool fuse = g_id_geglu.on() && !fused_disabled() && n_slots >= 1 && n_slots <= kMoeGemvMaxSlots && x_cols &&
                    y_cols && W_up.type == W_gate.type && W_up.ne[1] == N && W_up.nb[1] == W_gate.nb[1] &&
                    W_up.nb[2] == W_gate.nb[2] &&
                    gemv_id_geglu_supports(W_gate.type, W_gate.data, W_up.data, W_gate.nb[1], W_gate.nb[2], K, xp,
                                           x_ld) &&
                    (is_float_type(W_gate.type) || regions_.act_bytes >= q8_activation_bytes(K, kx * T));
  if (!fuse) return Ops::matmul_id_geglu(s, W_gate, W_up, x, ids, gate, up, out);
  DeviceGuard g(index_);
  cudaStream_t st = stream_of(s, index_);
  void* act = nullptr;
  if (!is_float_type(W_gate.type)) {
    act = region(regions_.act);
    launch_quantize_q8(xp, x_ld, K, kx * T, act, st);
  }
  launch_gemv_id_geglu(W_gate.type, W_gate.data, W_up.data, W_gate.nb[1], W_gate.nb[2], K, N, xp, x_ld, act,
                       static_cast<const int32_t*>(ids.data), n_slots, int(k), int(kx), static_cast<float*>(out.data),
                       int64_t(out.nb[1] / 4), st);
}

void CudaOps::moe_combine(Stream& s, const Tensor& y, const Tensor& weights, const Tensor& out) {
  op_checks::moe_combine(y, weights, out, DeviceId{DeviceKind::CUDA, index_});
  DeviceGuard g(index_);
  launch_moe_combine(y, static_cast<const float*>(weights.data), out, stream_of(s, index_));
}

}  // namespace tandem::cuda
