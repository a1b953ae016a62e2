// Metadata values of GGUF files: construction, typed access with range checks, printing, comparison.
#include <charconv>
#include <cmath>
#include <limits>

#include "gguf/gguf.h"

namespace tandem::gguf {
namespace {

// Storage: unsigned integers in uint64_t, signed ones in int64_t, both float widths in double.
bool is_unsigned_type(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}
bool is_signed_type(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}

std::string float_to_string(double v, bool single) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[512];
  // Shortest text that reads back to the same value, at the value's own precision; plain digits for the
  // magnitudes hyperparameters have (500000, not 5e+05), exponent form for the rest.
  double mag = std::fabs(v);
  auto fmt =
      (mag == 0 || (mag >= 1e-4 && mag < 1e16)) ? std::chars_format::fixed : std::chars_format::general;
  auto res = single ? std::to_chars(buf, buf + sizeof buf, float(v), fmt)
                    : std::to_chars(buf, buf + sizeof buf, v, fmt);
  return std::string(buf, res.ptr);
}

// Quoted, with control characters escaped, cut after max_bytes (long chat templates stay one short line).
std::string quote(const std::string& s, size_t max_bytes) {
  std::string out = "\"";
  size_t n = std::min(s.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          static const char* hex = "0123456789abcdef";
          out += "\\x";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += char(c);
        }
    }
  }
  out += "\"";
  if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

[[noreturn]] void type_error(const Value& v, const char* wanted) {
  throw Error("metadata value of type " + v.type_name() + " is not " + wanted);
}

bool same_float(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
      return "uint8";
    case ValueType::INT8:
      return "int8";
    case ValueType::UINT16:
      return "uint16";
    case ValueType::INT16:
      return "int16";
    case ValueType::UINT32:
      return "uint32";
    case ValueType::INT32:
      return "int32";
    case ValueType::FLOAT32:
      return "float32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::UINT64:
      return "uint64";
    case ValueType::INT64:
      return "int64";
    case ValueType::FLOAT64:
      return "float64";
  }
  return "invalid";
}

Value Value::u8(uint8_t v) {
  Value r;
  r.type_ = ValueType::UINT8;
  r.v_ = uint64_t(v);
  return r;
}
Value Value::u16(uint16_t v) {
  Value r;
  r.type_ = ValueType::UINT16;
  r.v_ = uint64_t(v);
  return r;
}
Value Value::u32(uint32_t v) {
  Value r;
  r.type_ = ValueType::UINT32;
  r.v_ = uint64_t(v);
  return r;
}
Value Value::u64(uint64_t v) {
  Value r;
  r.type_ = ValueType::UINT64;
  r.v_ = v;
  return r;
}
Value Value::i8(int8_t v) {
  Value r;
  r.type_ = ValueType::INT8;
  r.v_ = int64_t(v);
  return r;
}
Value Value::i16(int16_t v) {
  Value r;
  r.type_ = ValueType::INT16;
  r.v_ = int64_t(v);
  return r;
}
Value Value::i32(int32_t v) {
  Value r;
  r.type_ = ValueType::INT32;
  r.v_ = int64_t(v);
  return r;
}
Value Value::i64(int64_t v) {
  Value r;
  r.type_ = ValueType::INT64;
  r.v_ = v;
  return r;
}
Value Value::f32(float v) {
  Value r;
  r.type_ = ValueType::FLOAT32;
  r.v_ = double(v);
  return r;
}
Value Value::f64(double v) {
  Value r;
  r.type_ = ValueType::FLOAT64;
  r.v_ = v;
  return r;
}
Value Value::boolean(bool v) {
  Value r;
  r.type_ = ValueType::BOOL;
  r.v_ = v;
  return r;
}
Value Value::string(std::string v) {
  Value r;
  r.type_ = ValueType::STRING;
  r.v_ = std::move(v);
  return r;
}

Value Value::array(ValueType element_type, std::vector<Value> elements) {
  check(value_type_name(element_type) != std::string("invalid"),
        "invalid array element type " + std::to_string(int32_t(element_type)));
  for (size_t i = 0; i < elements.size(); ++i) {
    check(elements[i].type() == element_type, "array of " + std::string(value_type_name(element_type)) +
                                                  " has an element of type " + elements[i].type_name() +
                                                  " at index " + std::to_string(i));
  }
  Value r;
  r.type_ = ValueType::ARRAY;
  r.element_type_ = element_type;
  r.v_ = std::move(elements);
  return r;
}

Value Value::string_array(const std::vector<std::string>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (const auto& s : v) e.push_back(string(s));
  return array(ValueType::STRING, std::move(e));
}
Value Value::i32_array(const std::vector<int32_t>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (int32_t x : v) e.push_back(i32(x));
  return array(ValueType::INT32, std::move(e));
}
Value Value::f32_array(const std::vector<float>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (float x : v) e.push_back(f32(x));
  return array(ValueType::FLOAT32, std::move(e));
}

std::string Value::type_name() const {
  if (type_ != ValueType::ARRAY) return value_type_name(type_);
  return std::string("array<") + value_type_name(element_type_) + ">";
}

bool Value::is_integer() const {
  return is_unsigned_type(type_) || is_signed_type(type_);
}

int64_t Value::as_int() const {
  if (is_unsigned_type(type_)) {
    uint64_t u = std::get<uint64_t>(v_);
    check(u <= uint64_t(std::numeric_limits<int64_t>::max()),
          "metadata value " + std::to_string(u) + " does not fit in int64");
    return int64_t(u);
  }
  if (is_signed_type(type_)) return std::get<int64_t>(v_);
  type_error(*this, "an integer");
}

uint64_t Value::as_uint() const {
  if (is_unsigned_type(type_)) return std::get<uint64_t>(v_);
  if (is_signed_type(type_)) {
    int64_t i = std::get<int64_t>(v_);
    check(i >= 0,
          "metadata value " + std::to_string(i) + " is negative where a non-negative integer is needed");
    return uint64_t(i);
  }
  type_error(*this, "an integer");
}

double Value::as_float() const {
  if (is_float()) return std::get<double>(v_);
  if (is_unsigned_type(type_)) return double(std::get<uint64_t>(v_));
  if (is_signed_type(type_)) return double(std::get<int64_t>(v_));
  type_error(*this, "a number");
}

bool Value::as_bool() const {
  if (type_ != ValueType::BOOL) type_error(*this, "a bool");
  return std::get<bool>(v_);
}

const std::string& Value::as_string() const {
  if (type_ != ValueType::STRING) type_error(*this, "a string");
  return std::get<std::string>(v_);
}

const std::vector<Value>& Value::as_array() const {
  if (type_ != ValueType::ARRAY) type_error(*this, "an array");
  return std::get<std::vector<Value>>(v_);
}

std::vector<std::string> Value::as_string_array() const {
  if (type_ != ValueType::ARRAY || element_type_ != ValueType::STRING)
    type_error(*this, "an array of strings");
  std::vector<std::string> out;
  out.reserve(as_array().size());
  for (const auto& e : as_array()) out.push_back(e.as_string());
  return out;
}

std::vector<int64_t> Value::as_int_array() const {
  if (type_ != ValueType::ARRAY || !(is_unsigned_type(element_type_) || is_signed_type(element_type_)))
    type_error(*this, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(as_array().size());
  for (const auto& e : as_array()) out.push_back(e.as_int());
  return out;
}

std::vector<float> Value::as_float_array() const {
  bool numeric = element_type_ == ValueType::FLOAT32 || element_type_ == ValueType::FLOAT64 ||
                 is_unsigned_type(element_type_) || is_signed_type(element_type_);
  if (type_ != ValueType::ARRAY || !numeric) type_error(*this, "an array of numbers");
  std::vector<float> out;
  out.reserve(as_array().size());
  for (const auto& e : as_array()) out.push_back(float(e.as_float()));
  return out;
}

std::string Value::to_string(size_t max_items) const {
  switch (type_) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64:
      return std::to_string(std::get<uint64_t>(v_));
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64:
      return std::to_string(std::get<int64_t>(v_));
    case ValueType::FLOAT32:
      return float_to_string(std::get<double>(v_), true);
    case ValueType::FLOAT64:
      return float_to_string(std::get<double>(v_), false);
    case ValueType::BOOL:
      return std::get<bool>(v_) ? "true" : "false";
    case ValueType::STRING:
      return quote(std::get<std::string>(v_), 160);
    case ValueType::ARRAY: {
      const auto& elems = std::get<std::vector<Value>>(v_);
      std::string out = "[";
      size_t shown = std::min(elems.size(), max_items);
      // Nested arrays show fewer items per level, so the output stays short however deep they nest.
      size_t inner_items = std::max<size_t>(1, max_items / 2);
      for (size_t i = 0; i < shown; ++i) {
        if (i) out += ", ";
        out += elems[i].type_ == ValueType::STRING ? quote(elems[i].as_string(), 40)
                                                   : elems[i].to_string(inner_items);
      }
      if (shown < elems.size())
        out += std::string(shown ? ", " : "") + "... (" + std::to_string(elems.size()) + " items)";
      return out + "]";
    }
  }
  return "?";
}

bool Value::operator==(const Value& other) const {
  if (type_ != other.type_) return false;
  if (type_ == ValueType::ARRAY && element_type_ != other.element_type_) return false;
  if (is_float()) return same_float(std::get<double>(v_), std::get<double>(other.v_));
  return v_ == other.v_;
}

}  // namespace tandem::gguf
