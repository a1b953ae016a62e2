#include "model/weight_loader.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "core/half.h"
#include "core/out_of_memory.h"
#include "parallel/row_split.h"
#include "quant/quant.h"

namespace tandem {

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "{";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "}";
}

size_t aligned(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

// A fused gate_up expert tensor: out rows are 2 x n_ff_exp, cut in both halves.
bool WeightLoader::is_fused_experts(int64_t out_rows, const ShardRule* rule) const {
  return rule && rule->unit == CutUnit::ExpertFfRows && rule->cut == TensorCut::OutputRows &&
         dims_.n_ff_exp > 0 && out_rows == 2 * dims_.n_ff_exp;
}

namespace {}  // namespace

WeightLoader::WeightLoader(const gguf::GgufFile& file, DeviceId device, ShardRuleTable rules,
                           const RankShard& shard, const ShardDims& dims, RowSplitWeights* row_split)
    : file_(file), device_(device), rules_(rules), shard_(shard), dims_(dims), row_split_(row_split) {
  if (device.kind == DeviceKind::CPU) return;
  upload_device_ = create_device(device);
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    int64_t layer = -1;
    total += aligned(part_bytes(t, find_shard_rule(rules_, t.name, &layer), layer));
  }
  const bool head_cut = shard_.mode == SplitMode::Tensor || !shard_.first;
  if (shard_.last && head_cut && !row_split_ &&
      !file.find_tensor("output.weight")) {  // a tied head: token_embd again, cut as the head
    if (const gguf::TensorInfo* te = file.find_tensor("token_embd.weight"))
      total += aligned(part_bytes(*te, &shard_rule_named(rules_, "output.weight"), -1));
  }
  const size_t free_b = upload_device_->free_memory(), total_b = upload_device_->total_memory();
  auto gib = [](double b) { return std::to_string(b / double(1u << 30)).substr(0, 5) + " GiB"; };
  const std::string does_not_fit =
      "the model's weights need " + gib(double(total)) + " on " + upload_device_->name() + ", which has " +
      gib(double(free_b)) + " free of " + gib(double(total_b)) +
      ": use a smaller quantization (q8_0, q4_k) or split the model over more devices";
  if (total > free_b) throw OutOfMemory(does_not_fit);
  try {  // free memory is not always one block that fits
    device_weights_ = upload_device_->allocate(std::max<uint64_t>(total, 256));
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(does_not_fit + " (" + e.what() + ")");
  }
}

WeightLoader::~WeightLoader() = default;

size_t WeightLoader::part_bytes(const gguf::TensorInfo& info, const ShardRule* rule, int64_t layer) const {
  if (!rule) return info.nbytes;
  if (!shard_.holds(*rule, layer)) return 0;
  if (row_split_ && rule->row == RowPlacement::SplitRows) return 0;  // the registry places it
  if (shard_.mode != SplitMode::Tensor || rule->cut == TensorCut::Mirrored) return info.nbytes;
  const Range r = shard_.cut_range(rule->unit, dims_, layer);
  const int64_t rows = info.ne[1] * info.ne[2] * info.ne[3];  // every row of every matrix (expert)
  if (rule->cut == TensorCut::InputColumns) return dtype_row_bytes(info.type, r.size()) * size_t(rows);
  if (info.n_dims < 2) return size_t(r.size()) * sizeof(float);  // a cut vector (biases are F32 here)
  const bool fused = is_fused_experts(info.ne[1], rule);
  return dtype_row_bytes(info.type, info.ne[0]) * size_t(r.size()) * size_t(info.ne[2] * info.ne[3]) *
         (fused ? 2u : 1u);
}

Tensor WeightLoader::to_device(const Tensor& host, const std::string& key) {
  auto it = uploaded_.find(key);
  void* dst = it != uploaded_.end() ? it->second : nullptr;
  const size_t row_bytes = host.row_bytes();
  const size_t bytes = row_bytes * size_t(host.nrows());
  if (!dst) {
    if (device_used_ + bytes <= device_weights_.size()) {
      dst = static_cast<char*>(device_weights_.data()) + device_used_;
      device_used_ += aligned(bytes);
    } else {  // converted vectors (f16 -> f32) are larger than in the file
      dst = device_owned_.emplace_back(upload_device_->allocate(std::max<size_t>(bytes, 1))).data();
    }
    Stream& s = upload_device_->default_stream();
    if (host.is_contiguous()) {
      upload_device_->copy_from_host(s, dst, host.data, bytes);
    } else {  // a cut: one 2-D copy per matrix (expert, gate/up half) packs the strided rows
      const size_t matrix_bytes = row_bytes * size_t(host.ne[1]);
      for (int64_t i3 = 0; i3 < host.ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < host.ne[2]; ++i2)
          upload_device_->copy_2d(s, static_cast<char*>(dst) + size_t(i3 * host.ne[2] + i2) * matrix_bytes,
                                  row_bytes,
                                  static_cast<const char*>(host.data) + i2 * host.nb[2] + i3 * host.nb[3],
                                  host.nb[1], row_bytes, size_t(host.ne[1]), CopyKind::HostToDevice);
    }
    s.synchronize();  // the model's own stream uses the weights next (and the host views may go)
    uploaded_[key] = dst;
  }
  Tensor t = Tensor::contiguous(host.type, {host.ne[0], host.ne[1], host.ne[2], host.ne[3]}, dst, device_);
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

const ShardRule* WeightLoader::rule_for(const std::string& name, const char* as, int64_t* layer) const {
  const ShardRule* rule = find_shard_rule(rules_, name, layer);
  if (as) rule = &shard_rule_named(rules_, as);
  return rule;
}

Tensor WeightLoader::cut(const Tensor& t, const ShardRule* rule, int64_t layer) const {
  if (!rule || shard_.mode != SplitMode::Tensor || rule->cut == TensorCut::Mirrored) return t;
  const Range r = shard_.cut_range(rule->unit, dims_, layer);
  Tensor v = t;
  // Biases of row-cut matrices are vectors: their one dim is the output-feature dim.
  const bool is_vector =
      rule->cut == TensorCut::OutputRows && std::string_view(rule->name).ends_with(".bias");
  if (is_vector || rule->cut == TensorCut::InputColumns) {  // cut along ne[0]
    check(r.begin % dtype_block_size(t.type) == 0 && r.size() % dtype_block_size(t.type) == 0,
          "cannot cut " + std::string(dtype_name(t.type)) + " rows at column " + std::to_string(r.begin));
    v.data = static_cast<char*>(t.data) + dtype_row_bytes(t.type, r.begin);
    v.ne[0] = r.size();
  } else if (is_fused_experts(t.ne[1], rule)) {  // both halves of every expert: {in, rows, 2, n_expert}
    check(t.ne[3] == 1, "a fused expert tensor must be 3-D");
    v.data = static_cast<char*>(t.data) + size_t(r.begin) * t.nb[1];
    v.ne = {t.ne[0], r.size(), 2, t.ne[2]};
    v.nb = {t.nb[0], t.nb[1], t.nb[1] * size_t(dims_.n_ff_exp), t.nb[2]};
  } else if (t.ne[2] * t.ne[3] > 1) {  // rows of every matrix (expert): the matrix strides stay
    v.data = static_cast<char*>(t.data) + size_t(r.begin) * t.nb[1];
    v.ne[1] = r.size();
  } else {  // output rows: a contiguous block of rows
    v.data = static_cast<char*>(t.data) + size_t(r.begin) * t.nb[1];
    v.ne[1] = r.size();
    v.nb[2] = v.nb[3] = v.nb[1] * size_t(r.size());
  }
  return v;
}

Tensor WeightLoader::place(const Tensor& host, const std::string& key) {
  if (device_.kind == DeviceKind::CPU) {
    Tensor t = host;
    t.device = device_;
    return t;
  }
  return to_device(host, key);
}

Tensor WeightLoader::matrix(const std::string& name, std::initializer_list<int64_t> shape, const char* as) {
  const gguf::TensorInfo& info = find(name);
  check_shape(info, shape);
  check(quant::is_convertible(info.type),
        "tensor " + name + " has type " + dtype_name(info.type) +
            ", which matrix products do not support (f32, f16, bf16, q8_0, q4_0, q4_k, "
            "q5_k, q6_k)");
  Tensor full = Tensor::contiguous(info.type, {info.ne[0], info.ne[1], info.ne[2], info.ne[3]},
                                   const_cast<uint8_t*>(file_.tensor_data(info)), DeviceId{});
  int64_t layer = -1;
  const ShardRule* rule = rule_for(name, as, &layer);
  if (rule && !shard_.holds(*rule, layer)) {  // held by another rank: shape only
    full.data = nullptr;
    full.device = device_;
    return full;
  }
  if (rule && row_split_ && rule->row == RowPlacement::SplitRows) return row_split_->add(full, name);
  const Tensor part = cut(full, rule, layer);
  // Uncut, a tensor read under another role (a tied head) shares the upload of its own name.
  const bool was_cut = part.data != full.data || part.ne != full.ne;
  const std::string key = as && was_cut ? name + " as " + std::string(as) : name;
  return place(part, key);
}

std::optional<Tensor> WeightLoader::optional_matrix(const std::string& name,
                                                    std::initializer_list<int64_t> shape) {
  if (!has(name)) return std::nullopt;
  return matrix(name, shape);
}

Tensor WeightLoader::vector(const std::string& name, int64_t n) {
  const gguf::TensorInfo& info = find(name);
  check_shape(info, {n});
  check(info.type == DType::F32 || info.type == DType::F16 || info.type == DType::BF16,
        "tensor " + name + " has type " + dtype_name(info.type) + "; vectors must be f32, f16 or bf16");
  int64_t layer = -1;
  const ShardRule* rule = rule_for(name, nullptr, &layer);
  if (rule && !shard_.holds(*rule, layer)) {
    Tensor t = Tensor::contiguous(DType::F32, {n}, nullptr, device_);
    return t;
  }
  Tensor t;
  if (info.type == DType::F32) {
    t = Tensor::contiguous(DType::F32, {n}, const_cast<uint8_t*>(file_.tensor_data(info)), DeviceId{});
  } else {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(file_.tensor_data(info));
    std::vector<float>& dst = owned_.emplace_back(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + i, 2);
      dst[size_t(i)] = info.type == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
    t = Tensor::contiguous(DType::F32, {n}, dst.data(), DeviceId{});
  }
  return place(cut(t, rule, layer), name + " (f32)");
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

void WeightLoader::check_all_used(const std::string& arch, const std::string& hint) const {
  const std::vector<std::string> names = unused();
  if (names.empty()) return;
  std::string list;
  for (size_t i = 0; i < names.size() && i < 4; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 4) list += ", ... (" + std::to_string(names.size()) + " in all)";
  throw Error("the " + arch + " model has tensors tandem does not know how to use: " + list + hint);
}

size_t WeightLoader::owned_bytes() const {
  size_t n = 0;
  for (const auto& v : owned_) n += v.size() * sizeof(float);
  return n;
}

}  // namespace tandem
