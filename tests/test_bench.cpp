// `tandem bench` end to end on the CPU device, on a tiny random qwen3 model (tests/test_model_fixture.h):
// every test runs, the JSON report has the device, the commit, the limits and a positive tokens/s with its
// fraction of the limit for pp and for each tg batch; bad arguments give one clear error line and exit code 1.
// Speed itself is not checked (CI machines vary); the GPU figures are recorded in bench/BENCHMARKS.md.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "test_cli_util.h"
#include "test_model_fixture.h"

namespace tandem {
namespace {

using test::run_tandem;
using RunResult = test::CommandResult;

class BenchCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tandem_bench_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    model_ = (dir_ / "tiny.gguf").string();
    testing::TinyConfig c;
    c.wtype = DType::BF16;
    testing::write_tiny_gguf(testing::make_tiny(c), model_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string model_;
};

TEST_F(BenchCommand, JsonReportOnCpu) {
  const RunResult r = run_tandem("bench -m '" + model_ + "' -p 16 -n 4 -b 1,3 -r 2 --device cpu -t 2 --bw 10 -o json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_NE(j["device"].get<std::string>().find("cpu:0"), std::string::npos);
  EXPECT_FALSE(j["commit"].get<std::string>().empty());
  EXPECT_DOUBLE_EQ(j["bandwidth_gbs"].get<double>(), 10.0);
  EXPECT_GT(j["matmul_tflops"].get<double>(), 0.0);
  EXPECT_NE(j["model"]["shape"].get<std::string>().find("2 layers"), std::string::npos);
  const auto& res = j["results"];
  ASSERT_EQ(res.size(), 3u);  // pp16, tg4 x1, tg4 x3
  EXPECT_EQ(res[0]["test"], "pp16");
  EXPECT_EQ(res[1]["test"], "tg4");
  EXPECT_EQ(res[1]["batch"], 1);
  EXPECT_EQ(res[2]["batch"], 3);
  for (const auto& x : res) {
    EXPECT_GT(x["tokens_per_s"].get<double>(), 0.0);
    EXPECT_EQ(x["samples"].size(), 2u);
    EXPECT_GT(x["fraction_of_limit"].get<double>(), 0.0);
  }
}

TEST_F(BenchCommand, MarkdownTableAndMeasuredBandwidth) {
  const RunResult r = run_tandem("bench -m '" + model_ + "' -p 8 -n 2 -b 2 -r 1 --device cpu -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| test | batch | t/s |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| pp8 | 1 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| tg2 | 2 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("copy bandwidth"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("commit: "), std::string::npos) << r.out;
}

TEST_F(BenchCommand, BadArgumentsGiveOneErrorLine) {
  for (const char* args : {"-b 0", "-b 1,x", "-o xml", "--split-mode diagonal", "--device gpu", "-r 0"}) {
    // --device may be given once: the bad-device case replaces the cpu device instead of adding a second one.
    const std::string a(args);
    const std::string device = a.find("--device") == std::string::npos ? "--device cpu " : "";
    const RunResult r = run_tandem("bench -m '" + model_ + "' " + device + "-p 4 -n 2 " + a);
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.out;
    EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << args << ": " << r.out;
  }
  const RunResult missing = run_tandem("bench -m '" + (dir_ / "nope.gguf").string() + "' --device cpu");
  EXPECT_EQ(missing.exit_code, 1) << missing.out;
}

}  // namespace
}  // namespace tandem
