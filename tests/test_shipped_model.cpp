// The small model shipped in models/ (models/README.md): its file, tokenizer and forward pass stay stable.
//  - greedy decoding of a fixed prompt gives the recorded 32 ids (recorded with tandem on the CPU);
//  - the perplexity of tests/data/heldout_excerpt.txt (held-out text the model never trained on) stays within
//    1% of the recorded figure;
//  - compute_perplexity's windows agree with a direct loop over the session's logits;
//  - `tandem perplexity` prints the same figure and rejects bad input with a clear message.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "eval/default_model.h"
#include "eval/perplexity.h"
#include "gguf/gguf.h"
#include "tandem/batch.h"
#include "tandem/model.h"
#include "tandem/session.h"
#include "test_cli_util.h"
#include "test_greedy.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

const std::string kModelPath = std::string(TANDEM_SOURCE_DIR) + "/models/" + eval::kDefaultModelFile;
const std::string kDraftPath = std::string(TANDEM_SOURCE_DIR) + "/models/" + eval::kDefaultDraftFile;
const std::string kExcerptPath = std::string(TANDEM_SOURCE_DIR) + "/tests/data/heldout_excerpt.txt";

constexpr const char* kPrompt = "The Python interpreter";
// Recorded with tandem (Q8_0, CPU); the f32 GGUF gives the same ids as PyTorch for 32 tokens
// (models/README.md).
const std::vector<int32_t> kExpectedPromptIds = {0, 417, 1210, 4145};
const std::vector<int32_t> kExpectedGreedyIds = {
    306, 258, 1210, 1327, 2551, 809, 306, 2871, 287, 893, 268, 4145, 14, 394, 1210, 4145,
    306, 258, 1210, 1327, 2551, 809, 306, 2871, 287, 893, 268, 4145, 14, 394, 1210, 4145};
constexpr int32_t kExcerptCtx = 256;
constexpr double kExpectedExcerptPpl = 28.0401;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Shipped {
  std::shared_ptr<Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

Shipped load(const std::string& path) {
  Shipped s;
  s.tok = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(gguf::GgufFile::open(path)));
  ModelParams mp;
  mp.n_threads = 2;
  s.model = Model::load(path, mp);
  return s;
}

TEST(ShippedModel, FilesAndShapes) {
  for (const std::string& path : {kModelPath, kDraftPath}) {
    auto s = load(path);
    const ModelInfo& info = s.model->info();
    EXPECT_EQ(info.arch, "qwen3") << path;
    EXPECT_EQ(info.n_vocab, 8192) << path;
    EXPECT_EQ(info.bos_id, 0) << path;
    EXPECT_TRUE(s.tok->add_bos()) << path;
  }
}

TEST(ShippedModel, GreedyTokensAreStable) {
  auto s = load(kModelPath);
  const std::vector<int32_t> prompt = s.tok->encode(kPrompt, /*add_special=*/true);
  ASSERT_EQ(prompt, kExpectedPromptIds);
  const std::vector<int32_t> got = testing::plain_greedy(s.model, prompt, 32);
  EXPECT_EQ(got, kExpectedGreedyIds) << "text: " << s.tok->decode(got);
}

TEST(ShippedModel, HeldoutExcerptPerplexityWithinOnePercent) {
  auto s = load(kModelPath);
  const std::vector<int32_t> tokens = s.tok->encode(read_file(kExcerptPath), true);
  eval::PerplexityParams pp;
  pp.ctx = kExcerptCtx;
  pp.replace_first_with_bos = s.tok->add_bos();
  pp.bos_id = s.tok->bos();
  const eval::PerplexityResult r = eval::compute_perplexity(s.model, tokens, pp);
  EXPECT_GT(r.tokens_scored, 200);
  EXPECT_NEAR(r.ppl, kExpectedExcerptPpl, 0.01 * kExpectedExcerptPpl);
}

// The library's windows against a direct computation: one window over the first n tokens scores every target
// 1 .. n-1 with the logits of the token before it.
TEST(ShippedModel, PerplexityMatchesDirectLoop) {
  auto s = load(kModelPath);
  std::vector<int32_t> tokens = s.tok->encode(read_file(kExcerptPath), true);
  tokens.resize(96);
  eval::PerplexityParams pp;
  pp.ctx = 96;
  pp.stride = 48;  // one window covers everything: all 95 targets
  const eval::PerplexityResult r = eval::compute_perplexity(s.model, tokens, pp);
  ASSERT_EQ(r.tokens_scored, 95);

  SessionParams sp;
  sp.n_ctx = 96;
  sp.n_batch = 96;
  sp.n_logits_max = 96;
  sp.kv_type = KvType::F32;
  Session session(s.model, sp);
  Batch batch;
  for (size_t i = 0; i < tokens.size(); ++i) batch.add(tokens[i], int32_t(i), 0, true);
  session.decode(batch);
  double sum = 0;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) sum += eval::token_nll(session.logits(i), tokens[i + 1]);
  const double ppl = std::exp(sum / 95.0);
  EXPECT_NEAR(r.ppl, ppl, 1e-6 * ppl);
}

// Runs a shell command, returns its exit status and what it wrote (stdout and stderr).
test::CommandResult run(const std::string& cmd) {
  return test::run_command(cmd);
}

TEST(ShippedModel, PerplexityCommand) {
  const std::string base = std::string(TANDEM_BIN) + " perplexity -m " + kModelPath + " --no-progress ";
  auto [rc, out] = run(base + "-f " + kExcerptPath + " --ctx 256");
  ASSERT_EQ(rc, 0) << out;
  double ppl = 0, err = 0;
  const size_t at = out.find("PPL = ");
  ASSERT_NE(at, std::string::npos) << out;
  ASSERT_EQ(std::sscanf(out.c_str() + at, "PPL = %lf +/- %lf", &ppl, &err), 2) << out;
  EXPECT_NEAR(ppl, kExpectedExcerptPpl, 0.01 * kExpectedExcerptPpl);
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, 0.5 * ppl);
}

TEST(ShippedModel, PerplexityCommandBadInput) {
  const std::string base = std::string(TANDEM_BIN) + " perplexity -m " + kModelPath + " --no-progress ";
  struct Case {
    std::string args, message;
  };
  for (const Case& c : {Case{"-f /nonexistent/text.txt", "cannot open text file"},
                        Case{"-f " + kExcerptPath + " --ctx 1024", "exceeds the model's training context"},
                        Case{"-f " + kExcerptPath + " --ctx 64 --stride 64", "exceeds --ctx - 1"},
                        Case{"-f " + kExcerptPath + " --ctx 1", "--ctx must be in [2,"}}) {
    auto [rc, out] = run(base + c.args);
    EXPECT_EQ(rc, 1) << c.args << ": " << out;
    EXPECT_NE(out.find("error: "), std::string::npos) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << c.args << ": " << out;
  }
  auto [rc, out] = run(std::string(TANDEM_BIN) + " perplexity -m /nonexistent/model.gguf -f " + kExcerptPath);
  EXPECT_EQ(rc, 1) << out;
}

}  // namespace
}  // namespace tandem
