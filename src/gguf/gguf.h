// GGUF files: a validated, memory-mapped reader and a writer (../shared/GGUF-ARCH-FACTS.md section A).
//
// GgufFile::open() checks everything against the file size before it is used (counts, string and array
// lengths, dims and their products, type ids, offsets, alignment, duplicate names). A bad file throws
// tandem::Error naming the problem and the byte offset where it was found; never a crash or an out-of-bounds
// read.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem::gguf {

// Alignment of the data section and of every tensor when the file has no general.alignment key.
inline constexpr uint32_t kDefaultAlignment = 32;
// Tensor names must be shorter than 64 bytes (ggml's GGML_MAX_NAME includes the NUL terminator).
inline constexpr size_t kMaxTensorNameLength = 63;
// Arrays of arrays may nest at most this deep; deeper files are rejected (bounds the reader's recursion).
inline constexpr int kMaxArrayDepth = 16;

// gguf_type ids of metadata values.
enum class ValueType : int32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Arrays hold their element type and elements (nested arrays allowed in memory and on
// write; the reader accepts them too). Integer getters accept any integer width and check the range.
class Value {
 public:
  Value() = default;
  static Value u8(uint8_t v);
  static Value i8(int8_t v);
  static Value u16(uint16_t v);
  static Value i16(int16_t v);
  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value u64(uint64_t v);
  static Value i64(int64_t v);
  static Value f32(float v);
  static Value f64(double v);
  static Value boolean(bool v);
  static Value string(std::string v);
  static Value array(ValueType element_type, std::vector<Value> elements);
  static Value string_array(const std::vector<std::string>& v);
  static Value i32_array(const std::vector<int32_t>& v);
  static Value f32_array(const std::vector<float>& v);

  ValueType type() const { return type_; }
  ValueType element_type() const { return element_type_; }  // for arrays
  // "uint32", "string", "array<int32>", "array<array>" (nested arrays carry their own element types).
  std::string type_name() const;
  bool is_integer() const;
  bool is_float() const { return type_ == ValueType::FLOAT32 || type_ == ValueType::FLOAT64; }

  int64_t as_int() const;    // any integer type (uint64 above INT64_MAX throws); throws Error otherwise
  uint64_t as_uint() const;  // any non-negative integer
  double as_float() const;   // float or integer
  bool as_bool() const;
  const std::string& as_string() const;
  const std::vector<Value>& as_array() const;
  std::vector<std::string> as_string_array() const;
  std::vector<int64_t> as_int_array() const;
  std::vector<float> as_float_array() const;

  // Short human-readable form; arrays are abbreviated after max_items elements.
  std::string to_string(size_t max_items = 8) const;
  bool operator==(const Value& other) const;

 private:
  ValueType type_ = ValueType::UINT8;
  ValueType element_type_ = ValueType::UINT8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<Value>> v_;
};

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  uint32_t n_dims = 0;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // innermost first, missing dims are 1
  uint64_t offset = 0;                    // relative to the data section
  uint64_t nbytes = 0;
  int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class GgufFile {
 public:
  // mmap and validate a file. Throws Error("<path>: <problem> at byte <offset>") on anything wrong.
  static GgufFile open(const std::string& path);
  // Parse a buffer that the caller keeps alive (fuzzing, tests). Same validation as open().
  static GgufFile from_memory(const void* data, size_t size, std::string name = "<memory>");

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const;
  uint32_t version() const;
  size_t alignment() const;
  uint64_t data_offset() const;  // absolute byte offset of the data section
  uint64_t file_size() const;

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const;
  const Value* find(std::string_view key) const;
  // Typed getters: throw Error naming the key when it is missing (no default) or has the wrong type.
  const Value& get(std::string_view key) const;
  std::string get_string(std::string_view key, std::optional<std::string> fallback = std::nullopt) const;
  int64_t get_int(std::string_view key, std::optional<int64_t> fallback = std::nullopt) const;
  double get_float(std::string_view key, std::optional<double> fallback = std::nullopt) const;
  bool get_bool(std::string_view key, std::optional<bool> fallback = std::nullopt) const;
  std::string architecture() const;  // general.architecture, or "" if absent

  const std::vector<TensorInfo>& tensors() const;
  const TensorInfo* find_tensor(std::string_view name) const;
  // Pointer to a tensor's bytes inside the mapping (valid as long as this object lives).
  const uint8_t* tensor_data(const TensorInfo& info) const;

 private:
  struct Impl;
  explicit GgufFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes a GGUF v3 file: metadata in insertion order, tensors aligned to general.alignment (default 32),
// zero padding. Writes to "<path>.tmp" and renames at the end, so a failure leaves no partial file.
class GgufWriter {
 public:
  // Set or replace a key (replacing keeps its position).
  void set(const std::string& key, Value value);
  bool has(const std::string& key) const;
  void remove(const std::string& key);
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }

  // A tensor whose bytes the caller keeps alive until write() returns.
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne, const void* data,
                  size_t nbytes);
  // A tensor that owns its bytes.
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne,
                  std::vector<uint8_t> data);
  // A tensor produced when written: produce(dst) must fill exactly nbytes bytes (for streaming conversion).
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne, size_t nbytes,
                  std::function<void(uint8_t* dst)> produce);

  void write(const std::string& path) const;
  // The bytes write() would put in the file (tests and fuzzing; holds the whole file in memory).
  std::vector<uint8_t> write_to_memory() const;
  // general.alignment if set (validated: UINT32, non-zero power of two), else kDefaultAlignment.
  size_t alignment() const;

 private:
  // Emits the file's bytes in order through sink, producing streamed tensors one at a time.
  void emit(const std::function<void(const void* bytes, size_t n)>& sink) const;
  struct PendingTensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    size_t nbytes;
    const void* data = nullptr;
    std::shared_ptr<std::vector<uint8_t>> owned;
    std::function<void(uint8_t*)> produce;
  };
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tandem::gguf
