// The shared argument rules of the mixture-of-experts ops (moe_route, matmul_id, moe_combine; backend.h).
#include <string>

#include "backend/backend.h"
#include "backend/op_checks.h"
#include "core/error.h"
#include "quant/quant.h"

namespace tandem::op_checks {

namespace {
// An F32 or I32 {k, T} tensor stored densely (index j + k * t).
void dense_kt(const char* op, const char* name, const Tensor& t, DType dt, int64_t k, int64_t T,
              DeviceId dev) {
  on_device(op, name, t, dev);
  type(op, name, t, dt);
  dims(op, name, t, k, T);
  check(t.is_contiguous(), std::string(op) + ": " + name + " must be contiguous");
}
}  // namespace

void moe_route(const Tensor& logits, const Tensor* expert_scale, const Tensor& ids, const Tensor& weights,
               DeviceId dev) {
  const char* op = "moe_route";
  f32(op, "logits", logits, dev);
  check(logits.ne[2] == 1 && logits.ne[3] == 1,
        "moe_route: logits must be {n_expert, T}, got " + logits.shape_string());
  const int64_t n_expert = logits.ne[0], T = logits.ne[1];
  const int64_t k = ids.ne[0];
  check(k >= 1 && k <= n_expert && k <= Ops::kMaxMoeTopK,
        "moe_route: the number of selected experts (ids' ne[0] = " + std::to_string(k) +
            ") must be between 1 and the " + std::to_string(n_expert) + " experts (at most " +
            std::to_string(Ops::kMaxMoeTopK) + ")");
  dense_kt(op, "ids", ids, DType::I32, k, T, dev);
  dense_kt(op, "weights", weights, DType::F32, k, T, dev);
  if (expert_scale) {
    f32(op, "expert_scale", *expert_scale, dev);
    dims(op, "expert_scale", *expert_scale, n_expert, 1);
  }
}

void matmul_id(const Tensor& W, const Tensor& x, const Tensor& ids, const Tensor& y, DeviceId dev) {
  const char* op = "matmul_id";
  on_device(op, "W", W, dev);
  check(quant::is_convertible(W.type),
        std::string("matmul_id: W has unsupported dtype ") + dtype_name(W.type));
  check(W.ne[3] == 1, "matmul_id: W must be {in, out, n_expert}, got " + W.shape_string());
  check(W.nb[0] == dtype_block_bytes(W.type), "matmul_id: W must have contiguous rows");
  const int64_t K = W.ne[0], N = W.ne[1];
  check(K % dtype_block_size(W.type) == 0, "matmul_id: W's row length " + std::to_string(K) +
                                               " is not a multiple of the block size of " +
                                               dtype_name(W.type));
  on_device(op, "ids", ids, dev);
  type(op, "ids", ids, DType::I32);
  check(ids.ne[2] == 1 && ids.ne[3] == 1 && ids.is_contiguous(),
        "matmul_id: ids must be a contiguous {k, T}, got " + ids.shape_string());
  const int64_t k = ids.ne[0], T = ids.ne[1];
  f32(op, "x", x, dev);
  check(x.ne[0] == K && (x.ne[1] == 1 || x.ne[1] == k) && x.ne[2] == T && x.ne[3] == 1,
        "matmul_id: x must be {" + std::to_string(K) + ", 1 or " + std::to_string(k) + ", " +
            std::to_string(T) + "}, got " + x.shape_string());
  f32(op, "y", y, dev);
  dims(op, "y", y, N, k, T);
}

void moe_combine(const Tensor& y, const Tensor& weights, const Tensor& out, DeviceId dev) {
  const char* op = "moe_combine";
  f32(op, "y", y, dev);
  check(y.ne[3] == 1, "moe_combine: y must be {n, k, T}, got " + y.shape_string());
  dense_kt(op, "weights", weights, DType::F32, y.ne[1], y.ne[2], dev);
  f32(op, "out", out, dev);
  dims(op, "out", out, y.ne[0], y.ne[2]);
}

}  // namespace tandem::op_checks
