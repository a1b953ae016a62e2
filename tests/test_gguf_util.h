// Helpers for the GGUF tests: temporary files, a byte builder for hand-made files, random bytes.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace tandem::gguf::testing {

// A path in the temp directory, unique per process and name; the file (and "<path>.tmp") is removed at the
// end.
class TempPath {
 public:
  explicit TempPath(const std::string& name)
      : path_((std::filesystem::temp_directory_path() /
               ("tandem_gguf_test_" + std::to_string(::getpid()) + "_" + name))
                  .string()) {}
  ~TempPath() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    std::filesystem::remove(path_ + ".tmp", ec);
  }
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Builds a GGUF file field by field; pos() before a field is the byte offset a reader error should name.
class Bytes {
 public:
  size_t pos() const { return b_.size(); }
  template <class T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b_.insert(b_.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& i32(int32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& i64(int64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
    return *this;
  }
  // Magic, version, tensor count, kv count.
  Bytes& header(int64_t n_tensors, int64_t n_kv, uint32_t version = 3) {
    b_.insert(b_.end(), {'G', 'G', 'U', 'F'});
    return u32(version).i64(n_tensors).i64(n_kv);
  }
  Bytes& kv_u32(const std::string& key, uint32_t v) { return str(key).i32(4).u32(v); }
  // A tensor info: name, n_dims, dims, type, offset.
  Bytes& info(const std::string& name, const std::vector<int64_t>& ne, int32_t type, uint64_t offset) {
    str(name).u32(uint32_t(ne.size()));
    for (int64_t d : ne) i64(d);
    return i32(type).u64(offset);
  }
  Bytes& pad_to(size_t alignment) {
    while (b_.size() % alignment) b_.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b_.insert(b_.end(), n, 0);
    return *this;
  }
  const std::vector<uint8_t>& bytes() const { return b_; }

 private:
  std::vector<uint8_t> b_;
};

inline std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = uint8_t(rng() >> 56);
  return out;
}

}  // namespace tandem::gguf::testing
