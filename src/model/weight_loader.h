// Finds a model's tensors in a GGUF file by name, checks their shapes and dtypes, and hands them out as
// Tensor views. On the CPU device the views point into the memory-mapped file (no copy); small vectors stored
// in a 16-bit type are converted to F32 once (norm weights must be F32 for Ops::rms_norm).
//
// Messages name the tensor and both shapes: "missing tensor blk.3.attn_k.weight",
// "tensor blk.0.attn_q.weight has shape {64, 32}, expected {64, 64}".
//
// Split models: a loader serves one rank (RankShard) and applies the architecture's shard rule of each tensor
// (parallel/shard_rules.h), so model code asks for the whole tensor by name and gets what the rank holds:
//   - a tensor the rank does not hold (layer split) comes back with data == nullptr and its full shape;
//   - tensor split: a slice by output rows (contiguous) or input columns (strided: rows keep the full
//     matrix's stride on the CPU; other devices get a compact copy made by one 2-D copy per matrix). 3-D
//     expert tensors are cut in every expert alike (CutUnit::ExpertFfRows); a fused gate_up expert tensor
//     {in, 2 n_ff_exp, n_expert} comes back as {in, rows, 2, n_expert} (both halves cut);
//   - row split: matrices go to the RowSplitWeights registry (parallel/row_split.h), which places a row slice
//     on every device; the model gets the registry's handle.
// Shapes are always checked against the full tensor, on every rank.
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
#include "parallel/shard_rules.h"

namespace tandem {

class RowSplitWeights;

// The GGUF name of a per-layer tensor: "blk.<layer>.<name>".
inline std::string layer_tensor_name(int64_t layer, const char* name) {
  return "blk." + std::to_string(layer) + "." + name;
}

class WeightLoader {
 public:
  // Tensors for `device`. CPU: the views point into file's mapping, which must outlive them. Other devices
  // (CUDA): every tensor handed out is copied into one device allocation sized up front for this rank's share
  // of the file, so that a model that does not fit fails at once with the sizes; the views point there and
  // the loader keeps the memory. shard/dims: what this rank holds (default: everything). row_split: the
  // registry of a row-split model (matrices go there), else null.
  WeightLoader(const gguf::GgufFile& file, DeviceId device, ShardRuleTable rules, const RankShard& shard = {},
               const ShardDims& dims = {}, RowSplitWeights* row_split = nullptr);
  ~WeightLoader();

  // A matrix for Ops::matmul / get_rows: F32, F16, BF16 or a supported block type, of exactly `shape`. `as`
  // applies another tensor's shard rule (a tied output head is token_embd cut like "output.weight").
  Tensor matrix(const std::string& name, std::initializer_list<int64_t> shape, const char* as = nullptr);
  std::optional<Tensor> optional_matrix(const std::string& name, std::initializer_list<int64_t> shape);
  // A vector of F32 values (norm weights, biases, rope factors) of exactly `shape`; F16/BF16 are converted.
  Tensor vector(const std::string& name, int64_t n);
  std::optional<Tensor> optional_vector(const std::string& name, int64_t n);

  bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }
  const gguf::TensorInfo* info(const std::string& name) const { return file_.find_tensor(name); }
  // Tensors of the file that no call above asked for (a sign of an unsupported variant of the architecture).
  std::vector<std::string> unused() const;
  // Throws Error naming up to four tensors no call asked for ("the <arch> model has tensors tandem does not
  // know how to use: ..." then `hint`): a variant it does not know would otherwise give silently wrong
  // output.
  void check_all_used(const std::string& arch, const std::string& hint = "") const;
  // Bytes of F32 copies the loader had to make (kept alive by the loader: keep it as long as the tensors).
  size_t owned_bytes() const;

 private:
  const gguf::TensorInfo& find(const std::string& name);
  void check_shape(const gguf::TensorInfo& info, const std::vector<int64_t>& shape) const;
  // The rule for name (or `as`), null for names no rule knows; sets *layer.
  const ShardRule* rule_for(const std::string& name, const char* as, int64_t* layer) const;
  // The part of the full host tensor `t` this rank holds under `rule` (tensor split cuts), unchanged
  // otherwise.
  Tensor cut(const Tensor& t, const ShardRule* rule, int64_t layer) const;
  bool is_fused_experts(int64_t out_rows, const ShardRule* rule) const;
  // Bytes of this rank's part of a file tensor (for the up-front device allocation).
  size_t part_bytes(const gguf::TensorInfo& info, const ShardRule* rule, int64_t layer) const;
  Tensor place(const Tensor& host, const std::string& key);

  const gguf::GgufFile& file_;
  DeviceId device_;
  ShardRuleTable rules_;
  RankShard shard_;
  ShardDims dims_;
  RowSplitWeights* row_split_ = nullptr;
  std::vector<std::string> used_;
  std::deque<std::vector<float>> owned_;  // deque: growing keeps earlier buffers in place

  // Device copies (non-CPU devices only).
  Tensor to_device(const Tensor& host, const std::string& key);
  std::unique_ptr<Device> upload_device_;
  Buffer device_weights_;
  size_t device_used_ = 0;
  std::map<std::string, void*> uploaded_;
  std::deque<Buffer> device_owned_;
};

}  // namespace tandem
