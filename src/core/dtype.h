// Element types of tensors. The numeric values are the ggml type ids stored in GGUF tensor infos
// (../shared/GGUF-ARCH-FACTS.md A.6); block layouts are in src/quant/blocks.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

enum class DType : int32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

struct DTypeTraits {
  DType type;
  const char* name;      // lower case, as on the command line: "f32", "q4_k", ...
  int64_t block_size;    // elements per block (1 for plain types)
  size_t block_bytes;    // bytes per block
  bool quantized;        // a GGUF block type
};

// Traits of a supported type. Throws Error for an id tandem does not support.
const DTypeTraits& dtype_traits(DType t);
// True when id is a ggml type id tandem supports.
bool dtype_is_supported(int32_t id);
// "q4_k" -> Q4_K (case-insensitive); nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);
inline const char* dtype_name(DType t) { return dtype_traits(t).name; }
inline int64_t dtype_block_size(DType t) { return dtype_traits(t).block_size; }
inline size_t dtype_block_bytes(DType t) { return dtype_traits(t).block_bytes; }
// Bytes of a row of n elements; n must be a multiple of the block size (checked, throws Error).
size_t dtype_row_bytes(DType t, int64_t n);
// Name of any ggml type id, also the ones tandem does not support ("q2_k", "iq4_xs", ...), for messages.
std::string ggml_type_name(int32_t id);

}  // namespace tandem
