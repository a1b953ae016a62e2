// GgufFile: opening (mmap of the whole file, POSIX), and the accessors over what gguf_reader.cpp parsed.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gguf/gguf_impl.h"

namespace tandem::gguf {

Mapping::Mapping(const std::string& path) {
  // O_NONBLOCK: a FIFO must not block the open (it is refused below as not a regular file).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + (S_ISDIR(st.st_mode) ? ": is a directory, not a GGUF file" : ": not a regular file"));
  }
  size_ = uint64_t(st.st_size);
  if (size_ > 0) {
    void* addr = ::mmap(nullptr, size_t(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error(path + ": cannot mmap " + std::to_string(size_) + " bytes: " + std::strerror(err));
    }
    addr_ = addr;
  }
  ::close(fd);  // the mapping stays valid without the descriptor
}

Mapping::Mapping(Mapping&& other) noexcept : addr_(other.addr_), size_(other.size_) {
  other.addr_ = nullptr;
  other.size_ = 0;
}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    if (addr_) ::munmap(addr_, size_t(size_));
    addr_ = other.addr_;
    size_ = other.size_;
    other.addr_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

Mapping::~Mapping() {
  if (addr_) ::munmap(addr_, size_t(size_));
}

struct GgufFile::Impl : GgufState {};

namespace {
const uint8_t kNoBytes[1] = {0};  // stands in for the data of an empty file, so no pointer is ever null
}

GgufFile GgufFile::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->mapping = Mapping(path);
  impl->file_size = impl->mapping.size();
  impl->bytes = impl->mapping.data() ? impl->mapping.data() : kNoBytes;
  parse_gguf(*impl);
  return GgufFile(std::move(impl));
}

GgufFile GgufFile::from_memory(const void* data, size_t size, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->file_size = size;
  impl->bytes = data && size ? static_cast<const uint8_t*>(data) : kNoBytes;
  if (!data) impl->file_size = 0;
  parse_gguf(*impl);
  return GgufFile(std::move(impl));
}

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

const std::string& GgufFile::path() const {
  return impl_->path;
}
uint32_t GgufFile::version() const {
  return impl_->version;
}
size_t GgufFile::alignment() const {
  return impl_->alignment;
}
uint64_t GgufFile::data_offset() const {
  return impl_->data_offset;
}
uint64_t GgufFile::file_size() const {
  return impl_->file_size;
}

const std::vector<std::pair<std::string, Value>>& GgufFile::metadata() const {
  return impl_->metadata;
}

const Value* GgufFile::find(std::string_view key) const {
  auto it = impl_->key_index.find(key);
  return it == impl_->key_index.end() ? nullptr : &impl_->metadata[it->second].second;
}

const Value& GgufFile::get(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw Error(impl_->path + ": metadata key '" + std::string(key) + "' is missing");
  return *v;
}

namespace {

// Runs a typed getter on a key's value; turns a type or range error into one that names the file and key.
template <class T, class Fn>
T typed_get(const GgufFile& f, std::string_view key, const std::optional<T>& fallback, Fn&& fn) {
  const Value* v = f.find(key);
  if (!v) {
    if (fallback) return *fallback;
    throw Error(f.path() + ": metadata key '" + std::string(key) + "' is missing");
  }
  try {
    return fn(*v);
  } catch (const Error& e) {
    throw Error(f.path() + ": metadata key '" + std::string(key) + "': " + e.what());
  }
}

}  // namespace

std::string GgufFile::get_string(std::string_view key, std::optional<std::string> fallback) const {
  return typed_get<std::string>(*this, key, fallback, [](const Value& v) { return v.as_string(); });
}

int64_t GgufFile::get_int(std::string_view key, std::optional<int64_t> fallback) const {
  return typed_get<int64_t>(*this, key, fallback, [](const Value& v) { return v.as_int(); });
}

double GgufFile::get_float(std::string_view key, std::optional<double> fallback) const {
  return typed_get<double>(*this, key, fallback, [](const Value& v) { return v.as_float(); });
}

bool GgufFile::get_bool(std::string_view key, std::optional<bool> fallback) const {
  return typed_get<bool>(*this, key, fallback, [](const Value& v) { return v.as_bool(); });
}

std::string GgufFile::architecture() const {
  return get_string("general.architecture", std::string());
}

const std::vector<TensorInfo>& GgufFile::tensors() const {
  return impl_->tensors;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

const uint8_t* GgufFile::tensor_data(const TensorInfo& info) const {
  // The info may be a copy the caller edited: check its region again rather than trust it.
  uint64_t data_size = impl_->file_size - std::min(impl_->file_size, impl_->data_offset);
  check(info.offset <= data_size && info.nbytes <= data_size - info.offset,
        impl_->path + ": tensor '" + info.name + "' data lies outside the file");
  return impl_->bytes + std::min(impl_->file_size, impl_->data_offset + info.offset);
}

}  // namespace tandem::gguf
