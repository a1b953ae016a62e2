// tandem serve with a DFlash drafter (`--draft models/tandem-small-dflash-q8_0.gguf`, the kind detected from
// its architecture) over real HTTP on loopback: greedy completions equal plain `tandem generate`; concurrent
// streams (some forking a running request's prefix, with its drafter features) equal their solo texts; a
// client that disconnects frees its target KV and its drafter cache (both in /metrics); drafts are accepted;
// a seed repeats its sampled text alone and among others; drafters that do not fit are clear errors. The
// prefix-forking streams also run with a draft model (its cache forked through the same Drafter::fork).
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "test_cli_util.h"
#include "test_dflash_fixture.h"
#include "test_serve_util.h"

namespace {

using json = nlohmann::json;
using tandem::test::metric_at;
using tandem::test::metric_value_at;
using tandem::test::RawStream;
using tandem::test::ServerProcess;
using tandem::test::stream_greedy_completion;
using tandem::test::wait_metric_at;

const std::string kModels = std::string(TANDEM_SOURCE_DIR) + "/models/";
const std::string kDrafter = kModels + "tandem-small-dflash-q8_0.gguf";

class ServeDflash : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess("-t 2 --parallel 4 --ctx 4096 --kv-unified --draft-max 8 --draft '" +
                                kDrafter + "'");
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static int port() { return server_->port(); }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(300, 0);
    return c;
  }
  static json complete(const json& body) {
    auto c = client();
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json::object();
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }
  static std::string text_of(const json& r) {
    if (!r.contains("choices")) return "(no choices: " + r.dump() + ")";
    return r["choices"][0]["text"].get<std::string>();
  }
  static int64_t metric(const std::string& name) { return metric_at(port(), name); }
  static ServerProcess* server_;
};
ServerProcess* ServeDflash::server_ = nullptr;

TEST_F(ServeDflash, GreedyCompletionsEqualPlainGenerateAndDraftsAreAccepted) {
  ASSERT_GT(port(), 0) << "the server did not start with the DFlash drafter";
  const int64_t drafted0 = metric("tandem_speculative_drafted_total");
  const int64_t accepted0 = metric("tandem_speculative_accepted_total");
  for (const char* prompt : {"Once upon a time", "The little dog", "She opened the door and"}) {
    const auto gen = tandem::test::run_tandem(std::string("generate -t 2 -p '") + prompt + "' -n 24 --temp 0",
                                              tandem::test::Stderr::Discard);
    ASSERT_EQ(gen.exit_code, 0);
    const json r = complete({{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}});
    EXPECT_EQ(text_of(r) + "\n", gen.out) << prompt;
  }
  // Acceptance, for the DFlash drafter (the shipped one was trained on the target's own greedy text).
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("tandem_speculative_drafter{kind=\"dflash\"} 1"), std::string::npos) << m->body;
  EXPECT_GT(metric("tandem_speculative_drafted_total"), drafted0);
  EXPECT_GT(metric("tandem_speculative_accepted_total"), accepted0);
  EXPECT_GT(metric_value_at(port(), "tandem_speculative_mean_accepted_length"), 1.0);
  EXPECT_GT(metric_value_at(port(), "tandem_speculative_acceptance_rate"), 0.0);
}

// Six greedy streams at once over four slots, while a long request holds the same 40-odd-token prefix: the
// later ones fork its cells (and the drafter its cache of those positions: DFlash its features, a draft
// model its K/V), some wait for a slot. Each text equals the one the same request got alone.
void expect_forking_streams_equal_solo(int port) {
  auto complete = [&](const json& body) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(300, 0);
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200) return std::string("(failed: ") + (r ? r->body : "no answer") + ")";
    return json::parse(r->body)["choices"][0]["text"].get<std::string>();
  };
  std::string prefix;
  for (int i = 0; i < 4; ++i) prefix += "The quick brown fox jumps over the lazy dog. ";
  const int n = 6;
  std::vector<std::string> prompts, solo(n);
  for (int i = 0; i < n; ++i) prompts.push_back(prefix + "Story " + std::to_string(i) + ": once");
  for (int i = 0; i < n; ++i)
    solo[size_t(i)] = complete({{"prompt", prompts[size_t(i)]}, {"max_tokens", 24}, {"temperature", 0}});
  ASSERT_TRUE(wait_metric_at(port, "tandem_kv_cells_used", 0));
  const int64_t reused0 = metric_at(port, "tandem_prompt_tokens_reused_total");
  std::vector<std::string> got(n);
  std::vector<bool> done(n);
  {
    RawStream holder(port,
                     json{{"prompt", prefix + "A long one"}, {"max_tokens", 1000}, {"ignore_eos", true}});
    ASSERT_TRUE(holder.wait_for_tokens(1));  // its prompt is in the KV: a prefix to fork
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
      threads.emplace_back([&, i] {
        const auto s = stream_greedy_completion(port, prompts[size_t(i)], 24);
        if (!s) return;
        got[size_t(i)] = s->text[0];
        done[size_t(i)] = s->done;
      });
    for (auto& t : threads) t.join();
  }  // the holder's client leaves
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(done[size_t(i)]) << i;
    EXPECT_EQ(got[size_t(i)], solo[size_t(i)]) << i;
  }
  // The prefix (40-odd tokens, whole blocks of 16 at least) was forked for every one of them.
  EXPECT_GE(metric_at(port, "tandem_prompt_tokens_reused_total") - reused0, int64_t(n) * 32);
  EXPECT_TRUE(wait_metric_at(port, "tandem_kv_cells_used", 0));
  EXPECT_TRUE(wait_metric_at(port, "tandem_draft_kv_cells_used", 0));
}

TEST_F(ServeDflash, ConcurrentStreamsEqualTheirSoloTextsAlsoWhenForkingAPrefix) {
  ASSERT_GT(port(), 0);
  expect_forking_streams_equal_solo(port());
}

// The same with a draft model (Drafter::fork forks its cached K/V instead of decoding the prefix again).
TEST(ServeDraftModel, ConcurrentStreamsEqualTheirSoloTextsAlsoWhenForkingAPrefix) {
  ServerProcess s("-t 2 --parallel 4 --ctx 4096 --kv-unified --draft-max 4 --draft '" + kModels +
                  "tandem-draft-q8_0.gguf'");
  ASSERT_GT(s.port(), 0);
  expect_forking_streams_equal_solo(s.port());
}

TEST_F(ServeDflash, DisconnectMidStreamFreesTargetKvAndDrafterCache) {
  ASSERT_GT(port(), 0);
  ASSERT_TRUE(wait_metric_at(port(), "tandem_kv_cells_used", 0));
  const int64_t cancelled0 = metric("tandem_requests_cancelled_total");
  {
    RawStream long_one(port(), json{{"prompt", "A long story"}, {"max_tokens", 3000}, {"ignore_eos", true}});
    ASSERT_TRUE(long_one.wait_for_tokens(3));
    EXPECT_GT(metric("tandem_kv_cells_used"), 0);
    EXPECT_GT(metric("tandem_draft_kv_cells_used"), 0);  // the drafter holds its features
  }                                                      // closed mid-stream
  EXPECT_TRUE(wait_metric_at(port(), "tandem_kv_cells_used", 0, 100)) << "target KV not freed within 5 s";
  EXPECT_TRUE(wait_metric_at(port(), "tandem_draft_kv_cells_used", 0, 100)) << "drafter cache not freed";
  EXPECT_EQ(metric("tandem_requests_cancelled_total"), cancelled0 + 1);
  EXPECT_EQ(metric("tandem_requests_running"), 0);
}

// Sampled requests: the lossless acceptance test with the request's own generator and the drafter's own
// per-request sampler, so a seed repeats its text alone and among other requests; another seed differs.
TEST_F(ServeDflash, SeededSampledRequestsRepeat) {
  ASSERT_GT(port(), 0);
  const json req{{"prompt", "The dog"}, {"max_tokens", 20}, {"temperature", 0.8},
                 {"top_k", 40},         {"seed", 77},       {"ignore_eos", true}};
  const json a = complete(req);
  const std::string alone = text_of(a);
  EXPECT_EQ(a["usage"]["completion_tokens"], 20);
  EXPECT_EQ(text_of(complete(req)), alone);
  std::vector<std::string> got(5);
  std::vector<std::thread> threads;
  for (int i = 0; i < 5; ++i)
    threads.emplace_back([&, i] {
      json r = req;
      if (i != 2) {
        r["prompt"] = "Other prompt " + std::to_string(i);
        r["seed"] = 100 + i;
      }
      got[size_t(i)] = text_of(complete(r));
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[2], alone);
  json other = req;
  other["seed"] = 4321;
  EXPECT_NE(text_of(complete(other)), alone);
}

std::filesystem::path temp_file(const std::string& tag) {
  return std::filesystem::temp_directory_path() /
         ("tandem_serve_dflash_" + tag + "_" + std::to_string(::getpid()) + ".gguf");
}

// Drafters that do not fit: each a clear message naming the problem and a non-zero exit, before listening.
TEST(ServeDflashErrors, DraftersThatDoNotFitRefuseToStart) {
  using tandem::testing::make_tiny_dflash;
  using tandem::testing::TinyDflashConfig;
  using tandem::testing::write_tiny_dflash;
  // The shipped target is 512 wide; this drafter 64.
  const auto narrow = temp_file("narrow");
  write_tiny_dflash(make_tiny_dflash(TinyDflashConfig{}), narrow);
  // Of the target's width, but with a head of its own over 16 tokens (no d2t map to the target's).
  TinyDflashConfig dc = tandem::testing::shipped_shape_dflash_config();
  dc.own_embeddings = true;
  dc.n_vocab_own = 16;
  const auto small_vocab = temp_file("vocab");
  write_tiny_dflash(make_tiny_dflash(dc), small_vocab);
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"--draft '" + narrow.string() + "'", "hidden size (64) differs from its target's (512)"},
      {"--draft '" + small_vocab.string() + "'", "vocabulary (16) differs from the target's"},
      // Not a drafter: a text file, a target model named a DFlash drafter, a drafter named a draft model.
      {"--draft '" + std::string(TANDEM_SOURCE_DIR) + "/README.md'", "README.md"},
      {"--spec dflash --draft '" + kModels + "tandem-draft-q8_0.gguf'", "is a qwen3 model"},
      {"--spec draft --draft '" + kDrafter + "'", "is a dflash model"},
      {"--spec diffusion --draft '" + kDrafter + "'", "--spec must be draft or dflash"},
  };
  for (const Case& c : cases) {
    const auto r = tandem::test::run_tandem("serve --port 0 -t 2 --parallel 2 --ctx 1024 " + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.find("listening on"), std::string::npos) << c.args;
  }
  std::filesystem::remove(narrow);
  std::filesystem::remove(small_vocab);
}

}  // namespace
