// Internal to src/gguf: the state behind a GgufFile, shared by the parser (gguf_reader.cpp) and the
// accessors and mmap handling (gguf_file.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace tandem::gguf {

// A read-only mapping of a whole file; unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  explicit Mapping(const std::string& path);  // throws Error("<path>: cannot ...")
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  const uint8_t* data() const { return static_cast<const uint8_t*>(addr_); }
  uint64_t size() const { return size_; }

 private:
  void* addr_ = nullptr;
  uint64_t size_ = 0;
};

// What a GgufFile holds (GgufFile::Impl derives from it; Impl itself is private to GgufFile).
struct GgufState {
  std::string path;
  Mapping mapping;  // empty for from_memory()
  const uint8_t* bytes = nullptr;
  uint64_t file_size = 0;

  uint32_t version = 0;
  size_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;
  std::vector<std::pair<std::string, Value>> metadata;
  std::map<std::string, size_t, std::less<>> key_index;
  std::vector<TensorInfo> tensors;
  std::map<std::string, size_t, std::less<>> tensor_index;
};

// Parses and validates bytes[0, file_size) into impl (everything but path/mapping/bytes/file_size, which the
// caller sets first). Throws Error("<impl.path>: <problem> at byte <offset>").
void parse_gguf(GgufState& impl);

}  // namespace tandem::gguf
