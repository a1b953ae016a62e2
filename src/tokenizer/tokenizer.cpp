#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <queue>

#include "core/error.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581
constexpr size_t kMaxCachedWord = 64;                    // longer words are rare; caching them buys nothing
constexpr size_t kMaxCacheEntries = 1 << 18;

// Control tokens that end a turn in the chat formats of common models.
constexpr std::string_view kEndOfTurnTexts[] = {"<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<end_of_turn>",
                                                "<|end|>",    "<|eom_id|>", "<turn|>",       "</s>"};

}  // namespace

struct Tokenizer::State {
  explicit State(const std::vector<std::string>& regexes) : splitter(regexes) {}
  RegexSplitter splitter;
  std::array<std::vector<int32_t>, 256> specials_by_first_byte;  // longest first
  std::vector<bool> end_of_turn;
  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;
};

Tokenizer Tokenizer::from_gguf(const gguf::GgufFile& file) {
  return Tokenizer(load_vocab(file));
}

Tokenizer::Tokenizer(Vocab vocab)
    : vocab_(std::move(vocab)), state_(std::make_unique<State>(vocab_.pre_regexes)) {
  for (int32_t id : vocab_.special_tokens) {
    state_->specials_by_first_byte[static_cast<uint8_t>(vocab_.text[id][0])].push_back(id);
  }
  state_->end_of_turn.assign(vocab_.text.size(), false);
  for (int32_t i = 0; i < vocab_.size(); ++i) {
    if (vocab_.type[i] != TokenType::Control) continue;
    for (auto t : kEndOfTurnTexts) {
      if (vocab_.text[i] == t) state_->end_of_turn[i] = true;
    }
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::check_id(int32_t id) const {
  check(id >= 0 && id < vocab_.size(), "token id " + std::to_string(id) + " is outside the vocabulary (" +
                                           std::to_string(vocab_.size()) + " tokens)");
}

const std::string& Tokenizer::token_to_piece(int32_t id) const {
  check_id(id);
  return vocab_.piece[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return vocab_.text[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return vocab_.type[id];
}

int32_t Tokenizer::find_token(std::string_view text) const {
  auto it = vocab_.text_to_id.find(text);
  return it == vocab_.text_to_id.end() ? -1 : it->second;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  if (id < 0 || id >= vocab_.size()) return false;
  return id == vocab_.eos || id == vocab_.eot || state_->end_of_turn[id];
}

// ---- encoding
// ----------------------------------------------------------------------------------------------

std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  size_t text_begin = 0;
  for (size_t i = 0; i < text.size();) {
    const auto& candidates = state_->specials_by_first_byte[static_cast<uint8_t>(text[i])];
    int32_t hit = -1;
    for (int32_t id : candidates) {
      if (!parse_special && vocab_.type[id] != TokenType::UserDefined) continue;
      const std::string& t = vocab_.text[id];
      if (text.compare(i, t.size(), t) == 0) {
        hit = id;  // candidates are longest first
        break;
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    if (i > text_begin) frags.push_back({-1, text_begin, i});
    frags.push_back({hit, i, i + vocab_.text[hit].size()});
    i += vocab_.text[hit].size();
    text_begin = i;
  }
  if (text_begin < text.size()) frags.push_back({-1, text_begin, text.size()});
  return frags;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && vocab_.add_bos && vocab_.bos >= 0) out.push_back(vocab_.bos);
  bool after_special = true;  // the start of the text counts as "after a special token" for the prefix space
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
    } else {
      encode_text(text.substr(f.begin, f.end - f.begin), after_special, out);
      after_special = false;
    }
  }
  if (add_special && vocab_.add_eos && vocab_.eos >= 0) out.push_back(vocab_.eos);
  return out;
}

void Tokenizer::encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const {
  switch (vocab_.kind) {
    case VocabKind::BytePair: {
      if (vocab_.add_space_prefix && !text.empty() && text[0] != ' ') {
        std::string prefixed;
        prefixed.reserve(text.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(text);
        encode_byte_level(prefixed, out);
      } else {
        encode_byte_level(text, out);
      }
      return;
    }
    case VocabKind::SentencePiece: {
      // SentencePiece adds one space before the text (and after each special token, as llama.cpp does).
      std::string s = vocab_.add_space_prefix && after_special ? " " : "";
      s += text;
      encode_sentencepiece(s, out);
      return;
    }
    case VocabKind::Gemma4: {
      std::vector<Span> spans;
      state_->splitter.split(text, spans);
      for (const auto& [b, e] : spans) {
        const std::string_view piece = text.substr(b, e - b);
        if (piece[0] == '\n') {  // a run of newlines that is one token stays whole
          auto it = vocab_.text_to_id.find(piece);
          if (it != vocab_.text_to_id.end()) {
            out.push_back(it->second);
            continue;
          }
        }
        encode_sentencepiece(piece, out);
      }
      return;
    }
  }
}

void Tokenizer::encode_byte_level(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Span> spans;
  spans.reserve(text.size() / 4 + 1);
  state_->splitter.split(text, spans);
  for (const auto& [b, e] : spans) bpe_word_byte_level(text.substr(b, e - b), out);
}

bool Tokenizer::find_cached(std::string_view word, std::vector<int32_t>& out) const {
  std::lock_guard<std::mutex> lock(state_->cache_mutex);
  auto it = state_->cache.find(word);
  if (it == state_->cache.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void Tokenizer::store_cached(std::string_view word, const int32_t* ids, size_t n) const {
  std::lock_guard<std::mutex> lock(state_->cache_mutex);
  if (state_->cache.size() >= kMaxCacheEntries) state_->cache.clear();
  state_->cache.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
}

void Tokenizer::bpe_word_byte_level(std::string_view word, std::vector<int32_t>& out) const {
  if (vocab_.ignore_merges) {
    auto it = vocab_.piece_to_id.find(word);
    if (it != vocab_.piece_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable && find_cached(word, out)) return;
  std::vector<int32_t> ids(word.size());
  for (size_t i = 0; i < word.size(); ++i) ids[i] = vocab_.byte_token[static_cast<uint8_t>(word[i])];
  bpe_merge_by_rank(vocab_.merges, ids);
  // A byte with no token: the unknown token if there is one, else it is dropped (as Hugging Face does).
  std::erase_if(ids, [&](int32_t& id) {
    if (id >= 0) return false;
    id = vocab_.unk;
    return id < 0;
  });
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) store_cached(word, ids.data(), ids.size());
}

// SentencePiece-style: spaces become U+2581, then BPE over characters. Cut into words before each U+2581 when
// the vocabulary allows it (the result is the same, and words repeat, so they are cached).
void Tokenizer::encode_sentencepiece(std::string_view text, std::vector<int32_t>& out) const {
  std::string s;
  s.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ')
      s += kSpaceMark;
    else
      s += c;
  }
  if (!vocab_.split_at_space_mark) {
    bpe_sentencepiece(s, out);
    return;
  }
  const std::string_view sv(s);
  size_t begin = 0;
  while (begin < sv.size()) {
    size_t end = sv.find(kSpaceMark, begin + 1);
    if (end == std::string_view::npos) end = sv.size();
    const std::string_view word = sv.substr(begin, end - begin);
    if (word.size() <= kMaxCachedWord) {
      if (!find_cached(word, out)) {
        const size_t before = out.size();
        bpe_sentencepiece(word, out);
        store_cached(word, out.data() + before, out.size() - before);
      }
    } else {
      bpe_sentencepiece(word, out);
    }
    begin = end;
  }
}

// BPE over the characters of s (already with U+2581 for spaces), then byte fallback for characters with no
// token. Merges by rank when the vocabulary has merges, else by the score of the merged token.
void Tokenizer::bpe_sentencepiece(std::string_view s, std::vector<int32_t>& out) const {
  // Symbols: one per character (or per byte that is not valid UTF-8).
  std::vector<Span> sym;
  sym.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len = utf8_valid_len(s, i);
    if (len == 0) len = 1;
    sym.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(i + len));
    i += len;
  }
  auto emit = [&](size_t b, size_t e) {
    auto it = vocab_.text_to_id.find(std::string_view(s).substr(b, e - b));
    if (it != vocab_.text_to_id.end()) {
      out.push_back(it->second);
      return;
    }
    // Byte fallback: every byte has a <0xXX> token, or the whole character becomes the unknown token.
    bool all = true;
    for (size_t k = b; k < e; ++k) all = all && vocab_.byte_token[static_cast<uint8_t>(s[k])] >= 0;
    if (all) {
      for (size_t k = b; k < e; ++k) out.push_back(vocab_.byte_token[static_cast<uint8_t>(s[k])]);
    } else if (vocab_.unk >= 0) {
      out.push_back(vocab_.unk);
    }
  };

  if (!vocab_.merges.empty()) {
    // Rank order, as Hugging Face's BPE. A character with no token is -(index + 1) and never merges.
    std::vector<int32_t> ids(sym.size());
    for (size_t i = 0; i < sym.size(); ++i) {
      auto it =
          vocab_.text_to_id.find(std::string_view(s).substr(sym[i].first, sym[i].second - sym[i].first));
      ids[i] = it != vocab_.text_to_id.end() ? it->second : -static_cast<int32_t>(i + 1);
    }
    bpe_merge_by_rank(vocab_.merges, ids);
    for (int32_t id : ids) {
      if (id >= 0) {
        out.push_back(id);
      } else {
        const Span& sp = sym[static_cast<size_t>(-id - 1)];
        emit(sp.first, sp.second);
      }
    }
    return;
  }

  // Score order, as llama.cpp's SentencePiece tokenizer: merge the adjacent pair whose joined text is a token
  // with the highest score, leftmost first among equal scores.
  const int32_t n = static_cast<int32_t>(sym.size());
  std::vector<int32_t> next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t size;
    bool operator<(const Bigram& o) const { return score != o.score ? score < o.score : left > o.left; }
  };
  std::priority_queue<Bigram> heap;
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t b = sym[l].first, e = sym[r].second;
    auto it = vocab_.text_to_id.find(std::string_view(s).substr(b, e - b));
    // Only normal tokens come out of merging (as in SentencePiece): "<s>" typed as text is not BOS.
    if (it == vocab_.text_to_id.end() || vocab_.type[it->second] != TokenType::Normal) return;
    const float score = vocab_.score.empty() ? 0.0f : vocab_.score[it->second];
    heap.push({score, l, r, e - b});
  };
  for (int32_t i = 0; i + 1 < n; ++i) try_add(i, i + 1);
  while (!heap.empty()) {
    const Bigram g = heap.top();
    heap.pop();
    if (sym[g.left].second == sym[g.left].first || next[g.left] != g.right ||
        sym[g.right].second - sym[g.left].first != g.size) {
      continue;  // stale: one side changed since this pair was queued
    }
    sym[g.left].second = sym[g.right].second;
    sym[g.right].second = sym[g.right].first;  // empty = merged away
    next[g.left] = next[g.right];
    if (next[g.left] >= 0) prev[next[g.left]] = g.left;
    try_add(prev[g.left], g.left);
    try_add(g.left, next[g.left]);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) emit(sym[i].first, sym[i].second);
}

// ---- decoding
// ----------------------------------------------------------------------------------------------

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) {
    check_id(id);
    const TokenType ty = vocab_.type[id];
    if (!render_special &&
        (ty == TokenType::Control || ty == TokenType::Unknown || ty == TokenType::Unused)) {
      continue;
    }
    out += vocab_.piece[id];
  }
  if (vocab_.kind == VocabKind::SentencePiece && vocab_.add_space_prefix && !out.empty() && out[0] == ' ') {
    out.erase(0, 1);
  }
  return out;
}

std::string StreamingDetokenizer::push(int32_t id) {
  const TokenType ty = tok_->token_type(id);
  if (!render_special_ && (ty == TokenType::Control || ty == TokenType::Unknown || ty == TokenType::Unused)) {
    return {};
  }
  pending_ += tok_->token_to_piece(id);
  if (!started_ && !pending_.empty()) {
    started_ = true;
    if (at_text_start_ && tok_->vocab().kind == VocabKind::SentencePiece && tok_->add_space_prefix() &&
        pending_[0] == ' ') {
      pending_.erase(0, 1);
    }
  }
  const size_t keep = utf8_incomplete_tail(pending_);
  std::string ready = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return ready;
}

std::string StreamingDetokenizer::flush() {
  std::string rest = std::move(pending_);
  reset();
  return rest;
}

}  // namespace tandem::tokenizer
