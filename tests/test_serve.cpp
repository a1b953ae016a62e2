// tandem serve over real HTTP on loopback: the binary is started on a free port (it prints the port), and
// driven with cpp-httplib's client. Greedy completions equal `tandem generate`; 32 concurrent streams each
// equal their single-client text; a client that disconnects mid-stream frees its KV (seen in /metrics); bad
// requests get the right 4xx with a clear message and the server keeps serving.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_cli_util.h"
#include "test_serve_util.h"

namespace {

using json = nlohmann::json;

using tandem::test::complete_at;
using tandem::test::metric_at;
using tandem::test::parse_sse;
using tandem::test::RawStream;
using tandem::test::ServerProcess;
using tandem::test::stream_greedy_completion;
using tandem::test::Streamed;
using tandem::test::wait_metric_at;

// The build must compile httplib.h with the defines the linked library was built with (CMakeLists.txt,
// TANDEM_HTTPLIB_DEFINES): with CPPHTTPLIB_OPENSSL_SUPPORT missing, httplib::Client is a byte smaller here
// than the library's constructor writes, and every client these tests make overwrites a byte of its neighbour
// on the stack (on the H200 machine: request bodies corrupted under load, a 400 "must be a JSON object"). The
// client is built between two guard areas; not one of their bytes may change.
TEST(ServeBuild, TheHttplibClientHasTheLibrarysLayout) {
  struct Guarded {
    unsigned char before[32];
    alignas(httplib::Client) unsigned char storage[sizeof(httplib::Client)];
    unsigned char after[32];
  };
  Guarded g;
  std::memset(&g, 0xA5, sizeof g);
  auto* c = new (g.storage) httplib::Client("127.0.0.1", 1);
  c->set_read_timeout(1, 0);
  c->~Client();
  int changed = 0;
  for (unsigned char b : g.before) changed += b != 0xA5;
  for (unsigned char b : g.after) changed += b != 0xA5;
  EXPECT_EQ(changed, 0) << "httplib.h is compiled with other CPPHTTPLIB_* defines than the library (sizeof "
                        << sizeof(httplib::Client) << " here)";
}

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess("--parallel 8 --ctx 8192 --kv-unified --chat-template chatml");
  }
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
  static int64_t metric(const std::string& name) { return metric_at(server_->port(), name); }
  static bool wait_metric(const std::string& name, int64_t value) {
    return wait_metric_at(server_->port(), name, value);
  }
  static ServerProcess* server_;
};
ServerProcess* Serve::server_ = nullptr;

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
  const json r =
      post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}});
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
  auto s = c.Post(
      "/v1/completions",
      json{{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}}.dump(),
      "application/json");
  ASSERT_TRUE(s);
  const Streamed st = parse_sse(s->body, 1, false);
  EXPECT_TRUE(st.done);
  EXPECT_EQ(st.text[0], r["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(st.finish[0], "length");
}

TEST_F(Serve, StopStringsAndSeeds) {
  const json full =
      post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}});
  const std::string text = full["choices"][0]["text"];
  ASSERT_GT(text.size(), 12u);
  const std::string stop = text.substr(8, 4);
  const json r =
      post("/v1/completions",
           {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}, {"stop", stop}});
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>(), text.substr(0, text.find(stop)));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  // Same seed, same text; n choices use seed + i; logprobs come back.
  const json a = post("/v1/completions",
                      {{"prompt", "The"}, {"max_tokens", 16}, {"seed", 7}, {"n", 2}, {"logprobs", 3}});
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
        post("/v1/completions",
             {{"prompt", prompts[size_t(i)]}, {"max_tokens", 12}, {"temperature", 0}})["choices"][0]["text"];
  std::vector<std::string> got(n);
  std::vector<bool> done(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      const auto s = stream_greedy_completion(server_->port(), prompts[size_t(i)], 12);
      if (!s) return;
      got[size_t(i)] = s->text[0];
      done[size_t(i)] = s->done;
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(done[size_t(i)]) << i;
    EXPECT_EQ(got[size_t(i)], single[size_t(i)]) << i;
  }
}

TEST_F(Serve, DisconnectMidStreamFreesKv) {
  {
    RawStream long_one(server_->port(),
                       json{{"prompt", "A long story"}, {"max_tokens", 4000}, {"ignore_eos", true}});
    ASSERT_TRUE(long_one.wait_for_tokens(2));
    EXPECT_GT(metric("tandem_kv_cells_used"), 0);
  }  // closed mid-stream
  EXPECT_TRUE(wait_metric("tandem_kv_cells_used", 0));
  EXPECT_GE(metric("tandem_requests_cancelled_total"), 1);
}

// A non-streamed request writes nothing until it ends; its client closing the connection must still free
// its KV cells at once (the server watches the socket), not when its 8000 tokens are done.
TEST_F(Serve, NonStreamedClientThatDisconnectsFreesKvAtOnce) {
  ASSERT_TRUE(wait_metric("tandem_kv_cells_used", 0));
  const int64_t cancelled0 = metric("tandem_requests_cancelled_total");
  const int64_t generated0 = metric("tandem_generated_tokens_total");
  {
    RawStream request(server_->port(),
                      json{{"prompt", "A very long story"}, {"max_tokens", 8000}, {"ignore_eos", true}},
                      "/v1/completions", false);
    // Generating: its cells are in use and tokens are counted.
    ASSERT_TRUE(wait_metric_at(server_->port(), "tandem_generated_tokens_total", generated0 + 8, 400, true));
    EXPECT_GT(metric("tandem_kv_cells_used"), 0);
  }  // the client closes the connection without reading an answer
  EXPECT_TRUE(wait_metric_at(server_->port(), "tandem_kv_cells_used", 0, 100)) << "not freed within 5 s";
  EXPECT_EQ(metric("tandem_requests_cancelled_total"), cancelled0 + 1);
  EXPECT_LT(metric("tandem_generated_tokens_total") - generated0, 7000);
  EXPECT_EQ(metric("tandem_requests_running"), 0);
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

TEST_F(Serve, ChatCompletionsRenderTheChatmlTemplate) {
  const json messages = json::array({{{"role", "system"}, {"content", "You tell stories."}},
                                     {{"role", "user"}, {"content", "A story about a cat."}}});
  const json r =
      post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  const std::string text = r["choices"][0]["message"]["content"];
  // The same prompt rendered by hand in ChatML, sent as a plain completion, gives the same answer and the
  // same prompt length: the route renders with --chat-template chatml and tokenizes like /tokenize.
  const std::string rendered =
      "<|im_start|>system\nYou tell stories.<|im_end|>\n<|im_start|>user\nA story about a cat.<|im_end|>\n"
      "<|im_start|>assistant\n";
  const json plain = post("/v1/completions", {{"prompt", rendered}, {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(plain["choices"][0]["text"].get<std::string>(), text);
  EXPECT_EQ(plain["usage"]["prompt_tokens"], r["usage"]["prompt_tokens"]);
  EXPECT_EQ(post("/tokenize", {{"content", rendered}})["tokens"].size(),
            r["usage"]["prompt_tokens"].get<size_t>());
  // Streamed: a role delta first, then content deltas that add up to the same text.
  auto c = client();
  auto s =
      c.Post("/v1/chat/completions",
             json{{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}}.dump(),
             "application/json");
  ASSERT_TRUE(s);
  EXPECT_NE(s->body.find("\"role\":\"assistant\""), std::string::npos);
  const Streamed st = parse_sse(s->body, 1, true);
  EXPECT_TRUE(st.done);
  EXPECT_EQ(st.text[0], text);
  // Malformed conversations are 400s that name the field.
  const json none = post("/v1/chat/completions", {{"max_tokens", 2}}, 400);
  EXPECT_NE(none["error"]["message"].get<std::string>().find("messages"), std::string::npos);
  const json bad_role = post("/v1/chat/completions", {{"messages", json::array({{{"content", "hi"}}})}}, 400);
  EXPECT_NE(bad_role["error"]["message"].get<std::string>().find("role"), std::string::npos);
}

TEST_F(Serve, SameSeedSameTextWhateverElseRuns) {
  const json req{{"prompt", "The dog"}, {"max_tokens", 20}, {"temperature", 0.9}, {"top_k", 40},
                 {"top_p", 0.95},       {"min_p", 0.02},    {"seed", 1234}};
  const std::string alone = post("/v1/completions", req)["choices"][0]["text"];
  // The same request among eight others with other prompts and seeds, all in flight at once.
  std::vector<std::string> got(9), answer(9);
  std::vector<std::thread> threads;
  for (int i = 0; i < 9; ++i)
    threads.emplace_back([&, i] {
      json r = req;
      if (i != 4) {
        r["prompt"] = "Other prompt " + std::to_string(i);
        r["seed"] = 99 + i;
      }
      auto c = client();
      auto res = c.Post("/v1/completions", r.dump(), "application/json");
      answer[size_t(i)] = res ? std::to_string(res->status) + " " + res->body
                              : "no answer: " + httplib::to_string(res.error());
      if (res && res->status == 200) got[size_t(i)] = json::parse(res->body)["choices"][0]["text"];
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[4], alone) << answer[4];
  // Another seed gives another text (the seed is used at all).
  json other = req;
  other["seed"] = 4321;
  EXPECT_NE(post("/v1/completions", other)["choices"][0]["text"].get<std::string>(), alone);
}

TEST_F(Serve, SecondRequestWithTheSameSystemPromptReusesItsKvCells) {
  std::string system;
  for (int i = 0; i < 60; ++i) system += "The quick brown fox jumps over the lazy dog. ";
  const size_t n_system = post("/tokenize", {{"content", system}})["tokens"].size();
  ASSERT_GT(n_system, 400u);
  ASSERT_TRUE(wait_metric("tandem_kv_cells_used", 0));
  const int64_t reused0 = metric("tandem_prompt_tokens_reused_total");
  RawStream first(server_->port(),
                  json{{"prompt", system + "First question"}, {"max_tokens", 2000}, {"ignore_eos", true}});
  ASSERT_TRUE(first.wait_for_tokens(1));  // prefilled: its prompt is in the KV
  const int64_t used1 = metric("tandem_kv_cells_used");
  RawStream second(server_->port(),
                   json{{"prompt", system + "Second question"}, {"max_tokens", 2000}, {"ignore_eos", true}});
  ASSERT_TRUE(second.wait_for_tokens(1));
  const int64_t used2 = metric("tandem_kv_cells_used");
  // Without sharing the second request would add its whole prompt (> 400 cells); with it, only its own
  // tail and the tokens both generated meanwhile (a few steps' worth).
  EXPECT_GE(used1, int64_t(n_system));
  EXPECT_LT(used2 - used1, int64_t(n_system) / 2) << "used " << used1 << " then " << used2;
  EXPECT_GE(metric("tandem_prompt_tokens_reused_total") - reused0, int64_t(n_system) - 16);
}

TEST_F(Serve, MetricsCountTokensLatenciesAndKv) {
  post("/v1/completions",
       {{"prompt", "Metrics"}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}});
  auto c = client();
  auto r = c.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  for (const char* name :
       {"tandem_requests_running", "tandem_requests_queued", "tandem_prompt_tokens_total",
        "tandem_generated_tokens_total", "tandem_tokens_per_second", "tandem_kv_cells_used",
        "tandem_kv_cells_total", "tandem_time_to_first_token_seconds_bucket",
        "tandem_inter_token_latency_seconds_bucket"})
    EXPECT_NE(r->body.find(std::string("\n") + name), std::string::npos) << name;
  EXPECT_GE(metric("tandem_generated_tokens_total"), 5);
  EXPECT_GE(metric("tandem_prompt_tokens_total"), 1);
  EXPECT_GE(metric("tandem_time_to_first_token_seconds_count"), 1);
  EXPECT_GE(metric("tandem_inter_token_latency_seconds_count"), 4);
  EXPECT_GE(metric("tandem_kv_cells_total"), 8192);
}

// A server with one slot and a queue of one: a second request waits (then 503 after --queue-timeout), a
// third is refused at once with 503; the server still serves when the slot is free again.
TEST(ServeAdmission, FullQueueAndQueueTimeoutAre503) {
  ServerProcess s("--parallel 1 --ctx 8192 --max-queue 1 --queue-timeout 2");
  ASSERT_GT(s.port(), 0);
  auto runner = std::make_unique<RawStream>(
      s.port(), json{{"prompt", "Long"}, {"max_tokens", 8000}, {"ignore_eos", true}});
  ASSERT_TRUE(runner->wait_for_tokens(1));
  int waited_status = 0;
  std::string waited_body;
  std::thread waiter([&] {
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(60, 0);
    auto r =
        c.Post("/v1/completions", json{{"prompt", "Queued"}, {"max_tokens", 2}}.dump(), "application/json");
    if (r) waited_status = r->status, waited_body = r->body;
  });
  ASSERT_TRUE(wait_metric_at(s.port(), "tandem_requests_queued", 1));
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(60, 0);
  auto full =
      c.Post("/v1/completions", json{{"prompt", "Third"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 503);
  EXPECT_NE(full->body.find("queue is full"), std::string::npos) << full->body;
  waiter.join();
  EXPECT_EQ(waited_status, 503);
  EXPECT_NE(waited_body.find("\"error\""), std::string::npos);
  runner.reset();  // the slot frees at once
  ASSERT_TRUE(wait_metric_at(s.port(), "tandem_requests_running", 0));
  auto ok = c.Post("/v1/completions", json{{"prompt", "Now"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_GE(metric_at(s.port(), "tandem_requests_rejected_total"), 2);
}

// --draft: speculative decoding inside the scheduler. Greedy output equals `tandem generate` (plain decoding)
// alone and among concurrent streams, a seeded sampled answer is the same every time, and /metrics shows the
// drafts verified and accepted (the shipped draft model was trained on the same text as the main model).
TEST(ServeSpeculative, GreedyEqualsPlainDecodingAndDraftsAreAccepted) {
  ServerProcess s(std::string("--parallel 4 --ctx 4096 --kv-unified --draft-max 4 --draft ") +
                  TANDEM_SOURCE_DIR + "/models/tandem-draft-q8_0.gguf");
  ASSERT_GT(s.port(), 0);
  auto complete = [&](const json& body) { return complete_at(s.port(), body); };
  const auto gen = tandem::test::run_tandem("generate -p 'Once upon a time' -n 24 --temp 0",
                                            tandem::test::Stderr::Discard);
  ASSERT_EQ(gen.exit_code, 0);
  const json r = complete({{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}});
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>() + "\n", gen.out);
  EXPECT_EQ(r["usage"]["completion_tokens"], 24);
  EXPECT_GT(metric_at(s.port(), "tandem_speculative_drafted_total"), 0);
  EXPECT_GT(metric_at(s.port(), "tandem_speculative_accepted_total"), 0);
  // Four greedy streams at once, each equal to its plain `generate` text.
  const std::vector<std::string> prompts = {"The cat", "A dog ran", "Once upon a time", "She said"};
  std::vector<std::string> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      if (const auto st = stream_greedy_completion(s.port(), prompts[i], 16)) got[i] = st->text[0];
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto g = tandem::test::run_tandem("generate -p '" + prompts[i] + "' -n 16 --temp 0",
                                            tandem::test::Stderr::Discard);
    EXPECT_EQ(got[i] + "\n", g.out) << prompts[i];
  }
  // Sampled: lossless acceptance with the request's own generator, so a seed repeats its text.
  const json sampled{
      {"prompt", "The dog"}, {"max_tokens", 20}, {"temperature", 0.9}, {"seed", 77}, {"ignore_eos", true}};
  const json a = complete(sampled), b = complete(sampled);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_EQ(a["usage"]["completion_tokens"], 20);
  EXPECT_TRUE(wait_metric_at(s.port(), "tandem_kv_cells_used", 0));
}

TEST(ServeSpeculative, BadDraftFlagsRefuseToStart) {
  const auto missing = tandem::test::run_tandem("serve --port 0 --draft /nonexistent/draft.gguf");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.out.find("/nonexistent/draft.gguf"), std::string::npos) << missing.out;
  const auto negative = tandem::test::run_tandem(std::string("serve --port 0 --draft-max -1 --draft ") +
                                                 TANDEM_SOURCE_DIR + "/models/tandem-draft-q8_0.gguf");
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_NE(negative.out.find("--draft-max"), std::string::npos) << negative.out;
}

// A canvas diffusion model answers through the diffusion driver: the same text as `tandem diffuse` for the
// same prompt and seed (no chat template), streamed block by block; logprobs are refused with a 400.
TEST(ServeDiffusion, ACanvasModelAnswersThroughTheDiffusionDriver) {
  const std::string model = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-diffusion-q8_0.gguf";
  ServerProcess s("-m " + model);
  ASSERT_GT(s.port(), 0);
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(300, 0);
  const json body{{"prompt", "Once upon a time"}, {"max_tokens", 64}, {"seed", 5}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  const auto cli = tandem::test::run_tandem(
      "diffuse -m " + model + " --no-chat-template -p 'Once upon a time' -n 64 --seed 5",
      tandem::test::Stderr::Discard);
  ASSERT_EQ(cli.exit_code, 0);
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>() + "\n", cli.out);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 64);
  // Streamed: the same text.
  json sbody = body;
  sbody["stream"] = true;
  auto st = c.Post("/v1/completions", sbody.dump(), "application/json");
  ASSERT_TRUE(st);
  const Streamed parsed = parse_sse(st->body, 1, false);
  EXPECT_TRUE(parsed.done);
  EXPECT_EQ(parsed.text[0], j["choices"][0]["text"].get<std::string>());
  // No token distributions to report.
  json lp = body;
  lp["logprobs"] = 2;
  auto bad = c.Post("/v1/completions", lp.dump(), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("canvas diffusion"), std::string::npos) << bad->body;
}

// A client that leaves while its request still waits for a slot: the request leaves the queue at once (not
// after --queue-timeout) and counts as cancelled.
TEST(ServeAdmission, AQueuedRequestWhoseClientLeavesIsDropped) {
  ServerProcess s("--parallel 1 --ctx 8192 --queue-timeout 120");
  ASSERT_GT(s.port(), 0);
  auto runner = std::make_unique<RawStream>(
      s.port(), json{{"prompt", "Long"}, {"max_tokens", 8000}, {"ignore_eos", true}});
  ASSERT_TRUE(runner->wait_for_tokens(1));
  {
    RawStream queued(s.port(), json{{"prompt", "Queued"}, {"max_tokens", 4}}, "/v1/completions", false);
    ASSERT_TRUE(wait_metric_at(s.port(), "tandem_requests_queued", 1));
  }  // the waiting client closes its connection
  EXPECT_TRUE(wait_metric_at(s.port(), "tandem_requests_queued", 0, 100)) << "still queued after 5 s";
  EXPECT_GE(metric_at(s.port(), "tandem_requests_cancelled_total"), 1);
  EXPECT_EQ(metric_at(s.port(), "tandem_requests_rejected_total"), 0);
}

// --device-sampling on (on the CPU here: the CPU Ops' sample_rows; on a GPU it is the default): greedy equals
// generate; a seed repeats its text, with or without logprobs (a logprobs request draws on the device too and
// only reads its row's logits), and among other requests; a bad value refuses to start.
TEST(ServeDeviceSampling, GreedyEqualsGenerateAndSeedsRepeatWithOrWithoutLogprobs) {
  ServerProcess s("--parallel 4 --ctx 4096 --kv-unified --device-sampling on");
  ASSERT_GT(s.port(), 0);
  EXPECT_NE(s.banner().find("sampling on the device"), std::string::npos) << s.banner();
  auto complete = [&](const json& body) { return complete_at(s.port(), body); };
  const auto gen = tandem::test::run_tandem("generate -p 'Once upon a time' -n 24 --temp 0",
                                            tandem::test::Stderr::Discard);
  ASSERT_EQ(gen.exit_code, 0);
  const json g = complete({{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}});
  EXPECT_EQ(g["choices"][0]["text"].get<std::string>() + "\n", gen.out);
  const json req{{"prompt", "The dog"}, {"max_tokens", 20}, {"temperature", 0.9}, {"top_k", 40},
                 {"top_p", 0.95},       {"min_p", 0.02},    {"seed", 1234},      {"ignore_eos", true}};
  const json a = complete(req), b = complete(req);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_EQ(a["usage"]["completion_tokens"], 20);
  json with_lp = req;
  with_lp["logprobs"] = 3;
  const json l = complete(with_lp);
  EXPECT_EQ(l["choices"][0]["text"], a["choices"][0]["text"]);
  ASSERT_EQ(l["choices"][0]["logprobs"]["token_logprobs"].size(), 20u) << l.dump();
  EXPECT_LE(l["choices"][0]["logprobs"]["token_logprobs"][0].get<double>(), 0.0);
  // Among three other requests in flight at once: the same text.
  std::vector<std::string> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      json r = req;
      if (i != 2) {
        r["prompt"] = "Other prompt " + std::to_string(i);
        r["seed"] = 10 + i;
      }
      httplib::Client ci("127.0.0.1", s.port());
      ci.set_read_timeout(300, 0);
      auto res = ci.Post("/v1/completions", r.dump(), "application/json");
      if (res && res->status == 200) got[size_t(i)] = json::parse(res->body)["choices"][0]["text"];
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[2], a["choices"][0]["text"].get<std::string>());
  // Another seed, another text.
  json other = req;
  other["seed"] = 4321;
  EXPECT_NE(complete(other)["choices"][0]["text"], a["choices"][0]["text"]);
  EXPECT_TRUE(wait_metric_at(s.port(), "tandem_kv_cells_used", 0));

  // auto on the CPU: the host (its Sampler), as before the flag.
  ServerProcess h("--parallel 1 --ctx 512");
  EXPECT_NE(h.banner().find("sampling on the host"), std::string::npos) << h.banner();
  const auto bad = tandem::test::run_tandem("serve --port 0 --device-sampling maybe");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--device-sampling"), std::string::npos) << bad.out;
}

TEST(ServeCli, UnknownChatTemplateRefusesToStart) {
  const auto r = tandem::test::run_tandem("serve --port 0 --chat-template no-such-template");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("chatml"), std::string::npos) << r.out;  // the message lists the known names
}

TEST(ParallelCli, SimulatesConcurrentClientsThroughTheScheduler) {
  const auto r = tandem::test::run_tandem(
      "parallel --parallel 4 --sequences 8 --prompt-min 4 --prompt-max 12 --shared 32 -n 6 --ctx 2048 "
      "--kv-unified",
      tandem::test::Stderr::Discard);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("generated tokens: 48,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rejected: 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV: peak"), std::string::npos) << r.out;
}

}  // namespace
