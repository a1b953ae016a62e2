// Touches everything a parsed GGUF file exposes: every metadata value (through the getters and to_string) and
// every byte of every tensor. The fuzz harness and the mutation test call it on each input that parses, so an
// out-of-bounds offset or length that slipped through validation becomes a sanitizer finding.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "gguf/gguf.h"

namespace tandem::gguf::fuzzing {

inline uint64_t walk_value(const Value& v) {
  uint64_t h = uint64_t(v.type()) + v.to_string(4).size();
  try {
    if (v.is_integer()) h += uint64_t(v.as_int());
  } catch (const Error&) {  // a uint64 above INT64_MAX
    h += v.as_uint();
  }
  if (v.is_float()) h += uint64_t(v.as_float() != 0);
  if (v.type() == ValueType::BOOL) h += v.as_bool();
  if (v.type() == ValueType::STRING) h += v.as_string().size();
  if (v.type() == ValueType::ARRAY)
    for (const Value& e : v.as_array()) h += walk_value(e);
  return h;
}

inline uint64_t walk_file(const GgufFile& f) {
  uint64_t h = f.version() + f.alignment() + f.data_offset() + f.architecture().size();
  for (const auto& [key, value] : f.metadata()) {
    h += key.size() + walk_value(value);
    if (f.find(key) != &value) throw std::logic_error("find() does not return the value of key " + key);
  }
  for (const TensorInfo& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) throw std::logic_error("find_tensor() does not return tensor " + t.name);
    const uint8_t* data = f.tensor_data(t);
    for (uint64_t i = 0; i < t.nbytes; ++i) h += data[i];
    h += uint64_t(t.nelements());
  }
  return h;
}

}  // namespace tandem::gguf::fuzzing
