#include "convert/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/half.h"

namespace tandem::convert {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct StDTypeInfo {
  StDType type;
  const char* name;
  size_t size;
};

constexpr StDTypeInfo kDTypes[] = {
    {StDType::BOOL, "BOOL", 1}, {StDType::U8, "U8", 1},           {StDType::I8, "I8", 1},
    {StDType::I16, "I16", 2},   {StDType::U16, "U16", 2},         {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::I32, "I32", 4},         {StDType::U32, "U32", 4},
    {StDType::F32, "F32", 4},   {StDType::F64, "F64", 8},         {StDType::I64, "I64", 8},
    {StDType::U64, "U64", 8},   {StDType::F8_E4M3, "F8_E4M3", 1}, {StDType::F8_E5M2, "F8_E5M2", 1},
};

const StDTypeInfo& info(StDType t) {
  for (const auto& i : kDTypes)
    if (i.type == t) return i;
  throw Error("internal: unknown safetensors dtype");
}

// The HF reference implementation refuses headers above 100 MB; so do we (a corrupt length would otherwise
// make us parse gigabytes of tensor data as JSON).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Read-only mapping of a whole file; unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr_ && size_) munmap(addr_, size_);
  }
  void map(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path.string() + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      throw Error(path.string() + ": cannot stat: " + std::strerror(e));
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        size_ = 0;
        throw Error(path.string() + ": cannot mmap: " + std::strerror(e));
      }
      addr_ = p;
    }
    ::close(fd);
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(addr_); }
  size_t size() const { return size_; }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
};

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::optional<StDType> st_dtype_from_name(std::string_view name) {
  for (const auto& i : kDTypes)
    if (name == i.name) return i.type;
  return std::nullopt;
}
const char* st_dtype_name(StDType t) {
  return info(t).name;
}
size_t st_dtype_size(StDType t) {
  return info(t).size;
}
bool st_dtype_is_float(StDType t) {
  return t == StDType::F32 || t == StDType::F16 || t == StDType::BF16 || t == StDType::F64;
}

void st_to_f32(StDType t, const uint8_t* src, float* dst, int64_t n) {
  switch (t) {
    case StDType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case StDType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = fp16_to_fp32(h);
      }
      return;
    case StDType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_fp32(h);
      }
      return;
    case StDType::F64:
      for (int64_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        dst[i] = float(d);
      }
      return;
    default:
      throw Error(std::string("cannot read values of safetensors dtype ") + st_dtype_name(t) +
                  " as floats (supported: F32, F16, BF16, F64)");
  }
}

int64_t StTensor::nelements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
std::string StTensor::shape_string() const {
  return shape_to_string(shape);
}

// ---- SafetensorsFile -------------------------------------------------------------------------------------

struct SafetensorsFile::Impl {
  std::string path;
  Mapping mapping;
  std::vector<StTensor> tensors;
  std::map<std::string, size_t, std::less<>> index;
  std::map<std::string, std::string> metadata;

  void parse(const uint8_t* base, size_t size);
};

void SafetensorsFile::Impl::parse(const uint8_t* base, size_t size) {
  const std::string& f = path;
  check(size >= 8, f + ": not a safetensors file: " + std::to_string(size) +
                       " bytes, too short for the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  check(header_len <= size - 8, f + ": corrupt safetensors header: header length " +
                                    std::to_string(header_len) + " exceeds the file size " +
                                    std::to_string(size) + " (truncated file?)");
  check(header_len <= kMaxHeaderBytes,
        f + ": corrupt safetensors header: header length " + std::to_string(header_len) + " is above 100 MB");
  check(header_len >= 2 && base[8] == '{',
        f + ": corrupt safetensors header: the JSON header does not start with '{'");

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8),
                         reinterpret_cast<const char*>(base + 8 + header_len));
  } catch (const json::exception& e) {
    throw Error(f + ": corrupt safetensors header: invalid JSON: " + e.what());
  }
  check(header.is_object(), f + ": corrupt safetensors header: the JSON header is not an object");

  const uint64_t data_size = size - 8 - header_len;
  const uint8_t* data = base + 8 + header_len;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // for the overlap check

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      check(entry.is_object(), f + ": corrupt safetensors header: __metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        check(v.is_string(),
              f + ": corrupt safetensors header: __metadata__ value of '" + k + "' is not a string");
        metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = f + ": tensor '" + name + "': ";
    check(entry.is_object(), where + "header entry is not an object");
    check(entry.contains("dtype") && entry["dtype"].is_string(), where + "missing or non-string \"dtype\"");
    check(entry.contains("shape") && entry["shape"].is_array(), where + "missing or non-array \"shape\"");
    check(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
              entry["data_offsets"].size() == 2,
          where + "\"data_offsets\" must be an array [begin, end]");

    StTensor t;
    t.name = name;
    t.file = f;
    const std::string dtype_name = entry["dtype"].get<std::string>();
    const auto dt = st_dtype_from_name(dtype_name);
    check(dt.has_value(), where + "unknown dtype '" + dtype_name +
                              "' (known: BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, "
                              "F8_E4M3, F8_E5M2)");
    t.dtype = *dt;

    for (const auto& d : entry["shape"]) {
      check(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
            where + "shape " + entry["shape"].dump() + " has a dimension that is not a non-negative integer");
      const uint64_t v = d.get<uint64_t>();
      check(v <= uint64_t(INT64_MAX), where + "shape dimension " + std::to_string(v) + " is too large");
      t.shape.push_back(int64_t(v));
    }
    // Byte count with overflow checks; it is compared with the data offsets below.
    const size_t esize = st_dtype_size(t.dtype);
    uint64_t expected_bytes = esize;
    bool overflow = false;
    if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) {
      expected_bytes = 0;
    } else {
      for (int64_t v : t.shape)
        overflow = overflow || __builtin_mul_overflow(expected_bytes, uint64_t(v), &expected_bytes);
    }
    check(!overflow, where + "shape " + entry["shape"].dump() + " has more elements than any file can hold");

    const auto& offs = entry["data_offsets"];
    check(offs[0].is_number_unsigned() && offs[1].is_number_unsigned(),
          where + "\"data_offsets\" " + offs.dump() + " are not non-negative integers");
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    check(begin <= end, where + "data_offsets " + offs.dump() + ": begin is after end");
    check(end <= data_size, where + "data_offsets " + offs.dump() +
                                " point past the end of the data section (" + std::to_string(data_size) +
                                " bytes; truncated file?)");
    check(end - begin == expected_bytes, where + "data_offsets " + offs.dump() + " span " +
                                             std::to_string(end - begin) + " bytes but shape " +
                                             entry["shape"].dump() + " of " + dtype_name + " needs " +
                                             std::to_string(expected_bytes));
    t.data = data + begin;
    t.nbytes = size_t(expected_bytes);
    if (expected_bytes > 0) ranges.emplace_back(begin, end);
    tensors.push_back(std::move(t));
  }

  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    check(ranges[i].first >= ranges[i - 1].second,
          f + ": corrupt safetensors header: the data of two tensors overlap at data offset " +
              std::to_string(ranges[i].first));

  // Keep the file's order of tensors (by data offset), which is how the checkpoint was written.
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const StTensor& a, const StTensor& b) { return a.data < b.data; });
  index.clear();
  for (size_t i = 0; i < tensors.size(); ++i) index[tensors[i].name] = i;
}

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path.string();
  impl->mapping.map(path);
  impl->parse(impl->mapping.data(), impl->mapping.size());
  return SafetensorsFile(std::move(impl));
}

SafetensorsFile SafetensorsFile::from_memory(const void* data, size_t size, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->parse(static_cast<const uint8_t*>(data), size);
  return SafetensorsFile(std::move(impl));
}

const std::string& SafetensorsFile::path() const {
  return impl_->path;
}
const std::vector<StTensor>& SafetensorsFile::tensors() const {
  return impl_->tensors;
}
const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->metadata;
}
const StTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->tensors[it->second];
}

// ---- SafetensorsModel ------------------------------------------------------------------------------------

namespace {

std::string read_text_file(const fs::path& p) {
  return read_regular_file(p.string(), "the checkpoint's");  // a FIFO or directory is an error, not a hang
}

// Shard file names of an index, in first-seen order, and the tensor -> shard map.
struct ShardIndex {
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;
};

ShardIndex read_index(const fs::path& index_path) {
  const std::string f = index_path.string();
  json j;
  try {
    j = json::parse(read_text_file(index_path));
  } catch (const json::exception& e) {
    throw Error(f + ": invalid JSON: " + e.what());
  }
  check(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
        f + ": no \"weight_map\" object (expected {\"weight_map\": {\"<tensor>\": \"<shard file>\", ...}})");
  ShardIndex idx;
  std::set<std::string> seen;
  for (const auto& [name, file] : j["weight_map"].items()) {
    check(file.is_string(), f + ": weight_map entry of '" + name + "' is not a file name");
    const std::string shard = file.get<std::string>();
    check(!shard.empty() && fs::path(shard).filename().string() == shard,
          f + ": weight_map entry of '" + name + "' names '" + shard + "', which is not a plain file name");
    idx.weight_map[name] = shard;
    if (seen.insert(shard).second) idx.files.push_back(shard);
  }
  std::sort(idx.files.begin(), idx.files.end());
  check(!idx.files.empty(), f + ": weight_map is empty");
  return idx;
}

}  // namespace

SafetensorsModel SafetensorsModel::open_dir(const fs::path& dir) {
  check(fs::is_directory(dir), dir.string() + ": not a directory (expected a Hugging Face model directory)");
  SafetensorsModel m;
  const fs::path index_path = dir / "model.safetensors.index.json";
  std::optional<ShardIndex> index;
  if (fs::exists(index_path)) {
    index = read_index(index_path);
    for (const auto& shard : index->files) {
      check(fs::exists(dir / shard),
            index_path.string() + " lists shard '" + shard + "', which is missing from " + dir.string());
      m.file_names_.push_back((dir / shard).string());
    }
  } else if (fs::exists(dir / "model.safetensors")) {
    m.file_names_.push_back((dir / "model.safetensors").string());
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors")
        m.file_names_.push_back(e.path().string());
    std::sort(m.file_names_.begin(), m.file_names_.end());
    if (m.file_names_.empty()) {
      std::string hint;
      if (fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json"))
        hint = " (PyTorch .bin checkpoints are not supported: save the model with safe_serialization=True)";
      throw Error(dir.string() +
                  ": no model.safetensors, model.safetensors.index.json or *.safetensors file" + hint);
    }
  }

  for (const auto& name : m.file_names_) m.files_.push_back(SafetensorsFile::open(name));
  for (const auto& file : m.files_) {
    for (const auto& t : file.tensors()) {
      auto [it, inserted] = m.by_name_.emplace(t.name, &t);
      check(inserted, "tensor '" + t.name + "' is in two files: " + it->second->file + " and " + t.file);
    }
  }
  if (index) {
    for (const auto& [name, shard] : index->weight_map) {
      const StTensor* t = m.find(name);
      check(t != nullptr, index_path.string() + " maps tensor '" + name + "' to '" + shard +
                              "', but that file has no such tensor");
      check(fs::path(t->file).filename().string() == shard,
            index_path.string() + " maps tensor '" + name + "' to '" + shard + "', but it is in " + t->file);
    }
  }
  return m;
}

const StTensor* SafetensorsModel::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<const StTensor*> SafetensorsModel::tensors() const {
  std::vector<const StTensor*> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) out.push_back(t);
  return out;
}

}  // namespace tandem::convert
