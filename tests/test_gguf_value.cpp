// gguf::Value: typed getters with width conversion and range checks, printing, comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gguf/gguf.h"

namespace tandem::gguf {
namespace {

TEST(GgufValue, IntegerGettersAcceptEveryWidth) {
  EXPECT_EQ(Value::u8(200).as_int(), 200);
  EXPECT_EQ(Value::i8(-100).as_int(), -100);
  EXPECT_EQ(Value::u16(65535).as_int(), 65535);
  EXPECT_EQ(Value::i16(-32768).as_int(), -32768);
  EXPECT_EQ(Value::u32(4000000000u).as_int(), 4000000000ll);
  EXPECT_EQ(Value::i32(-7).as_int(), -7);
  EXPECT_EQ(Value::i64(std::numeric_limits<int64_t>::min()).as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(Value::u64(uint64_t(std::numeric_limits<int64_t>::max())).as_int(),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Value::u64(std::numeric_limits<uint64_t>::max()).as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(Value::i32(5).as_uint(), 5u);
  EXPECT_TRUE(Value::u16(1).is_integer());
  EXPECT_FALSE(Value::f32(1).is_integer());
}

TEST(GgufValue, IntegerGettersCheckRange) {
  EXPECT_THROW(Value::u64(uint64_t(1) << 63).as_int(), Error);
  EXPECT_THROW(Value::i8(-1).as_uint(), Error);
  EXPECT_THROW(Value::i64(-5).as_uint(), Error);
}

TEST(GgufValue, GettersRejectOtherTypes) {
  EXPECT_THROW(Value::string("12").as_int(), Error);
  EXPECT_THROW(Value::f32(1.5f).as_int(), Error);
  EXPECT_THROW(Value::boolean(true).as_int(), Error);
  EXPECT_THROW(Value::u8(1).as_bool(), Error);
  EXPECT_THROW(Value::u8(1).as_string(), Error);
  EXPECT_THROW(Value::string("x").as_float(), Error);
  EXPECT_THROW(Value::string("x").as_array(), Error);
  EXPECT_THROW(Value::i32_array({1}).as_string_array(), Error);
  EXPECT_THROW(Value::string_array({"a"}).as_int_array(), Error);
  EXPECT_THROW(Value::string_array({"a"}).as_float_array(), Error);
  try {
    (void)Value::string("x").as_int();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("string"), std::string::npos) << e.what();
  }
}

TEST(GgufValue, FloatGetterAcceptsIntegers) {
  EXPECT_EQ(Value::f32(0.25f).as_float(), 0.25);
  EXPECT_EQ(Value::f64(1e300).as_float(), 1e300);
  EXPECT_EQ(Value::i32(-3).as_float(), -3.0);
  EXPECT_EQ(Value::u64(7).as_float(), 7.0);
}

TEST(GgufValue, ArrayGetters) {
  EXPECT_EQ(Value::string_array({"a", "", "c"}).as_string_array(), (std::vector<std::string>{"a", "", "c"}));
  EXPECT_EQ(Value::i32_array({1, -2, 3}).as_int_array(), (std::vector<int64_t>{1, -2, 3}));
  auto u8s = Value::array(ValueType::UINT8, {Value::u8(1), Value::u8(255)});
  EXPECT_EQ(u8s.as_int_array(), (std::vector<int64_t>{1, 255}));
  EXPECT_EQ(u8s.as_float_array(), (std::vector<float>{1.f, 255.f}));
  EXPECT_EQ(Value::f32_array({0.5f, -1.f}).as_float_array(), (std::vector<float>{0.5f, -1.f}));
  EXPECT_EQ(Value::f32_array({}).as_array().size(), 0u);
  EXPECT_EQ(u8s.element_type(), ValueType::UINT8);
  EXPECT_EQ(u8s.type_name(), "array<uint8>");
}

TEST(GgufValue, ArrayElementsMustMatchTheElementType) {
  EXPECT_THROW(Value::array(ValueType::INT32, {Value::i32(1), Value::u32(2)}), Error);
  EXPECT_THROW(Value::array(ValueType(99), {}), Error);
  // Nested arrays: each inner array has its own element type.
  auto nested = Value::array(ValueType::ARRAY, {Value::i32_array({1}), Value::string_array({"x"})});
  EXPECT_EQ(nested.as_array()[1].as_string_array()[0], "x");
  EXPECT_EQ(nested.type_name(), "array<array>");
}

TEST(GgufValue, ToStringAbbreviatesArrays) {
  EXPECT_EQ(Value::u32(42).to_string(), "42");
  EXPECT_EQ(Value::i8(-3).to_string(), "-3");
  EXPECT_EQ(Value::f32(0.1f).to_string(), "0.1");
  EXPECT_EQ(Value::f64(1e-300).to_string(), "1e-300");
  EXPECT_EQ(Value::f32(500000.f).to_string(), "500000");
  EXPECT_EQ(Value::f32(1e-5f).to_string(), "1e-05");
  EXPECT_EQ(Value::f64(-0.0).to_string(), "-0");
  EXPECT_EQ(Value::boolean(true).to_string(), "true");
  EXPECT_EQ(Value::string("a\"b\n").to_string(), "\"a\\\"b\\n\"");
  std::vector<int32_t> many(100);
  for (int i = 0; i < 100; ++i) many[size_t(i)] = i;
  EXPECT_EQ(Value::i32_array(many).to_string(3), "[0, 1, 2, ... (100 items)]");
  EXPECT_EQ(Value::i32_array({1, 2}).to_string(3), "[1, 2]");
  EXPECT_EQ(Value::string_array({"a", "b"}).to_string(), "[\"a\", \"b\"]");
  EXPECT_EQ(Value::f32_array({}).to_string(), "[]");
  std::string long_string(1000, 'x');
  std::string shown = Value::string(long_string).to_string();
  EXPECT_LT(shown.size(), 200u);
  EXPECT_NE(shown.find("1000 bytes"), std::string::npos);
  auto nested = Value::array(ValueType::ARRAY, {Value::i32_array({1, 2, 3, 4, 5}), Value::i32_array({6})});
  EXPECT_EQ(nested.to_string(4), "[[1, 2, ... (5 items)], [6]]");
}

TEST(GgufValue, Equality) {
  EXPECT_EQ(Value::u32(1), Value::u32(1));
  EXPECT_NE(Value::u32(1), Value::u64(1));  // the type is part of the value
  EXPECT_NE(Value::u32(1), Value::u32(2));
  EXPECT_EQ(Value::f32(NAN), Value::f32(NAN));
  EXPECT_NE(Value::f32(0.f), Value::f32(-0.f));
  EXPECT_EQ(Value::string_array({"a"}), Value::string_array({"a"}));
  EXPECT_NE(Value::array(ValueType::INT32, {}), Value::array(ValueType::UINT32, {}));
  EXPECT_NE(Value::i32_array({1, 2}), Value::i32_array({1, 3}));
}

}  // namespace
}  // namespace tandem::gguf
