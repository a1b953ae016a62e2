// `tandem generate` end to end (the binary at TANDEM_BIN) on tiny random models: greedy ids against the
// library and the reference forward, --parallel against single runs, several prompts in one batch, EOS, text
// in and out, and every bad input giving one clear line and a non-zero exit.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/session.h"
#include "test_model_fixture.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Generate : public ::testing::Test {
 protected:
  static fs::path dir() {
    static const fs::path d = [] {
      fs::path p = fs::temp_directory_path() / ("tandem_test_generate_" + std::to_string(::getpid()));
      fs::create_directories(p);
      return p;
    }();
    return d;
  }
  static void TearDownTestSuite() { fs::remove_all(dir()); }

  RunResult run(const std::string& args) {
    const fs::path out = dir() / "stdout.txt", err = dir() / "stderr.txt";
    const std::string cmd =
        std::string(TANDEM_BIN) + " generate " + args + " >" + out.string() + " 2>" + err.string();
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  // A tiny model file (written once per name).
  static fs::path model_file(const std::string& name, const testing::TinyConfig& c,
                             const testing::WriteOptions& o = {}) {
    const fs::path p = dir() / (name + ".gguf");
    if (!fs::exists(p)) testing::write_tiny_gguf(testing::make_tiny(c), p, o);
    return p;
  }
  static testing::TinyConfig qwen3() {
    testing::TinyConfig c;
    c.n_vocab = 96;
    return c;
  }
};

std::vector<int32_t> ids_of_line(const std::string& line) {
  std::vector<int32_t> v;
  std::istringstream in(line);
  for (int32_t x; in >> x;) v.push_back(x);
  return v;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Greedy continuation through the library (the same Session the command uses).
std::vector<int32_t> library_greedy(const fs::path& model_path, const std::vector<int32_t>& prompt, int n) {
  auto model = Model::load(model_path.string());
  SessionParams sp;
  sp.n_ctx = 256;
  Session s(model, sp);
  Batch b;
  b.add_sequence(prompt, 0, 0, true);
  s.decode(b);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = argmax(s.logits(b.size() - 1));
    out.push_back(t);
    b.clear();
    b.add(t, s.seq_len(0), 0, true);
    s.decode(b);
  }
  return out;
}

TEST_F(Generate, GreedyIdsMatchTheLibraryAndTheReference) {
  const auto c = qwen3();
  const fs::path m = model_file("q", c);
  const RunResult r =
      run("-m " + m.string() + " --prompt-ids 1,2,3,4,5 -n 8 --temp 0 --ids --ignore-eos -t 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto got = ids_of_line(r.out);
  ASSERT_EQ(got.size(), 8u) << r.out;
  EXPECT_EQ(got, library_greedy(m, {1, 2, 3, 4, 5}, 8));
  // the first tokens against the double-precision reference (f16 KV cache: compare only where the margin is
  // clear)
  std::vector<int32_t> seq = {1, 2, 3, 4, 5};
  const testing::TinyModel tiny = testing::make_tiny(c);
  for (int i = 0; i < 3; ++i) {
    const auto ref = testing::reference_forward(tiny, seq);
    const auto& last = ref.logits.back();
    const int32_t best = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    EXPECT_EQ(got[size_t(i)], best) << "step " << i;
    seq.push_back(best);
  }
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

TEST_F(Generate, ParallelSequencesEqualSingleRunsWithSeedPlusI) {
  const fs::path m = model_file("q", qwen3());
  const std::string common = "-m " + m.string() +
                             " --prompt-ids 7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23 "
                             "-n 12 --ids --ignore-eos -t 2 --temp 1.0 --top-k 20 --top-p 0.9 --min-p 0.02 ";
  const RunResult par = run(common + "--parallel 4 --seed 100");
  ASSERT_EQ(par.rc, 0) << par.err;
  const auto par_lines = lines(par.out);
  ASSERT_EQ(par_lines.size(), 4u) << par.out;
  std::set<std::string> distinct;
  for (int i = 0; i < 4; ++i) {
    const RunResult one = run(common + "--seed " + std::to_string(100 + i));
    ASSERT_EQ(one.rc, 0) << one.err;
    EXPECT_EQ(ids_of_line(par_lines[size_t(i)]), ids_of_line(one.out)) << "sequence " << i;
    EXPECT_EQ(ids_of_line(par_lines[size_t(i)]).size(), 12u);
    distinct.insert(par_lines[size_t(i)]);
  }
  EXPECT_GT(distinct.size(), 1u);  // different seeds, different samples
  // greedy: all sequences identical
  const RunResult greedy = run(common + "--parallel 3 --temp 0");
  ASSERT_EQ(greedy.rc, 0) << greedy.err;
  const auto g = lines(greedy.out);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0], g[1]);
  EXPECT_EQ(g[0], g[2]);
}

TEST_F(Generate, SeveralPromptsInOneBatchEqualSeparateRuns) {
  const fs::path m = model_file("q", qwen3());
  const std::string common = "-m " + m.string() + " -n 6 --ids --ignore-eos --temp 0 -t 2 ";
  const RunResult both = run(common + "--prompt-ids '3,1,4,1,5;9,2,6'");
  ASSERT_EQ(both.rc, 0) << both.err;
  const auto l = lines(both.out);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(ids_of_line(l[0]), ids_of_line(run(common + "--prompt-ids 3,1,4,1,5").out));
  EXPECT_EQ(ids_of_line(l[1]), ids_of_line(run(common + "--prompt-ids 9,2,6").out));
}

TEST_F(Generate, StopsAtTheEndOfGenerationToken) {
  auto c = qwen3();
  const fs::path m = model_file("q", c);
  const RunResult r = run("-m " + m.string() + " --prompt-ids 1,2,3 -n 5 --temp 0 --ids -t 2 --ignore-eos");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto ids = ids_of_line(r.out);
  ASSERT_EQ(ids.size(), 5u);
  // Same weights, but the third greedy token is declared the EOS token: generation stops before it.
  testing::WriteOptions o;
  o.extra_keys["tokenizer.ggml.eos_token_id"] = gguf::Value::u32(uint32_t(ids[2]));
  const fs::path eos_model = model_file("q_eos" + std::to_string(ids[2]), c, o);
  const RunResult stop = run("-m " + eos_model.string() + " --prompt-ids 1,2,3 -n 5 --temp 0 --ids -t 2");
  ASSERT_EQ(stop.rc, 0) << stop.err;
  std::vector<int32_t> expect(ids.begin(), ids.begin() + 2);
  if (ids[0] == ids[2])
    expect.clear();
  else if (ids[1] == ids[2])
    expect.resize(1);
  EXPECT_EQ(ids_of_line(stop.out), expect);
}

// A byte-level BPE vocabulary of the 256 bytes (GPT-2's byte-to-unicode mapping) plus an end token.
gguf::Value byte_level_tokens() {
  std::vector<std::string> toks(256);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
    std::string s;
    if (cp < 0x80) {
      s += char(cp);
    } else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
    toks[size_t(b)] = s;
  }
  toks.push_back("<|endoftext|>");
  return gguf::Value::string_array(toks);
}

TEST_F(Generate, TextPromptAndStreamedTextOutput) {
  auto c = qwen3();
  c.n_vocab = 257;
  testing::WriteOptions o;
  o.extra_keys["tokenizer.ggml.model"] = gguf::Value::string("gpt2");
  o.extra_keys["tokenizer.ggml.pre"] = gguf::Value::string("default");
  o.extra_keys["tokenizer.ggml.tokens"] = byte_level_tokens();
  std::vector<int32_t> types(257, 1);
  types[256] = 3;  // control
  o.extra_keys["tokenizer.ggml.token_type"] = gguf::Value::i32_array(types);
  o.extra_keys["tokenizer.ggml.merges"] = gguf::Value::string_array({});
  o.extra_keys["tokenizer.ggml.eos_token_id"] = gguf::Value::u32(256);
  const fs::path m = model_file("bytes", c, o);
  // The prompt "Hi" is the byte tokens 72, 105: the same ids through --prompt-ids give the same tokens.
  const RunResult ids = run("-m " + m.string() + " -p Hi -n 6 --temp 0 --ids --ignore-eos -t 2");
  ASSERT_EQ(ids.rc, 0) << ids.err;
  const RunResult same =
      run("-m " + m.string() + " --prompt-ids 72,105 -n 6 --temp 0 --ids --ignore-eos -t 2");
  EXPECT_EQ(ids.out, same.out);
  // Text output: the tokenizer's text of those ids, then a newline.
  const RunResult text = run("-m " + m.string() + " -p Hi -n 6 --temp 0 --ignore-eos -t 2");
  ASSERT_EQ(text.rc, 0) << text.err;
  const auto tok = tokenizer::Tokenizer::from_gguf(gguf::GgufFile::open(m.string()));
  EXPECT_EQ(tok.encode("Hi"), (std::vector<int32_t>{72, 105}));
  EXPECT_EQ(text.out, tok.decode(ids_of_line(ids.out)) + "\n");
  // --parallel text output: one block per sequence
  const RunResult par = run("-m " + m.string() + " -p Hi -n 4 --temp 0.7 --seed 1 --parallel 2 -t 2");
  ASSERT_EQ(par.rc, 0) << par.err;
  EXPECT_NE(par.out.find("=== sequence 1 (seed 2) ==="), std::string::npos) << par.out;
}

TEST_F(Generate, BadInputGivesOneClearLineAndNonZeroExit) {
  const fs::path m = model_file("q", qwen3());
  auto expect_error = [&](const std::string& args, const std::string& part) {
    const RunResult r = run(args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(part), std::string::npos) << "for " << args << ":\n" << r.err;
  };
  const std::string mm = "-m " + m.string() + " ";
  expect_error(mm + "--prompt-ids 1,2 -n -1 --ids", "-n must be >= 0");
  expect_error(mm + "--prompt-ids 1,2,3,4,5,6,7,8,9,10 --ctx 8 --ids",
               "the prompt has 10 tokens but the context holds 8");
  expect_error(mm + "--prompt-ids 1,2,96 --ids", "token id 96 is out of range");
  expect_error(mm + "--prompt-ids 1,x --ids", "'x' is not a token id");
  expect_error(mm + "--prompt-ids 1,2 --ids --parallel 0", "--parallel must be at least 1");
  expect_error(mm + "--prompt-ids 1,2 --ids --temp 1 --top-p 2", "top-p must be in [0, 1]");
  expect_error(mm + "-p hello", "tokenizer");
  expect_error(mm + "--prompt-ids 1,2 -n 300 --ctx 64 --ids --ignore-eos", "KV cache full");
  expect_error("-m " + (dir() / "missing.gguf").string() + " --prompt-ids 1 --ids", "missing.gguf");

  testing::WriteOptions o;
  o.extra_keys["general.architecture"] = gguf::Value::string("rwkv42");
  expect_error("-m " + model_file("arch", qwen3(), o).string() + " --prompt-ids 1 --ids",
               "unknown architecture 'rwkv42'; supported: llama, qwen3, gemma4");
  testing::WriteOptions miss;
  miss.skip_tensors = {"blk.1.ffn_up.weight"};
  expect_error("-m " + model_file("miss", qwen3(), miss).string() + " --prompt-ids 1 --ids",
               "missing tensor blk.1.ffn_up.weight");
  testing::WriteOptions shape;
  shape.reshape["output_norm.weight"] = {63};
  expect_error("-m " + model_file("shape", qwen3(), shape).string() + " --prompt-ids 1 --ids",
               "tensor output_norm.weight has shape {63}, expected {64}");
}

}  // namespace
}  // namespace tandem
