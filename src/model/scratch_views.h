// Views on the scratch tensors of a decoder's forward pass. Scratch is planned once for the widest layer and
// the most rows ({width, max_rows}, contiguous), and every step views a part of it at the same addresses
// (which CUDA graphs need): the first T columns, a column range, a narrower layer's prefix, or a row split
// into heads.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem {

// Columns [begin, end) of a {width, max} scratch tensor.
inline Tensor col_range(const Tensor& t, int64_t begin, int64_t end) {
  Tensor v = t;
  v.data = static_cast<char*>(t.data) + size_t(begin) * t.nb[1];
  v.ne[1] = end - begin;
  v.nb[2] = v.nb[1] * size_t(end - begin);
  v.nb[3] = v.nb[2];
  return v;
}

// The first n columns of a {width, max} scratch tensor.
inline Tensor first_cols(const Tensor& t, int64_t n) {
  return col_range(t, 0, n);
}

// A contiguous F32 {width, n} tensor at the start of a scratch slot planned for the widest layer.
inline Tensor slot_view(const Tensor& slot, int64_t width, int64_t n) {
  return Tensor::contiguous(DType::F32, {width, n}, slot.data, slot.device);
}

// {n_head * head_dim, T} seen as {head_dim, n_head, T}.
inline Tensor split_heads(const Tensor& t, int64_t head_dim) {
  Tensor v = t;
  v.ne = {head_dim, t.ne[0] / head_dim, t.ne[1], 1};
  v.nb = {t.nb[0], t.nb[0] * size_t(head_dim), t.nb[1], t.nb[1] * size_t(t.ne[1])};
  return v;
}

}  // namespace tandem
