// Hostile command lines (part of the hardening issue): each gives one clear error line naming the flag or the
// word, and a non-zero exit, never a signal.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "test_cli_util.h"
#include "test_convert_fixture.h"

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

// Runs `tandem args...`; the moment `watched` (a file name in `dir`, the output's .tmp) is created, stops the
// process (SIGSTOP) and looks: when the file is still there, the command is mid-write, and it gets `sig`
// before it goes on (SIGCONT). inotify, not polling: these commands write their output in milliseconds. When
// the command finished before it could be stopped, the try does not count (`caught` false).
struct InterruptTry {
  bool created = false;  // the .tmp appeared
  bool caught = false;   // the command was stopped while the .tmp existed, and signalled
  int status = 0;        // wait status
};
InterruptTry interrupt_when_created(const std::vector<std::string>& args, const std::string& dir,
                                    const std::string& watched, int sig) {
  InterruptTry t;
  const int fd = ::inotify_init1(IN_CLOEXEC);
  if (fd < 0 || ::inotify_add_watch(fd, dir.c_str(), IN_CREATE) < 0) return t;
  const pid_t child = ::fork();
  if (child == 0) {
    std::vector<char*> argv{const_cast<char*>(TANDEM_BIN)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(TANDEM_BIN, argv.data());
    ::_exit(127);
  }
  bool exited = false;
  alignas(inotify_event) char buf[4096];
  for (int waited_ms = 0; !t.created && !exited && waited_ms < 60000; waited_ms += 20) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) > 0) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      for (ssize_t at = 0; at < n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(buf + at);
        if (e->len > 0 && watched == e->name) t.created = true;
        at += ssize_t(sizeof(inotify_event) + e->len);
      }
    }
    if (!t.created) exited = ::waitpid(child, &t.status, WNOHANG) == child;  // failed before writing
  }
  ::close(fd);
  if (t.created) {
    ::kill(child, SIGSTOP);
    siginfo_t info{};
    ::waitid(P_PID, id_t(child), &info, WSTOPPED | WEXITED | WNOWAIT);  // stopped (or already gone)
    t.caught = info.si_code == CLD_STOPPED && std::filesystem::exists(dir + "/" + watched);
    if (t.caught) ::kill(child, sig);
    ::kill(child, SIGCONT);
  } else if (!exited) {
    ::kill(child, SIGKILL);
  }
  if (!exited) ::waitpid(child, &t.status, 0);
  return t;
}

// Ctrl-C during every command that writes a GGUF (convert, bench --random-weights; quantize above) removes
// OUTPUT.tmp and exits 128 + signal. Before: bench --random-weights died of the signal and left OUTPUT.tmp.
TEST(CliHardening, EveryCommandThatWritesAFileCleansUpWhenInterrupted) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem_int_all_" + std::to_string(::getpid()));
  fs::create_directories(dir / "out");
  convert::fixture::Spec spec;  // about 50 MB of f32 output: a write that takes a while
  spec.n_layer = 4;
  spec.n_embd = 512;
  spec.n_ff = 1536;
  spec.n_head = 8;
  spec.n_head_kv = 4;
  spec.head_dim = 64;
  convert::fixture::write_checkpoint(dir / "hf", spec);
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  const std::string out = (dir / "out" / "x.gguf").string();
  const std::vector<std::vector<std::string>> commands = {
      {"bench", "-m", model, "--random-weights", "q4_k", "--to", out, "-t", "1"},
      {"convert", (dir / "hf").string(), "-o", out, "--type", "f32", "--threads", "1", "-q"},
  };
  for (const auto& args : commands) {
    for (int sig : {SIGINT, SIGTERM}) {
      SCOPED_TRACE(args[0] + " signal " + std::to_string(sig));
      int caught = 0;
      for (int attempt = 0; attempt < 8 && caught == 0; ++attempt) {
        fs::remove(out);
        const InterruptTry t = interrupt_when_created(args, (dir / "out").string(), "x.gguf.tmp", sig);
        ASSERT_TRUE(t.created) << "the command never created x.gguf.tmp";
        ASSERT_TRUE(WIFEXITED(t.status)) << "ended by signal " << WTERMSIG(t.status);
        EXPECT_FALSE(fs::exists(out + ".tmp"));  // never left behind, caught or not
        if (!t.caught) continue;                 // it had finished writing: try again
        ++caught;
        EXPECT_EQ(WEXITSTATUS(t.status), 128 + sig);
        EXPECT_FALSE(fs::exists(out));
      }
      EXPECT_GE(caught, 1) << "never interrupted mid-write in 8 tries";
    }
  }
  fs::remove_all(dir);
}

// No command writes over a file it reads: the replayed logits of `diffuse --replay-logits` as its --trace.
TEST(CliHardening, DiffuseTraceOverItsReplayedLogitsIsRefused) {
  const std::string logits =
      (std::filesystem::temp_directory_path() / ("tandem_replay_" + std::to_string(::getpid()) + ".tebl"))
          .string();
  {
    std::ofstream f(logits, std::ios::binary);
    f.write("TEBL", 4);
    const uint32_t dims[3] = {8, 2, 2};
    f.write(reinterpret_cast<const char*>(dims), sizeof dims);
    const std::vector<float> x(8 * 2 * 2, 0.5f);
    f.write(reinterpret_cast<const char*>(x.data()), std::streamsize(x.size() * 4));
  }
  const auto before = std::filesystem::file_size(logits);
  expect_error("diffuse --replay-logits " + logits + " --trace " + logits + " --seed 1",
               "is the --replay-logits file");
  EXPECT_EQ(std::filesystem::file_size(logits), before);
  std::filesystem::remove(logits);
}

// A checkpoint file that is a FIFO or a directory is an error naming it, not a read that blocks forever
// (before: convert waited on the FIFO; a directory read as an empty, invalid JSON text).
TEST(CliHardening, ConvertRefusesAFifoOrDirectoryAmongTheCheckpointFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem_conv_fifo_" + std::to_string(::getpid()));
  convert::fixture::write_checkpoint(dir / "hf", convert::fixture::Spec{});
  for (const char* name : {"config.json", "tokenizer.json"}) {
    SCOPED_TRACE(name);
    const fs::path file = dir / "hf" / name, keep = dir / "keep";
    fs::rename(file, keep);
    ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
    // `timeout`: a blocked read ends the test as a failure, not a hang
    const auto r = test::run_command("timeout 60 " + std::string(TANDEM_BIN) + " convert " +
                                     (dir / "hf").string() + " -o " + (dir / "out.gguf").string());
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find(std::string(name) + "' is a FIFO; give a regular file"), std::string::npos) << r.out;
    fs::remove(file);
    fs::create_directory(file);
    const auto d = run_tandem("convert " + (dir / "hf").string() + " -o " + (dir / "out.gguf").string());
    EXPECT_EQ(d.exit_code, 1) << d.out;
    EXPECT_NE(d.out.find(std::string(name) + "' is a directory; give a regular file"), std::string::npos)
        << d.out;
    fs::remove(file);
    fs::rename(keep, file);
  }
  EXPECT_FALSE(fs::exists(dir / "out.gguf"));
  fs::remove_all(dir);
}

// The commands added after the first hardening pass check their flags the same way: the flag, the range, exit
// 1, before any model is read. Before: parallel said "--threads out of range" and ran with --ctx 0 or
// --batch 0 until the scheduler failed with a message naming no flag.
TEST(CliHardening, NewerCommandsNameTheFlagAndRange) {
  const std::string draft = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-draft-q8_0.gguf";
  expect_error("serve -t 100000", "--threads must be in [0, 1024]");
  expect_error("serve --port 70000", "--port must be in [0, 65535]");
  expect_error("serve --max-body 5", "--max-body must be at least 1024");
  expect_error("serve --parallel 0", "--parallel must be at least 1");
  expect_error("parallel -t 100000", "--threads must be in [0, 1024]");
  expect_error("parallel --ctx 0", "--ctx must be at least 1");
  expect_error("parallel --batch 0", "--batch must be at least 1");
  expect_error("parallel --seed -1", "--seed must be >= 0");
  expect_error("parallel --parallel 100 --ctx 128", "leaves fewer than 64 positions each");
  expect_error("parallel --prompt-min 9 --prompt-max 3", "--prompt-min must be >= 1 and <= --prompt-max");
  expect_error("chat -t 100000 </dev/null", "--threads must be in [0, 1024]");
  expect_error("chat --top-k -1 </dev/null", "--top-k must be >= 0");
  expect_error("diffuse -t 100000 -p hi", "--threads must be in [0, 1024]");
  expect_error("diffuse -p hi -n 0", "-n must be in [1,");
  expect_error("generate -m " + draft + " --draft " + draft + " --draft-max -1 -p hi -n 2", "draft");
  expect_error("bench --diffusion --diffusion-steps -4", "--diffusion");
  // before: bench --random-weights -t 100000 started 100000 threads for every tensor (hung)
  const auto rw = test::run_command("timeout 120 " + std::string(TANDEM_BIN) + " bench -m " + draft +
                                    " --random-weights q4_k --to /tmp/tandem_never_written.gguf -t 100000");
  EXPECT_EQ(rw.exit_code, 1) << rw.out;  // 124: it hung
  EXPECT_NE(rw.out.find("-t must be in [0, 1024]"), std::string::npos) << rw.out;
  // before: a huge --batch was reported as a --ctx problem only
  // (10^8 rows of the small model's 8 KiB a position: 800 GB, more than any machine has, so the check fails
  // before anything is allocated; 2^31 rows also work but build a 134M-block table first, slowly)
  const std::string small = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";
  expect_error("generate -m " + small + " -p hi -n 1 --ctx 64 --batch 100000000",
               "with batches of 100000000 rows (--batch)");
  // and a good run of parallel still works on the small model
  const auto ok = run_tandem("parallel -m " + draft + " --parallel 2 --sequences 2 -n 2 --ctx 256 -t 1");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
}

}  // namespace
}  // namespace tandem
