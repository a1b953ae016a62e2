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

// DeepSeek LLM's letter class, every non-ASCII character written as \x{...}: written as the characters
// themselves, the class did not survive Unicode normalisation of the source (six of them, e.g. U+1FD3 and
// U+212A, have singleton decompositions; normalised, "U+1FD0-U+1FD3" became a reversed range and PCRE2
// refused the pattern).
const char* const kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
const char* const kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
const char* const kCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

struct PreType {
  const char* name;
  std::vector<std::string> regexes;
};

const std::vector<PreType>& pre_types() {
  static const std::vector<PreType> types = {
      // The names llama.cpp's converter writes (tokenizer.ggml.pre), grouped by the regexes llama.cpp gives
      // them. The GPT-2 group's pattern there lacks the final "|\s+": the same pieces, because text no
      // alternative matches becomes a piece of its own here. Names not listed are refused with this list.
      // "gpt2" is not a name llama.cpp knows: tandem's converter wrote it before 2026-12-04, so it stays readable.
      {"gpt-2", {kGpt2Pattern}},
      {"phi-2", {kGpt2Pattern}},
      {"jina-es", {kGpt2Pattern}},
      {"jina-de", {kGpt2Pattern}},
      {"jina-v1-en", {kGpt2Pattern}},
      {"jina-v2-es", {kGpt2Pattern}},
      {"jina-v2-de", {kGpt2Pattern}},
      {"jina-v2-code", {kGpt2Pattern}},
      {"gigachat", {kGpt2Pattern}},
      {"a.x-4.0", {kGpt2Pattern}},
      {"mellum", {kGpt2Pattern}},
      {"modern-bert", {kGpt2Pattern}},
      {"roberta-bpe", {kGpt2Pattern}},
      {"exaone4", {kGpt2Pattern}},
      {"mpt", {kGpt2Pattern}},
      {"olmo", {kGpt2Pattern}},
      {"jais", {kGpt2Pattern}},
      {"default", {kGpt2Pattern}},
      {"gpt2", {kGpt2Pattern}},
      {"trillion", {kGpt2Pattern}},
      {"granite-docling", {kGpt2Pattern}},
      {"llama-bpe", {kLlama3Pattern}},
      {"llama3", {kLlama3Pattern}},
      {"llama-v3", {kLlama3Pattern}},
      {"falcon3", {kLlama3Pattern}},
      {"falcon-h1", {kLlama3Pattern}},
      {"pixtral", {kLlama3Pattern}},
      {"midm-2.0", {kLlama3Pattern}},
      {"lfm2", {kLlama3Pattern}},
      {"jina-v5-nano", {kLlama3Pattern}},
      {"smaug-bpe", {kLlama3Pattern}},
      {"dbrx", {kLlama3Pattern}},
      {"qwen2", {kQwen2Pattern}},
      {"deepseek-r1-qwen", {kQwen2Pattern}},
      {"stablelm2", {kQwen2Pattern}},
      {"kormo", {kQwen2Pattern}},
      {"f2llmv2", {kQwen2Pattern}},
      {"megrez", {kQwen2Pattern}},
      {"hunyuan", {kQwen2Pattern}},
      {"solar-open", {kQwen2Pattern}},
      {"deepseek-llm", {R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+$)", kCjk, R"(\p{N}+)"}},
      {"deepseek-coder", {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}},
      {"starcoder", {R"(\p{N})", kGpt2Pattern}},
      {"refact", {R"(\p{N})", kGpt2Pattern}},
      {"command-r", {R"(\p{N})", kGpt2Pattern}},
      {"smollm", {R"(\p{N})", kGpt2Pattern}},
      {"codeshell", {R"(\p{N})", kGpt2Pattern}},
      {"exaone", {R"(\p{N})", kGpt2Pattern}},
      {"minerva-7b", {R"(\p{N})", kGpt2Pattern}},
      {"mellum2", {R"(\p{N})", kGpt2Pattern}},
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
  // The name llama.cpp's converter writes for each list of regexes (a name llama.cpp does not know would make
  // the file unloadable there: "gpt2" was, until llamacpp_runs_fixtures.py ran our files in llama.cpp).
  for (const char* name :
       {"gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "starcoder", "falcon"}) {
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
