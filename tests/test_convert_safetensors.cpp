// Safetensors reader (convert/safetensors.h) and writer (convert/safetensors_writer.h): round trips, sharded
// checkpoints, and corrupt headers, each of which must be a clear error naming the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "convert/safetensors.h"
#include "convert/safetensors_writer.h"
#include "core/error.h"
#include "core/half.h"

namespace tandem::convert {
namespace {
namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("tandem_st_test_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A file of 8-byte length + header text + data bytes, made by hand so any field can be broken.
std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data,
                              int64_t length_delta = 0) {
  const uint64_t len = uint64_t(int64_t(header.size()) + length_delta);
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes += char(uint8_t(len >> (8 * i)));
  bytes += header;
  bytes.append(data.begin(), data.end());
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

// Expects parsing `bytes` to throw an Error whose message contains every one of `parts`.
void expect_error(const std::vector<uint8_t>& bytes, const std::vector<std::string>& parts) {
  try {
    SafetensorsFile::from_memory(bytes.data(), bytes.size(), "bad.safetensors");
    FAIL() << "no error; expected one mentioning " << parts[0];
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
  }
}

TEST(Safetensors, WriterReaderRoundTripKeepsDtypesShapesBytesAndMetadata) {
  TempDir dir("roundtrip");
  const auto a = random_values(6 * 5, 1), b = random_values(7, 2), c = random_values(4 * 3 * 2, 3);
  SafetensorsWriter w;
  w.add_f32("a.weight", {6, 5}, a);
  w.add_bf16("b.bias", {7}, b);
  w.add_f16("c", {4, 3, 2}, c);
  std::vector<uint8_t> ids(3 * 8);
  for (int i = 0; i < 3; ++i) {
    const int64_t v = 1000 + i;
    std::memcpy(ids.data() + 8 * i, &v, 8);
  }
  w.add("ids", StDType::I64, {3}, ids);
  w.add("empty", StDType::F32, {0, 4}, {});
  w.set_metadata("format", "pt");
  const fs::path p = dir.path() / "x.safetensors";
  w.write(p);

  // The header is padded to 8 bytes, so data starts aligned.
  std::ifstream in(p, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);

  const auto f = SafetensorsFile::open(p);
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.tensors()[0].name, "a.weight");  // file order

  const StTensor* ta = f.find("a.weight");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, StDType::F32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{6, 5}));
  EXPECT_EQ(ta->nbytes, 6u * 5 * 4);
  EXPECT_EQ(ta->shape_string(), "[6, 5]");
  EXPECT_EQ(std::memcmp(ta->data, a.data(), ta->nbytes), 0);

  const StTensor* tb = f.find("b.bias");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, StDType::BF16);
  std::vector<float> got(7);
  st_to_f32(tb->dtype, tb->data, got.data(), 7);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(got[i], bf16_to_fp32(fp32_to_bf16(b[i])));

  const StTensor* tc = f.find("c");
  ASSERT_NE(tc, nullptr);
  EXPECT_EQ(tc->dtype, StDType::F16);
  EXPECT_EQ(tc->nelements(), 24);
  got.resize(24);
  st_to_f32(tc->dtype, tc->data, got.data(), 24);
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(got[i], fp16_to_fp32(fp32_to_fp16(c[i])));

  const StTensor* tid = f.find("ids");
  ASSERT_NE(tid, nullptr);
  EXPECT_EQ(tid->dtype, StDType::I64);
  EXPECT_FALSE(st_dtype_is_float(tid->dtype));
  EXPECT_THROW(st_to_f32(tid->dtype, tid->data, got.data(), 3), Error);
  int64_t v1;
  std::memcpy(&v1, tid->data + 8, 8);
  EXPECT_EQ(v1, 1001);

  const StTensor* te = f.find("empty");
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->nelements(), 0);
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(Safetensors, DtypeNamesAndSizes) {
  EXPECT_EQ(st_dtype_from_name("BF16"), StDType::BF16);
  EXPECT_EQ(st_dtype_from_name("F8_E4M3"), StDType::F8_E4M3);
  EXPECT_EQ(st_dtype_from_name("bf16"), std::nullopt);  // the format's names are upper case
  EXPECT_EQ(st_dtype_size(StDType::F64), 8u);
  EXPECT_EQ(st_dtype_size(StDType::BF16), 2u);
  EXPECT_STREQ(st_dtype_name(StDType::U16), "U16");
}

TEST(Safetensors, F64ValuesConvert) {
  const double d[3] = {1.5, -2.25, 1e-3};
  float out[3];
  st_to_f32(StDType::F64, reinterpret_cast<const uint8_t*>(d), out, 3);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.25f);
  EXPECT_EQ(out[2], float(1e-3));
}

TEST(Safetensors, CorruptHeadersAreClearErrors) {
  const std::vector<uint8_t> data16(16, 0);
  const std::string good = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  // The good file parses (so each case below fails for the reason it names).
  {
    const auto bytes = raw_file(good, data16);
    const auto f = SafetensorsFile::from_memory(bytes.data(), bytes.size(), "good.safetensors");
    EXPECT_EQ(f.tensors().size(), 1u);
  }
  expect_error({1, 2, 3}, {"too short"});
  expect_error(raw_file(good, data16, 1000), {"header length", "exceeds the file size"});
  expect_error(raw_file(good, data16, -5), {"invalid JSON"});
  expect_error(raw_file("[1,2,3]  ", data16), {"does not start with '{'"});
  expect_error(raw_file(R"({"w":{"dtype":"Q4","shape":[2,2],"data_offsets":[0,16]}})", data16),
               {"tensor 'w'", "unknown dtype 'Q4'"});
  expect_error(raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,32]}})", data16),
               {"tensor 'w'", "past the end"});
  expect_error(raw_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", data16),
               {"tensor 'w'", "span 16 bytes", "needs 24"});
  expect_error(raw_file(R"({"w":{"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]}})", data16),
               {"tensor 'w'", "not a non-negative integer"});
  expect_error(raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16,0]}})", data16),
               {"tensor 'w'", "begin is after end"});
  expect_error(raw_file(R"({"w":{"dtype":"F32","shape":[2,2]}})", data16), {"tensor 'w'", "data_offsets"});
  expect_error(raw_file(R"({"w":{"shape":[2,2],"data_offsets":[0,16]}})", data16), {"tensor 'w'", "dtype"});
  expect_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4,4],"data_offsets":[0,16]}})", data16),
      {"tensor 'w'", "more elements than any file can hold"});
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        data16),
               {"overlap"});
  expect_error(raw_file(R"({"__metadata__":{"k":1}})", data16), {"__metadata__"});
}

TEST(Safetensors, CorruptFileOnDiskNamesThePath) {
  TempDir dir("corrupt_disk");
  const fs::path p = dir.path() / "model.safetensors";
  {
    std::ofstream out(p, std::ios::binary);
    const auto bytes = raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", {1, 2, 3}, 0);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  try {
    SafetensorsFile::open(p);
    FAIL() << "truncated data accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SafetensorsFile::open(dir.path() / "missing.safetensors"), Error);
  // An empty file is an error too (and must not be mmapped with length 0).
  { std::ofstream(dir.path() / "empty.safetensors"); }
  EXPECT_THROW(SafetensorsFile::open(dir.path() / "empty.safetensors"), Error);
}

TEST(SafetensorsModel, ShardedIndexSingleFileAndGlob) {
  TempDir dir("sharded");
  const auto a = random_values(8, 4), b = random_values(12, 5);
  SafetensorsWriter s1, s2;
  s1.add_f32("a", {2, 4}, a);
  s2.add_bf16("b", {3, 4}, b);
  s1.write(dir.path() / "model-00001-of-00002.safetensors");
  s2.write(dir.path() / "model-00002-of-00002.safetensors");
  write_safetensors_index(
      dir.path(), {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}});
  {
    const auto m = SafetensorsModel::open_dir(dir.path());
    EXPECT_EQ(m.files().size(), 2u);
    ASSERT_NE(m.find("a"), nullptr);
    ASSERT_NE(m.find("b"), nullptr);
    EXPECT_EQ(m.find("b")->dtype, StDType::BF16);
    EXPECT_EQ(std::memcmp(m.find("a")->data, a.data(), 32), 0);
    ASSERT_EQ(m.tensors().size(), 2u);
    EXPECT_EQ(m.tensors()[0]->name, "a");
  }

  // The index names a tensor its shard lacks.
  write_safetensors_index(dir.path(), {{"a", "model-00001-of-00002.safetensors"},
                                       {"b", "model-00002-of-00002.safetensors"},
                                       {"c", "model-00002-of-00002.safetensors"}});
  try {
    SafetensorsModel::open_dir(dir.path());
    FAIL() << "missing tensor accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'c'"), std::string::npos) << e.what();
  }
  // The index names a tensor in the wrong shard.
  write_safetensors_index(
      dir.path(), {{"a", "model-00002-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}});
  EXPECT_THROW(SafetensorsModel::open_dir(dir.path()), Error);
  // The index names a missing shard.
  write_safetensors_index(
      dir.path(), {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00003-of-00002.safetensors"}});
  try {
    SafetensorsModel::open_dir(dir.path());
    FAIL() << "missing shard accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00003-of-00002.safetensors"), std::string::npos) << e.what();
  }
  // A shard path that escapes the directory.
  write_safetensors_index(dir.path(), {{"a", "../model-00001-of-00002.safetensors"}});
  EXPECT_THROW(SafetensorsModel::open_dir(dir.path()), Error);

  // Without an index every *.safetensors file is read; a tensor in two of them is an error.
  fs::remove(dir.path() / "model.safetensors.index.json");
  EXPECT_EQ(SafetensorsModel::open_dir(dir.path()).files().size(), 2u);
  SafetensorsWriter dup;
  dup.add_f32("a", {2, 4}, a);
  dup.write(dir.path() / "extra.safetensors");
  try {
    SafetensorsModel::open_dir(dir.path());
    FAIL() << "duplicate tensor accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two files"), std::string::npos) << e.what();
  }
  // model.safetensors takes precedence over other files.
  SafetensorsWriter single;
  single.add_f32("z", {1}, {1.0f});
  single.write(dir.path() / "model.safetensors");
  const auto m = SafetensorsModel::open_dir(dir.path());
  EXPECT_EQ(m.files().size(), 1u);
  EXPECT_NE(m.find("z"), nullptr);
}

TEST(SafetensorsModel, EmptyDirectoryIsAnError) {
  TempDir dir("nofiles");
  try {
    SafetensorsModel::open_dir(dir.path());
    FAIL() << "empty directory accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no model.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SafetensorsModel::open_dir(dir.path() / "does_not_exist"), Error);
}

TEST(SafetensorsWriter, RejectsWrongByteCountsAndDuplicates) {
  SafetensorsWriter w;
  EXPECT_THROW(w.add("x", StDType::F32, {2, 2}, std::vector<uint8_t>(15)), Error);
  w.add_f32("x", {1}, {1.0f});
  EXPECT_THROW(w.add_f32("x", {1}, {1.0f}), Error);
  EXPECT_THROW(w.add_f32("__metadata__", {1}, {1.0f}), Error);
}

}  // namespace
}  // namespace tandem::convert
