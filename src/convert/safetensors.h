// Reader of Hugging Face .safetensors checkpoints: one model.safetensors, or shards listed by
// model.safetensors.index.json ("weight_map": tensor name -> shard file).
//
// File format: 8-byte little-endian header length N, then N bytes of JSON
//   {"<tensor>": {"dtype": "BF16", "shape": [out, in], "data_offsets": [begin, end]}, ..., "__metadata__":
//   {...}}
// then the data section; offsets are relative to its start. Files are memory-mapped and everything is
// validated against the file size before use (header length, dtype names, shapes and their products, offsets
// in bounds, end - begin == elements x dtype size, no overlaps). A bad file throws tandem::Error naming the
// file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::convert {

// Element types of safetensors ("dtype" strings of the header).
enum class StDType { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2 };

std::optional<StDType> st_dtype_from_name(std::string_view name);  // "BF16" -> BF16; nullopt when unknown
const char* st_dtype_name(StDType t);
size_t st_dtype_size(StDType t);  // bytes per element
// True for the float types the converter can read values from (F32, F16, BF16, F64).
bool st_dtype_is_float(StDType t);

// Convert n elements of a float dtype at src (any alignment) to f32. Throws Error for a non-float dtype.
void st_to_f32(StDType t, const uint8_t* src, float* dst, int64_t n);

struct StTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;     // PyTorch order: outermost first ([out, in] for a Linear weight)
  const uint8_t* data = nullptr;  // inside the file mapping (any alignment)
  size_t nbytes = 0;
  std::string file;  // the file it lives in, for messages

  int64_t nelements() const;
  std::string shape_string() const;  // "[4096, 1024]"
};

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  // Parse a buffer the caller keeps alive (tests). Same validation as open().
  static SafetensorsFile from_memory(const void* data, size_t size, std::string name = "<memory>");

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const;
  const std::vector<StTensor>& tensors() const;  // in header order
  const StTensor* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const;  // "__metadata__" (string -> string)

 private:
  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// All tensors of a checkpoint directory. Looks for, in order: model.safetensors.index.json (sharded),
// model.safetensors, else every *.safetensors file in the directory. Tensor names must be unique across
// files.
class SafetensorsModel {
 public:
  static SafetensorsModel open_dir(const std::filesystem::path& dir);

  const StTensor* find(std::string_view name) const;
  // Every tensor, sorted by name.
  std::vector<const StTensor*> tensors() const;
  const std::vector<std::string>& files() const { return file_names_; }

 private:
  std::vector<SafetensorsFile> files_;
  std::vector<std::string> file_names_;
  std::map<std::string, const StTensor*, std::less<>> by_name_;
};

}  // namespace tandem::convert
