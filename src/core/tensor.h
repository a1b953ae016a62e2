// Tensor: a non-owning view of memory on some device. Dims are in ggml order: ne[0] is the innermost,
// contiguous dimension (a Linear weight [out, in] in PyTorch is ne = {in, out}). nb[] are byte strides; for
// block types nb[0] is the block size in bytes and ne[0] counts elements (a multiple of the block size).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

enum class DeviceKind : int32_t { CPU = 0, CUDA = 1 };

// Which device a pointer lives on: cpu:0, cuda:1, ... (cpu:N are separate CPU "devices" for split tests).
struct DeviceId {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  bool operator==(const DeviceId&) const = default;
  std::string to_string() const { return (kind == DeviceKind::CPU ? "cpu:" : "cuda:") + std::to_string(index); }
};

struct Tensor {
  DType type = DType::F32;
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  std::array<size_t, 4> nb{0, 0, 0, 0};
  void* data = nullptr;
  DeviceId device{};

  // A contiguous view of data with the given dims (innermost first, up to 4).
  static Tensor contiguous(DType type, std::initializer_list<int64_t> dims, void* data, DeviceId device = {}) {
    Tensor t;
    t.type = type;
    t.data = data;
    t.device = device;
    check(dims.size() >= 1 && dims.size() <= 4, "a tensor has 1 to 4 dims");
    int i = 0;
    for (int64_t d : dims) t.ne[i++] = d;
    t.nb[0] = dtype_block_bytes(type);
    t.nb[1] = dtype_row_bytes(type, t.ne[0]);
    for (int k = 2; k < 4; ++k) t.nb[k] = t.nb[k - 1] * size_t(t.ne[k - 1]);
    return t;
  }

  int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const { return dtype_row_bytes(type, ne[0]); }
  size_t nbytes() const { return row_bytes() * size_t(nrows()); }  // of the contiguous layout
  bool is_contiguous() const {
    return nb[0] == dtype_block_bytes(type) && nb[1] == row_bytes() && nb[2] == nb[1] * size_t(ne[1]) &&
           nb[3] == nb[2] * size_t(ne[2]);
  }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Pointer to row i1 of matrix (i2, i3).
  void* row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return static_cast<char*>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
  }
  // Rows [first, first + count) of a 2-D tensor, as a view.
  Tensor rows(int64_t first, int64_t count) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + first * nb[1];
    t.ne[1] = count;
    return t;
  }
  std::string shape_string() const {
    // Appends only: GCC 12 at -O3 reports a false -Wrestrict on `"literal" + std::string`.
    std::string s = "{";
    s += std::to_string(ne[0]);
    int n = 4;
    while (n > 1 && ne[n - 1] == 1) --n;
    for (int i = 1; i < n; ++i) {
      s += ", ";
      s += std::to_string(ne[i]);
    }
    s += "}";
    return s;
  }
};

}  // namespace tandem
