// Hostile and awkward requests to a real `tandem serve` over loopback (plain sockets, no HTTP library):
// answers are JSON with a clear message, never a JSON library's exception text, and the server keeps serving.
// Found by fuzz/fuzz_serve_request; each test failed before its fix.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "test_cli_util.h"

namespace {

using json = nlohmann::json;

// `tandem serve --port 0 ARGS` in a child process; the port is read from its first line.
class Server {
 public:
  explicit Server(const std::string& args) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      ::execl("/bin/sh", "sh", "-c", (std::string("exec ") + TANDEM_BIN + " serve --port 0 " + args).c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    FILE* f = ::fdopen(fds[0], "r");
    char line[512];
    std::smatch m;
    if (f && std::fgets(line, sizeof line, f)) {
      const std::string s = line;
      if (std::regex_search(s, m, std::regex(R"(:(\d+) )"))) port_ = std::stoi(m[1]);
    }
    if (f) std::fclose(f);
  }
  ~Server() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  int port() const { return port_; }

  struct Answer {
    int status = 0;
    std::string body;
  };
  // One POST over a fresh connection (Connection: close): the status and the body.
  Answer post(const std::string& path, const std::string& body) const {
    Answer a;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{60, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return a;
    }
    const std::string req =
        "POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
        body;
    if (::write(fd, req.data(), req.size()) != ssize_t(req.size())) {
      ::close(fd);
      return a;
    }
    std::string got;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, size_t(n));
    ::close(fd);
    std::smatch m;
    if (std::regex_search(got, m, std::regex(R"(^HTTP/1\.1 (\d+))"))) a.status = std::stoi(m[1]);
    const size_t head_end = got.find("\r\n\r\n");
    if (head_end != std::string::npos) a.body = got.substr(head_end + 4);
    return a;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

const std::string kDraft = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-draft-q8_0.gguf";

// A token that is one byte of a multi-byte character decodes to text that is not UTF-8 on its own. The
// answer carries U+FFFD there; before, the JSON library threw on the bytes and the server answered 400 with
// "[json.exception.type_error.316] invalid UTF-8 byte".
TEST(ServeHardening, TokensThatEndInsideACharacterAreAnsweredNotRefused) {
  Server s("-m " + kDraft + " --parallel 1 --ctx 256");
  ASSERT_GT(s.port(), 0);
  // A character of 4 UTF-8 bytes the small vocabulary has no merge for: byte tokens.
  const auto t = s.post("/tokenize", R"({"content": "\ud835\udd18", "add_special": false})");
  ASSERT_EQ(t.status, 200) << t.body;
  const std::vector<int> ids = json::parse(t.body)["tokens"].get<std::vector<int>>();
  ASSERT_GE(ids.size(), 2u) << t.body;
  const auto d = s.post("/detokenize", "{\"tokens\": [" + std::to_string(ids[0]) + "]}");
  EXPECT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.body.find("json.exception"), std::string::npos) << d.body;
  const json j = json::parse(d.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << d.body;
  EXPECT_EQ(j["content"], "\xef\xbf\xbd") << d.body;  // U+FFFD
  // the whole list still decodes to the character
  std::string all;
  for (size_t i = 0; i < ids.size(); ++i) {  // appended piecewise: GCC 12's -Wrestrict misfires on "," + string
    if (i) all += ',';
    all += std::to_string(ids[i]);
  }
  const auto w = s.post("/detokenize", "{\"tokens\": [" + all + "]}");
  ASSERT_EQ(w.status, 200) << w.body;
  EXPECT_EQ(json::parse(w.body)["content"], "\xf0\x9d\x94\x98");
  // and the server keeps serving
  EXPECT_EQ(s.post("/tokenize", R"({"content": "ok"})").status, 200);
}

}  // namespace
