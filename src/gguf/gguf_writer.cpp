// GgufWriter: GGUF v3 files with metadata of every type and aligned, zero-padded tensor data
// (../shared/GGUF-ARCH-FACTS.md section A). Tensors are emitted one at a time, so a converter that produces
// its tensors on demand never holds more than one of them in memory.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/interrupt_cleanup.h"
#include "gguf/gguf.h"

namespace tandem::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF writer assumes a little-endian host");

using Sink = std::function<void(const void*, size_t)>;

class Out {
 public:
  explicit Out(const Sink& sink) : sink_(sink) {}
  template <class T>
  void put(T v) {
    sink_(&v, sizeof(T));
    written_ += sizeof(T);
  }
  void bytes(const void* p, size_t n) {
    if (n == 0) return;
    sink_(p, n);
    written_ += n;
  }
  void string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(size_t alignment) {
    static const uint8_t zeros[256] = {0};
    uint64_t n = (alignment - written_ % alignment) % alignment;
    while (n > 0) {
      uint64_t k = std::min<uint64_t>(n, sizeof zeros);
      bytes(zeros, size_t(k));
      n -= k;
    }
  }

 private:
  const Sink& sink_;
  uint64_t written_ = 0;
};

// The payload of a value (without its type tag). An array's payload is its element type, count and elements,
// so an array nested in an array carries its own element type.
void put_value(Out& out, const Value& v) {
  switch (v.type()) {
    case ValueType::UINT8:
      out.put<uint8_t>(uint8_t(v.as_uint()));
      break;
    case ValueType::INT8:
      out.put<int8_t>(int8_t(v.as_int()));
      break;
    case ValueType::UINT16:
      out.put<uint16_t>(uint16_t(v.as_uint()));
      break;
    case ValueType::INT16:
      out.put<int16_t>(int16_t(v.as_int()));
      break;
    case ValueType::UINT32:
      out.put<uint32_t>(uint32_t(v.as_uint()));
      break;
    case ValueType::INT32:
      out.put<int32_t>(int32_t(v.as_int()));
      break;
    case ValueType::UINT64:
      out.put<uint64_t>(v.as_uint());
      break;
    case ValueType::INT64:
      out.put<int64_t>(v.as_int());
      break;
    case ValueType::FLOAT32:
      out.put<float>(float(v.as_float()));
      break;
    case ValueType::FLOAT64:
      out.put<double>(v.as_float());
      break;
    case ValueType::BOOL:
      out.put<uint8_t>(v.as_bool() ? 1 : 0);
      break;
    case ValueType::STRING:
      out.string(v.as_string());
      break;
    case ValueType::ARRAY: {
      const auto& elems = v.as_array();
      out.put<int32_t>(int32_t(v.element_type()));
      out.put<uint64_t>(elems.size());
      for (const auto& e : elems) put_value(out, e);
      break;
    }
  }
}

// Bytes of a tensor of this type and shape, with the checks the reader applies.
size_t tensor_bytes(const std::string& name, DType type, const std::vector<int64_t>& ne) {
  check(!name.empty(), "GGUF writer: a tensor name must not be empty");
  check(name.size() <= kMaxTensorNameLength, "GGUF writer: tensor name '" + name + "' is " +
                                                 std::to_string(name.size()) + " bytes long, the limit is " +
                                                 std::to_string(kMaxTensorNameLength));
  check(ne.size() <= 4, "GGUF writer: tensor '" + name + "' has " + std::to_string(ne.size()) +
                            " dimensions, at most 4 are allowed");
  for (int64_t d : ne) check(d >= 0, "GGUF writer: tensor '" + name + "' has a negative dimension");
  const DTypeTraits& tr = dtype_traits(type);
  int64_t ne0 = ne.empty() ? 1 : ne[0];
  check(ne0 % tr.block_size == 0, "GGUF writer: tensor '" + name + "' has ne[0] = " + std::to_string(ne0) +
                                      ", not a multiple of " + tr.name + "'s block size " +
                                      std::to_string(tr.block_size));
  uint64_t bytes = uint64_t(ne0 / tr.block_size);
  bool overflow = __builtin_mul_overflow(bytes, uint64_t(tr.block_bytes), &bytes);
  for (size_t d = 1; d < ne.size(); ++d)
    overflow = overflow || __builtin_mul_overflow(bytes, uint64_t(ne[d]), &bytes);
  check(!overflow && bytes <= SIZE_MAX, "GGUF writer: tensor '" + name + "' is too large");
  return size_t(bytes);
}

}  // namespace

void GgufWriter::set(const std::string& key, Value value) {
  check(!key.empty(), "GGUF writer: a metadata key must not be empty");
  for (auto& kv : metadata_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

bool GgufWriter::has(const std::string& key) const {
  return std::any_of(metadata_.begin(), metadata_.end(), [&](const auto& kv) { return kv.first == key; });
}

void GgufWriter::remove(const std::string& key) {
  std::erase_if(metadata_, [&](const auto& kv) { return kv.first == key; });
}

size_t GgufWriter::alignment() const {
  for (const auto& [key, v] : metadata_) {
    if (key != "general.alignment") continue;
    check(v.type() == ValueType::UINT32 && v.as_uint() != 0 && std::has_single_bit(v.as_uint()),
          "GGUF writer: general.alignment must be a uint32 non-zero power of two, got " + v.type_name() +
              " " + v.to_string());
    return size_t(v.as_uint());
  }
  return kDefaultAlignment;
}

void GgufWriter::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne,
                            const void* data, size_t nbytes) {
  size_t expected = tensor_bytes(name, type, ne);
  check(nbytes == expected, "GGUF writer: tensor '" + name + "' was given " + std::to_string(nbytes) +
                                " bytes, its type and shape need " + std::to_string(expected));
  check(data != nullptr || nbytes == 0, "GGUF writer: tensor '" + name + "' has no data");
  for (const auto& t : tensors_) check(t.name != name, "GGUF writer: duplicate tensor name '" + name + "'");
  tensors_.push_back(PendingTensor{name, type, ne, nbytes, data, nullptr, nullptr});
}

void GgufWriter::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne,
                            std::vector<uint8_t> data) {
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(data));
  add_tensor(name, type, ne, owned->data(), owned->size());
  tensors_.back().owned = std::move(owned);
}

void GgufWriter::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne,
                            size_t nbytes, std::function<void(uint8_t* dst)> produce) {
  size_t expected = tensor_bytes(name, type, ne);
  check(nbytes == expected, "GGUF writer: tensor '" + name + "' declares " + std::to_string(nbytes) +
                                " bytes, its type and shape need " + std::to_string(expected));
  check(bool(produce), "GGUF writer: tensor '" + name + "' has no producer");
  for (const auto& t : tensors_) check(t.name != name, "GGUF writer: duplicate tensor name '" + name + "'");
  tensors_.push_back(PendingTensor{name, type, ne, nbytes, nullptr, nullptr, std::move(produce)});
}

void GgufWriter::emit(const std::function<void(const void*, size_t)>& sink) const {
  const size_t align = alignment();
  Out out(sink);
  out.put<uint32_t>(0x46554747);  // "GGUF"
  out.put<uint32_t>(3);
  out.put<int64_t>(int64_t(tensors_.size()));
  out.put<int64_t>(int64_t(metadata_.size()));
  for (const auto& [key, value] : metadata_) {
    out.string(key);
    out.put<int32_t>(int32_t(value.type()));
    put_value(out, value);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.string(t.name);
    out.put<uint32_t>(uint32_t(t.ne.size()));
    for (int64_t d : t.ne) out.put<int64_t>(d);
    out.put<int32_t>(int32_t(t.type));
    out.put<uint64_t>(offset);
    offset += (t.nbytes + align - 1) / align * align;
  }
  out.pad_to(align);
  std::vector<uint8_t> scratch;  // holds one produced tensor at a time
  for (const auto& t : tensors_) {
    if (t.produce) {
      scratch.assign(t.nbytes, 0);
      t.produce(scratch.data());
      out.bytes(scratch.data(), scratch.size());
    } else {
      out.bytes(t.data, t.nbytes);
    }
    out.pad_to(align);
  }
}

std::vector<uint8_t> GgufWriter::write_to_memory() const {
  std::vector<uint8_t> bytes;
  emit([&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  });
  return bytes;
}

void GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  const PendingFile pending(tmp);  // removed if the process is interrupted (install_interrupt_cleanup)
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(path + ": cannot create " + tmp + ": " + std::strerror(errno));
  try {
    std::setvbuf(f, nullptr, _IOFBF, size_t(1) << 20);
    emit([&](const void* p, size_t n) {
      if (std::fwrite(p, 1, n, f) != n)
        throw Error(path + ": write to " + tmp + " failed: " + std::strerror(errno));
    });
    std::FILE* closing = f;
    f = nullptr;
    if (std::fclose(closing) != 0)
      throw Error(path + ": closing " + tmp + " failed: " + std::strerror(errno));
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(path + ": cannot rename " + tmp + " to it: " + std::strerror(errno));
  } catch (...) {
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace tandem::gguf
