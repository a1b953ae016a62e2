// The pre-tokenizer of each tokenizer.ggml.pre value: an ordered list of regular expressions. Each one splits
// every piece left by the previous one into its matches and the text between them (Hugging Face's Split with
// behavior "Isolated"). Patterns are written as in tokenizer.json; regex.h adapts them for PCRE2.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tokenizer {

// GPT-2's pattern, which Hugging Face's ByteLevel pre-tokenizer applies when use_regex is true.
extern const char* const kGpt2Pattern;
// What Hugging Face's Punctuation pre-tokenizer does (Falcon), as a regex.
extern const char* const kFalconPunctPattern;
// Gemma 4: runs of newlines and runs of everything else.
extern const char* const kGemma4Pattern;

// The regexes of a pre type, or nullopt when tandem does not know it.
std::optional<std::vector<std::string>> pre_regexes(std::string_view pre);

// The pre type whose regexes equal these pre-tokenizer steps (from tokenizer.json), or "" when none does.
// llama.cpp's converter picks the pre type by hashing the ids of a probe text; we compare the patterns
// instead.
std::string match_pre_type(const std::vector<std::string>& steps);

// Comma-separated list of the supported pre types, for error messages.
std::string supported_pre_types();

}  // namespace tandem::tokenizer
