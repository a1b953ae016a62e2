#include "tokenizer/unicode.h"

namespace tandem::tokenizer {

size_t utf8_valid_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
  if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
  return n;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t decode_utf8(std::string_view s, size_t i, size_t len) {
  const auto c = static_cast<uint8_t>(s[i]);
  if (len == 1) return c;
  uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  return cp;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // Look back over at most 2 continuation bytes for a lead byte whose sequence is not complete yet.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<uint8_t>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;             // continuation byte: keep looking for the lead
    if (c < 0xC2 || c > 0xF4) return 0;           // ASCII, or a byte that can never lead a sequence
    if (utf8_len_from_lead(c) <= back) return 0;  // complete (or invalid, which waiting cannot fix)
    if (back >= 2) {
      // The second byte has a narrower range after some lead bytes (no overlongs, surrogates, > U+10FFFF).
      const auto c1 = static_cast<uint8_t>(s[n - back + 1]);
      const uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
      const uint8_t hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
      if (c1 < lo || c1 > hi) return 0;
    }
    return back;
  }
  return 0;
}

ByteUnicodeMap::ByteUnicodeMap() {
  reverse_.fill(-1);
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
    append_utf8(byte_to_utf8_[b], cp);
    reverse_[cp] = static_cast<int16_t>(b);
  }
}

const ByteUnicodeMap& ByteUnicodeMap::get() {
  static const ByteUnicodeMap map;
  return map;
}

bool byte_level_decode(std::string_view text, std::string& out) {
  const auto& map = ByteUnicodeMap::get();
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_valid_len(text, i);
    if (len == 0) return false;
    const int b = map.decode(decode_utf8(text, i, len));
    if (b < 0) return false;
    out += static_cast<char>(b);
    i += len;
  }
  return true;
}

}  // namespace tandem::tokenizer
