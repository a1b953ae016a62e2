// tandem serve over real HTTP on loopback: the binary is started on a free port (it prints the port), and
// driven with cpp-httplib's client. Greedy completions equal `tandem generate`; 32 concurrent streams each
// equal their single-client text; a client that disconnects mid-stream frees its KV (seen in /metrics); bad
// requests get the right 4xx with a clear message and the server keeps serving.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_cli_util.h"

namespace {

using json = nlohmann::json;

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

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess("--parallel 8 --ctx 8192 --kv-unified"); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(300, 0);
    return c;
  }
  static json post(const std::string& path, const json& body, int expect = 200) {
    auto c = client();
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, expect) << r->body;
    return json::parse(r->body);
  }
  static int64_t metric(const std::string& name) {
    auto c = client();
    auto r = c.Get("/metrics");
    if (!r) return -1;
    std::smatch m;
    if (!std::regex_search(r->body, m, std::regex("\n" + name + " ([0-9.e+]+)"))) return -1;
    return int64_t(std::stod(m[1]));
  }
  static ServerProcess* server_;
};
ServerProcess* Serve::server_ = nullptr;

// The texts of every choice of an SSE stream, and whether it ended with [DONE].
struct Streamed {
  std::vector<std::string> text;
  std::vector<std::string> finish;
  bool done = false;
};
Streamed parse_sse(const std::string& body, size_t n, bool chat) {
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
    const json j = json::parse(payload);
    for (const json& c : j["choices"]) {
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

TEST_F(Serve, HealthModelsTokenize) {
  ASSERT_GT(server_->port(), 0);
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  const json models = json::parse(c.Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["id"], "tandem-small-q8_0");
  const json t = post("/tokenize", {{"content", "Once upon a time"}});
  ASSERT_TRUE(t["tokens"].is_array());
  const json d = post("/detokenize", {{"tokens", t["tokens"]}});
  EXPECT_NE(d["content"].get<std::string>().find("Once upon a time"), std::string::npos);
}

TEST_F(Serve, GreedyCompletionEqualsGenerate) {
  const auto gen = tandem::test::run_tandem("generate -p 'Once upon a time' -n 24 --temp 0",
                                            tandem::test::Stderr::Discard);
  ASSERT_EQ(gen.exit_code, 0);
  const json r = post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}});
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>() + "\n", gen.out);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 24);
  // Token ids as the prompt give the same text.
  const json ids = post("/tokenize", json{{"content", "Once upon a time"}});
  ASSERT_TRUE(ids.is_object() && ids.contains("tokens")) << ids.dump();
  json with_ids = json::object();
  with_ids["prompt"] = ids["tokens"];
  with_ids["max_tokens"] = 24;
  with_ids["temperature"] = 0;
  const json r2 = post("/v1/completions", with_ids);
  ASSERT_TRUE(r2.contains("choices")) << r2.dump();
  EXPECT_EQ(r2["choices"][0]["text"], r["choices"][0]["text"]);
  // Streaming gives the same text.
  auto c = client();
  auto s = c.Post("/v1/completions",
                  json{{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}}
                      .dump(),
                  "application/json");
  ASSERT_TRUE(s);
  const Streamed st = parse_sse(s->body, 1, false);
  EXPECT_TRUE(st.done);
  EXPECT_EQ(st.text[0], r["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(st.finish[0], "length");
}

TEST_F(Serve, StopStringsAndSeeds) {
  const json full = post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}});
  const std::string text = full["choices"][0]["text"];
  ASSERT_GT(text.size(), 12u);
  const std::string stop = text.substr(8, 4);
  const json r = post("/v1/completions",
                      {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"stop", stop}});
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>(), text.substr(0, text.find(stop)));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  // Same seed, same text; n choices use seed + i; logprobs come back.
  const json a = post("/v1/completions", {{"prompt", "The"}, {"max_tokens", 16}, {"seed", 7}, {"n", 2},
                                          {"logprobs", 3}});
  const json b = post("/v1/completions", {{"prompt", "The"}, {"max_tokens", 16}, {"seed", 7}});
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_EQ(a["choices"].size(), 2u);
  EXPECT_EQ(a["choices"][0]["logprobs"]["token_logprobs"].size(), 16u);
  EXPECT_LE(a["choices"][0]["logprobs"]["token_logprobs"][0].get<double>(), 0.0);
}

TEST_F(Serve, ThirtyTwoConcurrentStreamsEqualTheirSingleClientText) {
  const int n = 32;
  std::vector<std::string> prompts, single(n);
  for (int i = 0; i < n; ++i) prompts.push_back("Story number " + std::to_string(i) + ": once");
  for (int i = 0; i < n; ++i)
    single[size_t(i)] =
        post("/v1/completions", {{"prompt", prompts[size_t(i)]}, {"max_tokens", 12}, {"temperature", 0}})["choices"][0]["text"];
  std::vector<std::string> got(n);
  std::vector<bool> done(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      auto c = client();
      auto r = c.Post("/v1/completions",
                      json{{"prompt", prompts[size_t(i)]}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}}
                          .dump(),
                      "application/json");
      if (!r) return;
      const Streamed s = parse_sse(r->body, 1, false);
      got[size_t(i)] = s.text[0];
      done[size_t(i)] = s.done;
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(done[size_t(i)]) << i;
    EXPECT_EQ(got[size_t(i)], single[size_t(i)]) << i;
  }
}

TEST_F(Serve, DisconnectMidStreamFreesKv) {
  // A long streamed request over a raw socket, closed after its first chunks arrived.
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(server_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string body =
        json{{"prompt", "A long story"}, {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", true}}.dump();
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(write(fd, req.data(), req.size()), ssize_t(req.size()));
    std::string got;
    char buf[4096];
    while (got.find("data: ", got.find("data: ") + 1) == std::string::npos) {
      const ssize_t n = read(fd, buf, sizeof buf);
      ASSERT_GT(n, 0);
      got.append(buf, size_t(n));
    }
    EXPECT_GT(metric("tandem_kv_cells_used"), 0);
    close(fd);
  }
  int64_t used = -1;
  for (int i = 0; i < 100 && used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    used = metric("tandem_kv_cells_used");
  }
  EXPECT_EQ(used, 0);
  EXPECT_GE(metric("tandem_requests_cancelled_total"), 1);
}

TEST_F(Serve, BadRequestsGetClearErrorsAndTheServerStillServes) {
  auto c = client();
  auto bad_json = c.Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(bad_json);
  EXPECT_EQ(bad_json->status, 400);
  EXPECT_NE(bad_json->body.find("not valid JSON"), std::string::npos);
  const json wrong_type = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", "ten"}}, 400);
  EXPECT_NE(wrong_type["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos);
  const json negative = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", -1}}, 400);
  EXPECT_NE(negative["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos);
  const json model = post("/v1/completions", {{"prompt", "x"}, {"model", "gpt-17"}}, 404);
  EXPECT_EQ(model["error"]["code"], "model_not_found");
  auto big = c.Post("/v1/completions", std::string(2 << 20, 'a'), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_NE(big->body.find("--max-body"), std::string::npos);
  auto route = c.Get("/v2/nothing");
  ASSERT_TRUE(route);
  EXPECT_EQ(route->status, 404);
  EXPECT_NE(route->body.find("\"error\""), std::string::npos);
  // Still serving.
  const json ok = post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 2}, {"temperature", 0}});
  EXPECT_EQ(ok["usage"]["completion_tokens"], 2);
}

TEST(ServeAuth, ApiKeyIsRequired) {
  ServerProcess s("--parallel 1 --ctx 512 --api-key sekret");
  ASSERT_GT(s.port(), 0);
  httplib::Client c("127.0.0.1", s.port());
  auto no = c.Get("/v1/models");
  ASSERT_TRUE(no);
  EXPECT_EQ(no->status, 401);
  EXPECT_NE(no->body.find("--api-key"), std::string::npos);
  auto yes = c.Get("/v1/models", httplib::Headers{{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(yes);
  EXPECT_EQ(yes->status, 200);
}

}  // namespace
