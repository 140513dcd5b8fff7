// UTF-8 helpers and Unicode character classes for the tokenizer, with the semantics of Rust's `char`
// methods and `String::from_utf8_lossy`, which the reference (HF tokenizers) uses.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace arbor::unicode {

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i past it.
inline char32_t next_cp(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  if (c < 0xE0) {
    char32_t cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
    i += 2;
    return cp;
  }
  if (c < 0xF0) {
    char32_t cp = ((c & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
                  (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
    i += 3;
    return cp;
  }
  char32_t cp = ((c & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12) |
                ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
  i += 4;
  return cp;
}

// Byte length of the UTF-8 sequence that starts with lead byte c (1 for continuation bytes).
inline size_t seq_len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

void append_utf8(std::string& out, char32_t cp);

// Length of the longest valid UTF-8 prefix of s.
size_t valid_prefix_len(std::string_view s);
inline bool is_valid_utf8(std::string_view s) { return valid_prefix_len(s) == s.size(); }

// Replaces each maximal invalid subsequence with U+FFFD, exactly as Rust's from_utf8_lossy and the
// WHATWG decoder (Node's Buffer.toString) do. Valid input is returned unchanged.
std::string to_valid_utf8(std::string_view s);

// Length of a complete-or-invalid prefix: the bytes of s that can be emitted now, holding back only an
// incomplete (but so far valid) trailing sequence that more bytes could still complete.
size_t emittable_prefix_len(std::string_view s);

// Rust char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t c);
// Unicode general-category groups (\p{L}, \p{N}, \p{M}, \p{P}, \p{S}).
bool is_letter(char32_t c);
bool is_number(char32_t c);
bool is_mark(char32_t c);
bool is_punctuation(char32_t c);
bool is_symbol(char32_t c);

// Rust char::to_lowercase appended to out (full mapping: U+0130 becomes "i\u0307").
void append_lowercase(std::string& out, char32_t c);

}  // namespace arbor::unicode
