#include "convert/output_type.h"

#include "core/error.h"
#include "quant/quantize_model.h"

namespace tandem::convert {
namespace {

struct OutTypeName {
  OutType type;
  const char* name;
};
constexpr OutTypeName kNames[] = {
    {OutType::AUTO, "auto"}, {OutType::F32, "f32"},       {OutType::F16, "f16"},      {OutType::BF16, "bf16"},
    {OutType::Q8_0, "q8_0"}, {OutType::Q4_0, "q4_0"},     {OutType::Q4_K, "q4_k"},    {OutType::Q5_K, "q5_k"},
    {OutType::Q6_K, "q6_k"}, {OutType::Q4_K_M, "q4_k_m"}, {OutType::Q5_K_M, "q5_k_m"}};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The mixed recipes (llama.cpp's Q4_K_M / Q5_K_M, the same rule `tandem quantize` applies,
// quant/quantize_model.h): Q6_K for the output head (token_embd when tied) and for attn_v / ffn_down in the
// layers of quant::more_bits_layer; the base type (Q4_K / Q5_K) for every other matrix.
DType mixed_type(DType base, const PlannedTensor& t, int64_t n_layer, bool has_output) {
  if (t.gguf_name == "output.weight" || (!has_output && t.gguf_name == "token_embd.weight"))
    return DType::Q6_K;
  if (t.layer >= 0 &&
      (ends_with(t.gguf_name, ".attn_v.weight") || ends_with(t.gguf_name, ".ffn_down.weight") ||
       ends_with(t.gguf_name, ".ffn_down_exps.weight")) &&  // llama.cpp's rule matches ffn_down*
      quant::more_bits_layer(t.layer, int(n_layer)))
    return DType::Q6_K;
  return base;
}

}  // namespace

std::optional<OutType> out_type_from_name(std::string_view name) {
  for (const auto& n : kNames)
    if (name == n.name) return n.type;
  return std::nullopt;
}

const char* out_type_name(OutType t) {
  for (const auto& n : kNames)
    if (n.type == t) return n.name;
  return "?";
}

std::string out_type_names() {
  std::string s;
  for (const auto& n : kNames) s += std::string(s.empty() ? "" : ", ") + n.name;
  return s;
}

OutType resolve_auto(OutType t, StDType source_weight_dtype) {
  if (t != OutType::AUTO) return t;
  return source_weight_dtype == StDType::BF16 ? OutType::BF16 : OutType::F16;
}

uint32_t file_type_of(OutType t) {
  switch (t) {
    case OutType::F32:
      return 0;
    case OutType::F16:
      return 1;
    case OutType::Q4_0:
      return 2;
    case OutType::Q8_0:
      return 7;
    case OutType::Q4_K:
      return 14;
    case OutType::Q4_K_M:
      return 15;
    case OutType::Q5_K:
      return 16;
    case OutType::Q5_K_M:
      return 17;
    case OutType::Q6_K:
      return 18;
    case OutType::BF16:
      return 32;
    case OutType::AUTO:
      break;
  }
  throw Error("internal: file_type_of(auto)");
}

DType tensor_type_for(OutType t, const PlannedTensor& tensor, int64_t n_layer, bool has_output) {
  if (tensor.ne.size() < 2) return DType::F32;
  DType want = DType::F16;
  switch (t) {
    case OutType::F32:
      want = DType::F32;
      break;
    case OutType::F16:
      want = DType::F16;
      break;
    case OutType::BF16:
      want = DType::BF16;
      break;
    case OutType::Q8_0:
      want = DType::Q8_0;
      break;
    case OutType::Q4_0:
      want = DType::Q4_0;
      break;
    case OutType::Q4_K:
      want = DType::Q4_K;
      break;
    case OutType::Q5_K:
      want = DType::Q5_K;
      break;
    case OutType::Q6_K:
      want = DType::Q6_K;
      break;
    case OutType::Q4_K_M:
      want = mixed_type(DType::Q4_K, tensor, n_layer, has_output);
      break;
    case OutType::Q5_K_M:
      want = mixed_type(DType::Q5_K, tensor, n_layer, has_output);
      break;
    case OutType::AUTO:
      throw Error("internal: tensor_type_for(auto)");
  }
  const int64_t ne0 = tensor.ne[0];
  if (ne0 % dtype_block_size(want) == 0) return want;
  return ne0 % dtype_block_size(DType::Q8_0) == 0 ? DType::Q8_0 : DType::F16;
}

bool is_fallback_type(OutType t, DType stored) {
  switch (t) {
    case OutType::F32:
      return stored != DType::F32;
    case OutType::F16:
      return stored != DType::F16;
    case OutType::BF16:
      return stored != DType::BF16;
    case OutType::Q8_0:
      return stored != DType::Q8_0;
    case OutType::Q4_0:
      return stored != DType::Q4_0;
    case OutType::Q4_K:
      return stored != DType::Q4_K;
    case OutType::Q5_K:
      return stored != DType::Q5_K;
    case OutType::Q6_K:
      return stored != DType::Q6_K;
    case OutType::Q4_K_M:
      return stored != DType::Q4_K && stored != DType::Q6_K;
    case OutType::Q5_K_M:
      return stored != DType::Q5_K && stored != DType::Q6_K;
    case OutType::AUTO:
      break;
  }
  return false;
}

}  // namespace tandem::convert
