// Checks of a running `tandem serve --draft ...` that the CPU tests (test_serve_dflash.cpp) and the cuda:0 tests
// (test_serve_cuda.cpp) share: streams that fork a running request's prefix equal their solo texts, and a
// client that leaves mid-stream frees its target KV and its drafter cache.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "test_serve_util.h"

namespace tandem::test {

// Six greedy streams at once over four slots, while a long request holds the same 40-odd-token prefix: the
// later ones fork its cells (and the drafter its cache of those positions: DFlash its features, a draft
// model its K/V), some wait for a slot. Each text equals the one the same request got alone.
inline void expect_forking_streams_equal_solo(int port) {
  using json = nlohmann::json;
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

// A long stream closed by its client after 3 tokens: the target's KV cells and the drafter's cache are freed
// within 5 s, and the request counts as cancelled.
inline void expect_disconnect_frees_kv_and_drafter_cache(int port) {
  using json = nlohmann::json;
  ASSERT_TRUE(wait_metric_at(port, "tandem_kv_cells_used", 0));
  const int64_t cancelled0 = metric_at(port, "tandem_requests_cancelled_total");
  {
    RawStream long_one(port, json{{"prompt", "A long story"}, {"max_tokens", 3000}, {"ignore_eos", true}});
    ASSERT_TRUE(long_one.wait_for_tokens(3));
    EXPECT_GT(metric_at(port, "tandem_kv_cells_used"), 0);
    EXPECT_GT(metric_at(port, "tandem_draft_kv_cells_used"), 0);  // the drafter holds its features / K/V
  }                                                               // closed mid-stream
  EXPECT_TRUE(wait_metric_at(port, "tandem_kv_cells_used", 0, 100)) << "target KV not freed within 5 s";
  EXPECT_TRUE(wait_metric_at(port, "tandem_draft_kv_cells_used", 0, 100)) << "drafter cache not freed";
  EXPECT_EQ(metric_at(port, "tandem_requests_cancelled_total"), cancelled0 + 1);
  EXPECT_EQ(metric_at(port, "tandem_requests_running"), 0);
}

}  // namespace tandem::test
