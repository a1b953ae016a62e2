// The reader's error messages on hand-made corrupt files: each names the problem and the byte offset where it
// was found ("<path>: <problem> at byte <offset>"), through from_memory() and through a real file.
#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "test_gguf_util.h"

namespace tandem::gguf {
namespace {

using testing::Bytes;

// Parses bytes from memory and from a file; both must fail with a message holding `problem` and the offset.
void expect_error(const std::vector<uint8_t>& bytes, const std::string& problem, size_t offset) {
  const std::string at = " at byte " + std::to_string(offset);
  try {
    GgufFile::from_memory(bytes.data(), bytes.size(), "bad.gguf");
    ADD_FAILURE() << "no error, expected: " << problem;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << "expected '" << problem << "' in: " << msg;
    EXPECT_TRUE(msg.size() >= at.size() && msg.compare(msg.size() - at.size(), at.size(), at) == 0)
        << "expected it to end with '" << at << "': " << msg;
  }
  testing::TempPath path("errors.gguf");
  testing::write_bytes(path.str(), bytes);
  try {
    GgufFile::open(path.str());
    ADD_FAILURE() << "no error from open(), expected: " << problem;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path.str() + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << msg;
    EXPECT_NE(msg.find(at), std::string::npos) << msg;
  }
}

TEST(GgufErrors, BadMagic) {
  Bytes b;
  b.header(0, 0);
  auto bytes = b.bytes();
  bytes[0] = 'X';
  expect_error(bytes, "not a GGUF file: the magic is 'XGUF'", 0);
}

TEST(GgufErrors, EmptyAndTinyFiles) {
  expect_error({}, "too small to be a GGUF file (0 bytes)", 0);
  expect_error({'G', 'G'}, "too small to be a GGUF file (2 bytes)", 0);
}

TEST(GgufErrors, Versions) {
  expect_error(Bytes().header(0, 0, 1).bytes(), "GGUF version 1 is obsolete", 4);
  expect_error(Bytes().header(0, 0, 0).bytes(), "invalid GGUF version 0", 4);
  expect_error(Bytes().header(0, 0, 4).bytes(), "GGUF version 4 is newer", 4);
  expect_error(Bytes().header(0, 0, 0x03000000).bytes(), "looks byte-swapped", 4);
}

TEST(GgufErrors, TruncatedHeader) {
  const auto full = Bytes().header(0, 0).bytes();
  auto cut = [&](size_t n) { return std::vector<uint8_t>(full.begin(), full.begin() + long(n)); };
  expect_error(cut(6), "file ends inside the version (4 bytes needed, 2 left)", 4);
  expect_error(cut(12), "file ends inside the tensor count (8 bytes needed, 4 left)", 8);
  expect_error(cut(20), "file ends inside the metadata count", 16);
  // Truncated inside the metadata: the value is cut.
  Bytes b;
  b.header(0, 1).str("k").i32(10);
  size_t at = b.pos();
  expect_error(b.u32(7).bytes(), "file ends inside a uint64 value (8 bytes needed, 4 left)", at);
}

TEST(GgufErrors, NegativeAndHugeCounts) {
  expect_error(Bytes().header(-1, 0).bytes(), "tensor count -1 is negative", 8);
  expect_error(Bytes().header(0, -5).bytes(), "metadata count -5 is negative", 16);
  expect_error(Bytes().header(0, int64_t(1) << 62).bytes(), "metadata count 4611686018427387904 cannot fit",
               16);
  expect_error(Bytes().header(1000, 0).zeros(100).bytes(),
               "tensor count 1000 cannot fit in the remaining 100", 8);
}

TEST(GgufErrors, StringLengthPastEnd) {
  Bytes b;
  b.header(0, 1);
  size_t at = b.pos();
  b.u64(1000).zeros(10);  // a key that claims 1000 bytes, 10 present
  expect_error(b.bytes(), "metadata key length 1000 runs past the end of the file (10 bytes left)", at);

  Bytes v;
  v.header(0, 1).str("k").i32(8);
  at = v.pos();
  v.u64(uint64_t(-1));
  expect_error(v.bytes(), "a string value length 18446744073709551615 runs past the end", at);
}

TEST(GgufErrors, EmptyAndDuplicateKeys) {
  Bytes e;
  e.header(0, 1);
  expect_error(e.str("").i32(0).u8(1).bytes(), "metadata key #0 is empty", 24);

  Bytes b;
  b.header(0, 2).kv_u32("general.key", 1);
  size_t at = b.pos();
  b.kv_u32("general.key", 2);
  expect_error(b.bytes(), "duplicate metadata key 'general.key'", at);
}

TEST(GgufErrors, BadValueTypes) {
  Bytes b;
  b.header(0, 1).str("k");
  size_t at = b.pos();
  expect_error(b.i32(13).u8(0).bytes(), "metadata key 'k' has invalid value type 13", at);

  Bytes a;
  a.header(0, 1).str("k").i32(9);
  at = a.pos();
  expect_error(a.i32(-1).u64(0).bytes(), "array has invalid element type -1", at);

  Bytes bo;
  bo.header(0, 1).str("k").i32(7);
  at = bo.pos();
  expect_error(bo.u8(2).bytes(), "bool value 2 is neither 0 nor 1", at);
}

TEST(GgufErrors, ArrayCountsAndNesting) {
  Bytes b;
  b.header(0, 1).str("k").i32(9).i32(5);
  size_t at = b.pos();
  expect_error(b.u64(uint64_t(1) << 60).zeros(16).bytes(),
               "array of 1152921504606846976 int32 values cannot fit", at);

  // Arrays of arrays are read; nesting deeper than the limit is refused at the level that crosses it.
  Bytes n;
  n.header(0, 1).str("k").i32(9);
  size_t deep_at = 0;
  for (int level = 0; level <= kMaxArrayDepth; ++level) {
    if (level == kMaxArrayDepth) deep_at = n.pos();
    n.i32(9).u64(1);
  }
  n.i32(0).u64(0);
  expect_error(n.bytes(), "arrays nested deeper than 16 levels", deep_at);
}

TEST(GgufErrors, BadAlignment) {
  Bytes b;
  b.header(0, 1).str("general.alignment").i32(4);
  size_t at = b.pos();
  expect_error(b.u32(3).bytes(), "general.alignment is 3, it must be a non-zero power of two", at);
  Bytes z;
  z.header(0, 1).str("general.alignment").i32(4);
  expect_error(z.u32(0).bytes(), "general.alignment is 0", at);
  Bytes t;
  t.header(0, 1).str("general.alignment").i32(10);
  expect_error(t.u64(32).bytes(), "general.alignment has type uint64, it must be uint32", at);
}

TEST(GgufErrors, TensorNames) {
  Bytes e;
  e.header(1, 0);
  expect_error(e.info("", {4}, 0, 0).pad_to(32).zeros(16).bytes(), "tensor #0 has an empty name", 24);
  Bytes l;
  l.header(1, 0);
  expect_error(l.info(std::string(64, 'a'), {4}, 0, 0).pad_to(32).zeros(16).bytes(),
               "is 64 bytes long, the limit is 63", 24);
  Bytes d;
  d.header(2, 0).info("w", {4}, 0, 0);
  size_t at = d.pos();
  expect_error(d.info("w", {4}, 0, 32).pad_to(32).zeros(64).bytes(), "duplicate tensor name 'w'", at);
}

TEST(GgufErrors, TensorDims) {
  Bytes n;
  n.header(1, 0).str("w");
  size_t at = n.pos();
  expect_error(n.u32(5).zeros(64).bytes(), "tensor 'w' has 5 dimensions; a tensor has 0 (a scalar) to 4", at);
  // n_dims = 0 followed by dimensions: the dimension bytes read as the type; the message says why
  Bytes zero;
  zero.header(1, 0).str("w");
  at = zero.pos();
  expect_error(zero.u32(0).i64(512).i32(0).u64(0).zeros(64).bytes(),
               "tensor 'w' has invalid type id 512 after a dimension count of 0 (a scalar)", at + 4);

  Bytes neg;
  neg.header(1, 0).str("w").u32(2).i64(4);
  at = neg.pos();
  expect_error(neg.i64(-2).i32(0).u64(0).zeros(64).bytes(), "tensor 'w' has a negative dimension ne[1] = -2",
               at);

  Bytes o;
  o.header(1, 0).str("w").u32(3).i64(int64_t(1) << 40);
  size_t second = o.pos();
  o.i64(int64_t(1) << 40).i64(0).i32(0).u64(0).zeros(64);
  expect_error(o.bytes(), "tensor 'w' has dimensions whose element count overflows int64", second);

  // Fits in int64 elements but not in bytes: 2^61 f32 elements.
  Bytes ob;
  ob.header(1, 0).str("w");
  size_t dims_at = ob.pos() + 4;
  ob.u32(1).i64(int64_t(1) << 62).i32(0).u64(0).zeros(64);
  expect_error(ob.bytes(), "tensor 'w' is too large: its byte size overflows 64 bits", dims_at);

  Bytes blk;
  blk.header(1, 0).str("w");
  dims_at = blk.pos() + 4;
  blk.u32(2).i64(100).i64(2).i32(12).u64(0).zeros(512);
  expect_error(blk.bytes(), "tensor 'w' has ne[0] = 100, not a multiple of q4_k's block size 256", dims_at);
}

TEST(GgufErrors, TensorTypes) {
  Bytes u;
  u.header(1, 0).str("blk.0.attn_q.weight").u32(1).i64(256);
  size_t at = u.pos();
  expect_error(u.i32(10).u64(0).zeros(128).bytes(),
               "tensor 'blk.0.attn_q.weight' has type q2_k (id 10) which tandem does not support", at);
  Bytes i;
  i.header(1, 0).str("w").u32(1).i64(4);
  at = i.pos();
  expect_error(i.i32(99).u64(0).zeros(64).bytes(), "tensor 'w' has invalid type id 99", at);
  Bytes r;
  r.header(1, 0).str("w").u32(1).i64(32);
  expect_error(r.i32(4).u64(0).zeros(64).bytes(), "tensor 'w' has invalid type id 4", at);  // retired id
}

TEST(GgufErrors, TensorOffsets) {
  Bytes oob;
  oob.header(1, 0).str("w").u32(1).i64(16).i32(0);
  size_t at = oob.pos();
  oob.u64(0).pad_to(32).zeros(32);  // 64 bytes needed, 32 present
  expect_error(oob.bytes(), "tensor 'w' data (64 bytes at data offset 0) runs past the end of the file", at);

  Bytes far;
  far.header(1, 0).str("w").u32(1).i64(1).i32(0);
  at = far.pos();
  far.u64(uint64_t(-32)).pad_to(32).zeros(32);
  expect_error(far.bytes(), "runs past the end of the file", at);

  Bytes mis;
  mis.header(1, 0).str("w").u32(1).i64(1).i32(0);
  at = mis.pos();
  mis.u64(4).pad_to(32).zeros(64);
  expect_error(mis.bytes(), "tensor 'w' has data offset 4, not a multiple of the alignment 32", at);

  Bytes ov;
  ov.header(2, 0).info("a", {16}, 0, 0).str("b").u32(1).i64(8).i32(0);
  at = ov.pos();
  ov.u64(32).pad_to(32).zeros(128);
  expect_error(ov.bytes(), "tensor 'b' data at data offset 32 overlaps tensor 'a'", at);

  Bytes trunc;
  trunc.header(1, 0).info("w", {1}, 0, 0);
  size_t end = trunc.pos();  // no padding, no data
  expect_error(trunc.bytes(), "the data section would start at byte 64, past the end of the file", end);
}

TEST(GgufErrors, OpenReportsMissingFiles) {
  try {
    GgufFile::open("/nonexistent/tandem.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tandem.gguf: cannot open"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(GgufFile::open("/tmp"), Error);  // a directory
}

}  // namespace
}  // namespace tandem::gguf
