// The split flags of the commands that run a model (generate, perplexity, bench;
// tools/tandem/split_options.h) end to end on bad input: an unknown device, malformed ratios, a wrong ratio
// count, a missing device, an unknown split mode. Each must exit non-zero with one "error: ..." line that
// names the flag and the value, and must fail before the model is read (a path that does not exist shows it:
// the error is about the flag, not the file). That the splits give the single-device logits is tested with
// the model code (tests/test_split.cpp); here the commands run them end to end on the shipped model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "test_cli_util.h"

namespace tandem {
namespace {

using test::run_tandem;

const std::string kModel = std::string(TANDEM_SOURCE_DIR) + "/tests/data/models/qwen3_tiny.gguf";

struct BadCase {
  std::string flags;
  std::vector<std::string> mentions;  // pieces of the error line
};

std::vector<BadCase> bad_cases() {
  std::vector<BadCase> cases = {
      {"--devices cpu:0,tpu:1 --split-mode tensor", {"--devices", "tpu:1"}},
      {"--devices cpu:0,cpu:1 --split-mode tensor --tensor-split 1,x",
       {"--tensor-split", "'x'", "not a number"}},
      {"--devices cpu:0,cpu:1 --split-mode layer --tensor-split 1,1,1",
       {"--tensor-split", "3 ratios for 2 devices"}},
      {"--devices cpu:0,cpu:1 --split-mode diagonal",
       {"--split-mode", "'diagonal'", "none, layer, row or tensor"}},
      {"--devices cpu:0,cpu:1 --split-mode row --main-device 2", {"--main-device", "out of range"}},
      {"--devices cpu:0,,cpu:1 --split-mode tensor", {"--devices", "empty"}},
  };
  if (device_count(DeviceKind::CUDA) < 2)  // a GPU that is not there: never a crash, a clear error
    cases.push_back({"--devices cuda:0,cuda:1 --split-mode tensor", {"--devices", "does not exist"}});
  return cases;
}

// The last non-empty line of the output (the commands may print progress before failing).
std::string last_line(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const size_t nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

void expect_one_error_line(const std::string& cmd, const BadCase& c) {
  const test::CommandResult r = run_tandem(cmd);
  EXPECT_NE(r.exit_code, 0) << cmd << "\n" << r.out;
  EXPECT_NE(r.exit_code, -1) << "did not exit normally (crash?): " << cmd << "\n" << r.out;
  // Exactly one line, and it is the error.
  EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << cmd << "\n" << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "more than one line: " << cmd << "\n" << r.out;
  const std::string line = last_line(r.out);
  for (const std::string& m : c.mentions)
    EXPECT_NE(line.find(m), std::string::npos) << "'" << m << "' not in: " << line;
}

TEST(SplitCli, GenerateRejectsBadSplitFlags) {
  for (const BadCase& c : bad_cases())
    expect_one_error_line("generate -m '" + kModel + "' --prompt-ids 1,2,3 -n 2 --ids " + c.flags, c);
}

TEST(SplitCli, PerplexityRejectsBadSplitFlags) {
  // The text file does not exist either: the split flags are checked first.
  for (const BadCase& c : bad_cases())
    expect_one_error_line("perplexity -m '" + kModel + "' -f /nonexistent/text.txt --no-progress " + c.flags,
                          c);
}

TEST(SplitCli, BenchRejectsBadSplitFlags) {
  for (const BadCase& c : bad_cases())
    expect_one_error_line("bench -m '" + kModel + "' -p 4 -n 2 -b 1 -r 1 --bw 10 --tflops 1 " + c.flags, c);
  // --device and --devices together are ambiguous about the device the limits are measured on.
  expect_one_error_line("bench -m '" + kModel + "' --bw 10 --tflops 1 --device cpu --devices cpu:0,cpu:1",
                        {"", {"--device", "--devices"}});
}

TEST(SplitCli, FlagsAreCheckedBeforeTheModelIsRead) {
  const BadCase c{"--devices cpu:0,cpu:1 --split-mode tensor --tensor-split 1,x", {"--tensor-split"}};
  expect_one_error_line("generate -m /nonexistent/model.gguf --prompt-ids 1,2 -n 1 --ids " + c.flags, c);
  expect_one_error_line("bench -m /nonexistent/model.gguf --bw 10 --tflops 1 " + c.flags, c);
}

// The bench report names the split mode and the devices (here mode none, which needs no split to run): the
// main device of --devices is the one the model runs on and the limits are measured on.
TEST(SplitCli, BenchReportsSplitModeAndDevices) {
  const std::string run = "bench -m '" + kModel + "' -p 4 -n 2 -b 1 -r 1 --bw 10 --tflops 1 -t 1 ";
  const test::CommandResult md = run_tandem(run + "--device cpu");  // bench picks cuda:0 where there is one
  ASSERT_EQ(md.exit_code, 0) << md.out;
  EXPECT_NE(md.out.find("\nsplit: none on cpu:0\n"), std::string::npos) << md.out;

  const test::CommandResult js = run_tandem(
      run + "-o json --devices cpu:0,cpu:1 --split-mode none --main-device 1", test::Stderr::Discard);
  ASSERT_EQ(js.exit_code, 0) << js.out;
  const auto j = nlohmann::json::parse(js.out.substr(js.out.find('{')));
  EXPECT_EQ(j["split_mode"], "none");
  EXPECT_EQ(j["split"], "none on cpu:1");
  ASSERT_EQ(j["devices"].size(), 1u) << js.out;
  EXPECT_EQ(j["devices"][0].get<std::string>().rfind("cpu:1", 0), 0u) << js.out;
  EXPECT_EQ(j["device"].get<std::string>().rfind("cpu:1", 0), 0u) << js.out;
}

// generate on the shipped model (8 layers, 4 KV heads) continues a text prompt with the same greedy text in
// every split mode over 2 and 4 CPU ranks.
TEST(SplitCli, GenerateGivesTheSameTextInEverySplitMode) {
  const std::string shipped = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  const std::string gen =
      "generate -m '" + shipped + "' -p 'The capital of France is' -n 12 --temp 0 --ignore-eos -t 2 ";
  const test::CommandResult single = run_tandem(gen, test::Stderr::Discard);
  ASSERT_EQ(single.exit_code, 0) << single.out;
  ASSERT_GT(single.out.size(), 10u) << single.out;
  for (const char* devices : {"cpu:0,cpu:1", "cpu:0,cpu:1,cpu:2,cpu:3"})
    for (const char* mode : {"layer", "row", "tensor"}) {
      const std::string flags = std::string("--devices ") + devices + " --split-mode " + mode;
      const test::CommandResult r = run_tandem(gen + flags, test::Stderr::Discard);
      EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.out;
      EXPECT_EQ(r.out, single.out) << flags;
    }
}

// A split bench names the mode, the ratios and every device, in the table header and in JSON.
TEST(SplitCli, BenchReportsATensorSplit) {
  const std::string run = "bench -m '" + kModel + "' -p 4 -n 2 -b 1 -r 1 --bw 10 --tflops 1 -t 1 " +
                          "--devices cpu:0,cpu:1 --split-mode tensor --tensor-split 3,1 ";
  const test::CommandResult md = run_tandem(run);
  ASSERT_EQ(md.exit_code, 0) << md.out;
  EXPECT_NE(md.out.find("\nsplit: tensor over cpu:0,cpu:1 (ratios 0.75,0.25)\n"), std::string::npos)
      << md.out;
  EXPECT_NE(md.out.find("\ndevices: cpu:0 "), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("; cpu:1 "), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| tg2 | 1 |"), std::string::npos) << md.out;

  const test::CommandResult js = run_tandem(run + "-o json", test::Stderr::Discard);
  ASSERT_EQ(js.exit_code, 0) << js.out;
  const auto j = nlohmann::json::parse(js.out.substr(js.out.find('{')));
  EXPECT_EQ(j["split_mode"], "tensor");
  ASSERT_EQ(j["devices"].size(), 2u) << js.out;
  EXPECT_EQ(j["devices"][1].get<std::string>().rfind("cpu:1", 0), 0u) << js.out;
}

TEST(SplitCli, HelpListsTheSplitFlags) {
  for (const char* cmd : {"generate", "perplexity", "bench"}) {
    const test::CommandResult r = run_tandem(std::string(cmd) + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.out;
    for (const char* flag :
         {"--devices", "--split-mode", "--tensor-split", "--main-device", "--replicate-kv"})
      EXPECT_NE(r.out.find(flag), std::string::npos) << cmd << " --help lacks " << flag << "\n" << r.out;
  }
}

}  // namespace
}  // namespace tandem
