// UTF-8 helpers and the GPT-2 byte <-> character table that byte-level BPE vocabularies are written in.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tokenizer {

// Length of the valid UTF-8 sequence that starts at s[i] (1..4), or 0 when the bytes there are not valid
// UTF-8 (bad lead byte, bad or missing continuation, overlong form, surrogate, or above U+10FFFF).
size_t utf8_valid_len(std::string_view s, size_t i);

// Length implied by a lead byte (1..4), or 1 for a byte that cannot start a sequence.
inline size_t utf8_len_from_lead(uint8_t c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

// Appends the UTF-8 encoding of code point cp.
void append_utf8(std::string& out, uint32_t cp);

// Decodes one valid sequence at s[i] (the caller checked it with utf8_valid_len).
uint32_t decode_utf8(std::string_view s, size_t i, size_t len);

// Number of bytes at the end of s that form the start of a UTF-8 sequence still missing bytes (0..3). Bytes
// that can never become valid are not counted, so they are not held back forever.
size_t utf8_incomplete_tail(std::string_view s);

// GPT-2's reversible byte -> printable character map: printable Latin-1 bytes map to themselves, the rest to
// U+0100 and up, in byte order.
class ByteUnicodeMap {
 public:
  static const ByteUnicodeMap& get();
  // UTF-8 of the character that stands for byte b.
  const std::string& encode(uint8_t b) const { return byte_to_utf8_[b]; }
  // Byte that code point cp stands for, or -1 if cp is not one of the 256 characters.
  int decode(uint32_t cp) const { return cp < reverse_.size() ? reverse_[cp] : -1; }

 private:
  ByteUnicodeMap();
  std::array<std::string, 256> byte_to_utf8_;
  std::array<int16_t, 324> reverse_{};  // the map's characters are all below U+0144
};

// Converts a byte-level token text back to the bytes it stands for. Returns false (and leaves out unchanged
// in an unspecified state) when the text has a character outside the map.
bool byte_level_decode(std::string_view text, std::string& out);

}  // namespace tandem::tokenizer
