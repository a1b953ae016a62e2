// RowView: the part of a tensor view a CUDA kernel needs to address row r (r counts rows over ne[1..3]), made
// on the host from a Tensor and passed to kernels by value. Elements inside a row are contiguous (backend.h
// rule).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif

namespace tandem::cuda {

// Whether p may be read with 16-byte loads (the vector paths' condition, with their strides % 16).
inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

struct RowView {
  char* data = nullptr;
  int64_t ne0 = 0, ne1 = 1, ne2 = 1, ne3 = 1;
  size_t nb1 = 0, nb2 = 0, nb3 = 0;

  TANDEM_HD int64_t n_rows() const { return ne1 * ne2 * ne3; }
  TANDEM_HD char* row(int64_t r) const {
    const int64_t i1 = r % ne1;
    const int64_t i23 = r / ne1;
    const int64_t i2 = i23 % ne2;
    const int64_t i3 = i23 / ne2;
    return data + i1 * nb1 + i2 * nb2 + i3 * nb3;
  }
  template <class T>
  TANDEM_HD T* row_as(int64_t r) const {
    return reinterpret_cast<T*>(row(r));
  }
};

inline RowView row_view(const Tensor& t) {
  RowView v;
  v.data = static_cast<char*>(t.data);
  v.ne0 = t.ne[0];
  v.ne1 = t.ne[1];
  v.ne2 = t.ne[2];
  v.ne3 = t.ne[3];
  v.nb1 = t.nb[1];
  v.nb2 = t.nb[2];
  v.nb3 = t.nb[3];
  return v;
}

}  // namespace tandem::cuda
