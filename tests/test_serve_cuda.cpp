// tandem serve with speculative decoding on cuda:0, over real HTTP on loopback (skipped without a GPU): the
// target, the drafter and (DFlash) the hidden-state features that pass between them live on the GPU. The CPU
// versions are in test_serve_dflash.cpp. Greedy completions equal `tandem generate` with the same drafter on
// cuda:0 (whose output equals plain greedy decoding: DflashGpu / SpecGpu); both run batch-invariant
// (`serve --batch-invariant`; generate --draft turns it on for greedy requests), so a row's logits do not depend on
// the rows of other requests verified beside it.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "test_cli_util.h"
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
const std::string kDflash = kModels + "tandem-small-dflash-q8_0.gguf";
const std::string kDraftModel = kModels + "tandem-draft-q8_0.gguf";
const std::string kServeCuda = "--devices cuda:0 --batch-invariant -t 2 --parallel 4 --ctx 4096 --kv-unified ";

bool have_gpu() {
  return tandem::device_count(tandem::DeviceKind::CUDA) > 0;
}

class ServeCudaDflash : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (have_gpu()) server_ = new ServerProcess(kServeCuda + "--draft-max 8 --draft '" + kDflash + "'");
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    ASSERT_GT(port(), 0) << "the server did not start on cuda:0 with the DFlash drafter";
  }
  static int port() { return server_ ? server_->port() : 0; }
  static ServerProcess* server_;
};
ServerProcess* ServeCudaDflash::server_ = nullptr;

TEST_F(ServeCudaDflash, GreedyCompletionsEqualGenerateWithTheDrafterOnCuda) {
  const int64_t drafted0 = metric_at(port(), "tandem_speculative_drafted_total");
  const int64_t accepted0 = metric_at(port(), "tandem_speculative_accepted_total");
  httplib::Client c("127.0.0.1", port());
  c.set_read_timeout(300, 0);
  for (const char* prompt : {"Once upon a time", "The little dog", "She opened the door and"}) {
    const auto gen = tandem::test::run_tandem("generate --devices cuda:0 -t 2 --draft-max 8 --draft '" + kDflash +
                                                  "' -p '" + prompt + "' -n 24 --temp 0",
                                              tandem::test::Stderr::Discard);
    ASSERT_EQ(gen.exit_code, 0);
    auto r = c.Post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}}.dump(),
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["text"].get<std::string>() + "\n", gen.out) << prompt;
  }
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("tandem_speculative_drafter{kind=\"dflash\"} 1"), std::string::npos) << m->body;
  EXPECT_GT(metric_at(port(), "tandem_speculative_drafted_total"), drafted0);
  EXPECT_GT(metric_at(port(), "tandem_speculative_accepted_total"), accepted0);
  EXPECT_GT(metric_value_at(port(), "tandem_speculative_mean_accepted_length"), 1.0);
}

TEST_F(ServeCudaDflash, ConcurrentStreamsEqualTheirSoloTextsAlsoWhenForkingAPrefix) {
  expect_forking_streams_equal_solo(port());
}

TEST_F(ServeCudaDflash, DisconnectMidStreamFreesTargetKvAndDrafterCache) {
  expect_disconnect_frees_kv_and_drafter_cache(port());
}

TEST(ServeCudaDraftModel, ConcurrentStreamsEqualTheirSoloTextsAlsoWhenForkingAPrefix) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ServerProcess s(kServeCuda + "--draft-max 4 --draft '" + kDraftModel + "'");
  ASSERT_GT(s.port(), 0) << "the server did not start on cuda:0 with the draft model";
  expect_forking_streams_equal_solo(s.port());
}

}  // namespace
