// tandem's forward pass against transformers' own numbers, in CI without a GPU or PyTorch: tests/data/models/
// holds tiny random qwen3 / llama models (GGUF, converted by `tandem convert --type f32` from the Hugging
// Face checkpoint) and the float32 logits transformers produced for a fixed token sequence, plus
// transformers' greedy continuation. Both were made by tests/reference/run_model_parity.sh on the GPU
// machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/session.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

fs::path fixture_dir() {
  return fs::path(TANDEM_SOURCE_DIR) / "tests" / "data" / "models";
}

// max |a - b| / max |b|, as tests/reference/model_parity.py defines it.
double row_rel_error(std::span<const float> a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den > 0 ? num / den : num;
}

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, LogitsAndGreedyTokensMatchTransformers) {
  const fs::path json_path = fixture_dir() / (GetParam() + ".json");
  if (!fs::exists(json_path)) GTEST_SKIP() << json_path << " is not there yet (see tests/reference/)";
  std::ifstream in(json_path);
  const nlohmann::json fx = nlohmann::json::parse(in);
  const auto tokens = fx.at("tokens").get<std::vector<int32_t>>();
  const auto prompt = fx.at("prompt").get<std::vector<int32_t>>();
  const auto greedy = fx.at("greedy").get<std::vector<int32_t>>();
  const auto logits = fx.at("logits").get<std::vector<std::vector<double>>>();
  const double tol = fx.at("relative_tolerance").get<double>();
  ASSERT_EQ(logits.size(), tokens.size());
  ASSERT_EQ(tokens.size(), prompt.size() + greedy.size() - 1);

  ModelParams mp;
  mp.n_threads = 2;
  auto model = Model::load((fixture_dir() / fx.at("model").get<std::string>()).string(), mp);
  ASSERT_EQ(model->info().n_vocab, int64_t(logits[0].size()));
  SessionParams sp;
  sp.n_ctx = 64;
  sp.kv_type = KvType::F32;
  sp.block_size = 4;  // several blocks, a partial last one
  Session s(model, sp);

  // Every prompt row at once, then the greedy continuation one token at a time.
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], int32_t(i), 0, true);
  s.decode(b);
  double worst = 0;
  std::vector<int32_t> generated;
  for (size_t i = 0; i < prompt.size(); ++i) worst = std::max(worst, row_rel_error(s.logits(i), logits[i]));
  generated.push_back(argmax(s.logits(prompt.size() - 1)));
  for (size_t i = prompt.size(); i < tokens.size(); ++i) {
    b.clear();
    b.add(tokens[i], int32_t(i), 0, true);  // transformers' token, so the rows stay comparable
    s.decode(b);
    worst = std::max(worst, row_rel_error(s.logits(0), logits[i]));
    generated.push_back(argmax(s.logits(0)));
  }
  EXPECT_LE(worst, tol);
  EXPECT_EQ(generated, greedy);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", worst);
  RecordProperty("max_rel_error", buf);
}

INSTANTIATE_TEST_SUITE_P(Models, HfFixture, ::testing::Values("qwen3_tiny", "llama_tiny"));

}  // namespace
}  // namespace tandem
