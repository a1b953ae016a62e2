// `tandem inspect` end to end: runs the binary (TANDEM_BIN) on files written by GgufWriter.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "test_cli_util.h"
#include "test_gguf_util.h"

namespace tandem::gguf {
namespace {

using test::run_tandem;
using RunResult = test::CommandResult;

void write_model(const std::string& path) {
  GgufWriter w;
  w.set("general.architecture", Value::string("llama"));
  w.set("general.name", Value::string("inspect test"));
  w.set("llama.context_length", Value::u32(4096));
  w.set("llama.rope.freq_base", Value::f32(500000.f));
  std::vector<std::string> tokens;
  for (int i = 0; i < 100; ++i) tokens.push_back("tok" + std::to_string(i));
  w.set("tokenizer.ggml.tokens", Value::string_array(tokens));
  w.set("nested", Value::array(ValueType::ARRAY, {Value::i32_array({1, 2}), Value::i32_array({3})}));
  w.add_tensor("token_embd.weight", DType::Q8_0, {64, 100}, std::vector<uint8_t>(34 * 2 * 100, 1));
  w.add_tensor("output_norm.weight", DType::F32, {64}, std::vector<uint8_t>(256, 2));
  w.add_tensor("blk.0.attn_q.weight", DType::Q4_K, {256, 64}, std::vector<uint8_t>(144 * 64, 3));
  w.write(path);
}

TEST(GgufInspect, PrintsHeaderMetadataTensorsAndTotals) {
  testing::TempPath path("inspect.gguf");
  write_model(path.str());
  RunResult r = run_tandem("inspect " + path.str());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* expected : {"gguf version:  3",
                               "architecture:  llama",
                               "alignment:     32",
                               "metadata: 6 keys",
                               "llama.context_length",
                               "uint32",
                               "4096",
                               "500000",
                               "tokenizer.ggml.tokens",
                               "array<string>[100]",
                               "\"tok0\", \"tok1\"",
                               "... (100 items)]",
                               "array<array>[2]",
                               "[[1, 2], [3]]",
                               "tensors: 3",
                               "token_embd.weight",
                               "q8_0",
                               "[64, 100]",
                               "6800",
                               "blk.0.attn_q.weight",
                               "q4_k",
                               "[256, 64]",
                               "9216",
                               "parameters:  22848 (22.85 K)",
                               "bytes:       16272 (15.89 KiB)",
                               "f32          1 tensors, 64 parameters, 256 bytes (256 B)"}) {
    EXPECT_NE(r.out.find(expected), std::string::npos) << "missing '" << expected << "' in:\n" << r.out;
  }
}

TEST(GgufInspect, JsonDocument) {
  testing::TempPath path("inspect_json.gguf");
  write_model(path.str());
  RunResult r = run_tandem("inspect --json --items 3 " + path.str(), test::Stderr::Discard);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["alignment"], 32);
  ASSERT_EQ(j["metadata"].size(), 6u);
  EXPECT_EQ(j["metadata"][2]["key"], "llama.context_length");
  EXPECT_EQ(j["metadata"][2]["type"], "uint32");
  EXPECT_EQ(j["metadata"][2]["value"], 4096);
  const auto& tokens = j["metadata"][4];
  EXPECT_EQ(tokens["type"], "array");
  EXPECT_EQ(tokens["value"]["element_type"], "string");
  EXPECT_EQ(tokens["value"]["count"], 100);
  EXPECT_EQ(tokens["value"]["items"], nlohmann::json({"tok0", "tok1", "tok2"}));
  EXPECT_EQ(tokens["value"]["truncated"], true);
  ASSERT_EQ(j["tensors"].size(), 3u);
  EXPECT_EQ(j["tensors"][2]["name"], "blk.0.attn_q.weight");
  EXPECT_EQ(j["tensors"][2]["type"], "q4_k");
  EXPECT_EQ(j["tensors"][2]["shape"], nlohmann::json({256, 64}));
  EXPECT_EQ(j["tensors"][2]["bytes"], 9216);
  EXPECT_EQ(j["tensors"][1]["offset"], 6816);  // 6800 rounded up to 32
  EXPECT_EQ(j["totals"]["tensors"], 3);
  EXPECT_EQ(j["totals"]["parameters"], 64 * 100 + 64 + 256 * 64);
  EXPECT_EQ(j["totals"]["by_type"]["q8_0"]["bytes"], 6800);
}

TEST(GgufInspect, TruncatedFileGivesOneErrorLineAndExitCode1) {
  testing::TempPath path("inspect_bad.gguf");
  write_model(path.str());
  auto bytes = testing::read_bytes(path.str());
  bytes.resize(100);  // inside the metadata
  testing::write_bytes(path.str(), bytes);
  RunResult r = run_tandem("inspect " + path.str());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out.rfind("error: " + path.str() + ": ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" at byte "), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;

  RunResult missing = run_tandem("inspect /nonexistent/x.gguf");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.out.find("cannot open"), std::string::npos) << missing.out;
}

}  // namespace
}  // namespace tandem::gguf
