// Finds a model's tensors in a GGUF file by name, checks their shapes and dtypes, and hands them out as
// Tensor views. On the CPU device the views point into the memory-mapped file (no copy); small vectors stored
// in a 16-bit type are converted to F32 once (norm weights must be F32 for Ops::rms_norm).
//
// Messages name the tensor and both shapes: "missing tensor blk.3.attn_k.weight",
// "tensor blk.0.attn_q.weight has shape {64, 32}, expected {64, 64}".
//
// Later (tensor split, issue 7) a loader for one rank hands out shards of the same names; model code asks for
// tensors by role and does not care whether it gets the whole matrix or a slice.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "gguf/gguf.h"

namespace tandem {

class WeightLoader {
 public:
  // Tensors for `device`. CPU: the views point into file's mapping, which must outlive them. Other devices
  // (CUDA): every tensor handed out is copied into one device allocation sized for all tensors of the file up
  // front, so that a model that does not fit fails at once with the sizes; the views point there and the
  // loader keeps the memory.
  WeightLoader(const gguf::GgufFile& file, DeviceId device);

  // A matrix for Ops::matmul / get_rows: F32, F16, BF16 or a supported block type, of exactly `shape`.
  Tensor matrix(const std::string& name, std::initializer_list<int64_t> shape);
  std::optional<Tensor> optional_matrix(const std::string& name, std::initializer_list<int64_t> shape);
  // A vector of F32 values (norm weights, biases, rope factors) of exactly `shape`; F16/BF16 are converted.
  Tensor vector(const std::string& name, int64_t n);
  std::optional<Tensor> optional_vector(const std::string& name, int64_t n);

  bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }
  const gguf::TensorInfo* info(const std::string& name) const { return file_.find_tensor(name); }
  // Tensors of the file that no call above asked for (a sign of an unsupported variant of the architecture).
  std::vector<std::string> unused() const;
  // Bytes of F32 copies the loader had to make (kept alive by the loader: keep it as long as the tensors).
  size_t owned_bytes() const;

 private:
  const gguf::TensorInfo& find(const std::string& name);
  void check_shape(const gguf::TensorInfo& info, const std::vector<int64_t>& shape) const;
  Tensor view(const gguf::TensorInfo& info);

  const gguf::GgufFile& file_;
  DeviceId device_;
  std::vector<std::string> used_;
  std::deque<std::vector<float>> owned_;  // deque: growing keeps earlier buffers in place

  // Device copies (non-CPU devices only).
  Tensor to_device(const Tensor& host, const std::string& name);
  std::unique_ptr<Device> upload_device_;
  Buffer device_weights_;
  size_t device_used_ = 0;
  std::map<std::string, void*> uploaded_;
  std::deque<Buffer> device_owned_;
};

}  // namespace tandem
