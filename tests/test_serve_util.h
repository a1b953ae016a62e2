// What the server tests share: `tandem serve --port 0 ARGS` in a child process (the port read from its first
// line), a streamed request over a raw socket (the test decides when the client leaves), /metrics values, and
// the texts of an SSE stream.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace tandem::test {

class ServerProcess {
 public:
  explicit ServerProcess(const std::string& args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      execl("/bin/sh", "sh", "-c", (std::string("exec ") + TANDEM_BIN + " serve --port 0 " + args).c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    FILE* f = fdopen(fds[0], "r");
    char line[512];
    if (f && std::fgets(line, sizeof line, f)) {
      std::smatch m;
      const std::string s = line;
      if (std::regex_search(s, m, std::regex(R"(:(\d+) )"))) port_ = std::stoi(m[1]);
      banner_ = s;
    }
    if (f) std::fclose(f);
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }
  int port() const { return port_; }
  // The server's first line ("listening on http://...:PORT (slots, ctx, ...)").
  const std::string& banner() const { return banner_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string banner_;
};

// A streamed completion over a raw socket, so that the test decides when the client goes away (closing the
// socket mid-stream, as a client that disconnects does).
class RawStream {
 public:
  RawStream(int port, nlohmann::json body, const std::string& path = "/v1/completions", bool stream = true) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{30, 0};  // a read never waits longer than this
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return;
    body["stream"] = stream;
    const std::string b = body.dump();
    const std::string req = "POST " + path +
                            " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            "Content-Length: " +
                            std::to_string(b.size()) + "\r\n\r\n" + b;
    ok_ = write(fd_, req.data(), req.size()) == ssize_t(req.size());
  }
  ~RawStream() {
    if (fd_ >= 0) close(fd_);
  }
  // Reads until `n` SSE events have arrived; false on a closed socket or a read timeout.
  bool wait_for_tokens(int n) {
    char buf[4096];
    while (ok_ && count("data: ") < size_t(n)) {
      const ssize_t k = read(fd_, buf, sizeof buf);
      if (k <= 0) return false;
      got_.append(buf, size_t(k));
    }
    return ok_;
  }
  const std::string& received() const { return got_; }

 private:
  size_t count(const std::string& what) const {
    size_t n = 0;
    for (size_t p = got_.find(what); p != std::string::npos; p = got_.find(what, p + 1)) ++n;
    return n;
  }
  int fd_ = -1;
  bool ok_ = false;
  std::string got_;
};

// POST /v1/completions with `body` to the server on `port`; expects an answer with status 200 and returns its
// JSON (null when there was no answer).
inline nlohmann::json complete_at(int port, const nlohmann::json& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300, 0);
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return {};
  EXPECT_EQ(r->status, 200) << r->body;
  return nlohmann::json::parse(r->body);
}

// One value of GET /metrics (-1 when it cannot be read).
inline double metric_value_at(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  auto r = c.Get("/metrics");
  if (!r) return -1;
  std::smatch m;
  if (!std::regex_search(r->body, m, std::regex("\n" + name + " ([0-9.e+]+)"))) return -1;
  return std::stod(m[1]);
}
inline int64_t metric_at(int port, const std::string& name) {
  return int64_t(metric_value_at(port, name));
}
// Polls /metrics (every 50 ms, up to `tries` times: 20 s by default) until `name` has `value` (or, with
// `at_least`, reaches it).
inline bool wait_metric_at(int port, const std::string& name, int64_t value, int tries = 400,
                           bool at_least = false) {
  for (int i = 0; i < tries; ++i) {
    const int64_t v = metric_at(port, name);
    if (v == value || (at_least && v >= value)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The texts of every choice of an SSE stream, and whether it ended with [DONE].
struct Streamed {
  std::vector<std::string> text;
  std::vector<std::string> finish;
  bool done = false;
};
inline Streamed parse_sse(const std::string& body, size_t n, bool chat) {
  Streamed s;
  s.text.resize(n);
  s.finish.resize(n);
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      s.done = true;
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(payload);
    for (const nlohmann::json& c : j["choices"]) {
      const size_t i = c["index"].get<size_t>();
      if (chat) {
        if (c["delta"].contains("content")) s.text[i] += c["delta"]["content"].get<std::string>();
      } else {
        s.text[i] += c["text"].get<std::string>();
      }
      if (!c["finish_reason"].is_null()) s.finish[i] = c["finish_reason"].get<std::string>();
    }
  }
  return s;
}

// A greedy (temperature 0) streamed /v1/completions of `prompt` on a connection of its own, parsed; nullopt
// when no response came back. The concurrency tests start many of these at once and compare each with a solo
// run.
inline std::optional<Streamed> stream_greedy_completion(int port, const std::string& prompt, int max_tokens) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300, 0);
  const nlohmann::json body = {
      {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return std::nullopt;
  return parse_sse(r->body, 1, false);
}

}  // namespace tandem::test
