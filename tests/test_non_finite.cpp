// A model whose weights hold NaN or Inf: generate (first step) and perplexity (every window) fail with an
// error that says the logits are not finite and where the values first appear, instead of junk text or
// "PPL nan" with exit 0.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include "core/error.h"
#include "eval/perplexity.h"
#include "tandem/generator.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "test_cli_util.h"
#include "test_model_fixture.h"

namespace tandem {
namespace {

struct BrokenModel {
  std::filesystem::path path;
  // value written into one weight of `layer` (-1: the token embedding of token 3)
  BrokenModel(float value, int64_t layer, const std::string& name) {
    path = std::filesystem::temp_directory_path() /
           ("tandem_nonfinite_" + std::to_string(::getpid()) + "_" + name + ".gguf");
    testing::TinyConfig c;
    c.n_layer = 3;
    testing::TinyModel m = testing::make_tiny(c);
    if (layer >= 0) {
      for (float& v : m.w[testing::blk_name(layer, "ffn_down.weight")]) v = value;
    } else {
      std::vector<float>& e = m.w["token_embd.weight"];
      for (int64_t i = 0; i < c.n_embd; ++i) e[size_t(3 * c.n_embd + i)] = value;
    }
    testing::write_tiny_gguf(m, path);
  }
  ~BrokenModel() { std::filesystem::remove(path); }
};

std::string generate_error(const std::string& path, std::vector<int32_t> prompt) {
  auto model = Model::load(path);
  Session s(model, SessionParams{});
  Generator gen(s);
  GenerationParams gp;
  gp.max_tokens = 4;
  gen.add_request(prompt, gp);
  try {
    gen.run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NonFinite, GenerateFailsAtTheFirstStepAndNamesTheLayer) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  {
    BrokenModel m(nan, 1, "nan_l1");
    const std::string err = generate_error(m.path.string(), {1, 2, 3, 4});
    EXPECT_NE(err.find("not finite (NaN or Inf) at the first step"), std::string::npos) << err;
    EXPECT_NE(err.find("the output of layer 1"), std::string::npos) << err;
  }
  {
    BrokenModel m(inf, 2, "inf_l2");
    const std::string err = generate_error(m.path.string(), {1, 2, 3, 4});
    EXPECT_NE(err.find("not finite"), std::string::npos) << err;
    EXPECT_NE(err.find("the output of layer 2"), std::string::npos) << err;
  }
  {
    BrokenModel m(nan, -1, "nan_embd");
    const std::string err = generate_error(m.path.string(), {1, 3, 2});
    EXPECT_NE(err.find("the token embeddings"), std::string::npos) << err;
  }
  {  // a finite model is not reported
    BrokenModel m(0.01f, 1, "fine");
    EXPECT_EQ(generate_error(m.path.string(), {1, 2, 3, 4}), "");
  }
}

TEST(NonFinite, PerplexityFailsInsteadOfPrintingNan) {
  BrokenModel m(std::numeric_limits<float>::quiet_NaN(), 0, "ppl");
  auto model = Model::load(m.path.string());
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(int32_t(1 + i % 50));
  eval::PerplexityParams pp;
  pp.ctx = 16;
  try {
    eval::compute_perplexity(model, tokens, pp);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string err = e.what();
    EXPECT_NE(err.find("not finite (NaN or Inf) at window 1 of"), std::string::npos) << err;
    EXPECT_NE(err.find("the output of layer 0"), std::string::npos) << err;
  }
}

TEST(NonFinite, TheCommandsExitNonZero) {
  BrokenModel m(std::numeric_limits<float>::quiet_NaN(), 1, "cli");
  const auto g = test::run_tandem("generate -m '" + m.path.string() + "' --prompt-ids 1,2,3 -n 4 --ids");
  EXPECT_EQ(g.exit_code, 1) << g.out;
  EXPECT_NE(g.out.find("not finite"), std::string::npos) << g.out;
}

}  // namespace
}  // namespace tandem
