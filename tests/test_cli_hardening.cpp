// Hostile command lines (part of the hardening issue): each gives one clear error line naming the flag or the
// word, and a non-zero exit, never a signal.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "test_cli_util.h"

namespace tandem {
namespace {

using test::run_tandem;

void expect_error(const std::string& args, const std::string& needle) {
  const auto r = run_tandem(args);
  EXPECT_GT(r.exit_code, 0) << args << "\n" << r.out;  // -1: killed by a signal
  EXPECT_NE(r.out.find(needle), std::string::npos) << args << "\n" << r.out;
}

TEST(CliHardening, AThreadCountTheMachineCannotStartIsAnErrorNotAnAbort) {
  EXPECT_THROW(ThreadPool(100000), Error);
  try {
    ThreadPool p(100000);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 1024"), std::string::npos) << e.what();
  }
  expect_error("generate -t 100000 -n 1 -p hi", "--threads must be in [0, 1024]");
  expect_error("perplexity -t 100000 -f " + std::string(TANDEM_SOURCE_DIR) + "/README.md", "threads");
}

TEST(CliHardening, AnUnknownCommandIsNamedWithTheListOfCommands) {
  const auto r = run_tandem("frobnicate --x 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("unknown command 'frobnicate'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("generate"), std::string::npos) << r.out;
  EXPECT_EQ(run_tandem("--version").exit_code, 0);
}

TEST(CliHardening, SamplingFlagsOutOfRangeNameTheFlag) {
  expect_error("generate -n 1 -p hi --top-k -3", "--top-k must be >= 0");
  expect_error("generate -n 1 -p hi --temp inf", "--temp must be a finite number");
  expect_error("generate -n 1 -p hi --seed -2", "--seed must be >= 0, or -1");
  expect_error("generate -n 1 -p hi --top-p 1.5", "--top-p must be in [0, 1]");
  expect_error("generate -n 1 -p hi --min-p -0.1", "--min-p must be in [0, 1]");
  expect_error("generate -n 1 -p hi --repeat-penalty 0", "--repeat-penalty must be a positive number");
  expect_error("generate -n 1 --prompt-ids 1,,3", "--prompt-ids: empty entry");
  expect_error("generate -n 1 --prompt-ids ,1", "--prompt-ids: empty entry");
  // the good forms still work
  EXPECT_EQ(run_tandem("generate -n 2 --prompt-ids 1,2,3 --ids --temp 0").exit_code, 0);
}

TEST(CliHardening, ADirectoryFifoOrMissingFileIsAnErrorNotAnEmptyText) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("tandem_hard_dir_" + std::to_string(::getpid()));
  const std::string fifo = dir + "/fifo";
  std::filesystem::create_directories(dir);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  expect_error("tokenize -m " + model + " -f " + dir, "is a directory; give a regular file");
  expect_error("tokenize -m " + model + " -f " + fifo,
               "is a FIFO; give a regular file");  // and does not block
  expect_error("perplexity -m " + model + " -f " + dir, "is a directory");
  expect_error("perplexity -m " + model + " -f " + dir + "/missing.txt", "No such file");
  expect_error("inspect " + fifo, "not a regular file");
  expect_error("inspect " + dir, "is a directory");
  std::filesystem::remove_all(dir);
}

TEST(CliHardening, BenchRandomWeightsRefusesToOverwriteItsInput) {
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_hard_rw_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "m.gguf").string();
  std::filesystem::copy_file(std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf", model);
  const auto before = std::filesystem::file_size(model);
  const auto mtime = std::filesystem::last_write_time(model);
  expect_error("bench -m " + model + " --random-weights q4_k --to " + model, "is the input model");
  expect_error("bench -m " + model + " --random-weights q4_k --to " + (dir / "." / "m.gguf").string(),
               "is the input model");
  std::filesystem::create_hard_link(model, dir / "link.gguf");
  expect_error("bench -m " + model + " --random-weights q4_k --to " + (dir / "link.gguf").string(),
               "is the input model");
  EXPECT_EQ(std::filesystem::file_size(model), before);  // nothing lost
  EXPECT_EQ(std::filesystem::last_write_time(model), mtime);
  std::filesystem::remove_all(dir);
}

TEST(CliHardening, PerplexityWithNoScoredTokenIsAnError) {
  const std::string text =
      std::filesystem::temp_directory_path() / ("tandem_hard_" + std::to_string(::getpid()) + ".txt");
  { std::ofstream(text) << "hello world this is a test of the perplexity tool\n"; }
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  expect_error("perplexity -m " + model + " -f " + text + " --ctx 2", "no token was scored");
  EXPECT_EQ(run_tandem("perplexity -m " + model + " -f " + text + " --ctx 8").exit_code, 0);
  std::filesystem::remove(text);
}

// Numeric flags of every command name the flag and the allowed range (no 300-digit range from the parser).
TEST(CliHardening, NumericFlagsOfEveryCommandNameTheFlagAndRange) {
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  const std::string text = std::string(TANDEM_SOURCE_DIR) + "/README.md";
  expect_error("quantize '" + model + "' /tmp/tandem_never_written.gguf q4_k --threads -1",
               "--threads must be in [0, 1024]");
  const auto q = run_tandem("quantize '" + model + "' /tmp/tandem_never_written.gguf q4_k --threads -1");
  EXPECT_LT(q.out.size(), 200u) << q.out;
  expect_error("convert /tmp -o /tmp/tandem_never_written.gguf --threads 5000",
               "--threads must be in [0, 1024]");
  expect_error("perplexity -f " + text + " --stride -3", "--stride must be at least 0");
  expect_error("perplexity -f " + text + " --batch 0", "--batch must be at least 1");
  expect_error("perplexity -f " + text + " --ctx 1", "--ctx must be in [2,");
  expect_error("bench -m '" + model + "' -t -1 --device cpu", "-t must be in [0, 1024]");
  expect_error("bench -m '" + model + "' -r 0 --device cpu", "-r must be in [1,");
  expect_error("bench -m '" + model + "' --bw nan --device cpu", "--bw must be a finite number");
  EXPECT_FALSE(std::filesystem::exists("/tmp/tandem_never_written.gguf"));
}

// A context the machine cannot hold names --ctx and the bytes the KV cache needs.
TEST(CliHardening, AContextTooLargeForMemoryNamesCtxAndTheBytes) {
  const auto r = run_tandem("generate -n 1 -p hi --ctx 2147483647");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("(--ctx) needs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bytes"), std::string::npos) << r.out;
}

// quantize does not replace a read-only output unless told to.
TEST(CliHardening, QuantizeRefusesAReadOnlyOutputWithoutForce) {
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-draft-q8_0.gguf";
  const std::string out =
      (std::filesystem::temp_directory_path() / ("tandem_ro_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  { std::ofstream(out) << "keep me"; }
  ::chmod(out.c_str(), 0444);
  const auto r = run_tandem("quantize '" + model + "' '" + out + "' q8_0 -q");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("is read-only; pass --force"), std::string::npos) << r.out;
  {
    std::ifstream in(out);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(content, "keep me");
  }
  const auto forced = run_tandem("quantize '" + model + "' '" + out + "' q8_0 -q --force");
  EXPECT_EQ(forced.exit_code, 0) << forced.out;
  std::filesystem::remove(out);
}

// Ctrl-C (SIGINT) or SIGTERM during quantize leaves no OUTPUT.tmp behind and exits 128 + signal.
TEST(CliHardening, AnInterruptedQuantizeRemovesItsTemporaryFile) {
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    const std::string out =
        (std::filesystem::temp_directory_path() /
         ("tandem_int_" + std::to_string(::getpid()) + "_" + std::to_string(sig) + ".gguf"))
            .string();
    const std::string tmp = out + ".tmp";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::execl(TANDEM_BIN, TANDEM_BIN, "quantize", model.c_str(), out.c_str(), "q4_k", "-q", "--threads", "1",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    bool seen = false;
    for (int i = 0; i < 4000 && !seen; ++i) {  // up to 20 s for the temporary file to appear
      seen = std::filesystem::exists(tmp);
      if (!seen) ::usleep(5000);
    }
    ASSERT_TRUE(seen) << "quantize never created " << tmp;
    ::kill(child, sig);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "ended by a signal";
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig);
    EXPECT_FALSE(std::filesystem::exists(tmp));
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

// generate's one output file (--dump-logits) is refused when it is the model.
TEST(CliHardening, DumpLogitsOverTheModelIsRefused) {
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-draft-q8_0.gguf";
  const auto before = std::filesystem::file_size(model);
  expect_error("generate -m '" + model + "' -p hi -n 1 --dump-logits '" + model + "'",
               "--dump-logits '" + model + "' is the model file");
  EXPECT_EQ(std::filesystem::file_size(model), before);
}

}  // namespace
}  // namespace tandem
