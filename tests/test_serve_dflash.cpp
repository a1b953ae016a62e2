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
#include "test_serve_spec_checks.h"
#include "test_serve_util.h"

namespace {

using json = nlohmann::json;
using tandem::test::expect_disconnect_frees_kv_and_drafter_cache;
using tandem::test::expect_forking_streams_equal_solo;
using tandem::test::metric_at;
using tandem::test::metric_value_at;
using tandem::test::ServerProcess;

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
  expect_disconnect_frees_kv_and_drafter_cache(port());
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
