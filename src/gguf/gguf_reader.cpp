// The GGUF parser: reads and validates the header, metadata and tensor infos of a file held in memory
// (../shared/GGUF-ARCH-FACTS.md section A). Every length, count and offset read from the file is checked
// against the bytes that remain before it is used, so a corrupt or hostile file gives an Error, never an
// out-of-bounds read, an overflow or a huge allocation.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include "gguf/gguf_impl.h"

namespace tandem::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
// Fewest bytes one entry can take, used to reject counts that cannot fit in what is left of the file (an
// empty key or name is counted as possible here, so that it is reported as such when it comes): key length
// (8) + value type (4) + 1-byte value.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
// name length (8) + n_dims (4) + type (4) + offset (8).
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;
// Upper bound on metadata values (array elements included) in one file. The largest real tokenizers have a
// few hundred thousand tokens times three arrays; the bound keeps a hostile file from making us build
// billions of Value objects (~48 bytes each) out of a big array of bytes.
constexpr uint64_t kMaxMetadataValues = uint64_t(1) << 24;

// ggml type ids that exist (some tandem does not support); the gaps are retired ids.
bool is_ggml_type_id(int32_t id) {
  if (id < 0 || id > 42) return false;
  return !(id == 4 || id == 5 || (id >= 31 && id <= 33) || (id >= 36 && id <= 38));
}

bool is_value_type(int32_t t) {
  return t >= 0 && t <= 12;
}

uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
    case ValueType::STRING:
      return 8;  // the length, for an empty string
    case ValueType::ARRAY:
      return 12;  // element type + count, for an empty array
  }
  return 1;
}

// Names and keys from a corrupt file may hold any bytes: show them escaped and cut short in messages.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > 80) out += "...";
  return "'" + out + "'";
}

std::string str(uint64_t v) {
  return std::to_string(v);
}

class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t size() const { return size_; }

  [[noreturn]] void fail(const std::string& problem, uint64_t at) const {
    throw Error(path_ + ": " + problem + " at byte " + str(at));
  }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      fail(std::string("file ends inside ") + what + " (" + str(n) + " bytes needed, " + str(remaining()) +
               " left)",
           pos_);
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    uint64_t at = pos_;
    uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      fail(std::string(what) + " length " + str(len) + " runs past the end of the file (" + str(remaining()) +
               " bytes left)",
           at);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_t(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

class Parser {
 public:
  explicit Parser(GgufState& impl) : impl_(impl), c_(impl.bytes, impl.file_size, impl.path) {}

  void run() {
    read_header();
    read_metadata();
    read_tensor_infos();
    place_data_section();
    check_tensor_regions();
  }

 private:
  struct InfoPos {  // where each tensor's fields were read, for messages
    uint64_t name_at, dims_at, offset_at;
  };

  void read_header() {
    if (c_.size() < 4) c_.fail("file is too small to be a GGUF file (" + str(c_.size()) + " bytes)", 0);
    uint32_t magic = c_.read<uint32_t>("magic");
    if (magic != kMagic) {
      char shown[5] = {0};
      std::memcpy(shown, &magic, 4);
      for (int i = 0; i < 4; ++i)  // NULs too: what() would end the message at the first one
        if (shown[i] < 0x20 || shown[i] > 0x7e) shown[i] = '?';
      c_.fail("not a GGUF file: the magic is '" + std::string(shown, 4) + "', expected 'GGUF'", 0);
    }
    uint64_t at = c_.pos();
    uint32_t version = c_.read<uint32_t>("the version");
    if (version == 0) c_.fail("invalid GGUF version 0", at);
    if (version == 1) c_.fail("GGUF version 1 is obsolete and not supported (convert the model again)", at);
    if ((version & 0xFFFF) == 0)
      c_.fail("GGUF version " + str(version) + " looks byte-swapped: big-endian GGUF files are not supported",
              at);
    if (version > 3)
      c_.fail("GGUF version " + str(version) + " is newer than this reader (it reads 2 and 3)", at);
    impl_.version = version;

    tensor_count_at_ = c_.pos();
    int64_t n_tensors = c_.read<int64_t>("the tensor count");
    kv_count_at_ = c_.pos();
    int64_t n_kv = c_.read<int64_t>("the metadata count");
    if (n_tensors < 0)
      c_.fail("tensor count " + std::to_string(n_tensors) + " is negative", tensor_count_at_);
    if (n_kv < 0) c_.fail("metadata count " + std::to_string(n_kv) + " is negative", kv_count_at_);
    uint64_t left = c_.remaining();
    if (uint64_t(n_tensors) > left / kMinTensorInfoBytes)
      c_.fail(
          "tensor count " + str(uint64_t(n_tensors)) + " cannot fit in the remaining " + str(left) + " bytes",
          tensor_count_at_);
    if (uint64_t(n_kv) > left / kMinKvBytes)
      c_.fail(
          "metadata count " + str(uint64_t(n_kv)) + " cannot fit in the remaining " + str(left) + " bytes",
          kv_count_at_);
    if (uint64_t(n_tensors) * kMinTensorInfoBytes + uint64_t(n_kv) * kMinKvBytes > left)
      c_.fail("tensor count " + str(uint64_t(n_tensors)) + " and metadata count " + str(uint64_t(n_kv)) +
                  " cannot fit in the remaining " + str(left) + " bytes",
              tensor_count_at_);
    n_tensors_ = uint64_t(n_tensors);
    n_kv_ = uint64_t(n_kv);
  }

  void read_metadata() {
    for (uint64_t i = 0; i < n_kv_; ++i) {
      uint64_t key_at = c_.pos();
      std::string key = c_.read_string("a metadata key");
      if (key.empty()) c_.fail("metadata key #" + str(i) + " is empty", key_at);
      if (impl_.key_index.count(key)) c_.fail("duplicate metadata key " + printable(key), key_at);
      uint64_t type_at = c_.pos();
      int32_t type = c_.read<int32_t>("a metadata value type");
      if (!is_value_type(type))
        c_.fail("metadata key " + printable(key) + " has invalid value type " + std::to_string(type),
                type_at);
      uint64_t value_at = c_.pos();
      Value value = read_value(ValueType(type), 0);
      if (key == "general.alignment") check_alignment(value, value_at);
      impl_.key_index.emplace(key, impl_.metadata.size());
      impl_.metadata.emplace_back(std::move(key), std::move(value));
    }
  }

  Value read_value(ValueType type, int depth) {
    if (++n_values_ > kMaxMetadataValues)
      c_.fail("the metadata holds more than " + str(kMaxMetadataValues) + " values", c_.pos());
    switch (type) {
      case ValueType::UINT8:
        return Value::u8(c_.read<uint8_t>("a uint8 value"));
      case ValueType::INT8:
        return Value::i8(c_.read<int8_t>("an int8 value"));
      case ValueType::UINT16:
        return Value::u16(c_.read<uint16_t>("a uint16 value"));
      case ValueType::INT16:
        return Value::i16(c_.read<int16_t>("an int16 value"));
      case ValueType::UINT32:
        return Value::u32(c_.read<uint32_t>("a uint32 value"));
      case ValueType::INT32:
        return Value::i32(c_.read<int32_t>("an int32 value"));
      case ValueType::UINT64:
        return Value::u64(c_.read<uint64_t>("a uint64 value"));
      case ValueType::INT64:
        return Value::i64(c_.read<int64_t>("an int64 value"));
      case ValueType::FLOAT32:
        return Value::f32(c_.read<float>("a float32 value"));
      case ValueType::FLOAT64:
        return Value::f64(c_.read<double>("a float64 value"));
      case ValueType::BOOL: {
        uint64_t at = c_.pos();
        uint8_t b = c_.read<uint8_t>("a bool value");
        if (b > 1) c_.fail("bool value " + str(b) + " is neither 0 nor 1", at);
        return Value::boolean(b == 1);
      }
      case ValueType::STRING:
        return Value::string(c_.read_string("a string value"));
      case ValueType::ARRAY:
        return read_array(depth);
    }
    c_.fail("invalid value type " + std::to_string(int32_t(type)), c_.pos());
  }

  Value read_array(int depth) {
    uint64_t type_at = c_.pos();
    if (depth >= kMaxArrayDepth)
      c_.fail("arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels", type_at);
    int32_t elem = c_.read<int32_t>("an array element type");
    if (!is_value_type(elem)) c_.fail("array has invalid element type " + std::to_string(elem), type_at);
    ValueType elem_type = ValueType(elem);
    uint64_t count_at = c_.pos();
    uint64_t count = c_.read<uint64_t>("an array length");
    uint64_t min_bytes = min_value_bytes(elem_type);
    if (count > c_.remaining() / min_bytes)
      c_.fail("array of " + str(count) + " " + value_type_name(elem_type) +
                  " values cannot fit in the remaining " + str(c_.remaining()) + " bytes",
              count_at);
    if (count > kMaxMetadataValues - std::min(n_values_, kMaxMetadataValues))
      c_.fail("array of " + str(count) + " values exceeds the limit of " + str(kMaxMetadataValues) +
                  " metadata values per file",
              count_at);
    std::vector<Value> elements;
    // The count fits in the bytes left, but each Value is ~48 bytes per byte read: reserve a little and let
    // the vector grow only as elements actually parse.
    elements.reserve(size_t(std::min<uint64_t>(count, 4096)));
    for (uint64_t i = 0; i < count; ++i) elements.push_back(read_value(elem_type, depth + 1));
    return Value::array(elem_type, std::move(elements));
  }

  void check_alignment(const Value& v, uint64_t at) {
    if (v.type() != ValueType::UINT32)
      c_.fail("general.alignment has type " + v.type_name() + ", it must be uint32", at);
    uint64_t a = v.as_uint();
    if (a == 0 || !std::has_single_bit(a))
      c_.fail("general.alignment is " + str(a) + ", it must be a non-zero power of two", at);
    impl_.alignment = size_t(a);
  }

  static bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
    return __builtin_mul_overflow(a, b, out);
  }

  void read_tensor_infos() {
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      InfoPos pos{};
      pos.name_at = c_.pos();
      TensorInfo info;
      info.name = c_.read_string("a tensor name");
      const std::string shown = printable(info.name);
      if (info.name.empty()) c_.fail("tensor #" + str(i) + " has an empty name", pos.name_at);
      if (info.name.size() > kMaxTensorNameLength)
        c_.fail("tensor name " + shown + " is " + str(info.name.size()) + " bytes long, the limit is " +
                    str(kMaxTensorNameLength),
                pos.name_at);
      if (impl_.tensor_index.count(info.name)) c_.fail("duplicate tensor name " + shown, pos.name_at);

      uint64_t ndims_at = c_.pos();
      info.n_dims = c_.read<uint32_t>("a tensor's dimension count");
      if (info.n_dims > 4)
        c_.fail(
            "tensor " + shown + " has " + str(info.n_dims) + " dimensions; a tensor has 0 (a scalar) to 4",
            ndims_at);
      pos.dims_at = c_.pos();
      uint64_t elements = 1;
      for (uint32_t d = 0; d < info.n_dims; ++d) {
        uint64_t dim_at = c_.pos();
        int64_t ne = c_.read<int64_t>("a tensor dimension");
        if (ne < 0)
          c_.fail("tensor " + shown + " has a negative dimension ne[" + str(d) + "] = " + std::to_string(ne),
                  dim_at);
        if (mul_overflows(elements, uint64_t(ne), &elements) ||
            elements > uint64_t(std::numeric_limits<int64_t>::max()))
          c_.fail("tensor " + shown + " has dimensions whose element count overflows int64", dim_at);
        info.ne[d] = ne;
      }

      uint64_t type_at = c_.pos();
      int32_t type = c_.read<int32_t>("a tensor type");
      if (!is_ggml_type_id(type))
        c_.fail("tensor " + shown + " has invalid type id " + std::to_string(type) +
                    (info.n_dims == 0 ? " after a dimension count of 0 (a scalar); if the tensor is not a "
                                        "scalar, its dimension count is wrong"
                                      : ""),
                type_at);
      if (!dtype_is_supported(type))
        c_.fail(
            "tensor " + shown + " has type " + ggml_type_name(type) +
                " which tandem does not support (supported: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, "
                "i8, i16, i32, i64, f64)",
            type_at);
      info.type = DType(type);
      const DTypeTraits& tr = dtype_traits(info.type);
      if (info.ne[0] % tr.block_size != 0)
        c_.fail("tensor " + shown + " has ne[0] = " + std::to_string(info.ne[0]) + ", not a multiple of " +
                    tr.name + "'s block size " + std::to_string(tr.block_size),
                pos.dims_at);
      uint64_t nbytes = uint64_t(info.ne[0] / tr.block_size);
      bool overflow = mul_overflows(nbytes, tr.block_bytes, &nbytes);
      for (int d = 1; d < 4; ++d) overflow = overflow || mul_overflows(nbytes, uint64_t(info.ne[d]), &nbytes);
      if (overflow)
        c_.fail("tensor " + shown + " is too large: its byte size overflows 64 bits", pos.dims_at);
      info.nbytes = nbytes;

      pos.offset_at = c_.pos();
      info.offset = c_.read<uint64_t>("a tensor offset");
      impl_.tensor_index.emplace(info.name, impl_.tensors.size());
      impl_.tensors.push_back(std::move(info));
      positions_.push_back(pos);
    }
  }

  void place_data_section() {
    uint64_t end = c_.pos();
    uint64_t a = impl_.alignment;
    impl_.data_offset = (end + a - 1) / a * a;  // end <= file size and a <= 2^31: no overflow
    // A file without tensors may stop right after its infos, without the padding.
    if (n_tensors_ > 0 && impl_.data_offset > c_.size())
      c_.fail("the data section would start at byte " + str(impl_.data_offset) +
                  ", past the end of the file (" + str(c_.size()) + " bytes)",
              end);
  }

  // Tensor data must be aligned, inside the file and disjoint. We do not require the exact packing that
  // llama.cpp's reader enforces (info-table order, no gaps): safety needs only bounds and disjointness, and
  // being lenient reads everything llama.cpp reads plus files whose writers order or pad the data
  // differently.
  void check_tensor_regions() {
    const uint64_t data_size = c_.size() - std::min(c_.size(), impl_.data_offset);
    const auto& ts = impl_.tensors;
    for (size_t i = 0; i < ts.size(); ++i) {
      const TensorInfo& t = ts[i];
      if (t.offset % impl_.alignment != 0)
        c_.fail("tensor " + printable(t.name) + " has data offset " + str(t.offset) +
                    ", not a multiple of the alignment " + str(impl_.alignment),
                positions_[i].offset_at);
      if (t.offset > data_size || t.nbytes > data_size - t.offset)
        c_.fail("tensor " + printable(t.name) + " data (" + str(t.nbytes) + " bytes at data offset " +
                    str(t.offset) + ") runs past the end of the file (the data section holds " +
                    str(data_size) + " bytes)",
                positions_[i].offset_at);
    }
    std::vector<size_t> order(ts.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return ts[a].offset < ts[b].offset; });
    const TensorInfo* prev = nullptr;
    for (size_t i : order) {
      const TensorInfo& t = ts[i];
      if (t.nbytes == 0) continue;  // an empty tensor occupies no bytes
      if (prev && prev->offset + prev->nbytes > t.offset)
        c_.fail("tensor " + printable(t.name) + " data at data offset " + str(t.offset) +
                    " overlaps tensor " + printable(prev->name) + " (data offset " + str(prev->offset) +
                    ", " + str(prev->nbytes) + " bytes)",
                positions_[i].offset_at);
      prev = &t;
    }
  }

  GgufState& impl_;
  Cursor c_;
  uint64_t tensor_count_at_ = 0, kv_count_at_ = 0;
  uint64_t n_tensors_ = 0, n_kv_ = 0;
  uint64_t n_values_ = 0;
  std::vector<InfoPos> positions_;
};

}  // namespace

void parse_gguf(GgufState& impl) {
  Parser(impl).run();
}

}  // namespace tandem::gguf
