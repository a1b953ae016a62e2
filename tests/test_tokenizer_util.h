// Helpers for the tokenizer tests: temporary directories, and small Hugging Face tokenizer.json files built
// in code and converted to vocab-only GGUF files with tandem's converter.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "convert/tokenizer_to_gguf.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tandem::tokenizer_test {

namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    static std::mt19937_64 rng(std::random_device{}());
    path_ = fs::temp_directory_path() / ("tandem_tok_" + std::to_string(rng()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline void write_file(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// Converts dir/tokenizer.json (and friends) to dir/vocab.gguf and returns its path.
inline std::string convert_dir(const fs::path& dir, const std::string& arch = "llama") {
  gguf::GgufWriter w;
  w.set("general.architecture", gguf::Value::string(arch));
  convert::add_tokenizer_metadata(dir, w);
  const std::string out = (dir / "vocab.gguf").string();
  w.write(out);
  return out;
}

inline tokenizer::Tokenizer load_tokenizer(const std::string& gguf_path) {
  return tokenizer::Tokenizer::from_gguf(gguf::GgufFile::open(gguf_path));
}

// GPT-2 characters of raw bytes.
inline std::string byte_chars(const std::string& raw) {
  std::string s;
  for (unsigned char c : raw) s += tokenizer::ByteUnicodeMap::get().encode(c);
  return s;
}

// A byte-level BPE tokenizer.json: ids 0..255 are the bytes in order, then one token per merge (given as raw
// bytes), then the added tokens (content, special).
inline json byte_level_json(const std::vector<std::pair<std::string, std::string>>& merges,
                            const std::vector<std::pair<std::string, bool>>& added, json pre_tokenizer) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_chars(std::string(1, static_cast<char>(b)))] = b;
  json jm = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    const std::string joined = byte_chars(a + b);
    if (!vocab.contains(joined)) vocab[joined] = next++;
    jm.push_back(byte_chars(a) + " " + byte_chars(b));
  }
  json at = json::array();
  for (const auto& [content, special] : added) {
    at.push_back({{"id", next++},
                  {"content", content},
                  {"special", special},
                  {"single_word", false},
                  {"lstrip", false},
                  {"rstrip", false},
                  {"normalized", false}});
  }
  return {{"version", "1.0"},
          {"added_tokens", at},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges", jm},
            {"byte_fallback", false},
            {"ignore_merges", false}}}};
}

inline json gpt2_pre() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
}

// A Llama-2-style SentencePiece tokenizer.json: <unk> <s> </s>, the 256 <0xXX> byte tokens, the single
// characters given, then one token per merge (given as texts with "▁" for spaces).
inline json sentencepiece_json(const std::vector<std::string>& chars,
                               const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  int next = 3;
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    vocab[buf] = next++;
  }
  for (const auto& c : chars) {
    if (!vocab.contains(c)) vocab[c] = next++;
  }
  json jm = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    jm.push_back(json::array({a, b}));
  }
  json added = json::array();
  const char* specials[] = {"<unk>", "<s>", "</s>"};
  for (int i = 0; i < 3; ++i) {
    added.push_back({{"id", i},
                     {"content", specials[i]},
                     {"special", true},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false}});
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             json::array({{{"type", "Prepend"}, {"prepend", "\u2581"}},
                          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", json::array()},
            {"special_tokens", json::object()}}},
          {"decoder", {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteFallback"}}})}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges", jm},
            {"byte_fallback", true},
            {"unk_token", "<unk>"},
            {"fuse_unk", true}}}};
}

}  // namespace tandem::tokenizer_test
