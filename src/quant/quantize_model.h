// Requantizing a whole GGUF model (`tandem quantize IN.gguf OUT.gguf TYPE`): which tensor gets which type,
// and the streaming rewrite of the file.
//
// Which tensors are quantized: every weight matrix, i.e. a tensor named "*.weight" with at least 2 dims and
// ne[1] > 1, of a float or block type tandem reads. Kept as they are: 1-D tensors (norms, biases, rope
// factors), anything named "*_norm*", MoE routers (ffn_gate_inp: small, and their errors reorder experts),
// and non-float tensors.
//
// Types: every quantized tensor gets the target type, except in the mixed recipes and where the type's block
// does not divide ne[0] (then q8_0 when ne[0] % 32 == 0, else f16, with a note). A tensor already of its
// planned type is copied byte for byte (requantizing it would only add error).
//
// Mixed recipes q4_k_m / q5_k_m (after llama.cpp's Q4_K_M / Q5_K_M): base q4_k / q5_k, and q6_k for
//  - output.weight, or token_embd.weight when the file has no output.weight (it is then also the output
//  head);
//  - attn_v and ffn_down (ffn_down_exps, ffn_down_shexp too) of layer i when more_bits_layer(i, n_layer):
//    the first n/8 layers, the last n - 7n/8 layers, and every third layer in between (i - n/8 = 2, 5, ...);
//  - q4_k_m only: fused attn_qkv gets q5_k.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace tandem::quant {

// What `tandem quantize` was asked for.
struct QuantTarget {
  std::string name;    // as given on the command line, lower case ("q4_k_m")
  DType base;          // the type of most matrices
  bool mixed = false;  // q4_k_m / q5_k_m: sensitive tensors at q6_k (see above)
  uint32_t file_type;  // general.file_type (llama_ftype) of the result
};

// Parses a target name (case-insensitive): f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m
// (q4_k_s / q5_k_s are accepted as q4_k / q5_k). Throws Error listing the valid names.
QuantTarget parse_quant_target(std::string_view name);
// The valid target names, for help texts.
std::string quant_target_names();

// True when layer i of n gets more bits in the mixed recipes (see the header comment).
bool more_bits_layer(int i, int n);

// What happens to one tensor of the input.
struct TensorPlan {
  std::string name;
  DType from;
  DType to;
  bool convert = false;  // false: bytes copied unchanged
  std::string note;      // why the type differs from the target's base type, if it does ("" otherwise)
};

// The per-tensor plan for a file, in file order (no tensor data is read).
std::vector<TensorPlan> plan_quantization(const gguf::GgufFile& in, const QuantTarget& target);

struct QuantizeOptions {
  int n_threads = 0;  // <= 0: one per hardware thread
  // Called before each tensor and as a large one progresses: tensor index (0-based), tensor count, its plan,
  // and the fraction of all elements of the file done so far (0..1).
  std::function<void(size_t index, size_t count, const TensorPlan& tensor, double fraction)> progress;
};

struct QuantizeResult {
  std::vector<TensorPlan> plan;
  uint64_t input_bytes = 0;   // size of the input file
  uint64_t output_bytes = 0;  // size of the output file
};

// Reads in_path, writes out_path (through "<out_path>.tmp" and a rename: no partial file on failure) with
// every metadata key copied, general.file_type and general.quantization_version (2) set, and tensors
// converted as plan_quantization says; source tensors of any supported type are dequantized to f32 first.
// Only one tensor is held in memory at a time. Throws Error for a missing input, out == in, or bad data.
QuantizeResult quantize_model(const std::string& in_path, const std::string& out_path,
                              const QuantTarget& target, const QuantizeOptions& options = {});

}  // namespace tandem::quant
