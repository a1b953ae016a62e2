// The --type of `tandem convert`: which GGUF type each tensor is stored in, and the general.file_type it
// implies.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "convert/safetensors.h"
#include "convert/tensor_plan.h"
#include "core/dtype.h"

namespace tandem::convert {

enum class OutType { AUTO, F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, Q4_K_M, Q5_K_M };

std::optional<OutType> out_type_from_name(std::string_view name);  // "q4_k_m" -> Q4_K_M
const char* out_type_name(OutType t);
std::string out_type_names();  // "auto, f32, f16, ..." for help and messages

// AUTO becomes BF16 when the checkpoint's weights are BF16, F16 otherwise (llama.cpp's converter does the
// same).
OutType resolve_auto(OutType t, StDType source_weight_dtype);

// llama_ftype value for general.file_type (facts A.6): f32 0, f16 1, q4_0 2, q8_0 7, q4_k 14 (Q4_K_S),
// q4_k_m 15, q5_k 16 (Q5_K_S), q5_k_m 17, q6_k 18, bf16 32. t must be resolved (not AUTO).
uint32_t file_type_of(OutType t);

// The GGUF type of one tensor. 1-D tensors (norms, biases, rope_freqs) are always F32. A 2-D tensor whose
// rows are not a multiple of the block size falls back to Q8_0 (rows a multiple of 32), else F16. has_output:
// the file has output.weight (if not, token_embd doubles as the output head for q4_k_m / q5_k_m).
DType tensor_type_for(OutType t, const PlannedTensor& tensor, int64_t n_layer, bool has_output);
// True when a matrix stored as `stored` under --type t got a fallback type (rows not a multiple of the
// block).
bool is_fallback_type(OutType t, DType stored);

}  // namespace tandem::convert
