// Writes .safetensors files (and the model.safetensors.index.json of a sharded checkpoint) from C++, so tests
// and tools can make Hugging Face style checkpoints without Python. Format: see convert/safetensors.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "convert/safetensors.h"

namespace tandem::convert {

class SafetensorsWriter {
 public:
  // Add a tensor with raw little-endian bytes; bytes.size() must be elements(shape) x dtype size (checked).
  void add(const std::string& name, StDType dtype, const std::vector<int64_t>& shape,
           std::vector<uint8_t> bytes);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values);
  // Values are rounded to bf16 / f16 (round to nearest even).
  void add_bf16(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values);
  void add_f16(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  // Header (padded with spaces to a multiple of 8 bytes, as the HF writer does), then the data in add()
  // order.
  void write(const std::filesystem::path& path) const;
  std::vector<std::string> names() const;

 private:
  struct Entry {
    std::string name;
    StDType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes dir/model.safetensors.index.json with "metadata": {"total_size": ...} and the given weight_map.
void write_safetensors_index(const std::filesystem::path& dir,
                             const std::map<std::string, std::string>& weight_map, uint64_t total_size = 0);

}  // namespace tandem::convert
