#include "tokenizer/vocab.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/pre_patterns.h"
#include "tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

int parse_byte_token(const std::string& s) {
  if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(s[3]), lo = hex(s[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

std::vector<std::string> string_array(const gguf::GgufFile& f, const char* key) {
  const gguf::Value& v = f.get(key);
  if (v.type() != gguf::ValueType::ARRAY || v.element_type() != gguf::ValueType::STRING) {
    throw Error(f.path() + ": " + key + " must be an array of strings, not " + v.to_string(2));
  }
  return v.as_string_array();
}

}  // namespace

Vocab load_vocab(const gguf::GgufFile& f) {
  const std::string& where = f.path();
  Vocab v;
  const gguf::Value* model = f.find("tokenizer.ggml.model");
  check(model != nullptr,
        where +
            ": this GGUF has no tokenizer (tokenizer.ggml.model is missing); convert the model "
            "with its tokenizer.json, e.g. `tandem convert --vocab-only`");
  check(model->type() == gguf::ValueType::STRING, where + ": tokenizer.ggml.model must be a string");
  v.model = model->as_string();
  if (v.model == "gpt2") {
    v.kind = VocabKind::BytePair;
  } else if (v.model == "llama") {
    v.kind = VocabKind::SentencePiece;
  } else if (v.model == "gemma4") {
    v.kind = VocabKind::Gemma4;
  } else {
    // Name the kind of tokenizer, so that the user knows it is not a corrupt file.
    const std::string kind = v.model == "bert"     ? " (WordPiece, BERT-style)"
                             : v.model == "t5"     ? " (Unigram / UGM, T5-style)"
                             : v.model == "rwkv"   ? " (RWKV's trie tokenizer)"
                             : v.model == "plamo2" ? " (PLaMo-2's tokenizer)"
                                                   : "";
    throw Error(where + ": tokenizer.ggml.model = \"" + v.model + "\"" + kind +
                " is not supported: tandem tokenizes gpt2 (byte-level BPE), llama (SentencePiece BPE) and "
                "gemma4 vocabularies");
  }
  if (const auto* pre = f.find("tokenizer.ggml.pre")) {
    check(pre->type() == gguf::ValueType::STRING, where + ": tokenizer.ggml.pre must be a string");
    v.pre = pre->as_string();
  }

  // ---- tokens, types, scores ----
  check(f.find("tokenizer.ggml.tokens") != nullptr, where + ": tokenizer.ggml.tokens is missing");
  v.text = string_array(f, "tokenizer.ggml.tokens");
  check(!v.text.empty(), where + ": tokenizer.ggml.tokens is empty");
  check(v.text.size() < (size_t{1} << 31), where + ": too many tokens");
  const size_t n = v.text.size();
  v.type.assign(n, TokenType::Normal);
  if (const auto* tt = f.find("tokenizer.ggml.token_type")) {
    std::vector<int64_t> types;
    try {
      types = tt->as_int_array();
    } catch (const Error&) {
      throw Error(where + ": tokenizer.ggml.token_type must be an array of integers");
    }
    check(types.size() == n, where + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                                 " entries but there are " + std::to_string(n) + " tokens");
    for (size_t i = 0; i < n; ++i) {
      check(types[i] >= 0 && types[i] <= 6, where + ": tokenizer.ggml.token_type[" + std::to_string(i) +
                                                "] = " + std::to_string(types[i]) +
                                                " is not a token type (0..6)");
      v.type[i] = static_cast<TokenType>(types[i]);
      if (v.type[i] == TokenType::Undefined) v.type[i] = TokenType::Normal;
    }
  } else if (v.kind != VocabKind::BytePair) {
    for (size_t i = 0; i < n; ++i) {
      if (parse_byte_token(v.text[i]) >= 0) v.type[i] = TokenType::Byte;
    }
  }
  if (const auto* sc = f.find("tokenizer.ggml.scores")) {
    try {
      v.score = sc->as_float_array();
    } catch (const Error&) {
      throw Error(where + ": tokenizer.ggml.scores must be an array of numbers");
    }
    check(v.score.size() == n, where + ": tokenizer.ggml.scores has " + std::to_string(v.score.size()) +
                                   " entries but there are " + std::to_string(n) + " tokens");
  }
  v.text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) v.text_to_id.try_emplace(v.text[i], static_cast<int32_t>(i));

  // ---- pieces (decoded bytes) and byte tokens ----
  v.piece.resize(n);
  v.byte_token.fill(-1);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = v.text[i];
    const TokenType ty = v.type[i];
    if (ty == TokenType::Control || ty == TokenType::Unused || ty == TokenType::UserDefined ||
        ty == TokenType::Unknown) {
      v.piece[i] = t;
    } else if (v.kind == VocabKind::BytePair) {
      std::string bytes;
      v.piece[i] = byte_level_decode(t, bytes) ? bytes : t;
    } else if (ty == TokenType::Byte) {
      const int b = parse_byte_token(t);
      check(b >= 0,
            where + ": token " + std::to_string(i) + " (\"" + t + "\") has type byte but is not <0xXX>");
      v.piece[i] = std::string(1, static_cast<char>(b));
      if (v.byte_token[b] < 0) v.byte_token[b] = static_cast<int32_t>(i);
    } else {
      v.piece[i] = replace_all(t, kSpaceMark, " ");
    }
  }
  if (v.kind == VocabKind::BytePair) {
    const auto& map = ByteUnicodeMap::get();
    for (int b = 0; b < 256; ++b) {
      auto it = v.text_to_id.find(map.encode(static_cast<uint8_t>(b)));
      if (it != v.text_to_id.end()) v.byte_token[b] = it->second;
    }
  }

  // ---- merges ----
  std::vector<size_t> merges_right_start_with_mark;
  if (f.find("tokenizer.ggml.merges")) {
    const std::vector<std::string> merges = string_array(f, "tokenizer.ggml.merges");
    v.merges.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
      const std::string& m = merges[r];
      bool found = false, parts_known = false;
      // Token texts may themselves contain spaces: take the first split whose two sides are tokens.
      for (size_t sp = m.find(' ', 1); sp != std::string::npos && sp + 1 < m.size();
           sp = m.find(' ', sp + 1)) {
        auto l = v.text_to_id.find(m.substr(0, sp));
        auto rr = v.text_to_id.find(m.substr(sp + 1));
        if (l == v.text_to_id.end() || rr == v.text_to_id.end()) continue;
        parts_known = true;
        auto res = v.text_to_id.find(m.substr(0, sp) + m.substr(sp + 1));
        if (res == v.text_to_id.end()) continue;
        v.merges.add(l->second, rr->second, static_cast<int32_t>(r), res->second);
        if (m.compare(sp + 1, kSpaceMark.size(), kSpaceMark) == 0) merges_right_start_with_mark.push_back(r);
        found = true;
        break;
      }
      if (!found) {
        const std::string what = m.find(' ', 1) == std::string::npos || m.back() == ' '
                                     ? "is not two tokens separated by a space"
                                 : parts_known ? "joins two tokens into text that is not a token"
                                               : "names a token that is not in tokenizer.ggml.tokens";
        throw Error(where + ": tokenizer.ggml.merges[" + std::to_string(r) + "] = \"" + m + "\" " + what);
      }
    }
  }
  if (v.kind == VocabKind::BytePair) {
    check(f.find("tokenizer.ggml.merges") != nullptr || n <= 256,
          where + ": tokenizer.ggml.merges is missing (byte-level BPE needs it)");
  }

  // ---- can SentencePiece text be cut before each U+2581? ----
  if (v.kind != VocabKind::BytePair) {
    // A merge joins across a cut before "▁" only if its right side starts with "▁"; without merges, any two
    // symbols whose joined text is a token merge, so no token may hold "▁" after its first character.
    bool safe = true;
    if (!merges_right_start_with_mark.empty()) {
      safe = false;
    } else if (v.merges.empty()) {
      for (size_t i = 0; i < n && safe; ++i) {
        if (v.type[i] == TokenType::Normal && v.text[i].find(kSpaceMark, 1) != std::string::npos)
          safe = false;
      }
    }
    v.split_at_space_mark = safe;
  }

  // ---- pre-tokenizer ----
  if (v.kind == VocabKind::BytePair) {
    if (f.find("tokenizer.tandem.pre_regexes")) {
      v.pre_regexes = string_array(f, "tokenizer.tandem.pre_regexes");
    } else {
      auto regexes = pre_regexes(v.pre.empty() ? "default" : v.pre);
      check(regexes.has_value(),
            where + ": tokenizer.ggml.pre = \"" + v.pre +
                "\" is not a pre-tokenizer tandem knows (known: " + supported_pre_types() + ")");
      v.pre_regexes = *regexes;
    }
  } else if (v.kind == VocabKind::Gemma4) {
    v.pre_regexes = {kGemma4Pattern};
  }
  if (const auto* im = f.find("tokenizer.ggml.ignore_merges")) {
    check(im->type() == gguf::ValueType::BOOL, where + ": tokenizer.ggml.ignore_merges must be a bool");
    v.ignore_merges = im->as_bool();
  } else {
    v.ignore_merges =
        v.kind == VocabKind::BytePair && (v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3");
  }
  if (v.kind == VocabKind::BytePair && v.ignore_merges) {
    for (size_t i = 0; i < n; ++i) {
      if (v.type[i] == TokenType::Normal || v.type[i] == TokenType::Byte) {
        v.piece_to_id.try_emplace(v.piece[i], static_cast<int32_t>(i));
      }
    }
  }

  // ---- special tokens and flags ----
  auto special = [&](const char* key, int32_t& id) {
    const gguf::Value* val = f.find(key);
    if (!val) return;
    check(val->is_integer(), where + ": " + key + " must be an integer");
    const int64_t x = val->as_int();
    check(x >= 0 && x < static_cast<int64_t>(n), where + ": " + key + " = " + std::to_string(x) +
                                                     " is outside the vocabulary (" + std::to_string(n) +
                                                     " tokens)");
    id = static_cast<int32_t>(x);
  };
  special("tokenizer.ggml.bos_token_id", v.bos);
  special("tokenizer.ggml.eos_token_id", v.eos);
  special("tokenizer.ggml.unknown_token_id", v.unk);
  special("tokenizer.ggml.padding_token_id", v.pad);
  special("tokenizer.ggml.mask_token_id", v.mask);
  special("tokenizer.ggml.eot_token_id", v.eot);
  if (v.unk < 0) {
    for (size_t i = 0; i < n; ++i) {
      if (v.type[i] == TokenType::Unknown) {
        v.unk = static_cast<int32_t>(i);
        break;
      }
    }
  }
  auto flag = [&](const char* key, bool fallback) {
    const gguf::Value* val = f.find(key);
    if (!val) return fallback;
    check(val->type() == gguf::ValueType::BOOL, where + ": " + key + " must be a bool");
    return val->as_bool();
  };
  v.add_bos = flag("tokenizer.ggml.add_bos_token", v.kind != VocabKind::BytePair);
  v.add_eos = flag("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = flag("tokenizer.ggml.add_space_prefix", v.kind == VocabKind::SentencePiece);
  if (v.kind == VocabKind::Gemma4) v.add_space_prefix = false;

  for (size_t i = 0; i < n; ++i) {
    const TokenType ty = v.type[i];
    if ((ty == TokenType::Control || ty == TokenType::UserDefined || ty == TokenType::Unknown) &&
        !v.text[i].empty()) {
      v.special_tokens.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(v.special_tokens.begin(), v.special_tokens.end(),
                   [&](int32_t a, int32_t b) { return v.text[a].size() > v.text[b].size(); });
  return v;
}

}  // namespace tandem::tokenizer
