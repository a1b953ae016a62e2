// Tokenizer behaviour on small vocabularies built in the test: BPE merge order against a naive reference, the
// pre-tokenizer regexes, special tokens, SentencePiece prefix space and byte fallback, Gemma 4, streaming
// detokenization, and decode(encode(x)) == x on random bytes.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "test_tokenizer_util.h"
#include "tokenizer/bpe_merge.h"
#include "tokenizer/pre_patterns.h"
#include "tokenizer/regex_split.h"

namespace tandem::tokenizer_test {
namespace {

using tokenizer::Tokenizer;

std::vector<std::string> split_with(const std::vector<std::string>& regexes, const std::string& text) {
  tokenizer::RegexSplitter splitter(regexes);
  std::vector<tokenizer::Span> spans;
  splitter.split(text, spans);
  std::vector<std::string> out;
  for (auto [b, e] : spans) out.push_back(text.substr(b, e - b));
  return out;
}

using Pieces = std::vector<std::string>;

TEST(TokenizerRegex, Gpt2Pattern) {
  EXPECT_EQ(split_with({tokenizer::kGpt2Pattern}, "Hello world's  12345 x!!\n\n  y"),
            (Pieces{"Hello", " world", "'s", " ", " 12345", " x", "!!", "\n\n ", " y"}));
}

TEST(TokenizerRegex, Llama3Pattern) {
  const auto re = *tokenizer::pre_regexes("llama-bpe");
  EXPECT_EQ(split_with(re, "Hello WORLD'S 1234567 x!!\n\n  y"),
            (Pieces{"Hello", " WORLD", "'S", " ", "123", "456", "7", " x", "!!\n\n", " ", " y"}));
  // Letters of any script; one leading non-letter joins the word, a space and a symbol do not.
  EXPECT_EQ(split_with(re, "日本語 $abc $$d"), (Pieces{"日本語", " $", "abc", " $$", "d"}));
}

TEST(TokenizerRegex, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(split_with(*tokenizer::pre_regexes("qwen2"), "a 2024"), (Pieces{"a", " ", "2", "0", "2", "4"}));
}

TEST(TokenizerRegex, WhiteSpaceIsUnicodeWhiteSpace) {
  // U+0085 and U+3000 are White_Space (Oniguruma's \s); U+180E is not, though PCRE2's \s with UCP matches it.
  EXPECT_EQ(split_with({R"(\s+)"}, "a\u0085\u3000b"), (Pieces{"a", "\u0085\u3000", "b"}));
  EXPECT_EQ(split_with({R"(\s+)"}, "a\u180Eb"), (Pieces{"a\u180Eb"}));
  EXPECT_EQ(split_with({R"([^\s]+)"}, "a\u180E b"), (Pieces{"a\u180E", " ", "b"}));
}

TEST(TokenizerRegex, InvalidUtf8BytesArePiecesOfTheirOwn) {
  const std::string text =
      "ab\xff"
      "cd\xc3";
  EXPECT_EQ(split_with({tokenizer::kGpt2Pattern}, text), (Pieces{"ab", "\xff", "cd", "\xc3"}));
}

TEST(TokenizerRegex, SequentialSplitsKeepTheGaps) {
  // Digits first (StarCoder), then GPT-2's pattern on each piece.
  EXPECT_EQ(split_with(*tokenizer::pre_regexes("starcoder"), "ab 12"), (Pieces{"ab", " ", "1", "2"}));
}

// Every pre-tokenizer tandem lists compiles (the DeepSeek LLM letter class did not: its literal characters
// had been Unicode-normalised into reversed ranges).
TEST(TokenizerRegex, EveryKnownPreTokenizerCompiles) {
  std::string names = tokenizer::supported_pre_types();
  size_t n = 0;
  for (size_t b = 0; b < names.size();) {
    size_t e = names.find(", ", b);
    if (e == std::string::npos) e = names.size();
    const std::string name = names.substr(b, e - b);
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(tokenizer::RegexSplitter(*tokenizer::pre_regexes(name)));
    ++n;
    b = e + 2;
  }
  EXPECT_GE(n, 50u);
}

// DeepSeek LLM: its letter class covers Latin-1, Greek and the Kelvin/Ohm signs; its punctuation class
// [!-/:-~...] also holds the ASCII letters (":-~" spans them), so it re-cuts ASCII runs out of a word.
TEST(TokenizerRegex, DeepseekLlmPattern) {
  const auto re = *tokenizer::pre_regexes("deepseek-llm");
  EXPECT_EQ(split_with(re, "Hello World! \u0391\u0392\u0393 123 \u4e2d\u6587\n"),
            (Pieces{"Hello", " World", "!", " \u0391\u0392\u0393", " ", "123", " ", "\u4e2d\u6587", "\n"}));
  // U+212A KELVIN SIGN and U+1FD3 are letters of the class (normalised, they were not, and the class broke);
  // the CJK step's range U+0800-U+4E00 then cuts them from the leading space, as it does U+2126.
  EXPECT_EQ(split_with(re, " \u212a\u1fd3\u1fd0"), (Pieces{" ", "\u212a\u1fd3\u1fd0"}));
  EXPECT_EQ(split_with(re, "\u00c0\u00df\u00f6 \u2126"), (Pieces{"\u00c0\u00df\u00f6", " ", "\u2126"}));
}

TEST(TokenizerRegex, BadPatternIsAnError) {
  EXPECT_THROW(tokenizer::RegexSplitter({"(unclosed"}), Error);
}

// ---- BPE merges ----

// Reference BPE: repeatedly merge the leftmost pair of lowest rank, rescanning everything each time.
std::vector<std::string> naive_bpe(const std::string& word,
                                   const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> sym;
  for (char c : word) sym.emplace_back(1, c);
  while (true) {
    int best = -1, best_rank = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = ranks.find({sym[i], sym[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best_rank)) {
        best = static_cast<int>(i);
        best_rank = it->second;
      }
    }
    if (best < 0) return sym;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + best + 1);
  }
}

TEST(TokenizerBpe, MatchesNaiveReferenceOnRandomMergesAndWords) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 5; ++trial) {
    // Random merges over the alphabet {a, b, c}, each joining two tokens that exist already.
    std::vector<std::string> tokens = {"a", "b", "c"};
    std::set<std::string> known(tokens.begin(), tokens.end());
    std::vector<std::pair<std::string, std::string>> merges;
    std::map<std::pair<std::string, std::string>, int> ranks;
    while (merges.size() < 60) {
      const std::string& l = tokens[rng() % tokens.size()];
      const std::string& r = tokens[rng() % tokens.size()];
      if (l.size() + r.size() > 12 || ranks.count({l, r})) continue;
      ranks[{l, r}] = static_cast<int>(merges.size());
      merges.emplace_back(l, r);
      if (known.insert(l + r).second) tokens.push_back(l + r);
    }
    TempDir dir;
    write_file(dir.path() / "tokenizer.json", byte_level_json(merges, {}, gpt2_pre()).dump());
    const Tokenizer tok = load_tokenizer(convert_dir(dir.path()));
    for (int w = 0; w < 200; ++w) {
      std::string word;
      const int len = 1 + static_cast<int>(rng() % (w < 190 ? 30 : 600));  // a few very long words too
      for (int i = 0; i < len; ++i) word += static_cast<char>('a' + rng() % 3);
      std::vector<int32_t> expected;
      for (const auto& s : naive_bpe(word, ranks)) expected.push_back(tok.find_token(byte_chars(s)));
      ASSERT_EQ(tok.encode(word, false), expected) << "trial " << trial << " word " << word;
      ASSERT_EQ(tok.encode(word, false), expected) << "second call (cached) differs";
    }
  }
}

TEST(TokenizerBpe, MergeEngineKeepsUnknownSymbols) {
  tokenizer::MergeTable t;
  t.add(1, 2, 0, 10);
  t.add(10, 1, 1, 11);
  std::vector<int32_t> ids = {1, 2, 1, -5, 1, 2};
  tokenizer::bpe_merge_by_rank(t, ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{11, -5, 10}));
}

// ---- byte-level tokenizer with special tokens ----

class ByteLevelTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(
        dir_.path() / "tokenizer.json",
        byte_level_json({{" ", "t"}, {"h", "e"}, {" t", "he"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}},
                        {{"<|endoftext|>", true}, {"<|im_start|>", true}, {"<tool>", false}}, gpt2_pre())
            .dump());
    write_file(dir_.path() / "tokenizer_config.json", json({{"bos_token", "<|endoftext|>"},
                                                            {"eos_token", "<|endoftext|>"},
                                                            {"add_bos_token", true},
                                                            {"chat_template", "{{ messages }}"}})
                                                          .dump());
    tok_ = std::make_unique<Tokenizer>(load_tokenizer(convert_dir(dir_.path())));
  }
  int32_t id(const std::string& raw) const { return tok_->find_token(byte_chars(raw)); }
  TempDir dir_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(ByteLevelTokenizer, EncodesByMergeRank) {
  EXPECT_EQ(tok_->encode("hello the", false), (std::vector<int32_t>{id("hello"), id(" the")}));
  EXPECT_EQ(tok_->encode("hellx", false), (std::vector<int32_t>{id("hell"), id("x")}));
}

TEST_F(ByteLevelTokenizer, AddsBos) {
  const int32_t bos = tok_->find_token("<|endoftext|>");
  EXPECT_EQ(tok_->bos(), bos);
  EXPECT_EQ(tok_->encode("he", true), (std::vector<int32_t>{bos, id("he")}));
}

TEST_F(ByteLevelTokenizer, SpecialTokensOnlyWhenAllowed) {
  const int32_t im_start = tok_->find_token("<|im_start|>");
  EXPECT_EQ(tok_->token_type(im_start), tokenizer::TokenType::Control);
  const auto parsed = tok_->encode("<|im_start|>hello", false, true);
  EXPECT_EQ(parsed, (std::vector<int32_t>{im_start, id("hello")}));
  const auto plain = tok_->encode("<|im_start|>hello", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_start), 0);
  EXPECT_EQ(tok_->decode(plain), "<|im_start|>hello");
  // Control tokens are left out of decoded text unless asked for.
  EXPECT_EQ(tok_->decode(parsed), "hello");
  EXPECT_EQ(tok_->decode(parsed, true), "<|im_start|>hello");
}

TEST_F(ByteLevelTokenizer, UserDefinedTokensAlwaysMatch) {
  const int32_t tool = tok_->find_token("<tool>");
  EXPECT_EQ(tok_->token_type(tool), tokenizer::TokenType::UserDefined);
  EXPECT_EQ(tok_->encode("he<tool>he", false, false), (std::vector<int32_t>{id("he"), tool, id("he")}));
  EXPECT_EQ(tok_->decode(tok_->encode("he<tool>he", false)), "he<tool>he");
}

TEST_F(ByteLevelTokenizer, RoundTripsRandomBytes) {
  std::mt19937 rng(7);
  const std::string alphabet[] = {"h",      "e",  "l",    "o",    " ",     "t",        "\n",
                                  "é",      "日", "🙂", "\xff", "\x80",  "\xe2\x82", "<|im_start|>",
                                  "<tool>", "1",  "'s",   "\t",   "\u0085"};
  for (int i = 0; i < 500; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) s += alphabet[rng() % std::size(alphabet)];
    const bool parse_special = i % 2 == 0;
    ASSERT_EQ(tok_->decode(tok_->encode(s, true, parse_special), true).substr(tok_->add_bos() ? 13 : 0), s);
  }
}

TEST_F(ByteLevelTokenizer, IdsOutsideTheVocabularyAreErrors) {
  EXPECT_THROW(tok_->decode(std::vector<int32_t>{tok_->n_vocab()}), Error);
  EXPECT_THROW(tok_->token_to_piece(-1), Error);
}

TEST_F(ByteLevelTokenizer, EndOfGeneration) {
  EXPECT_TRUE(tok_->is_end_of_generation(tok_->eos()));
  EXPECT_FALSE(tok_->is_end_of_generation(id("he")));
}

// ---- SentencePiece-style ----

class SentencePieceTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(
        dir_.path() / "tokenizer.json",
        sentencepiece_json({"\u2581", "a", "b", "c", "h", "i", "日"},
                           {{"\u2581", "h"}, {"\u2581h", "i"}, {"a", "b"}, {"\u2581", "a"}, {"ab", "c"}})
            .dump());
    tok_ = std::make_unique<Tokenizer>(load_tokenizer(convert_dir(dir_.path())));
  }
  int32_t id(const std::string& text) const { return tok_->find_token(text); }
  TempDir dir_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SentencePieceTokenizer, PrefixSpaceAndMerges) {
  EXPECT_TRUE(tok_->add_space_prefix());
  EXPECT_TRUE(tok_->add_bos());
  EXPECT_EQ(tok_->bos(), 1);
  // (a, b) ranks before (▁, a), and no merge joins ▁ with ab.
  EXPECT_EQ(tok_->encode("hi abc", true), (std::vector<int32_t>{1, id("\u2581hi"), id("\u2581"), id("abc")}));
  EXPECT_EQ(tok_->encode("hi ac", false), (std::vector<int32_t>{id("\u2581hi"), id("\u2581a"), id("c")}));
  // Starting with a space gives two U+2581.
  EXPECT_EQ(tok_->encode(" hi", false), (std::vector<int32_t>{id("\u2581"), id("\u2581hi")}));
}

TEST_F(SentencePieceTokenizer, ByteFallbackAndDecode) {
  const auto ids = tok_->encode("é日", false);
  EXPECT_EQ(ids, (std::vector<int32_t>{id("\u2581"), id("<0xC3>"), id("<0xA9>"), id("日")}));
  EXPECT_EQ(tok_->token_type(id("<0xC3>")), tokenizer::TokenType::Byte);
  EXPECT_EQ(tok_->decode(ids), "é日");
  EXPECT_EQ(tok_->decode(tok_->encode(" hi abc", true)), " hi abc");
}

TEST_F(SentencePieceTokenizer, RoundTripsRandomText) {
  std::mt19937 rng(11);
  const std::string alphabet[] = {"a",  "b", "c",  "h",    "i",        " ", "  ",
                                  "日", "é", "\n", "\xff", "\xe2\x82", "x"};
  for (int i = 0; i < 500; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 30);
    for (int k = 0; k < n; ++k) s += alphabet[rng() % std::size(alphabet)];
    ASSERT_EQ(tok_->decode(tok_->encode(s, true)), s) << "text: " << s;
  }
}

TEST_F(SentencePieceTokenizer, ScoreOrderWithoutMerges) {
  // The same vocabulary without merges: llama.cpp's score-ordered merging (scores written by the converter
  // are minus the merge rank, so for this vocabulary the result is the same).
  gguf::GgufFile f = gguf::GgufFile::open((dir_.path() / "vocab.gguf").string());
  gguf::GgufWriter w;
  for (const auto& [k, v] : f.metadata()) {
    if (k != "tokenizer.ggml.merges") w.set(k, v);
  }
  const std::string path = (dir_.path() / "scores.gguf").string();
  w.write(path);
  const Tokenizer by_score = load_tokenizer(path);
  for (const char* text : {"hi abc", " hi", "abcabc hihi", "é日 ab"}) {
    EXPECT_EQ(by_score.encode(text, true), tok_->encode(text, true)) << text;
  }
}

// ---- Gemma 4 ----

TEST(TokenizerGemma4, NewlineRunsNoPrefixSpaceByteFallback) {
  TempDir dir;
  json j = sentencepiece_json({"\u2581", "a", "b", "\n"}, {{"a", "b"}, {"\u2581", "ab"}, {"\n", "\n"}});
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  write_file(dir.path() / "tokenizer.json", j.dump());
  const std::string path = convert_dir(dir.path(), "gemma4");
  const gguf::GgufFile f = gguf::GgufFile::open(path);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gemma4");
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_space_prefix"));
  const Tokenizer tok = Tokenizer::from_gguf(f);
  auto id = [&](const char* t) { return tok.find_token(t); };
  EXPECT_EQ(tok.encode("ab ab\n\nb\n\n\né", false),
            (std::vector<int32_t>{id("ab"), id("\u2581ab"), id("\n\n"), id("b"), id("\n\n"), id("\n"),
                                  id("<0xC3>"), id("<0xA9>")}));
  EXPECT_EQ(tok.decode(tok.encode(" ab\n\n x", true)), " ab\n\n x");
}

// ---- streaming detokenization ----

TEST(TokenizerStreaming, HoldsBackIncompleteCharacters) {
  TempDir dir;
  write_file(dir.path() / "tokenizer.json", sentencepiece_json({"\u2581", "a"}, {{"\u2581", "a"}}).dump());
  const Tokenizer tok = load_tokenizer(convert_dir(dir.path()));
  // "你" is E4 BD A0: three byte tokens.
  const auto ids = tok.encode("a你a", false);
  ASSERT_EQ(ids.size(), 5u);
  tokenizer::StreamingDetokenizer stream(tok, false, /*at_text_start=*/true);
  EXPECT_EQ(stream.push(ids[0]), "a");
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[2]), "");
  EXPECT_EQ(stream.push(ids[3]), "你");
  EXPECT_EQ(stream.push(ids[4]), "a");
  EXPECT_EQ(stream.flush(), "");
  // An incomplete tail at the end comes out on flush; bytes that can never complete are not held.
  EXPECT_EQ(stream.push(tok.find_token("<0xE4>")), "");
  EXPECT_EQ(stream.flush(), "\xE4");
  EXPECT_EQ(stream.push(tok.find_token("<0xFF>")), "\xFF");
  EXPECT_EQ(stream.push(tok.find_token("<0xE0>")), "");
  EXPECT_EQ(stream.push(tok.find_token("<0x80>")), "\xE0\x80");  // E0 80 is never valid: released at once
}

TEST(TokenizerStreaming, ConcatenationEqualsDecodeOnRandomText) {
  TempDir dir;
  write_file(dir.path() / "tokenizer.json", sentencepiece_json({"\u2581", "a", "b"}, {{"a", "b"}}).dump());
  const Tokenizer tok = load_tokenizer(convert_dir(dir.path()));
  std::mt19937 rng(3);
  const std::string alphabet[] = {"a", "b", " ", "é", "日", "🙂", "\u0301"};
  for (int i = 0; i < 200; ++i) {
    std::string s;
    for (int k = 0, n = static_cast<int>(rng() % 20); k < n; ++k) s += alphabet[rng() % std::size(alphabet)];
    const auto ids = tok.encode(s, true);
    tokenizer::StreamingDetokenizer stream(tok, false, true);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string part = stream.push(id);
      EXPECT_EQ(tokenizer::utf8_incomplete_tail(part), 0u);
      for (size_t p = 0; p < part.size();) {
        const size_t len = tokenizer::utf8_valid_len(part, p);
        ASSERT_GT(len, 0u) << "streamed text is not valid UTF-8";
        p += len;
      }
      streamed += part;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, tok.decode(ids));
    EXPECT_EQ(streamed, s);
  }
}

TEST(TokenizerUnicode, IncompleteTail) {
  using tokenizer::utf8_incomplete_tail;
  EXPECT_EQ(utf8_incomplete_tail("ab"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE4"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE4\xBD"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE4\xBD\xA0"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x99"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("\xED\xA0"), 0u);  // a surrogate can never complete
  EXPECT_EQ(utf8_incomplete_tail("\x80"), 0u);
}

}  // namespace
}  // namespace tandem::tokenizer_test
