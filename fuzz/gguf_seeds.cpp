#include "gguf_seeds.h"

#include <random>

#include "gguf/gguf.h"

namespace tandem::gguf::fuzzing {
namespace {

std::vector<uint8_t> bytes_of(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = uint8_t(rng() >> 24);
  return out;
}

void add(GgufWriter& w, const std::string& name, DType type, std::vector<int64_t> ne, uint32_t seed) {
  int64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
  size_t n = dtype_row_bytes(type, ne.empty() ? 1 : ne[0]) * size_t(rows);
  w.add_tensor(name, type, ne, bytes_of(n, seed));
}

// A llama-like file: the usual scalar keys, a small tokenizer, tensors with names of equal length (so a
// mutation can copy one name over another and make a duplicate).
std::vector<uint8_t> llama_like() {
  GgufWriter w;
  w.set("general.architecture", Value::string("llama"));
  w.set("general.name", Value::string("seed"));
  w.set("general.file_type", Value::u32(15));
  w.set("llama.context_length", Value::u32(4096));
  w.set("llama.embedding_length", Value::u64(256));
  w.set("llama.rope.freq_base", Value::f32(10000.f));
  w.set("llama.attention.layer_norm_rms_epsilon", Value::f64(1e-5));
  w.set("llama.use_parallel_residual", Value::boolean(true));
  w.set("tokenizer.ggml.tokens", Value::string_array({"<s>", "</s>", "a", "b", "\xE2\x96\x81the"}));
  w.set("tokenizer.ggml.scores", Value::f32_array({0.f, 0.f, -1.f, -2.f, -3.5f}));
  w.set("tokenizer.ggml.token_type", Value::i32_array({3, 3, 1, 1, 1}));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
  add(w, "blk.0.attn_q.weight", DType::Q4_K, {256, 2}, 1);
  add(w, "blk.1.attn_q.weight", DType::Q8_0, {64, 3}, 2);
  add(w, "blk.0.attn_norm.weight", DType::F32, {7}, 3);
  add(w, "output.weight", DType::F16, {5, 3}, 4);
  return w.write_to_memory();
}

// Every metadata type, nested arrays three levels deep, alignment 64, the other block types.
std::vector<uint8_t> every_type_aligned_64() {
  GgufWriter w;
  w.set("general.alignment", Value::u32(64));
  w.set("u8", Value::u8(200));
  w.set("i8", Value::i8(-5));
  w.set("u16", Value::u16(60000));
  w.set("i16", Value::i16(-300));
  w.set("u32", Value::u32(7));
  w.set("i32", Value::i32(-7));
  w.set("u64", Value::u64(uint64_t(1) << 40));
  w.set("i64", Value::i64(-(int64_t(1) << 40)));
  w.set("f32", Value::f32(0.5f));
  w.set("f64", Value::f64(-0.25));
  w.set("bool", Value::boolean(false));
  w.set("str", Value::string("hello"));
  w.set("arr.u8", Value::array(ValueType::UINT8, {Value::u8(1), Value::u8(2)}));
  w.set("arr.i16", Value::array(ValueType::INT16, {Value::i16(-1)}));
  w.set("arr.u64", Value::array(ValueType::UINT64, {Value::u64(9), Value::u64(10)}));
  w.set("arr.f64", Value::array(ValueType::FLOAT64, {Value::f64(3.0)}));
  w.set("arr.bool", Value::array(ValueType::BOOL, {Value::boolean(true), Value::boolean(false)}));
  w.set("arr.empty", Value::array(ValueType::STRING, {}));
  w.set("arr.nested",
        Value::array(ValueType::ARRAY, {Value::i32_array({1, 2}), Value::string_array({"x"}),
                                        Value::array(ValueType::ARRAY, {Value::f32_array({1.f})})}));
  add(w, "q4_0", DType::Q4_0, {32, 2}, 5);
  add(w, "q5_k", DType::Q5_K, {256}, 6);
  add(w, "q6_k", DType::Q6_K, {256, 1, 1}, 7);
  add(w, "bf16", DType::BF16, {2, 2, 2, 2}, 8);
  return w.write_to_memory();
}

// Alignment 1, integer dtypes, an empty tensor and a 0-dim one.
std::vector<uint8_t> aligned_1_small_types() {
  GgufWriter w;
  w.set("general.architecture", Value::string("qwen3"));
  w.set("general.alignment", Value::u32(1));
  w.set("qwen3.block_count", Value::u32(2));
  add(w, "i8", DType::I8, {3}, 9);
  add(w, "i16", DType::I16, {3}, 10);
  add(w, "i32", DType::I32, {1, 2}, 11);
  add(w, "i64", DType::I64, {1}, 12);
  add(w, "f64", DType::F64, {2}, 13);
  add(w, "empty", DType::F32, {0, 3}, 14);
  add(w, "scalar", DType::F32, {}, 15);
  return w.write_to_memory();
}

// GGUF v2, metadata only.
std::vector<uint8_t> v2_metadata_only() {
  GgufWriter w;
  w.set("general.architecture", Value::string("llama"));
  w.set("split.count", Value::u16(1));
  w.set("nested", Value::array(ValueType::ARRAY, {Value::array(ValueType::ARRAY, {}), Value::i32_array({})}));
  auto bytes = w.write_to_memory();
  bytes[4] = 2;
  return bytes;
}

}  // namespace

std::vector<std::vector<uint8_t>> make_gguf_seeds() {
  return {llama_like(), every_type_aligned_64(), aligned_1_small_types(), v2_metadata_only()};
}

}  // namespace tandem::gguf::fuzzing
