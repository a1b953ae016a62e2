// read(write(x)) == x for GGUF files: every metadata type, nested arrays, tensors of every supported dtype,
// custom alignment, streamed tensors, and the writer's all-or-nothing file replacement.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "gguf/gguf.h"
#include "test_gguf_util.h"

namespace tandem::gguf {
namespace {

using testing::random_bytes;
using testing::TempPath;

std::vector<std::pair<std::string, Value>> every_value_type() {
  std::vector<std::pair<std::string, Value>> kv;
  kv.emplace_back("general.architecture", Value::string("llama"));
  kv.emplace_back("u8", Value::u8(255));
  kv.emplace_back("i8", Value::i8(-128));
  kv.emplace_back("u16", Value::u16(65535));
  kv.emplace_back("i16", Value::i16(-32768));
  kv.emplace_back("u32", Value::u32(4294967295u));
  kv.emplace_back("i32", Value::i32(std::numeric_limits<int32_t>::min()));
  kv.emplace_back("u64", Value::u64(std::numeric_limits<uint64_t>::max()));
  kv.emplace_back("i64", Value::i64(std::numeric_limits<int64_t>::min()));
  kv.emplace_back("f32", Value::f32(-3.14159274f));
  kv.emplace_back("f32.nan", Value::f32(std::numeric_limits<float>::quiet_NaN()));
  kv.emplace_back("f32.inf", Value::f32(-std::numeric_limits<float>::infinity()));
  kv.emplace_back("f32.denormal", Value::f32(std::numeric_limits<float>::denorm_min()));
  kv.emplace_back("f64", Value::f64(2.718281828459045e-200));
  kv.emplace_back("bool.true", Value::boolean(true));
  kv.emplace_back("bool.false", Value::boolean(false));
  kv.emplace_back("string.empty", Value::string(""));
  kv.emplace_back("string.utf8", Value::string("h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C"));
  kv.emplace_back("string.nul", Value::string(std::string("a\0b", 3)));
  kv.emplace_back("array.u8", Value::array(ValueType::UINT8, {Value::u8(0), Value::u8(7), Value::u8(255)}));
  kv.emplace_back("array.i8", Value::array(ValueType::INT8, {Value::i8(-1), Value::i8(127)}));
  kv.emplace_back("array.u16", Value::array(ValueType::UINT16, {Value::u16(1), Value::u16(65535)}));
  kv.emplace_back("array.i16", Value::array(ValueType::INT16, {Value::i16(-2)}));
  kv.emplace_back("array.u32", Value::array(ValueType::UINT32, {Value::u32(3), Value::u32(0)}));
  kv.emplace_back("array.i32", Value::i32_array({-1, 0, 1, 2147483647}));
  kv.emplace_back("array.u64", Value::array(ValueType::UINT64, {Value::u64(uint64_t(1) << 63)}));
  kv.emplace_back("array.i64", Value::array(ValueType::INT64, {Value::i64(-(int64_t(1) << 40))}));
  kv.emplace_back("array.f32", Value::f32_array({0.5f, -0.f, 1e-30f}));
  kv.emplace_back("array.f64", Value::array(ValueType::FLOAT64, {Value::f64(1.0 / 3.0)}));
  kv.emplace_back("array.bool", Value::array(ValueType::BOOL, {Value::boolean(true), Value::boolean(false)}));
  kv.emplace_back("array.string", Value::string_array({"<s>", "", "\xE2\x96\x81the", std::string(300, 'z')}));
  kv.emplace_back("array.empty", Value::array(ValueType::STRING, {}));
  kv.emplace_back("array.nested", Value::array(ValueType::ARRAY,
                                               {Value::i32_array({1, 2, 3}), Value::string_array({"x", "y"}),
                                                Value::array(ValueType::FLOAT64, {}),
                                                Value::array(ValueType::BOOL, {Value::boolean(true)})}));
  kv.emplace_back(
      "array.nested3",
      Value::array(ValueType::ARRAY,
                   {Value::array(ValueType::ARRAY, {Value::i32_array({7}), Value::f32_array({1.5f})}),
                    Value::array(ValueType::ARRAY, {})}));
  return kv;
}

TEST(GgufRoundTrip, EveryMetadataType) {
  GgufWriter w;
  for (auto& [k, v] : every_value_type()) w.set(k, v);
  TempPath path("meta.gguf");
  w.write(path.str());

  GgufFile f = GgufFile::open(path.str());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_TRUE(f.tensors().empty());
  auto expected = every_value_type();
  ASSERT_EQ(f.metadata().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].first, expected[i].first);
    EXPECT_EQ(f.metadata()[i].second, expected[i].second)
        << expected[i].first << ": got " << f.metadata()[i].second.to_string() << ", wrote "
        << expected[i].second.to_string();
  }
  // Same bytes through from_memory.
  auto bytes = testing::read_bytes(path.str());
  EXPECT_EQ(bytes, w.write_to_memory());
  GgufFile m = GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_EQ(m.metadata(), f.metadata());
}

TEST(GgufRoundTrip, TypedGetters) {
  GgufWriter w;
  for (auto& [k, v] : every_value_type()) w.set(k, v);
  auto bytes = w.write_to_memory();
  GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "mem.gguf");
  EXPECT_EQ(f.get_int("u8"), 255);
  EXPECT_EQ(f.get_int("i16"), -32768);
  EXPECT_EQ(f.get_int("u32"), 4294967295ll);
  EXPECT_EQ(f.get_float("u16"), 65535.0);
  EXPECT_FLOAT_EQ(float(f.get_float("f32")), -3.14159274f);
  EXPECT_TRUE(f.get_bool("bool.true"));
  EXPECT_EQ(f.get_string("string.utf8"), "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C");
  EXPECT_EQ(f.get_int("missing", 5), 5);
  EXPECT_EQ(f.get_string("missing", "dflt"), "dflt");
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(f.get("array.i32").as_int_array(), (std::vector<int64_t>{-1, 0, 1, 2147483647}));
  for (auto call : {+[](const GgufFile& g) { (void)g.get_int("missing"); },
                    +[](const GgufFile& g) { (void)g.get_int("u64"); },  // above INT64_MAX
                    +[](const GgufFile& g) { (void)g.get_string("u8"); },
                    +[](const GgufFile& g) { (void)g.get_bool("string.empty"); }}) {
    try {
      call(f);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("mem.gguf: metadata key '", 0), 0u) << e.what();
    }
  }
}

struct TensorCase {
  DType type;
  std::vector<int64_t> ne;
};

std::vector<TensorCase> every_dtype() {
  return {{DType::F32, {5}},
          {DType::F16, {3, 7}},
          {DType::BF16, {8, 2, 3}},
          {DType::Q8_0, {64, 3}},
          {DType::Q4_0, {32, 1, 2, 2}},
          {DType::Q4_K, {256, 2}},
          {DType::Q5_K, {512}},
          {DType::Q6_K, {256, 3}},
          {DType::I8, {9}},
          {DType::I16, {4, 4}},
          {DType::I32, {1}},
          {DType::I64, {2, 1}},
          {DType::F64, {3}},
          {DType::F32, {}},
          {DType::F32, {0, 4}}};
}

void check_tensors(const GgufFile& f, const std::vector<TensorCase>& cases, size_t alignment) {
  ASSERT_EQ(f.tensors().size(), cases.size());
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.data_offset() % alignment, 0u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, "tensor." + std::to_string(i));
    EXPECT_EQ(t.type, cases[i].type);
    EXPECT_EQ(t.n_dims, cases[i].ne.size());
    for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < cases[i].ne.size() ? cases[i].ne[d] : 1);
    size_t nbytes = dtype_row_bytes(t.type, t.ne[0]) * size_t(t.ne[1] * t.ne[2] * t.ne[3]);
    EXPECT_EQ(t.nbytes, nbytes);
    EXPECT_EQ(t.offset % alignment, 0u);
    EXPECT_EQ(f.find_tensor(t.name), &t);
    auto expected = random_bytes(nbytes, 1000 + i);
    EXPECT_EQ(std::vector<uint8_t>(f.tensor_data(t), f.tensor_data(t) + t.nbytes), expected);
  }
}

size_t case_bytes(const TensorCase& c) {
  int64_t rows = 1;
  for (size_t d = 1; d < c.ne.size(); ++d) rows *= c.ne[d];
  return dtype_row_bytes(c.type, c.ne.empty() ? 1 : c.ne[0]) * size_t(rows);
}

// Adds every case, alternating the three ways to hand over tensor bytes: borrowed, owned, produced.
void add_every_dtype(GgufWriter& w, std::vector<std::vector<uint8_t>>& borrowed, int* produced_calls) {
  auto cases = every_dtype();
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string name = "tensor." + std::to_string(i);
    size_t nbytes = case_bytes(cases[i]);
    switch (i % 3) {
      case 0:
        borrowed.push_back(random_bytes(nbytes, 1000 + i));
        w.add_tensor(name, cases[i].type, cases[i].ne, borrowed.back().data(), nbytes);
        break;
      case 1:
        w.add_tensor(name, cases[i].type, cases[i].ne, random_bytes(nbytes, 1000 + i));
        break;
      case 2:
        w.add_tensor(name, cases[i].type, cases[i].ne, nbytes, [i, nbytes, produced_calls](uint8_t* dst) {
          ++*produced_calls;
          auto b = random_bytes(nbytes, 1000 + i);
          std::copy(b.begin(), b.end(), dst);
        });
        break;
    }
  }
}

TEST(GgufRoundTrip, TensorsOfEverySupportedTypeAndAlignment) {
  for (uint32_t alignment : {0u, 1u, 8u, 64u, 4096u}) {  // 0: no general.alignment key, the default 32
    SCOPED_TRACE("alignment " + std::to_string(alignment));
    GgufWriter w;
    w.set("general.architecture", Value::string("test"));
    if (alignment) w.set("general.alignment", Value::u32(alignment));
    w.set("after", Value::string_array({"metadata", "after", "the", "alignment"}));
    std::vector<std::vector<uint8_t>> borrowed;
    borrowed.reserve(32);
    int produced = 0;
    add_every_dtype(w, borrowed, &produced);
    TempPath path("tensors_" + std::to_string(alignment) + ".gguf");
    w.write(path.str());
    EXPECT_EQ(produced, 5);  // each produced tensor exactly once
    EXPECT_FALSE(std::filesystem::exists(path.str() + ".tmp"));
    size_t expected_alignment = alignment ? alignment : 32;
    GgufFile f = GgufFile::open(path.str());
    check_tensors(f, every_dtype(), expected_alignment);
    EXPECT_EQ(f.get("after").as_string_array().size(), 4u);
    // Each tensor is followed by zero padding up to the alignment, the last one too.
    auto bytes = testing::read_bytes(path.str());
    EXPECT_EQ(bytes.size() % expected_alignment, 0u);
    for (const auto& t : f.tensors()) {
      size_t end = size_t(f.data_offset() + t.offset + t.nbytes);
      for (size_t p = end; p % expected_alignment; ++p) ASSERT_EQ(bytes.at(p), 0) << t.name << " byte " << p;
    }
  }
}

TEST(GgufRoundTrip, ProducedTensorsAreMadeDuringWriteInOrder) {
  GgufWriter w;
  std::vector<int> order;
  for (int i = 0; i < 4; ++i) {
    w.add_tensor("t" + std::to_string(i), DType::F32, {int64_t(3 + i)}, size_t(4 * (3 + i)),
                 [i, &order](uint8_t* dst) {
                   order.push_back(i);
                   for (int k = 0; k < 4 * (3 + i); ++k) dst[k] = uint8_t(i * 16 + k);
                 });
  }
  EXPECT_TRUE(order.empty());  // nothing is produced before write
  auto bytes = w.write_to_memory();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size());
  for (int i = 0; i < 4; ++i) {
    const TensorInfo* t = f.find_tensor("t" + std::to_string(i));
    ASSERT_NE(t, nullptr);
    for (int k = 0; k < 4 * (3 + i); ++k) EXPECT_EQ(f.tensor_data(*t)[k], uint8_t(i * 16 + k));
  }
}

TEST(GgufRoundTrip, FailedWriteLeavesNoFileAndKeepsTheOldOne) {
  TempPath path("failed.gguf");
  testing::write_bytes(path.str(), {1, 2, 3});
  GgufWriter w;
  w.set("general.architecture", Value::string("llama"));
  w.add_tensor("ok", DType::F32, {4}, std::vector<uint8_t>(16, 1));
  w.add_tensor("boom", DType::F32, {4}, 16, [](uint8_t*) { throw Error("producer failed"); });
  EXPECT_THROW(w.write(path.str()), Error);
  EXPECT_FALSE(std::filesystem::exists(path.str() + ".tmp"));
  EXPECT_EQ(testing::read_bytes(path.str()), (std::vector<uint8_t>{1, 2, 3}));
  // A directory that does not exist: a clear error, nothing left behind.
  EXPECT_THROW(w.write("/nonexistent-dir-of-tandem/x.gguf"), Error);
}

TEST(GgufRoundTrip, WriterRejectsBadInput) {
  GgufWriter w;
  EXPECT_THROW(w.set("", Value::u8(1)), Error);
  EXPECT_THROW(w.add_tensor("", DType::F32, {1}, std::vector<uint8_t>(4)), Error);
  EXPECT_THROW(w.add_tensor(std::string(64, 'n'), DType::F32, {1}, std::vector<uint8_t>(4)), Error);
  w.add_tensor(std::string(63, 'n'), DType::F32, {1}, std::vector<uint8_t>(4));
  EXPECT_THROW(w.add_tensor(std::string(63, 'n'), DType::F32, {1}, std::vector<uint8_t>(4)),
               Error);  // duplicate
  EXPECT_THROW(w.add_tensor("five", DType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)), Error);
  EXPECT_THROW(w.add_tensor("neg", DType::F32, {-1}, std::vector<uint8_t>()), Error);
  EXPECT_THROW(w.add_tensor("size", DType::F32, {3}, std::vector<uint8_t>(8)), Error);
  EXPECT_THROW(w.add_tensor("block", DType::Q4_K, {128}, std::vector<uint8_t>(72)), Error);
  EXPECT_THROW(w.add_tensor("huge", DType::F32, {int64_t(1) << 62, int64_t(1) << 62}, nullptr, 0), Error);
  EXPECT_THROW(w.add_tensor("nodata", DType::F32, {2}, nullptr, 8), Error);
  w.set("general.alignment", Value::u32(48));
  EXPECT_THROW(w.write_to_memory(), Error);
  w.set("general.alignment", Value::u64(64));
  EXPECT_THROW(w.write_to_memory(), Error);
  w.set("general.alignment", Value::u32(64));
  EXPECT_EQ(w.alignment(), 64u);
}

TEST(GgufRoundTrip, SetReplacesInPlaceAndRemoveDeletes) {
  GgufWriter w;
  w.set("a", Value::u8(1));
  w.set("b", Value::u8(2));
  w.set("c", Value::u8(3));
  w.set("a", Value::string("first"));
  w.remove("b");
  EXPECT_TRUE(w.has("a"));
  EXPECT_FALSE(w.has("b"));
  auto bytes = w.write_to_memory();
  GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[0].first, "a");
  EXPECT_EQ(f.metadata()[0].second, Value::string("first"));
  EXPECT_EQ(f.metadata()[1].first, "c");
}

TEST(GgufRoundTrip, ReadsVersion2) {
  GgufWriter w;
  w.set("general.architecture", Value::string("llama"));
  w.add_tensor("x", DType::F16, {2}, std::vector<uint8_t>{1, 2, 3, 4});
  auto bytes = w.write_to_memory();
  bytes[4] = 2;  // v2 and v3 share the layout for little-endian files
  GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().at(0).nbytes, 4u);
  EXPECT_EQ(f.tensor_data(f.tensors()[0])[3], 4);
}

TEST(GgufRoundTrip, AcceptsTensorsStoredOutOfInfoOrderWithGaps) {
  // The reader checks bounds, alignment and disjointness, not llama.cpp's exact packing (see
  // gguf_reader.cpp).
  testing::Bytes b;
  b.header(2, 0).info("a", {8}, 0, 64).info("b", {8}, 0, 0).pad_to(32);
  size_t data = b.pos();
  for (int i = 0; i < 96; ++i) b.u8(uint8_t(i));
  GgufFile f = GgufFile::from_memory(b.bytes().data(), b.bytes().size());
  EXPECT_EQ(f.data_offset(), data);
  EXPECT_EQ(f.tensor_data(*f.find_tensor("a"))[0], 64);
  EXPECT_EQ(f.tensor_data(*f.find_tensor("b"))[31], 31);
}

}  // namespace
}  // namespace tandem::gguf
