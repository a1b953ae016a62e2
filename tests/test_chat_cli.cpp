// `tandem chat` end to end on the shipped small model (no chat template in its GGUF: --chat-template chatml),
// driven through pipes: a piped conversation whose second answer (prefilled on the KV cache kept from the
// first turn) equals `tandem generate` on the whole rendered conversation, /reset, bad flags, and SIGINT
// mid-answer (the answer stops, the program goes on to the next prompt; SIGINT at the prompt exits).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <chrono>
#include <string>
#include <vector>

#include "tandem/chat.h"
#include "tandem/model.h"
#include "test_cli_util.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kModel = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";

// A running `tandem chat` with pipes to its stdin, stdout and stderr.
class ChatProcess {
 public:
  explicit ChatProcess(const std::vector<std::string>& args) {
    int in[2], out[2], err[2];
    EXPECT_EQ(::pipe(in), 0);
    EXPECT_EQ(::pipe(out), 0);
    EXPECT_EQ(::pipe(err), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) ::close(fd);
      std::vector<char*> argv;
      std::string bin = TANDEM_BIN;
      argv.push_back(bin.data());
      std::vector<std::string> copy = args;
      for (auto& s : copy) argv.push_back(s.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
  }
  ~ChatProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {in_, out_, err_})
      if (fd >= 0) ::close(fd);
  }
  void write(const std::string& s) { ASSERT_EQ(::write(in_, s.data(), s.size()), ssize_t(s.size())); }
  void close_stdin() {
    ::close(in_);
    in_ = -1;
  }
  void interrupt() { ::kill(pid_, SIGINT); }
  // Reads stdout until it holds `n` more bytes than `from` after... until pred(out) holds or the timeout.
  bool read_until(const std::function<bool(const std::string&)>& pred, double seconds = 120) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!pred(out)) {
      if (std::chrono::steady_clock::now() > end) return false;
      if (!pump(200)) return pred(out);
    }
    return true;
  }
  // Reads until stderr holds `n` copies of text, or the timeout.
  bool read_until_err(const std::string& text, size_t n, double seconds = 30);
  int wait_exit(double seconds = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      pump(100);
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        while (pump(0)) {
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
    }
    return -2;
  }
  std::string out, err;

 private:
  // Reads what is available from stdout and stderr; false when both are closed.
  bool pump(int timeout_ms) {
    pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
    if (out_ < 0 && err_ < 0) return false;
    if (::poll(fds, 2, timeout_ms) <= 0) return true;
    bool open = false;
    for (int i = 0; i < 2; ++i) {
      int& fd = i == 0 ? out_ : err_;
      if (fd < 0) continue;
      if (fds[i].revents & (POLLIN | POLLHUP)) {
        char buf[4096];
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) {
          ::close(fd);
          fd = -1;
          continue;
        }
        (i == 0 ? out : err).append(buf, size_t(n));
      }
      open = true;
    }
    return open || out_ >= 0 || err_ >= 0;
  }
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  bool exited_ = false;
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + what.size())) ++n;
  return n;
}

bool ChatProcess::read_until_err(const std::string& text, size_t n, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (count(err, text) < n) {
    if (std::chrono::steady_clock::now() > end || !pump(200)) return count(err, text) >= n;
  }
  return true;
}

TEST(ChatCommand, PipedConversationReusesTheCacheAndMatchesGenerate) {
  ChatProcess chat({"chat", "-m", kModel, "--chat-template", "chatml", "--system", "Be brief.", "-n", "12",
                    "--temp", "0", "-t", "2", "-v"});
  chat.write("Hello there\nWhat is two plus two?\n");
  chat.close_stdin();
  ASSERT_EQ(chat.wait_exit(), 0) << chat.out << chat.err;
  // "> " answer1 "\n> " answer2 "\n> \n"
  ASSERT_EQ(chat.out.rfind("> ", 0), 0u) << chat.out;
  ASSERT_TRUE(chat.out.ends_with("\n> \n")) << chat.out;
  const std::string body(chat.out.begin() + 2, chat.out.end() - 4);
  const size_t split = body.find("\n> ");
  ASSERT_NE(split, std::string::npos) << chat.out;
  ASSERT_EQ(body.find("\n> ", split + 1), std::string::npos) << "ambiguous answers: " << chat.out;
  const std::string answer1 = body.substr(0, split), answer2 = body.substr(split + 3);
  // The second turn decodes only what follows the first turn's prompt and answer.
  EXPECT_NE(chat.err.find("[prompt "), std::string::npos) << chat.err;
  const size_t second = chat.err.find("[prompt ", chat.err.find("[prompt ") + 1);
  ASSERT_NE(second, std::string::npos) << chat.err;
  EXPECT_EQ(chat.err.find(" 0 reused]", second), std::string::npos) << chat.err;

  // The same conversation, rendered and generated in one go, gives the same second answer.
  const auto model = tandem::Model::load(kModel);
  const std::string prompt =
      tandem::ChatTemplate::builtin("chatml").render({{"system", "Be brief."},
                                                      {"user", "Hello there"},
                                                      {"assistant", answer1},
                                                      {"user", "What is two plus two?"}},
                                                     true);
  const auto ids = model->tokenizer().encode(prompt, false, true);
  std::string ids_text;
  for (int32_t id : ids) {
    if (!ids_text.empty()) ids_text += ',';
    ids_text += std::to_string(id);
  }
  const auto gen = tandem::test::run_tandem(
      "generate -m '" + kModel + "' --prompt-ids " + ids_text + " -n 12 --temp 0 -t 2",
      tandem::test::Stderr::Discard);
  ASSERT_EQ(gen.exit_code, 0) << gen.out;
  EXPECT_EQ(gen.out, answer2 + "\n");
}

TEST(ChatCommand, ResetAndExitCommands) {
  ChatProcess chat(
      {"chat", "-m", kModel, "--chat-template", "chatml", "-n", "4", "--temp", "0", "-t", "2", "-v"});
  chat.write("One\n/reset\nOne\n/exit\nnot read\n");
  ASSERT_EQ(chat.wait_exit(), 0) << chat.out << chat.err;
  EXPECT_NE(chat.err.find("[conversation reset]"), std::string::npos) << chat.err;
  // After /reset the same question is a fresh prompt: nothing reused, the same greedy answer.
  EXPECT_EQ(count(chat.err, " 0 reused]"), 2u) << chat.err;
  EXPECT_EQ(count(chat.out, "> "), 4u) << chat.out;  // One, /reset, One, /exit
}

TEST(ChatCommand, AFullContextEndsTheAnswerNotTheChat) {
  ChatProcess chat({"chat", "-m", kModel, "--chat-template", "chatml", "-n", "-1", "--temp", "0",
                    "--ignore-eos", "--ctx", "48", "-t", "2"});
  chat.write("Tell me everything.\nAnd more?\n/reset\nHi\n");
  chat.close_stdin();
  ASSERT_EQ(chat.wait_exit(), 0) << chat.out << chat.err;
  EXPECT_EQ(count(chat.err, "[context full: /reset to start over]"), 2u) << chat.err;
  EXPECT_NE(chat.err.find("the context holds 48 (--ctx); /reset to start over"), std::string::npos)
      << chat.err;
  EXPECT_EQ(count(chat.out, "> "), 5u) << chat.out;
}

TEST(ChatCommand, BadFlagsAreClearErrors) {
  auto r = tandem::test::run_tandem("chat -m '" + kModel + "' --chat-template vicuna </dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--chat-template: unknown template 'vicuna'"), std::string::npos) << r.out;
  r = tandem::test::run_tandem("chat -m '" + kModel + "' </dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("has no tokenizer.chat_template; choose one with --chat-template"), std::string::npos)
      << r.out;
  r = tandem::test::run_tandem("chat -m '" + kModel + "' --chat-template chatml --top-p 2 </dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--top-p must be in [0, 1]"), std::string::npos) << r.out;
  r = tandem::test::run_tandem("chat -m '" + kModel + "' --chat-template /nonexistent/t.jinja </dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("/nonexistent/t.jinja"), std::string::npos) << r.out;
}

TEST(ChatCommand, CtrlCStopsTheAnswerNotTheProgram) {
  // Answers that would run until the context is full, so SIGINT arrives mid-answer.
  ChatProcess chat({"chat", "-m", kModel, "--chat-template", "chatml", "-n", "-1", "--temp", "0.8", "--seed",
                    "1", "--ctx", "4096", "-t", "2"});
  ASSERT_TRUE(chat.read_until([](const std::string& o) { return o == "> "; }, 60)) << chat.out << chat.err;
  chat.write("Tell me a long story.\n");
  ASSERT_TRUE(chat.read_until([](const std::string& o) { return o.size() > 12; })) << chat.out << chat.err;
  chat.interrupt();
  // The answer ends and the next prompt comes.
  ASSERT_TRUE(chat.read_until([](const std::string& o) { return o.ends_with("\n> "); }))
      << chat.out << chat.err;
  EXPECT_TRUE(chat.read_until_err("[interrupted]", 1)) << chat.err;
  const size_t first_len = chat.out.size();
  chat.write("And another?\n");
  ASSERT_TRUE(chat.read_until([&](const std::string& o) { return o.size() > first_len + 12; })) << chat.out;
  chat.interrupt();
  ASSERT_TRUE(chat.read_until([&](const std::string& o) {
    return o.size() > first_len && o.ends_with("\n> ");
  })) << chat.out
      << chat.err;
  EXPECT_TRUE(chat.read_until_err("[interrupted]", 2)) << chat.err;
  // Ctrl-C at the empty prompt exits.
  chat.interrupt();
  EXPECT_EQ(chat.wait_exit(), 0) << chat.out << chat.err;
}

}  // namespace
