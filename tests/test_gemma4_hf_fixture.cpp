// gemma4 against transformers' own numbers in CI: tests/data/models/gemma4_tiny.gguf and .json are written by
// tests/reference/gemma4_parity.py (scripts/device/gemma4.sh, $OUT/fixtures) on the GPU machine: a random
// Gemma4ForCausalLM, its GGUF, transformers' float32 logits of every prompt row and its greedy continuation.
// gemma4_moe_tiny.* is the same for a mixture-of-experts model (C.5). Until they are committed the tests
// skip, saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/session.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

class Gemma4HfFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(Gemma4HfFixture, LogitsAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam();
  const fs::path dir = fs::path(TANDEM_SOURCE_DIR) / "tests" / "data" / "models";
  const fs::path gguf = dir / (name + ".gguf"), ref = dir / (name + ".json");
  if (!fs::exists(gguf) || !fs::exists(ref))
    GTEST_SKIP() << "no " << name << " fixture yet: run scripts/device/gemma4.sh and commit $OUT/fixtures/"
                 << name << ".*";
  std::ifstream in(ref);
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::vector<int32_t> prompt = j.at("prompt").get<std::vector<int32_t>>();
  const std::vector<std::vector<double>> logits = j.at("logits").get<std::vector<std::vector<double>>>();
  const std::vector<int32_t> greedy = j.at("greedy").get<std::vector<int32_t>>();
  ASSERT_EQ(logits.size(), prompt.size());
  ModelParams mp;
  mp.n_threads = 1;
  auto model = Model::load(gguf.string(), mp);
  SessionParams sp;
  sp.n_ctx = 256;
  sp.n_seq_max = 1;
  sp.kv_type = KvType::F32;
  sp.n_batch = 64;
  Session s(model, sp);
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], int32_t(i), 0, true);
  s.decode(b);
  for (size_t r = 0; r < prompt.size(); ++r) {
    const auto row = s.logits(r);
    ASSERT_EQ(row.size(), logits[r].size());
    double num = 0, den = 0;
    for (size_t i = 0; i < row.size(); ++i) {
      num = std::max(num, std::abs(double(row[i]) - logits[r][i]));
      den = std::max(den, std::abs(logits[r][i]));
    }
    EXPECT_LE(num / den, 1e-3) << "prompt row " << r;
  }
  std::vector<int32_t> out{argmax(s.logits(prompt.size() - 1))};
  int32_t pos = int32_t(prompt.size());
  while (out.size() < greedy.size()) {
    Batch g;
    g.add(out.back(), pos++, 0, true);
    s.decode(g);
    out.push_back(argmax(s.logits(0)));
  }
  EXPECT_EQ(out, greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, Gemma4HfFixture, ::testing::Values("gemma4_tiny", "gemma4_moe_tiny"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param) == "gemma4_tiny" ? "Dense" : "Moe";
                         });

}  // namespace
}  // namespace tandem
