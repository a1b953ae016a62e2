// tandem::Generator (include/tandem/generator.h) on the shipped model and on tiny random models: the same
// tokens as a hand-written decode loop over Session, requests independent of each other in one batch, shared
// prompts forked, stop strings cut and never streamed, max_tokens, end of generation, the logits hook, bad
// requests; Model::tokenizer(); and `tandem generate --stop` end to end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "eval/default_model.h"
#include "tandem/generator.h"
#include "tandem/model.h"
#include "tandem/sampling.h"
#include "tandem/session.h"
#include "test_cli_util.h"
#include "test_model_fixture.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const std::string kShippedPath = std::string(TANDEM_SOURCE_DIR) + "/models/" + eval::kDefaultModelFile;

// ---- helpers ---------------------------------------------------------------------------------------------

std::shared_ptr<Model> load_model(const std::string& path) {
  ModelParams mp;
  mp.n_threads = 2;
  return Model::load(path, mp);
}

const std::shared_ptr<Model>& shipped() {
  static const std::shared_ptr<Model> m = load_model(kShippedPath);
  return m;
}

SamplingParams greedy_sampling() {
  SamplingParams s;
  s.temperature = 0.0f;
  return s;
}

SamplingParams random_sampling(uint64_t seed) {
  SamplingParams s;
  s.temperature = 1.0f;
  s.top_k = 20;
  s.top_p = 0.9f;
  s.min_p = 0.02f;
  s.repeat_penalty = 1.1f;
  s.seed = seed;
  return s;
}

GenerationParams gen_params(int max_tokens, const SamplingParams& s, bool ignore_eos = true) {
  GenerationParams p;
  p.max_tokens = max_tokens;
  p.sampling = s;
  p.ignore_eos = ignore_eos;
  return p;
}

SessionParams session_params(int32_t n_seq = 1, int32_t n_ctx = 256) {
  SessionParams sp;
  sp.n_ctx = n_ctx;
  sp.n_seq_max = n_seq;
  return sp;
}

// The plain decode loop over Session: one sequence, n tokens, no end of generation. With `sampling` unset the
// token is the argmax; else a Sampler that has seen the prompt, as a user would write it.
std::vector<int32_t> hand_loop(const std::shared_ptr<Model>& model, const std::vector<int32_t>& prompt, int n,
                               const SamplingParams* sampling = nullptr) {
  Session session(model, session_params());
  std::unique_ptr<Sampler> sampler;
  if (sampling) {
    sampler = std::make_unique<Sampler>(*sampling);
    sampler->accept(prompt);
  }
  Batch batch;
  batch.add_sequence(prompt, 0, 0, /*last_logits=*/true);
  session.decode(batch);
  std::vector<int32_t> out;
  while (int(out.size()) < n) {
    const auto logits = session.logits(batch.size() - 1);
    const int32_t t = sampler ? sampler->sample(logits) : argmax(logits);
    if (sampler) sampler->accept(t);
    out.push_back(t);
    if (int(out.size()) == n) break;
    batch.clear();
    batch.add(t, session.seq_len(0), 0, true);
    session.decode(batch);
  }
  return out;
}

// What a request's stream callback saw.
struct Event {
  int32_t token;
  std::string text;
  FinishReason finish;
};
struct Stream {
  std::vector<Event> events;
  std::string text() const {
    std::string s;
    for (const Event& e : events) s += e.text;
    return s;
  }
  StreamCallback callback() {
    return [this](const TokenEvent& e) { events.push_back({e.token, std::string(e.text), e.finish}); };
  }
};

// One request alone in its own session.
GenerationResult generate_alone(const std::shared_ptr<Model>& model, const std::vector<int32_t>& prompt,
                                const GenerationParams& p, Stream* stream = nullptr) {
  Session session(model, session_params());
  Generator gen(session);
  const int id = gen.add_request(prompt, p, stream ? stream->callback() : StreamCallback{});
  gen.run();
  return gen.result(id);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A text that occurs in `text` first at a position > 0 and ends before its end: a stop string to cut at.
std::string stop_string_in(const std::string& text, size_t len, size_t* first) {
  for (size_t at = text.size() / 3; at + len < text.size(); ++at) {
    const std::string s = text.substr(at, len);
    const size_t f = text.find(s);
    if (f > 0 && s.find('\'') == std::string::npos) {
      *first = f;
      return s;
    }
  }
  *first = std::string::npos;
  return {};
}

// ---- the shipped model -----------------------------------------------------------------------------------

constexpr const char* kPrompt = "The Python interpreter";

std::vector<int32_t> shipped_prompt() {
  return shipped()->tokenizer().encode(kPrompt, /*add_special=*/true);
}

TEST(StepApiGeneratorShipped, GreedyEqualsHandWrittenLoop) {
  const auto prompt = shipped_prompt();
  Stream stream;
  const GenerationResult r = generate_alone(shipped(), prompt, gen_params(32, greedy_sampling()), &stream);
  EXPECT_EQ(r.tokens, hand_loop(shipped(), prompt, 32));
  EXPECT_EQ(r.finish, FinishReason::Length);
  EXPECT_EQ(r.n_generated(), 32);
  EXPECT_EQ(r.n_prompt_tokens, int32_t(prompt.size()));
  EXPECT_GT(r.prompt_seconds, 0.0);
  EXPECT_GT(r.generation_seconds, 0.0);
  // Byte-level BPE: the streamed text is the decoded ids; one event per token, then the last one.
  EXPECT_EQ(r.text, shipped()->tokenizer().decode(r.tokens));
  EXPECT_EQ(stream.text(), r.text);
  ASSERT_EQ(stream.events.size(), 33u);
  for (size_t i = 0; i < 32; ++i) {
    EXPECT_EQ(stream.events[i].token, r.tokens[i]);
    EXPECT_EQ(stream.events[i].finish, FinishReason::None);
  }
  EXPECT_EQ(stream.events.back().token, -1);
  EXPECT_EQ(stream.events.back().finish, FinishReason::Length);
}

TEST(StepApiGeneratorShipped, SampledRequestsInOneBatchEqualEachAlone) {
  const auto prompt = shipped_prompt();
  const std::vector<int32_t> other = shipped()->tokenizer().encode("A dictionary of", true);
  Session session(shipped(), session_params(2));
  Generator gen(session);
  const int a = gen.add_request(prompt, gen_params(24, random_sampling(11)));
  const int b = gen.add_request(other, gen_params(24, random_sampling(12)));
  gen.run();
  EXPECT_EQ(gen.result(a).tokens,
            generate_alone(shipped(), prompt, gen_params(24, random_sampling(11))).tokens);
  EXPECT_EQ(gen.result(b).tokens,
            generate_alone(shipped(), other, gen_params(24, random_sampling(12))).tokens);
  const SamplingParams s11 = random_sampling(11);
  EXPECT_EQ(gen.result(a).tokens, hand_loop(shipped(), prompt, 24, &s11));
  EXPECT_EQ(gen.result(a).n_generated(), 24);
}

TEST(StepApiGeneratorShipped, StopStringIsCutAndNeverStreamed) {
  const auto prompt = shipped_prompt();
  const GenerationResult full = generate_alone(shipped(), prompt, gen_params(32, greedy_sampling()));
  for (size_t len : {1u, 4u, 9u}) {
    size_t first = 0;
    const std::string stop = stop_string_in(full.text, len, &first);
    ASSERT_NE(first, std::string::npos) << full.text;
    GenerationParams p = gen_params(32, greedy_sampling());
    p.stop = {"never in the text", stop};
    Stream stream;
    const GenerationResult r = generate_alone(shipped(), prompt, p, &stream);
    EXPECT_EQ(r.finish, FinishReason::Stop) << stop;
    EXPECT_EQ(r.text, full.text.substr(0, first)) << "stop '" << stop << "'";
    EXPECT_EQ(stream.text(), r.text);
    for (const Event& e : stream.events) EXPECT_EQ(e.text.find(stop), std::string::npos);
    EXPECT_EQ(stream.events.back().finish, FinishReason::Stop);
    // The tokens go up to the one that completed the stop string.
    ASSERT_LE(r.tokens.size(), full.tokens.size());
    EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), full.tokens.begin()));
    const std::string decoded = shipped()->tokenizer().decode(r.tokens);
    EXPECT_EQ(decoded.find(stop), first) << decoded;
    const std::vector<int32_t> fewer(r.tokens.begin(), r.tokens.end() - 1);
    EXPECT_EQ(shipped()->tokenizer().decode(fewer).find(stop), std::string::npos);
  }
}

TEST(StepApiGeneratorShipped, EarliestStopStringWins) {
  const auto prompt = shipped_prompt();
  const GenerationResult full = generate_alone(shipped(), prompt, gen_params(32, greedy_sampling()));
  size_t first = 0;
  const std::string early = stop_string_in(full.text, 5, &first);
  ASSERT_NE(first, std::string::npos);
  std::string late;  // a text that first occurs after `early`
  for (size_t at = first + 1; at + 4 <= full.text.size() && late.empty(); ++at)
    if (full.text.find(full.text.substr(at, 4)) > first) late = full.text.substr(at, 4);
  ASSERT_FALSE(late.empty()) << full.text;
  GenerationParams p = gen_params(32, greedy_sampling());
  p.stop = {late, early};
  const GenerationResult r = generate_alone(shipped(), prompt, p);
  EXPECT_EQ(r.finish, FinishReason::Stop);
  EXPECT_EQ(r.text, full.text.substr(0, first));
}

// Text that could start a stop string is held back, and released when it turns out not to be one (here: at
// the end, by the last event).
TEST(StepApiGeneratorShipped, HeldBackTextIsReleased) {
  const auto prompt = shipped_prompt();
  const GenerationResult full = generate_alone(shipped(), prompt, gen_params(32, greedy_sampling()));
  const std::string tail = full.text.substr(full.text.size() - 2);
  GenerationParams p = gen_params(32, greedy_sampling());
  p.stop = {tail + "\x01"};
  Stream stream;
  const GenerationResult r = generate_alone(shipped(), prompt, p, &stream);
  EXPECT_EQ(r.finish, FinishReason::Length);
  EXPECT_EQ(r.text, full.text);
  EXPECT_EQ(stream.text(), full.text);
  EXPECT_EQ(stream.events.back().token, -1);
  EXPECT_EQ(stream.events.back().text, tail);
}

TEST(StepApiGeneratorShipped, SharedPromptForkEqualsSeparatePrefills) {
  const auto prompt = shipped_prompt();
  Session forked_session(shipped(), session_params(3));
  Generator forked(forked_session);
  const std::vector<int> ids =
      forked.add_shared_prompt_requests(prompt, 3, gen_params(20, random_sampling(40)));
  ASSERT_EQ(ids, (std::vector<int>{0, 1, 2}));
  forked.run();
  Session separate_session(shipped(), session_params(3));
  Generator separate(separate_session);
  for (uint64_t i = 0; i < 3; ++i) separate.add_request(prompt, gen_params(20, random_sampling(40 + i)));
  separate.run();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(forked.result(i).tokens, separate.result(i).tokens) << "request " << i;
    EXPECT_EQ(forked.result(i).seq, i);
    EXPECT_EQ(forked.result(i).n_prompt_tokens, int32_t(prompt.size()));
  }
  EXPECT_NE(forked.result(0).tokens, forked.result(1).tokens);
}

// Requests added while others run (continuous batching) get the tokens they get alone.
TEST(StepApiGeneratorShipped, RequestAddedLaterEqualsItAlone) {
  const auto prompt = shipped_prompt();
  const std::vector<int32_t> later = shipped()->tokenizer().encode("The programmer", true);
  Session session(shipped(), session_params(2));
  Generator gen(session);
  const int a = gen.add_request(prompt, gen_params(16, random_sampling(5)));
  for (int i = 0; i < 5; ++i) gen.step();
  EXPECT_EQ(gen.result(a).n_generated(), 5);
  const int b = gen.add_request(later, gen_params(16, random_sampling(6)));
  gen.run();
  EXPECT_EQ(gen.result(a).tokens,
            generate_alone(shipped(), prompt, gen_params(16, random_sampling(5))).tokens);
  EXPECT_EQ(gen.result(b).tokens,
            generate_alone(shipped(), later, gen_params(16, random_sampling(6))).tokens);
}

// ---- tiny random models ----------------------------------------------------------------------------------

class StepApiGeneratorTiny : public ::testing::Test {
 protected:
  static fs::path dir() {
    static const fs::path d = [] {
      fs::path p = fs::temp_directory_path() / ("tandem_test_generator_" + std::to_string(::getpid()));
      fs::create_directories(p);
      return p;
    }();
    return d;
  }
  static void TearDownTestSuite() { fs::remove_all(dir()); }

  static testing::TinyConfig config(const std::string& arch) {
    testing::TinyConfig c;
    c.arch = arch;
    c.n_vocab = 96;
    return c;
  }
  // A tiny model file (written once per name), loaded.
  static std::shared_ptr<Model> tiny(const std::string& name, const testing::TinyConfig& c,
                                     const testing::WriteOptions& o = {}) {
    const fs::path p = dir() / (name + ".gguf");
    if (!fs::exists(p)) testing::write_tiny_gguf(testing::make_tiny(c), p, o);
    return load_model(p.string());
  }
  static std::shared_ptr<Model> qwen3() { return tiny("qwen3", config("qwen3")); }

  // A byte-level BPE vocabulary: the 256 bytes (in GPT-2's byte-to-unicode alphabet) and <|endoftext|>
  // (id 256, control), which is EOS unless eos_id says otherwise.
  static testing::WriteOptions byte_vocab(int32_t eos_id = 256) {
    std::vector<std::string> tokens;
    int next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool direct = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xFF && b != 0xAD);
      const uint32_t cp = direct ? uint32_t(b) : uint32_t(next_extra++);
      std::string s;
      if (cp < 0x80) {
        s.push_back(char(cp));
      } else {
        s.push_back(char(0xC0 | (cp >> 6)));
        s.push_back(char(0x80 | (cp & 0x3F)));
      }
      tokens.push_back(s);
    }
    tokens.push_back("<|endoftext|>");
    std::vector<int32_t> types(257, 1);  // normal
    types[256] = 3;                      // control
    testing::WriteOptions o;
    o.extra_keys["tokenizer.ggml.model"] = gguf::Value::string("gpt2");
    o.extra_keys["tokenizer.ggml.pre"] = gguf::Value::string("default");
    o.extra_keys["tokenizer.ggml.tokens"] = gguf::Value::string_array(tokens);
    o.extra_keys["tokenizer.ggml.token_type"] = gguf::Value::i32_array(types);
    o.extra_keys["tokenizer.ggml.merges"] = gguf::Value::string_array({});
    o.extra_keys["tokenizer.ggml.eos_token_id"] = gguf::Value::u32(uint32_t(eos_id));
    return o;
  }
  static testing::TinyConfig byte_config() {
    testing::TinyConfig c = config("qwen3");
    c.n_vocab = 257;
    return c;
  }
};

TEST_F(StepApiGeneratorTiny, GreedyEqualsHandWrittenLoop) {
  for (const char* arch : {"qwen3", "llama"}) {
    const auto model = tiny(arch, config(arch));
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
    const GenerationResult r = generate_alone(model, prompt, gen_params(12, greedy_sampling()));
    EXPECT_EQ(r.tokens, hand_loop(model, prompt, 12)) << arch;
    EXPECT_EQ(r.finish, FinishReason::Length);
    EXPECT_TRUE(r.text.empty());  // no tokenizer: ids only
  }
}

TEST_F(StepApiGeneratorTiny, SampledEqualsHandWrittenSamplerLoop) {
  const auto model = qwen3();
  const std::vector<int32_t> prompt = {7, 8, 9, 10, 11, 12};
  SamplingParams s = random_sampling(77);
  s.presence_penalty = 0.3f;
  s.frequency_penalty = 0.1f;
  const GenerationResult r = generate_alone(model, prompt, gen_params(16, s));
  EXPECT_EQ(r.tokens, hand_loop(model, prompt, 16, &s));
}

TEST_F(StepApiGeneratorTiny, SequencesAreIndependent) {
  const auto model = qwen3();
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {4, 5, 6, 7, 8, 9}, {10}, {1, 2, 3}};
  Session session(model, session_params(4));
  Generator gen(session);
  for (size_t i = 0; i < prompts.size(); ++i) gen.add_request(prompts[i], gen_params(10, random_sampling(i)));
  EXPECT_EQ(gen.n_requests(), 4);
  EXPECT_EQ(gen.n_running(), 4);
  gen.run();
  EXPECT_TRUE(gen.done());
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(gen.result(int(i)).tokens,
              generate_alone(model, prompts[i], gen_params(10, random_sampling(i))).tokens)
        << "request " << i;
  EXPECT_NE(gen.result(0).tokens, gen.result(3).tokens);  // same prompt, other seed
}

TEST_F(StepApiGeneratorTiny, MaxTokens) {
  const auto model = qwen3();
  Session session(model, session_params(3));
  Generator gen(session);
  const int a = gen.add_request({1, 2, 3}, gen_params(5, greedy_sampling()));
  const int b = gen.add_request({1, 2, 3}, gen_params(1, greedy_sampling()));
  Stream stream;
  const int c = gen.add_request({1, 2, 3}, gen_params(0, greedy_sampling()), stream.callback());
  gen.step();  // the prompts, and the first token of a and b; c finishes at once
  EXPECT_EQ(gen.result(c).finish, FinishReason::Length);
  EXPECT_TRUE(gen.result(c).tokens.empty());
  EXPECT_EQ(gen.result(c).prompt_seconds, 0.0);  // nothing to decode for it
  ASSERT_EQ(stream.events.size(), 1u);
  EXPECT_EQ(stream.events[0].token, -1);
  EXPECT_EQ(gen.result(b).finish, FinishReason::Length);
  EXPECT_EQ(gen.result(b).n_generated(), 1);
  EXPECT_FALSE(gen.result(a).finished());
  EXPECT_EQ(gen.n_running(), 1);
  int steps = 1;
  while (!gen.done()) {
    gen.step();
    ++steps;
  }
  EXPECT_EQ(steps, 5);  // one token per step; the last needs no forward pass
  EXPECT_EQ(gen.result(a).tokens, hand_loop(model, {1, 2, 3}, 5));
  EXPECT_EQ(gen.result(a).finish, FinishReason::Length);
  gen.step();                        // nothing left: does nothing
  EXPECT_EQ(session.seq_len(0), 0);  // a finished request gives its sequence back
}

TEST_F(StepApiGeneratorTiny, EndOfGenerationFromTheModelsEosIds) {
  const auto c = config("qwen3");
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> ids = hand_loop(qwen3(), prompt, 6);
  // Same weights, the third greedy token declared EOS.
  testing::WriteOptions o;
  o.extra_keys["tokenizer.ggml.eos_token_id"] = gguf::Value::u32(uint32_t(ids[2]));
  const auto eos_model = tiny("qwen3_eos" + std::to_string(ids[2]), c, o);
  ASSERT_FALSE(eos_model->has_tokenizer());
  const size_t first = size_t(std::find(ids.begin(), ids.end(), ids[2]) - ids.begin());
  Stream stream;
  const GenerationResult r =
      generate_alone(eos_model, prompt, gen_params(6, greedy_sampling(), false), &stream);
  EXPECT_EQ(r.finish, FinishReason::EndOfGeneration);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(ids.begin(), ids.begin() + long(first)));
  ASSERT_EQ(stream.events.size(), first + 1);
  for (const Event& e : stream.events) EXPECT_NE(e.token, ids[2]);  // the EOG token is not streamed
  EXPECT_EQ(stream.events.back().finish, FinishReason::EndOfGeneration);
  // ignore_eos runs to max_tokens.
  const GenerationResult all = generate_alone(eos_model, prompt, gen_params(6, greedy_sampling(), true));
  EXPECT_EQ(all.tokens, ids);
  EXPECT_EQ(all.finish, FinishReason::Length);
}

TEST_F(StepApiGeneratorTiny, EndOfGenerationFromTheTokenizerAndStopOnText) {
  const auto plain = tiny("bytes", byte_config(), byte_vocab());
  ASSERT_TRUE(plain->has_tokenizer());
  const std::vector<int32_t> prompt = plain->tokenizer().encode("Hi");
  const GenerationResult full = generate_alone(plain, prompt, gen_params(12, greedy_sampling()));
  ASSERT_EQ(full.n_generated(), 12);
  EXPECT_EQ(full.text, plain->tokenizer().decode(full.tokens));
  // The tokenizer's EOS (here the fourth greedy token) ends generation.
  const int32_t eos = full.tokens[3];
  const auto eos_model = tiny("bytes_eos" + std::to_string(eos), byte_config(), byte_vocab(eos));
  ASSERT_TRUE(eos_model->tokenizer().is_end_of_generation(eos));
  const GenerationResult r = generate_alone(eos_model, prompt, gen_params(12, greedy_sampling(), false));
  size_t first = 0;  // <|endoftext|> (control) ends generation too
  while (!eos_model->tokenizer().is_end_of_generation(full.tokens[first])) ++first;
  EXPECT_EQ(r.finish, FinishReason::EndOfGeneration);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + long(first)));
  // Stop strings work on any bytes the tokens stand for.
  ASSERT_GE(full.text.size(), 4u);
  const std::string stop = full.text.substr(full.text.size() / 2, 2);
  GenerationParams p = gen_params(12, greedy_sampling());
  p.stop = {stop};
  Stream stream;
  const GenerationResult cut = generate_alone(plain, prompt, p, &stream);
  EXPECT_EQ(cut.finish, FinishReason::Stop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(stream.text(), cut.text);
}

TEST_F(StepApiGeneratorTiny, UseTokenizerFalseGivesIdsOnly) {
  const auto model = tiny("bytes", byte_config(), byte_vocab());
  Session session(model, session_params());
  GeneratorParams gp;
  gp.use_tokenizer = false;
  Generator gen(session, gp);
  Stream stream;
  const int id = gen.add_request({72, 105}, gen_params(4, greedy_sampling()), stream.callback());
  gen.run();
  EXPECT_EQ(gen.result(id).n_generated(), 4);
  EXPECT_TRUE(gen.result(id).text.empty());
  EXPECT_TRUE(stream.text().empty());
  GenerationParams p = gen_params(4, greedy_sampling());
  p.stop = {"x"};
  EXPECT_NE(error_of([&] { gen.add_request({1}, p); }).find("use_tokenizer = false"), std::string::npos);
}

TEST_F(StepApiGeneratorTiny, SharedPromptForkEqualsSeparatePrefills) {
  const auto model = qwen3();
  const std::vector<int32_t> prompt = {5, 4, 3, 2, 1, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  Session a_session(model, session_params(4));
  Generator forked(a_session);
  forked.add_shared_prompt_requests(prompt, 4, gen_params(9, random_sampling(3)));
  forked.run();
  for (uint64_t i = 0; i < 4; ++i)
    EXPECT_EQ(forked.result(int(i)).tokens,
              generate_alone(model, prompt, gen_params(9, random_sampling(3 + i))).tokens)
        << "request " << i;
  // Greedy: every fork continues alike.
  Session g_session(model, session_params(3));
  Generator greedy(g_session);
  greedy.add_shared_prompt_requests(prompt, 3, gen_params(9, greedy_sampling()));
  greedy.run();
  EXPECT_EQ(greedy.result(0).tokens, hand_loop(model, prompt, 9));
  EXPECT_EQ(greedy.result(1).tokens, greedy.result(0).tokens);
  EXPECT_EQ(greedy.result(2).tokens, greedy.result(0).tokens);
}

// The logits hook sees every row that computed logits: all prompt rows (all_prompt_logits), then one row per
// running request per step, with its sequence and position.
TEST_F(StepApiGeneratorTiny, LogitsHookSeesEveryComputedRow) {
  const auto model = qwen3();
  Session session(model, session_params(2));
  GeneratorParams gp;
  gp.all_prompt_logits = true;
  struct Row {
    int request;
    int32_t seq, pos, best;
  };
  std::vector<std::vector<Row>> batches;
  gp.on_logits = [&](std::span<const LogitsRow> rows) {
    batches.emplace_back();
    for (const LogitsRow& r : rows) {
      EXPECT_EQ(r.logits.size(), 96u);
      batches.back().push_back({r.request, r.seq, r.pos, argmax(r.logits)});
    }
  };
  Generator gen(session, gp);
  gen.add_request({1, 2, 3}, gen_params(3, greedy_sampling()));
  gen.add_request({4, 5}, gen_params(2, greedy_sampling()));
  gen.run();
  ASSERT_EQ(batches.size(), 3u);  // prefill, then steps with 2 and 1 rows
  ASSERT_EQ(batches[0].size(), 5u);
  EXPECT_EQ(batches[0][2].request, 0);
  EXPECT_EQ(batches[0][2].pos, 2);
  EXPECT_EQ(batches[0][3].request, 1);
  EXPECT_EQ(batches[0][3].seq, 1);
  EXPECT_EQ(batches[0][4].pos, 1);
  ASSERT_EQ(batches[1].size(), 2u);
  EXPECT_EQ(batches[1][0].pos, 3);
  EXPECT_EQ(batches[1][1].pos, 2);
  ASSERT_EQ(batches[2].size(), 1u);
  EXPECT_EQ(batches[2][0].request, 0);
  // greedy: each request's tokens are the argmax of its last prompt row, then of its decoded rows
  EXPECT_EQ(gen.result(0).tokens,
            (std::vector<int32_t>{batches[0][2].best, batches[1][0].best, batches[2][0].best}));
  EXPECT_EQ(gen.result(1).tokens, (std::vector<int32_t>{batches[0][4].best, batches[1][1].best}));
  // With the hook, a request of max_tokens 0 still decodes its prompt.
  batches.clear();
  Generator zero(session, gp);
  zero.add_request({1, 2, 3, 4}, gen_params(0, greedy_sampling()));
  zero.run();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].size(), 4u);
  EXPECT_TRUE(zero.result(0).tokens.empty());
}

// A sequence given back by a finished request is taken by the next one.
TEST_F(StepApiGeneratorTiny, FinishedRequestsGiveTheirSequenceBack) {
  const auto model = qwen3();
  Session session(model, session_params(1));
  Generator gen(session);
  gen.add_request({1, 2, 3}, gen_params(4, random_sampling(1)));
  EXPECT_NE(error_of([&] { gen.add_request({1}, gen_params(4, greedy_sampling())); }).find("n_seq_max = 1"),
            std::string::npos);
  gen.run();
  const int b = gen.add_request({9, 8, 7}, gen_params(6, random_sampling(2)));
  EXPECT_EQ(gen.result(b).seq, 0);
  gen.run();
  EXPECT_EQ(gen.result(0).tokens, generate_alone(model, {1, 2, 3}, gen_params(4, random_sampling(1))).tokens);
  EXPECT_EQ(gen.result(b).tokens, generate_alone(model, {9, 8, 7}, gen_params(6, random_sampling(2))).tokens);
}

TEST_F(StepApiGeneratorTiny, BadRequestsThrowNamingTheProblem) {
  const auto model = qwen3();
  Session session(model, session_params(2, 16));
  Generator gen(session);
  const GenerationParams ok = gen_params(4, greedy_sampling());
  auto expect_error = [&](auto&& f, const std::string& part) {
    const std::string msg = error_of(f);
    EXPECT_NE(msg.find(part), std::string::npos) << "expected '" << part << "' in: " << msg;
  };
  expect_error([&] { gen.add_request({}, ok); }, "the prompt is empty");
  expect_error([&] { gen.add_request(std::vector<int32_t>(20, 1), ok); },
               "the prompt has 20 tokens but the context holds 16");
  expect_error([&] { gen.add_request({1, 96}, ok); }, "token id 96 is out of range");
  expect_error([&] { gen.add_request({1, -1}, ok); }, "token id -1 is out of range");
  GenerationParams p = ok;
  p.max_tokens = -1;
  expect_error([&] { gen.add_request({1}, p); }, "max_tokens must be >= 0");
  p = ok;
  p.sampling.temperature = 1.0f;
  p.sampling.top_p = 2.0f;
  expect_error([&] { gen.add_request({1}, p); }, "top-p must be in [0, 1]");
  p = ok;
  p.stop = {"a", ""};
  expect_error([&] { gen.add_request({1}, p); }, "stop string 1 is empty");
  p.stop = {"a"};
  expect_error([&] { gen.add_request({1}, p); }, "stop strings need the model's tokenizer");
  expect_error(
      [&] {
        gen.add_shared_prompt_requests({1, 2}, 3, ok);
      },
      "3 requests need 3 free sequences, but 2 of the session's 2");
  expect_error([&] { gen.add_shared_prompt_requests({1, 2}, 0, ok); }, "at least 1 request");
  expect_error([&] { (void)gen.result(0); }, "request 0 does not exist");
  EXPECT_EQ(gen.n_requests(), 0);  // nothing was added
  EXPECT_TRUE(gen.done());
  gen.add_request({1}, ok);
  gen.add_request({2}, ok);
  expect_error([&] { gen.add_request({3}, ok); },
               "all 2 sequences of the session (SessionParams::n_seq_max = 2)");
  EXPECT_EQ(gen.n_requests(), 2);
  // The session's own errors come out of step(): a full KV cache.
  Session small(model, session_params(1, 16));
  Generator full(small);
  full.add_request({1, 2, 3}, gen_params(40, greedy_sampling()));
  expect_error([&] { full.run(); }, "KV cache full");
}

TEST_F(StepApiGeneratorTiny, ModelTokenizer) {
  const auto none = qwen3();
  EXPECT_FALSE(none->has_tokenizer());
  const std::string msg = error_of([&] { (void)none->tokenizer(); });
  // the tokenizer's own message, every time
  const std::string own = error_of(
      [&] { (void)tokenizer::Tokenizer::from_gguf(gguf::GgufFile::open((dir() / "qwen3.gguf").string())); });
  EXPECT_EQ(msg, own);
  EXPECT_EQ(error_of([&] { (void)none->tokenizer(); }), own);

  const auto bytes = tiny("bytes", byte_config(), byte_vocab());
  const tokenizer::Tokenizer* seen[2] = {nullptr, nullptr};
  std::thread t0([&] { seen[0] = &bytes->tokenizer(); });
  std::thread t1([&] { seen[1] = &bytes->tokenizer(); });
  t0.join();
  t1.join();
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[0], &bytes->tokenizer());
  EXPECT_TRUE(bytes->has_tokenizer());
  EXPECT_EQ(bytes->tokenizer().n_vocab(), 257);
}

TEST(StepApiGeneratorNames, FinishReasons) {
  EXPECT_STREQ(finish_reason_name(FinishReason::None), "none");
  EXPECT_STREQ(finish_reason_name(FinishReason::Length), "length");
  EXPECT_STREQ(finish_reason_name(FinishReason::EndOfGeneration), "eog");
  EXPECT_STREQ(finish_reason_name(FinishReason::Stop), "stop");
}

// ---- `tandem generate --stop` ----------------------------------------------------------------------------

TEST(StepApiGeneratorCli, StopFlagCutsTheText) {
  const std::string gen = "generate -m '" + kShippedPath + "' -p '" + kPrompt + "' -n 32 --temp 0 -t 2 ";
  const test::CommandResult full = test::run_tandem(gen, test::Stderr::Discard);
  ASSERT_EQ(full.exit_code, 0) << full.out;
  ASSERT_GT(full.out.size(), 20u);
  const std::string text = full.out.substr(0, full.out.size() - 1);  // the newline after the text
  size_t first = 0;
  const std::string stop = stop_string_in(text, 6, &first);
  ASSERT_NE(first, std::string::npos) << text;
  // streamed text
  const test::CommandResult cut = test::run_tandem(gen + "--stop '" + stop + "'", test::Stderr::Discard);
  ASSERT_EQ(cut.exit_code, 0) << cut.out;
  EXPECT_EQ(cut.out, text.substr(0, first) + "\n") << "stop '" << stop << "'";
  // repeatable: the earliest wins
  const test::CommandResult two =
      test::run_tandem(gen + "--stop 'not in the text' --stop '" + stop + "'", test::Stderr::Discard);
  EXPECT_EQ(two.out, cut.out);
  // --parallel blocks (greedy: every sequence alike)
  const test::CommandResult par = test::run_tandem(gen + "--parallel 2 --stop '" + stop + "'");
  ASSERT_EQ(par.exit_code, 0) << par.out;
  EXPECT_NE(par.out.find("=== sequence 1 (seed"), std::string::npos) << par.out;
  EXPECT_NE(par.out.find("===\n" + text.substr(0, first) + "\n=== sequence 1"), std::string::npos) << par.out;
  // --ids: the ids up to the one that completed the stop string
  const test::CommandResult ids =
      test::run_tandem(gen + "--ids --stop '" + stop + "'", test::Stderr::Discard);
  ASSERT_EQ(ids.exit_code, 0) << ids.out;
  std::vector<int32_t> v;
  std::istringstream in(ids.out);
  for (int32_t x; in >> x;) v.push_back(x);
  ASSERT_FALSE(v.empty());
  EXPECT_LT(v.size(), 32u);
  EXPECT_EQ(shipped()->tokenizer().decode(v).find(stop), first);
}

TEST(StepApiGeneratorCli, StopFlagErrors) {
  const std::string gen = "generate -m '" + kShippedPath + "' --prompt-ids 0,417 -n 4 --temp 0 -t 2 --ids ";
  const test::CommandResult empty = test::run_tandem(gen + "--stop ''");
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_NE(empty.out.find("error: --stop: the stop string is empty"), std::string::npos) << empty.out;
  // a model without a tokenizer
  const fs::path p =
      fs::temp_directory_path() / ("tandem_test_generator_cli_" + std::to_string(::getpid()) + ".gguf");
  testing::TinyConfig c;
  testing::write_tiny_gguf(testing::make_tiny(c), p);
  const test::CommandResult no_tok =
      test::run_tandem("generate -m '" + p.string() + "' --prompt-ids 1,2 -n 4 --ids --stop x");
  fs::remove(p);
  EXPECT_NE(no_tok.exit_code, 0);
  EXPECT_EQ(std::count(no_tok.out.begin(), no_tok.out.end(), '\n'), 1) << no_tok.out;
  EXPECT_NE(no_tok.out.find("tokenizer cannot be used"), std::string::npos) << no_tok.out;
  EXPECT_NE(no_tok.out.find("--stop needs it"), std::string::npos) << no_tok.out;
}

}  // namespace
}  // namespace tandem
