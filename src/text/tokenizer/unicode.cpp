// UTF-8 validation/repair (maximal-subpart replacement) and Unicode classes via utf8proc.
#include "text/tokenizer/unicode.h"

#include <utf8proc.h>

namespace arbor::unicode {

void append_utf8(std::string& out, char32_t cp) {
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

namespace {

// Inspects the sequence at s[i]. Returns its length when it is a complete valid character; otherwise
// returns 0 and sets `consumed` to the length of the maximal invalid subpart (>= 1) and `truncated` when
// the subpart ran into the end of the input (so more bytes could still complete it).
size_t check_seq(std::string_view s, size_t i, size_t& consumed, bool& truncated) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  truncated = false;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    consumed = 1;
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      consumed = k;
      truncated = true;
      return 0;
    }
    unsigned char x = b(i + k);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (x < l || x > h) {
      consumed = k;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

size_t valid_prefix_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t consumed;
    bool truncated;
    size_t n = check_seq(s, i, consumed, truncated);
    if (n == 0) return i;
    i += n;
  }
  return i;
}

std::string to_valid_utf8(std::string_view s) {
  size_t first_bad = valid_prefix_len(s);
  if (first_bad == s.size()) return std::string(s);
  std::string out(s.substr(0, first_bad));
  size_t i = first_bad;
  while (i < s.size()) {
    size_t consumed;
    bool truncated;
    size_t n = check_seq(s, i, consumed, truncated);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += consumed;
    }
  }
  return out;
}

size_t emittable_prefix_len(std::string_view s) {
  // Only the last (up to 3) bytes can be an incomplete sequence.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i-- > start;) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t consumed;
    bool truncated;
    if (check_seq(s, i, consumed, truncated) == 0 && truncated) return i;
    return s.size();
  }
  return s.size();
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static utf8proc_category_t cat(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

bool is_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
bool is_mark(char32_t c) {
  auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME;
}
bool is_punctuation(char32_t c) {
  auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}
bool is_symbol(char32_t c) {
  auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_SM && k <= UTF8PROC_CATEGORY_SO;
}

void append_lowercase(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  if (c == 0x130) {  // the one full (multi-character) lowercase mapping
    out += "i\xCC\x87";
    return;
  }
  append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

}  // namespace arbor::unicode
