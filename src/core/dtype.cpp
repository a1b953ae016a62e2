#include "core/dtype.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace tandem {
namespace {

constexpr DTypeTraits kTraits[] = {
    {DType::F32, "f32", 1, 4, false},     {DType::F16, "f16", 1, 2, false},
    {DType::BF16, "bf16", 1, 2, false},   {DType::Q4_0, "q4_0", 32, 18, true},
    {DType::Q8_0, "q8_0", 32, 34, true},  {DType::Q4_K, "q4_k", 256, 144, true},
    {DType::Q5_K, "q5_k", 256, 176, true}, {DType::Q6_K, "q6_k", 256, 210, true},
    {DType::I8, "i8", 1, 1, false},       {DType::I16, "i16", 1, 2, false},
    {DType::I32, "i32", 1, 4, false},     {DType::I64, "i64", 1, 8, false},
    {DType::F64, "f64", 1, 8, false},
};

}  // namespace

const DTypeTraits& dtype_traits(DType t) {
  for (const auto& tr : kTraits)
    if (tr.type == t) return tr;
  throw Error("unsupported tensor type " + ggml_type_name(int32_t(t)));
}

bool dtype_is_supported(int32_t id) {
  return std::any_of(std::begin(kTraits), std::end(kTraits), [&](const auto& tr) { return int32_t(tr.type) == id; });
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  for (const auto& tr : kTraits)
    if (lower == tr.name) return tr.type;
  return std::nullopt;
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const auto& tr = dtype_traits(t);
  check(n >= 0 && n % tr.block_size == 0, std::string("row of ") + std::to_string(n) + " elements is not a multiple of " +
                                              tr.name + "'s block size " + std::to_string(tr.block_size));
  return size_t(n / tr.block_size) * tr.block_bytes;
}

std::string ggml_type_name(int32_t id) {
  static const char* names[] = {"f32",    "f16",     "q4_0",    "q4_1",  "q4_2(retired)", "q4_3(retired)",
                                "q5_0",   "q5_1",    "q8_0",    "q8_1",  "q2_k",          "q3_k",
                                "q4_k",   "q5_k",    "q6_k",    "q8_k",  "iq2_xxs",       "iq2_xs",
                                "iq3_xxs", "iq1_s",  "iq4_nl",  "iq3_s", "iq2_s",         "iq4_xs",
                                "i8",     "i16",     "i32",     "i64",   "f64",           "iq1_m",
                                "bf16",   "retired", "retired", "retired", "tq1_0",       "tq2_0",
                                "retired", "retired", "retired", "mxfp4", "nvfp4",        "q1_0",
                                "q2_0"};
  if (id >= 0 && id < int32_t(std::size(names))) return std::string(names[id]) + " (id " + std::to_string(id) + ")";
  return "unknown type id " + std::to_string(id);
}

}  // namespace tandem
