#include "tokenizer/pre_patterns.h"

#include <utility>

namespace tandem::tokenizer {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kFalconPunctPattern = R"([\p{P}\$\+<=>\^~\|`]+)";
const char* const kGemma4Pattern = R"([^\n]+|[\n]+)";

namespace {

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// llama.cpp's spelling of the same pattern (case-insensitivity written out); matched when converting too.
const char* const kLlama3PatternAlt =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* const kDeepseekLetters =
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)";
const char* const kDeepseekPunct = R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)";
const char* const kCjk = R"([一-龥ࠀ-一가-퟿]+)";

struct PreType {
  const char* name;
  std::vector<std::string> regexes;
};

const std::vector<PreType>& pre_types() {
  static const std::vector<PreType> types = {
      {"gpt2", {kGpt2Pattern}},
      {"default", {kGpt2Pattern}},
      {"llama-bpe", {kLlama3Pattern}},
      {"llama3", {kLlama3Pattern}},
      {"llama-v3", {kLlama3Pattern}},
      {"smaug-bpe", {kLlama3Pattern}},
      {"dbrx", {kLlama3Pattern}},
      {"qwen2", {kQwen2Pattern}},
      {"deepseek-r1-qwen", {kQwen2Pattern}},
      {"deepseek-llm", {R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+$)", kCjk, R"(\p{N}+)"}},
      {"deepseek-coder", {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}},
      {"starcoder", {R"(\p{N})", kGpt2Pattern}},
      {"refact", {R"(\p{N})", kGpt2Pattern}},
      {"falcon", {kFalconPunctPattern, kGpt2Pattern, R"([0-9][0-9][0-9])"}},
      {"gemma4", {kGemma4Pattern}},
  };
  return types;
}

}  // namespace

std::optional<std::vector<std::string>> pre_regexes(std::string_view pre) {
  for (const auto& t : pre_types()) {
    if (pre == t.name) return t.regexes;
  }
  return std::nullopt;
}

std::string match_pre_type(const std::vector<std::string>& steps) {
  std::vector<std::string> s = steps;
  for (auto& x : s) {
    if (x == kLlama3PatternAlt) x = kLlama3Pattern;
    // "[\r\n]" may be written with the characters themselves.
    if (x == "[\r\n]") x = R"([\r\n])";
  }
  // The first name listed for a list of regexes is the one llama.cpp's converter writes.
  for (const char* name :
       {"gpt2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "starcoder", "falcon"}) {
    if (*pre_regexes(name) == s) return name;
  }
  // Falcon's tokenizer.json also splits digit runs (Digits) before cutting them in threes.
  if (s.size() == 4 && s[0] == kFalconPunctPattern && s[1] == kGpt2Pattern && s[3] == "[0-9][0-9][0-9]") {
    return "falcon";
  }
  // DeepSeek LLM: match on the shape, since the long letter class is easy to spell differently.
  if (s.size() == 6 && s[0] == R"([\r\n])" && s[1].rfind(R"(\s?[A-Za-z)", 0) == 0 && s[3] == R"(\s+$)") {
    return "deepseek-llm";
  }
  return "";
}

std::string supported_pre_types() {
  std::string out;
  for (const auto& t : pre_types()) {
    if (!out.empty()) out += ", ";
    out += t.name;
  }
  return out;
}

}  // namespace tandem::tokenizer
