// `tandem generate --draft`: greedy ids equal plain generate's (several prompts at once), the acceptance
// statistics line is printed, and every bad speculative flag is a clear error with a non-zero exit.
#include <gtest/gtest.h>

#include <string>

#include "test_cli_util.h"

namespace tandem {
namespace {

using test::run_tandem;
using test::Stderr;

const std::string kModels = std::string(TANDEM_SOURCE_DIR) + "/models/";
const std::string kTarget = "-m '" + kModels + "tandem-small-q8_0.gguf' -t 2 ";
const std::string kDraft = "--draft '" + kModels + "tandem-draft-q8_0.gguf' ";

TEST(SpecCli, GreedyIdsEqualPlainGenerate) {
  const std::string common = kTarget + "--prompt-ids '0,417,1210,4145;0,893' -n 30 --temp 0 --ids ";
  const auto plain = run_tandem("generate " + common, Stderr::Discard);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  for (const char* n : {"1", "5"}) {
    const auto spec = run_tandem("generate " + common + kDraft + "--draft-max " + n, Stderr::Discard);
    ASSERT_EQ(spec.exit_code, 0) << spec.out;
    EXPECT_EQ(spec.out, plain.out) << "--draft-max " << n;
  }
  const auto stats = run_tandem("generate " + common + kDraft + "--spec draft --draft-max 4");
  EXPECT_NE(stats.out.find("mean accepted length"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("per position:"), std::string::npos) << stats.out;
}

TEST(SpecCli, BadFlagsAreClearErrors) {
  const std::string base = "generate " + kTarget + "-p hi -n 4 ";
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {kDraft + "--draft-max -2", "--draft-max must be >= 0"},
      {kDraft + "--draft-min 5 --draft-max 4", "--draft-min (5) must not exceed --draft-max (4)"},
      {kDraft + "--draft-p-min 1.5", "--draft-p-min must be in [0, 1]"},
      {kDraft + "--spec foo", "--spec must be draft or dflash"},
      {kDraft + "--spec dflash", "is a qwen3 model"},
      {"--spec draft", "--spec needs --draft FILE"},
      {"--draft /nonexistent.gguf", "/nonexistent.gguf"},
      {kDraft + "--stop x", "--draft does not combine with --stop"},
  };
  for (const Case& c : cases) {
    const auto r = run_tandem(base + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
  }
}

TEST(SpecCli, BenchReportsSpeedupAndAcceptance) {
  const auto r = run_tandem("bench " + kTarget + kDraft + "--draft-max 3 -p 0 -n 16 -b 1 -r 1 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("speedup over AR:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mean accepted length"), std::string::npos) << r.out;
  const auto json = run_tandem("bench " + kTarget + kDraft + "-p 0 -n 4 -b 1 -r 1 -o json --device cpu");
  EXPECT_NE(json.exit_code, 0);
  EXPECT_NE(json.out.find("--draft reports in markdown only"), std::string::npos) << json.out;
  const auto no_model = run_tandem("bench " + kDraft + "--kernels -r 1 --device cpu");
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_NE(no_model.out.find("--draft needs the target model with -m"), std::string::npos) << no_model.out;
}

}  // namespace
}  // namespace tandem
