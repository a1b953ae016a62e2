#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_split.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

// Unicode White_Space, as the contents of a character class.
constexpr std::string_view kWhiteSpace =
    R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

}  // namespace

std::string adapt_pattern_for_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct RegexSplitter::Impl {
  std::vector<std::unique_ptr<pcre2_code, CodeDeleter>> codes;
  std::vector<bool> jit;
};

RegexSplitter::RegexSplitter(const std::vector<std::string>& patterns) : impl_(std::make_unique<Impl>()) {
  for (const auto& pattern : patterns) {
    const std::string adapted = adapt_pattern_for_pcre2(pattern);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(adapted.data()), adapted.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error("pre-tokenizer regex \"" + pattern + "\" does not compile: " +
                  reinterpret_cast<const char*>(msg) + " (at offset " + std::to_string(err_off) + ")");
    }
    impl_->codes.emplace_back(code);
    impl_->jit.push_back(pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0);
  }
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

bool RegexSplitter::empty() const {
  return impl_->codes.empty();
}

void RegexSplitter::split(std::string_view text, std::vector<Span>& out) const {
  // Valid UTF-8 runs, and each invalid byte on its own.
  std::vector<Span> pieces, next;
  std::vector<bool> valid, next_valid;
  for (size_t i = 0, run = 0; i <= text.size();) {
    const size_t len = i < text.size() ? utf8_valid_len(text, i) : 0;
    if (len == 0) {
      if (i > run) {
        pieces.emplace_back(run, i);
        valid.push_back(true);
      }
      if (i == text.size()) break;
      pieces.emplace_back(i, i + 1);
      valid.push_back(false);
      run = ++i;
    } else {
      i += len;
    }
  }

  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create(1, nullptr));
  for (size_t r = 0; r < impl_->codes.size(); ++r) {
    pcre2_code* code = impl_->codes[r].get();
    next.clear();
    next_valid.clear();
    for (size_t p = 0; p < pieces.size(); ++p) {
      const auto [pb, pe] = pieces[p];
      if (!valid[p]) {
        next.push_back(pieces[p]);
        next_valid.push_back(false);
        continue;
      }
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + pb);
      const size_t n = pe - pb;
      size_t pos = 0, last = 0;
      while (pos <= n) {
        int rc = impl_->jit[r] ? pcre2_jit_match(code, subject, n, pos, 0, md.get(), nullptr)
                               : pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
          rc = pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          throw Error(std::string("pre-tokenizer regex failed: ") + reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {  // an empty match splits nothing; move on by one character
          if (ms >= n) break;
          pos = ms + utf8_len_from_lead(static_cast<uint8_t>(text[pb + ms]));
          continue;
        }
        if (ms > last) {
          next.emplace_back(pb + last, pb + ms);
          next_valid.push_back(true);
        }
        next.emplace_back(pb + ms, pb + me);
        next_valid.push_back(true);
        last = pos = me;
      }
      if (last < n) {
        next.emplace_back(pb + last, pe);
        next_valid.push_back(true);
      }
    }
    pieces.swap(next);
    valid.swap(next_valid);
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

}  // namespace tandem::tokenizer
