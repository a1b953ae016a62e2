// tokenizer.json -> tokenizer.ggml.* keys (convert/tokenizer_to_gguf), and the clear errors for bad tokenizer
// input, both in the converter and in the loader of GGUF files.
#include <gtest/gtest.h>

#include "core/error.h"
#include "test_tokenizer_util.h"

namespace tandem::tokenizer_test {
namespace {

using tokenizer::Tokenizer;

// Expects f() to throw tandem::Error whose message contains `part`.
template <typename F>
void expect_error(F f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what();
  }
}

gguf::GgufFile convert_json(const TempDir& dir, const json& tj, const json& config = nullptr,
                            const std::string& arch = "llama") {
  write_file(dir.path() / "tokenizer.json", tj.dump());
  if (!config.is_null()) write_file(dir.path() / "tokenizer_config.json", config.dump());
  return gguf::GgufFile::open(convert_dir(dir.path(), arch));
}

json sequence_pre(json split_regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"},
                         {"pattern", {{"Regex", split_regex}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
}

TEST(TokenizerConvert, ByteLevelKeys) {
  TempDir dir;
  const auto f = convert_json(
      dir, byte_level_json({{"a", "b"}}, {{"<|endoftext|>", true}, {"<tool>", false}}, gpt2_pre()),
      {{"bos_token", {{"content", "<|endoftext|>"}}},
       {"eos_token", "<|endoftext|>"},
       {"add_bos_token", true},
       {"chat_template", "{{ bos_token }}"}});
  EXPECT_TRUE(f.tensors().empty());  // a vocab-only file
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "gpt-2");  // llama.cpp's name; it refuses "gpt2"
  const auto tokens = f.get("tokenizer.ggml.tokens").as_string_array();
  ASSERT_EQ(tokens.size(), 259u);
  EXPECT_EQ(tokens[256], "ab");
  EXPECT_EQ(f.get("tokenizer.ggml.merges").as_string_array(), std::vector<std::string>{"a b"});
  const auto types = f.get("tokenizer.ggml.token_type").as_int_array();
  EXPECT_EQ(types[0], 1);
  EXPECT_EQ(types[257], 3);  // special added token: control
  EXPECT_EQ(types[258], 4);  // non-special added token: user-defined
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), 257);
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 257);
  EXPECT_EQ(f.get("tokenizer.ggml.bos_token_id").type(), gguf::ValueType::UINT32);
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_eos_token"));
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), "{{ bos_token }}");
  EXPECT_EQ(f.find("tokenizer.ggml.scores"), nullptr);
}

TEST(TokenizerConvert, PreTypeChosenByPattern) {
  const std::string llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const json starcoder = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}}, gpt2_pre()})}};
  const std::pair<json, std::string> cases[] = {
      {sequence_pre(llama3), "llama-bpe"}, {sequence_pre(qwen2), "qwen2"}, {starcoder, "starcoder"}};
  for (const auto& [pre, expected] : cases) {
    TempDir dir;
    const auto f = convert_json(dir, byte_level_json({{"a", "b"}}, {}, pre));
    EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), expected);
    EXPECT_EQ(f.find("tokenizer.tandem.pre_regexes"), nullptr);
  }
}

TEST(TokenizerConvert, UnknownPatternKeepsTheRegexes) {
  TempDir dir;
  const auto f = convert_json(dir, byte_level_json({{"a", "b"}}, {}, sequence_pre(R"(\p{L}+|\p{N}+)")));
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "default");
  EXPECT_EQ(f.get("tokenizer.tandem.pre_regexes").as_string_array(),
            std::vector<std::string>{R"(\p{L}+|\p{N}+)"});
  const Tokenizer tok = Tokenizer::from_gguf(f);
  // "ab 12": pieces "ab", " ", "12" (the space is a gap between matches, kept as its own piece).
  const auto ids = tok.encode("ab 12", false);
  EXPECT_EQ(ids, (std::vector<int32_t>{256, ' ', '1', '2'}));
}

TEST(TokenizerConvert, HolesBecomeUnusedPadTokens) {
  TempDir dir;
  json tj = byte_level_json({}, {}, gpt2_pre());
  tj["added_tokens"] = json::array({{{"id", 300}, {"content", "<x>"}, {"special", true}}});
  const auto f = convert_json(dir, tj);
  const auto tokens = f.get("tokenizer.ggml.tokens").as_string_array();
  ASSERT_EQ(tokens.size(), 301u);
  EXPECT_EQ(tokens[256], "[PAD256]");
  EXPECT_EQ(f.get("tokenizer.ggml.token_type").as_int_array()[256], 5);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'a', 256, 'b'}), "ab");
}

TEST(TokenizerConvert, SentencePieceKeys) {
  TempDir dir;
  const auto f =
      convert_json(dir, sentencepiece_json({"\u2581", "a", "b"}, {{"\u2581", "a"}, {"\u2581a", "b"}}),
                   {{"add_eos_token", true}, {"eos_token", "</s>"}});
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_space_prefix"));
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));  // from the post-processor template
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_eos_token"));  // tokenizer_config.json wins
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f.get_int("tokenizer.ggml.unknown_token_id"), 0);
  const auto types = f.get("tokenizer.ggml.token_type").as_int_array();
  EXPECT_EQ(types[0], 2);  // <unk>
  EXPECT_EQ(types[1], 3);  // <s>
  EXPECT_EQ(types[3], 6);  // <0x00>
  EXPECT_EQ(types[259], 1);
  const auto scores = f.get("tokenizer.ggml.scores").as_float_array();
  ASSERT_EQ(scores.size(), types.size());
  EXPECT_EQ(scores[262], -1.0f);  // "▁a": made by merge 0
  EXPECT_EQ(scores[263], -2.0f);  // "▁ab": made by merge 1
  EXPECT_EQ(f.get("tokenizer.ggml.merges").as_string_array().size(), 2u);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok.encode("ab", true), (std::vector<int32_t>{1, 263, 2}));
}

TEST(TokenizerConvert, UnigramBecomesScoredSentencePiece) {
  TempDir dir;
  json vocab =
      json::array({json::array({"<unk>", 0.0}), json::array({"<s>", 0.0}), json::array({"</s>", 0.0}),
                   json::array({"\u2581", -2.0}), json::array({"a", -3.0}), json::array({"b", -3.0}),
                   json::array({"\u2581a", -1.0}), json::array({"\u2581ab", -0.5})});
  json tj = {
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}}},
      {"decoder", nullptr},
      {"model", {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", vocab}, {"byte_fallback", false}}}};
  const auto f = convert_json(dir, tj, {{"unk_token", "<unk>"}, {"bos_token", "<s>"}});
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.find("tokenizer.ggml.merges"), nullptr);
  EXPECT_FLOAT_EQ(f.get("tokenizer.ggml.scores").as_float_array()[6], -1.0f);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok.encode("ab a", false), (std::vector<int32_t>{7, 6}));
}

TEST(TokenizerConvert, ChatTemplateSources) {
  TempDir dir;
  json config = {{"chat_template", json::array({{{"name", "default"}, {"template", "D"}},
                                                {{"name", "tool_use"}, {"template", "T"}}})}};
  auto f = convert_json(dir, byte_level_json({}, {}, gpt2_pre()), config);
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), "D");
  EXPECT_EQ(f.get_string("tokenizer.chat_template.tool_use"), "T");
  write_file(dir.path() / "chat_template.jinja", "J");
  f = gguf::GgufFile::open(convert_dir(dir.path()));
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), "J");
}

TEST(TokenizerConvert, SpecialIdsFromGenerationConfig) {
  TempDir dir;
  write_file(dir.path() / "generation_config.json", json({{"eos_token_id", json::array({5, 6})}}).dump());
  const auto f = convert_json(dir, byte_level_json({}, {}, gpt2_pre()));
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 5);
}

TEST(TokenizerConvert, Gemma4ByArchitecture) {
  TempDir dir;
  json tj = sentencepiece_json({"\u2581", "a"}, {});
  const auto f = convert_json(dir, tj, nullptr, "gemma4");
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gemma4");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "gemma4");
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_space_prefix"));
}

// ---- bad input: converter ----

TEST(TokenizerConvertErrors, MissingOrBrokenTokenizerJson) {
  TempDir dir;
  gguf::GgufWriter w;
  expect_error([&] { convert::add_tokenizer_metadata(dir.path(), w); }, "tokenizer.json: cannot open");
  write_file(dir.path() / "tokenizer.json", "{not json");
  expect_error([&] { convert::add_tokenizer_metadata(dir.path(), w); }, "not valid JSON");
  write_file(dir.path() / "tokenizer.json", R"({"version": "1.0"})");
  expect_error([&] { convert::add_tokenizer_metadata(dir.path(), w); }, "no \"model\"");
}

TEST(TokenizerConvertErrors, UnsupportedModel) {
  TempDir dir;
  write_file(dir.path() / "tokenizer.json",
             R"({"model": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "[UNK]"}})");
  gguf::GgufWriter w;
  expect_error([&] { convert::add_tokenizer_metadata(dir.path(), w); }, "\"WordPiece\" is not supported");
}

TEST(TokenizerConvertErrors, BadMerges) {
  {
    TempDir dir;
    json tj = byte_level_json({}, {}, gpt2_pre());
    tj["model"]["merges"] = json::array({"a b", "abc"});
    write_file(dir.path() / "tokenizer.json", tj.dump());
    gguf::GgufWriter w;
    expect_error([&] { convert::add_tokenizer_metadata(dir.path(), w); }, "merge 0");  // "ab" is not a token
  }
  {
    TempDir dir;
    json tj = byte_level_json({{"a", "b"}}, {}, gpt2_pre());
    tj["model"]["merges"].push_back("abc");
    write_file(dir.path() / "tokenizer.json", tj.dump());
    gguf::GgufWriter w;
    expect_error([&] { convert::add_tokenizer_metadata(dir.path(), w); },
                 "merge 1 (\"abc\") is not \"left right\"");
  }
}

TEST(TokenizerConvertErrors, DuplicateIds) {
  TempDir dir;
  json tj = byte_level_json({}, {}, gpt2_pre());
  tj["model"]["vocab"]["zz"] = 5;
  write_file(dir.path() / "tokenizer.json", tj.dump());
  gguf::GgufWriter w;
  expect_error([&] { convert::add_tokenizer_metadata(dir.path(), w); }, "have the same id 5");
}

// ---- bad input: loading a GGUF ----

// A valid byte-level vocabulary as GGUF metadata, for tests that then break one key.
gguf::GgufWriter good_metadata() {
  gguf::GgufWriter w;
  w.set("general.architecture", gguf::Value::string("llama"));
  w.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
  w.set("tokenizer.ggml.pre", gguf::Value::string("gpt2"));
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_chars(std::string(1, static_cast<char>(b))));
  tokens.push_back("ab");
  w.set("tokenizer.ggml.tokens", gguf::Value::string_array(tokens));
  w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(std::vector<int32_t>(tokens.size(), 1)));
  w.set("tokenizer.ggml.merges", gguf::Value::string_array({"a b"}));
  return w;
}

Tokenizer load_written(const TempDir& dir, const gguf::GgufWriter& w) {
  const std::string path = (dir.path() / "t.gguf").string();
  w.write(path);
  return Tokenizer::from_gguf(gguf::GgufFile::open(path));
}

TEST(TokenizerLoadErrors, GoodMetadataLoads) {
  TempDir dir;
  EXPECT_EQ(load_written(dir, good_metadata()).encode("ab", false), std::vector<int32_t>{256});
}

TEST(TokenizerLoadErrors, NoTokenizerKeys) {
  TempDir dir;
  gguf::GgufWriter w;
  w.set("general.architecture", gguf::Value::string("llama"));
  expect_error([&] { load_written(dir, w); }, "tokenizer.ggml.model is missing");
}

TEST(TokenizerLoadErrors, UnknownModel) {
  TempDir dir;
  auto w = good_metadata();
  // WordPiece (bert), Unigram (t5) and RWKV vocabularies are refused at load, naming the kind.
  w.set("tokenizer.ggml.model", gguf::Value::string("bert"));
  expect_error([&] { load_written(dir, w); },
               "tokenizer.ggml.model = \"bert\" (WordPiece, BERT-style) is not supported");
  w.set("tokenizer.ggml.model", gguf::Value::string("t5"));
  expect_error([&] { load_written(dir, w); }, "\"t5\" (Unigram / UGM, T5-style) is not supported");
  w.set("tokenizer.ggml.model", gguf::Value::string("rwkv"));
  expect_error([&] { load_written(dir, w); }, "\"rwkv\" (RWKV's trie tokenizer) is not supported");
}

// The pre-tokenizer names llama.cpp's converter writes for GPT-2-style vocabularies load (they were refused).
TEST(TokenizerLoadErrors, LlamaCppPreNamesLoad) {
  for (const char* pre : {"gpt-2", "mpt", "phi-2", "jina-es", "olmo", "stablelm2", "command-r", "falcon3"}) {
    SCOPED_TRACE(pre);
    TempDir dir;
    auto w = good_metadata();
    w.set("tokenizer.ggml.pre", gguf::Value::string(pre));
    EXPECT_EQ(load_written(dir, w).encode("ab", false), std::vector<int32_t>{256});
  }
}

TEST(TokenizerLoadErrors, UnknownPre) {
  TempDir dir;
  auto w = good_metadata();
  w.set("tokenizer.ggml.pre", gguf::Value::string("no-such-pre"));
  expect_error([&] { load_written(dir, w); }, "\"no-such-pre\" is not a pre-tokenizer tandem knows");
  expect_error([&] { load_written(dir, w); }, "gpt-2, phi-2, jina-es");  // the list of known names
}

TEST(TokenizerLoadErrors, MalformedMerges) {
  TempDir dir;
  auto w = good_metadata();
  w.set("tokenizer.ggml.merges", gguf::Value::string_array({"a b", "ab"}));
  expect_error([&] { load_written(dir, w); }, "tokenizer.ggml.merges[1] = \"ab\" is not two tokens");
  w.set("tokenizer.ggml.merges", gguf::Value::string_array({"a zzz"}));
  expect_error([&] { load_written(dir, w); }, "names a token that is not in tokenizer.ggml.tokens");
  w.set("tokenizer.ggml.merges", gguf::Value::string_array({"b a"}));
  expect_error([&] { load_written(dir, w); }, "joins two tokens into text that is not a token");
  w.set("tokenizer.ggml.merges", gguf::Value::i32_array({1, 2}));
  expect_error([&] { load_written(dir, w); }, "tokenizer.ggml.merges must be an array of strings");
  w.remove("tokenizer.ggml.merges");
  expect_error([&] { load_written(dir, w); }, "tokenizer.ggml.merges is missing");
}

TEST(TokenizerLoadErrors, InconsistentArraysAndIds) {
  TempDir dir;
  auto w = good_metadata();
  w.set("tokenizer.ggml.token_type", gguf::Value::i32_array({1, 1}));
  expect_error([&] { load_written(dir, w); }, "token_type has 2 entries but there are 257 tokens");
  w = good_metadata();
  w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(std::vector<int32_t>(257, 9)));
  expect_error([&] { load_written(dir, w); }, "is not a token type");
  w = good_metadata();
  w.set("tokenizer.ggml.scores", gguf::Value::f32_array({1.0f}));
  expect_error([&] { load_written(dir, w); }, "scores has 1 entries");
  w = good_metadata();
  w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(1000));
  expect_error([&] { load_written(dir, w); }, "bos_token_id = 1000 is outside the vocabulary");
  w = good_metadata();
  w.set("tokenizer.ggml.tokens", gguf::Value::string_array({}));
  expect_error([&] { load_written(dir, w); }, "tokenizer.ggml.tokens is empty");
  w = good_metadata();
  w.set("tokenizer.ggml.add_bos_token", gguf::Value::u32(1));
  expect_error([&] { load_written(dir, w); }, "add_bos_token must be a bool");
}

TEST(TokenizerLoadErrors, ByteTokenThatIsNotAByte) {
  TempDir dir;
  gguf::GgufWriter w;
  w.set("tokenizer.ggml.model", gguf::Value::string("llama"));
  w.set("tokenizer.ggml.tokens", gguf::Value::string_array({"<unk>", "<0xZZ>"}));
  w.set("tokenizer.ggml.token_type", gguf::Value::i32_array({2, 6}));
  expect_error([&] { load_written(dir, w); }, "has type byte but is not <0xXX>");
}

// Found by fuzz_hf_json: a field of the wrong JSON type escaped as the JSON library's exception (abort), and a
// deeply nested pre_tokenizer Sequence was copied at every level until memory ran out.
TEST(TokenizerConvertErrors, WrongJsonShapesAndDeepNesting) {
  TempDir dir;
  gguf::GgufWriter w;
  write_file(dir.path() / "tokenizer.json",
             R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},)"
             R"("pre_tokenizer":{"type":"Split","pattern":{"Regex":5}}})");
  expect_error([&] { convert::add_tokenizer_metadata(dir.path(), w); }, "unexpected JSON shape");
  std::string deep = R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":)";
  for (int i = 0; i < 3000; ++i) deep += R"({"type":"Sequence","pretokenizers":[)";
  deep += "{}";
  for (int i = 0; i < 3000; ++i) deep += "]}";
  deep += "}";
  write_file(dir.path() / "tokenizer.json", deep);
  expect_error([&] { convert::add_tokenizer_metadata(dir.path(), w); }, "nested more than 64 levels deep");
}

}  // namespace
}  // namespace tandem::tokenizer_test
