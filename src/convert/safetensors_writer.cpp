#include "convert/safetensors_writer.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"

namespace tandem::convert {
using nlohmann::json;

namespace {

uint64_t count_elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    check(d >= 0, "safetensors writer: negative dimension");
    n *= uint64_t(d);
  }
  return n;
}

template <typename Convert>
std::vector<uint8_t> to_u16_bytes(const std::vector<float>& values, Convert convert) {
  std::vector<uint8_t> bytes(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = convert(values[i]);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  return bytes;
}

}  // namespace

void SafetensorsWriter::add(const std::string& name, StDType dtype, const std::vector<int64_t>& shape,
                            std::vector<uint8_t> bytes) {
  check(name != "__metadata__", "safetensors writer: '__metadata__' is not a tensor name");
  for (const auto& e : entries_) check(e.name != name, "safetensors writer: duplicate tensor '" + name + "'");
  check(bytes.size() == count_elements(shape) * st_dtype_size(dtype),
        "safetensors writer: tensor '" + name + "' has " + std::to_string(bytes.size()) +
            " bytes, its shape and dtype need " +
            std::to_string(count_elements(shape) * st_dtype_size(dtype)));
  entries_.push_back({name, dtype, shape, std::move(bytes)});
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  add(name, StDType::F32, shape, std::move(bytes));
}

void SafetensorsWriter::add_bf16(const std::string& name, const std::vector<int64_t>& shape,
                                 const std::vector<float>& values) {
  add(name, StDType::BF16, shape, to_u16_bytes(values, fp32_to_bf16));
}

void SafetensorsWriter::add_f16(const std::string& name, const std::vector<int64_t>& shape,
                                const std::vector<float>& values) {
  add(name, StDType::F16, shape, to_u16_bytes(values, fp32_to_fp16));
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  json header = json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", st_dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  check(bool(out), path.string() + ": cannot create");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& e : entries_)
    out.write(reinterpret_cast<const char*>(e.bytes.data()), std::streamsize(e.bytes.size()));
  check(bool(out.flush()), path.string() + ": write failed");
}

void write_safetensors_index(const std::filesystem::path& dir,
                             const std::map<std::string, std::string>& weight_map, uint64_t total_size) {
  json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  const auto path = dir / "model.safetensors.index.json";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  check(bool(out), path.string() + ": cannot create");
  out << j.dump(2) << "\n";
  check(bool(out.flush()), path.string() + ": write failed");
}

}  // namespace tandem::convert
