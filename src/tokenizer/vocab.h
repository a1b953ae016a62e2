// A tokenizer vocabulary read from the tokenizer.ggml.* keys of a GGUF file (vocab-only files included),
// checked once so that encoding and decoding never meet an inconsistent table.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/bpe_merge.h"

namespace tandem::tokenizer {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

enum class VocabKind {
  BytePair,       // "gpt2": byte-level BPE, regex pre-tokenizer, merges by rank
  SentencePiece,  // "llama": spaces as U+2581, prefix space, byte fallback; merges by rank if stored, else
                  // scores
  Gemma4,         // "gemma4": SentencePiece-style BPE by rank, no prefix space, text split at newline runs
};

// String-keyed map that can be searched with a string_view (no temporary std::string).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <typename T>
using StringMap = std::unordered_map<std::string, T, StringHash, std::equal_to<>>;

struct Vocab {
  VocabKind kind = VocabKind::BytePair;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre (or "")

  std::vector<std::string> text;  // token text as stored
  std::vector<TokenType> type;
  std::vector<float> score;        // empty when the file has none
  std::vector<std::string> piece;  // the bytes a token stands for in decoded text
  StringMap<int32_t> text_to_id;   // first id of each stored text
  StringMap<int32_t> piece_to_id;  // BytePair with ignore_merges: decoded bytes -> id (normal/byte tokens)
  std::array<int32_t, 256> byte_token{};  // token of each byte: its GPT-2 character, or <0xXX>; -1 if none

  MergeTable merges;
  bool ignore_merges = false;  // a word that is one token is not merged (Llama 3)
  std::vector<std::string> pre_regexes;
  // SentencePiece kinds: no merge (or, without merges, no token) can join across a "▁" that starts a word, so
  // text can be cut before each "▁" and the words cached. True for vocabularies trained on Metaspace words.
  bool split_at_space_mark = false;

  int32_t bos = -1, eos = -1, unk = -1, pad = -1, mask = -1, eot = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;

  // Tokens matched in text before pre-tokenization: user-defined ones always, control/unknown ones only when
  // the caller parses special tokens. Longest first.
  std::vector<int32_t> special_tokens;

  int32_t size() const { return static_cast<int32_t>(text.size()); }
};

// Throws tandem::Error with the file name and the key at fault when the metadata is missing or inconsistent.
Vocab load_vocab(const gguf::GgufFile& file);

}  // namespace tandem::tokenizer
