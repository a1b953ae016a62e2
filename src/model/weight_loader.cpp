#include "model/weight_loader.h"

#include <algorithm>
#include <cstring>

#include "core/half.h"
#include "quant/quant.h"

namespace tandem {

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "{";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "}";
}

}  // namespace

WeightLoader::WeightLoader(const gguf::GgufFile& file, DeviceId device) : file_(file), device_(device) {
  if (device.kind == DeviceKind::CPU) return;
  upload_device_ = create_device(device);
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : file.tensors()) total += (t.nbytes + 255) / 256 * 256;
  const size_t free_b = upload_device_->free_memory(), total_b = upload_device_->total_memory();
  auto gib = [](double b) { return std::to_string(b / double(1u << 30)).substr(0, 5) + " GiB"; };
  check(total <= free_b,
        "the model's weights need " + gib(double(total)) + " on " + upload_device_->name() + ", which has " +
            gib(double(free_b)) + " free of " + gib(double(total_b)) +
            ": use a smaller quantization (q8_0, q4_k) or split the model over more devices");
  device_weights_ = upload_device_->allocate(std::max<uint64_t>(total, 256));
}

Tensor WeightLoader::to_device(const Tensor& host, const std::string& name) {
  auto it = uploaded_.find(name);
  void* dst = it != uploaded_.end() ? it->second : nullptr;
  if (!dst) {
    const size_t bytes = host.nbytes();
    if (device_used_ + bytes <= device_weights_.size()) {
      dst = static_cast<char*>(device_weights_.data()) + device_used_;
      device_used_ += (bytes + 255) / 256 * 256;
    } else {  // converted vectors (f16 -> f32) are larger than in the file
      dst = device_owned_.emplace_back(upload_device_->allocate(std::max<size_t>(bytes, 1))).data();
    }
    Stream& s = upload_device_->default_stream();
    upload_device_->copy_from_host(s, dst, host.data, bytes);
    s.synchronize();  // the model's own stream uses the weights next
    uploaded_[name] = dst;
  }
  Tensor t = host;
  t.data = dst;
  t.device = device_;
  return t;
}

const gguf::TensorInfo& WeightLoader::find(const std::string& name) {
  const gguf::TensorInfo* info = file_.find_tensor(name);
  check(info != nullptr, "missing tensor " + name);
  used_.push_back(name);
  return *info;
}

void WeightLoader::check_shape(const gguf::TensorInfo& info, const std::vector<int64_t>& shape) const {
  std::vector<int64_t> actual(info.ne.begin(), info.ne.begin() + std::max<uint32_t>(info.n_dims, 1));
  std::vector<int64_t> expect = shape;
  // Compare with trailing 1s dropped on both sides ({n} == {n, 1}).
  while (actual.size() > 1 && actual.back() == 1) actual.pop_back();
  while (expect.size() > 1 && expect.back() == 1) expect.pop_back();
  check(actual == expect,
        "tensor " + info.name + " has shape " + shape_string(actual) + ", expected " + shape_string(expect));
}

Tensor WeightLoader::view(const gguf::TensorInfo& info) {
  Tensor t = Tensor::contiguous(info.type, {info.ne[0], info.ne[1], info.ne[2], info.ne[3]},
                                const_cast<uint8_t*>(file_.tensor_data(info)), DeviceId{});
  if (device_.kind == DeviceKind::CPU) {
    t.device = device_;
    return t;
  }
  return to_device(t, info.name);
}

Tensor WeightLoader::matrix(const std::string& name, std::initializer_list<int64_t> shape) {
  const gguf::TensorInfo& info = find(name);
  check_shape(info, shape);
  check(quant::is_convertible(info.type),
        "tensor " + name + " has type " + dtype_name(info.type) +
            ", which matrix products do not support (f32, f16, bf16, q8_0, q4_0, q4_k, "
            "q5_k, q6_k)");
  return view(info);
}

std::optional<Tensor> WeightLoader::optional_matrix(const std::string& name,
                                                    std::initializer_list<int64_t> shape) {
  if (!has(name)) return std::nullopt;
  return matrix(name, shape);
}

Tensor WeightLoader::vector(const std::string& name, int64_t n) {
  const gguf::TensorInfo& info = find(name);
  check_shape(info, {n});
  if (info.type == DType::F32) return view(info);
  check(info.type == DType::F16 || info.type == DType::BF16,
        "tensor " + name + " has type " + dtype_name(info.type) + "; vectors must be f32, f16 or bf16");
  const uint16_t* src = reinterpret_cast<const uint16_t*>(file_.tensor_data(info));
  std::vector<float>& dst = owned_.emplace_back(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + i, 2);
    dst[size_t(i)] = info.type == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
  }
  Tensor t = Tensor::contiguous(DType::F32, {n}, dst.data(), DeviceId{});
  if (device_.kind == DeviceKind::CPU) {
    t.device = device_;
    return t;
  }
  return to_device(t, name + " (f32)");
}

std::optional<Tensor> WeightLoader::optional_vector(const std::string& name, int64_t n) {
  if (!has(name)) return std::nullopt;
  return vector(name, n);
}

std::vector<std::string> WeightLoader::unused() const {
  std::vector<std::string> used = used_;
  std::sort(used.begin(), used.end());
  std::vector<std::string> out;
  for (const gguf::TensorInfo& t : file_.tensors())
    if (!std::binary_search(used.begin(), used.end(), t.name)) out.push_back(t.name);
  return out;
}

size_t WeightLoader::owned_bytes() const {
  size_t n = 0;
  for (const auto& v : owned_) n += v.size() * sizeof(float);
  return n;
}

}  // namespace tandem
