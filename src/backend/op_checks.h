// Argument checks shared by every backend's ops (CPU and CUDA follow the same rules): each failure names the
// op, the argument and what was expected, and throws tandem::Error before any work is done.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/tensor.h"

namespace tandem::op_checks {

// t lives on `dev` (for a CPU device: any CPU device), has data unless empty, and no negative dimension.
void on_device(const char* op, const char* name, const Tensor& t, DeviceId dev);
void type(const char* op, const char* name, const Tensor& t, DType type);
// F32 on dev with contiguous rows (nb[0] == 4) and 4-byte aligned row strides.
void f32(const char* op, const char* name, const Tensor& t, DeviceId dev);
// I32 {n} contiguous on dev.
void i32_vector(const char* op, const char* name, const Tensor& t, int64_t n, DeviceId dev);
void same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b);
void dims(const char* op, const char* name, const Tensor& t, int64_t ne0, int64_t ne1, int64_t ne2 = 1,
          int64_t ne3 = 1);
// The tensors (named together in `names`, e.g. "x, dense and moe") have pairwise distinct data: the fused row
// ops read a whole row of one before they write another, so an alias would read half-written values.
void no_alias(const char* op, const char* names, std::initializer_list<const Tensor*> tensors);

}  // namespace tandem::op_checks

namespace tandem::op_checks {

// The argument rules of the mixture-of-experts ops (backend.h), shared by every backend. They check shapes,
// dtypes and devices, not the index values inside ids (the CPU ops check those while they run).
void moe_route(const Tensor& logits, const Tensor* expert_scale, const Tensor& ids, const Tensor& weights,
               DeviceId dev);
void matmul_id(const Tensor& W, const Tensor& x, const Tensor& ids, const Tensor& y, DeviceId dev);
void moe_combine(const Tensor& y, const Tensor& weights, const Tensor& out, DeviceId dev);

}  // namespace tandem::op_checks
