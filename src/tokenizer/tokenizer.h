// Text <-> token ids for the vocabularies GGUF files carry (tokenizer.ggml.model gpt2, llama, gemma4).
//
//   Tokenizer tok = Tokenizer::from_gguf(file);        // vocab-only files work too
//   std::vector<int32_t> ids = tok.encode(prompt, /*add_special=*/true, /*parse_special=*/false);
//   std::string text = tok.decode(ids);
//
// Special tokens (chat markup such as <|im_start|>) are recognised in the text only when parse_special is
// set; otherwise their text is tokenized like any other. User-defined tokens are always recognised, as in
// Hugging Face tokenizers and llama.cpp. A Tokenizer is immutable after loading and may be shared between
// threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/vocab.h"

namespace tandem::tokenizer {

class Tokenizer {
 public:
  static Tokenizer from_gguf(const gguf::GgufFile& file);
  explicit Tokenizer(Vocab vocab);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // add_special: BOS / EOS as the vocabulary asks (add_bos_token / add_eos_token).
  // Any bytes are accepted; bytes that are not valid UTF-8 become byte tokens.
  std::vector<int32_t> encode(std::string_view text, bool add_special = true,
                              bool parse_special = false) const;

  // Bytes of the ids joined. Control, unknown and unused tokens are left out unless render_special. With a
  // SentencePiece prefix space, the one leading space it adds is removed. Throws Error for an id out of
  // range.
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

  // The bytes one token stands for (may be part of a UTF-8 character). Throws Error for an id out of range.
  const std::string& token_to_piece(int32_t id) const;
  const std::string& token_text(int32_t id) const;  // as stored in the vocabulary
  TokenType token_type(int32_t id) const;
  // Token id of this exact stored text, or -1.
  int32_t find_token(std::string_view text) const;

  int32_t n_vocab() const { return vocab_.size(); }
  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  int32_t unk() const { return vocab_.unk; }
  int32_t pad() const { return vocab_.pad; }
  int32_t mask() const { return vocab_.mask; }
  int32_t eot() const { return vocab_.eot; }
  bool add_bos() const { return vocab_.add_bos; }
  bool add_eos() const { return vocab_.add_eos; }
  bool add_space_prefix() const { return vocab_.add_space_prefix; }
  // Does generation stop at this token? EOS, EOT, and control tokens that end a turn (<|im_end|>, <|eot_id|>,
  // ...).
  bool is_end_of_generation(int32_t id) const;
  const Vocab& vocab() const { return vocab_; }

 private:
  struct Fragment {
    int32_t token;  // >= 0: a special token; -1: text
    size_t begin, end;
  };
  void check_id(int32_t id) const;
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
  void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const;
  void encode_byte_level(std::string_view text, std::vector<int32_t>& out) const;
  void encode_sentencepiece(std::string_view text, std::vector<int32_t>& out) const;
  void bpe_sentencepiece(std::string_view s, std::vector<int32_t>& out) const;
  bool find_cached(std::string_view word, std::vector<int32_t>& out) const;
  void store_cached(std::string_view word, const int32_t* ids, size_t n) const;
  void bpe_word_byte_level(std::string_view word, std::vector<int32_t>& out) const;

  Vocab vocab_;
  struct State;  // regexes, special-token index, word cache
  std::unique_ptr<State> state_;
};

// Turns a stream of generated ids into text, holding back the bytes of a UTF-8 character that is not complete
// yet.
class StreamingDetokenizer {
 public:
  // at_text_start: the ids begin a text, so the SentencePiece prefix space is removed as decode() does. Leave
  // it false when streaming a continuation (generated tokens after a prompt).
  explicit StreamingDetokenizer(const Tokenizer& tok, bool render_special = false, bool at_text_start = false)
      : tok_(&tok), render_special_(render_special), at_text_start_(at_text_start) {}
  // The text that is complete after this token (may be empty).
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete character at the very end), then resets.
  std::string flush();
  void reset() {
    pending_.clear();
    started_ = false;
  }

 private:
  const Tokenizer* tok_;
  bool render_special_;
  bool at_text_start_;
  bool started_ = false;  // the SentencePiece prefix space is removed from the first text only
  std::string pending_;
};

}  // namespace tandem::tokenizer
