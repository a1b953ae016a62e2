// Pre-tokenization by a list of regular expressions, with PCRE2 (UTF + UCP, JIT when available).
//
// Each regex splits every piece left by the previous one into its matches and the text between them, and sees
// only that piece (anchors and lookarounds stop at its ends), as Hugging Face's Split(behavior = Isolated)
// does. Bytes that are not valid UTF-8 become pieces of their own before any regex runs, so any input is
// accepted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::tokenizer {

using Span = std::pair<uint32_t, uint32_t>;  // [begin, end) byte offsets

// Rewrites a pattern written for Oniguruma (what Hugging Face tokenizers uses) so PCRE2 matches the same
// characters: \s and \S become explicit classes of the Unicode White_Space characters (PCRE2's \s with UCP
// also matches U+180E, Oniguruma's does not).
std::string adapt_pattern_for_pcre2(std::string_view pattern);

class RegexSplitter {
 public:
  // Throws tandem::Error naming the pattern when one does not compile.
  explicit RegexSplitter(const std::vector<std::string>& patterns);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;

  // Appends the pieces of text (offsets relative to text, in order, covering all of it) to out.
  void split(std::string_view text, std::vector<Span>& out) const;
  bool empty() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::tokenizer
