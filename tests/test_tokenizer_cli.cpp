// `tandem tokenize` end to end, on the vocab-only fixture GGUFs in tests/data/tokenizer.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "gguf/gguf.h"
#include "test_cli_util.h"
#include "test_tokenizer_util.h"

namespace tandem::tokenizer_test {
namespace {

// `tandem <args>` with stdout and stderr together.
test::CommandResult run(const std::string& args) { return test::run_tandem(args); }

std::string fixture(const char* name) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/data/tokenizer/" + name + ".gguf";
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ids[i]);
  }
  s += "]\n";
  return s;
}

TEST(TokenizeCommand, PrintsIdsOfAVocabOnlyFile) {
  const auto tok = load_tokenizer(fixture("llama3-1k"));
  const test::CommandResult r =
      run("tokenize -m " + fixture("llama3-1k") + " -p 'Hello, world! 12345' --ids");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, ids_text(tok.encode("Hello, world! 12345", true)));
}

TEST(TokenizeCommand, PiecesBosAndSpecialTokens) {
  const auto tok = load_tokenizer(fixture("spm-1k"));
  ASSERT_TRUE(tok.add_bos());
  test::CommandResult r = run("tokenize -m " + fixture("spm-1k") + " -p 'hi <|im_start|>' --parse-special");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(std::to_string(tok.bos()) + " -> '<s>'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-> '<|im_start|>'"), std::string::npos) << r.out;
  // Without --parse-special the markup is plain text; --no-bos drops BOS.
  r = run("tokenize -m " + fixture("spm-1k") + " -p 'hi <|im_start|>' --ids --no-bos");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, ids_text(tok.encode("hi <|im_start|>", false, false)));
  EXPECT_EQ(r.out.find(std::to_string(tok.find_token("<|im_start|>")) + ","), std::string::npos);
}

TEST(TokenizeCommand, FileAndLines) {
  TempDir dir;
  write_file(dir.path() / "in.txt", "first line\n\nthird 日本\n");
  const auto tok = load_tokenizer(fixture("gpt2-1k"));
  test::CommandResult r =
      run("tokenize -m " + fixture("gpt2-1k") + " -f " + (dir.path() / "in.txt").string() + " --ids");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, ids_text(tok.encode("first line\n\nthird 日本\n", true)));
  r = run("tokenize -m " + fixture("gpt2-1k") + " -f " + (dir.path() / "in.txt").string() +
          " --lines --roundtrip");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::string expected;
  for (const char* line : {"first line", "", "third 日本"}) {
    const auto ids = tok.encode(line, true);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) expected += ' ';
      expected += std::to_string(ids[i]);
    }
    expected += "\t1\n";
  }
  EXPECT_EQ(r.out, expected);
}

TEST(TokenizeCommand, ClearErrors) {
  test::CommandResult r = run("tokenize -m " + fixture("gpt2-1k"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("exactly one of -p TEXT or -f FILE"), std::string::npos) << r.out;
  TempDir dir;
  gguf::GgufWriter w;
  w.set("general.architecture", gguf::Value::string("llama"));
  w.write((dir.path() / "none.gguf").string());
  r = run("tokenize -m " + (dir.path() / "none.gguf").string() + " -p hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("error: "), std::string::npos);
  EXPECT_NE(r.out.find("tokenizer.ggml.model is missing"), std::string::npos) << r.out;
  r = run("tokenize -m " + (dir.path() / "missing.gguf").string() + " -p hi");
  EXPECT_EQ(r.exit_code, 1);
}

}  // namespace
}  // namespace tandem::tokenizer_test
