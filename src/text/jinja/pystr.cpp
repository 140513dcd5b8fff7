// Python string semantics on UTF-8 strings (see pystr.h).
#include "text/jinja/pystr.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

namespace arbor::jinja::py {

std::vector<uint32_t> decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    uint32_t cp = 0;
    int len = 0;
    if (c < 0x80) {
      out.push_back(c), ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F, len = 2;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F, len = 3;
    } else if ((c & 0xF8) == 0xF0) {
      cp = c & 0x07, len = 4;
    }
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF like a strict decoder.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
               (cp >= 0xD800 && cp <= 0xDFFF)))
      ok = false;
    if (!ok) {
      out.push_back(0xDC00 + c), ++i;  // surrogateescape: keeps the raw byte
      continue;
    }
    out.push_back(cp), i += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(char(cp - 0xDC00));
  } else if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string encode(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) append_utf8(out, cp);
  return out;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

size_t length(std::string_view s) { return is_ascii(s) ? s.size() : decode(s).size(); }

int64_t cp_index(std::string_view s, size_t byte_off) { return int64_t(length(s.substr(0, byte_off))); }

bool is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_linebreak(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
         cp == 0x2028 || cp == 0x2029;
}

// Case pairs for the scripts templates meet in practice: ASCII, Latin-1, Greek, Cyrillic.
uint32_t to_upper(uint32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7)) return cp - 32;
  if (cp == 0xFF) return 0x178;
  if (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) return cp - 32;
  if (cp == 0x3C2) return 0x3A3;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
    // Latin Extended-A alternates upper/lower pairs (even = upper) except in 0x139..0x148 and 0x179..0x17E.
    bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    if (odd_upper ? (cp % 2 == 0) : (cp % 2 == 1)) return cp - 1;
  }
  return cp;
}

uint32_t to_lower(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)) return cp + 32;
  if (cp == 0x178) return 0xFF;
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
    bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    if (odd_upper ? (cp % 2 == 1) : (cp % 2 == 0)) return cp + 1;
  }
  return cp;
}

bool is_upper(uint32_t cp) { return to_lower(cp) != cp; }
bool is_lower(uint32_t cp) { return to_upper(cp) != cp || cp == 0xDF; }
static bool is_cased(uint32_t cp) { return is_upper(cp) || is_lower(cp); }
bool is_digit(uint32_t cp) { return cp >= '0' && cp <= '9'; }
bool is_alpha(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  // Outside ASCII: letters of cased scripts, plus the CJK/kana/hangul blocks (category Lo).
  return is_cased(cp) || cp == 0xDF || (cp >= 0x3040 && cp <= 0x30FF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3);
}

template <typename F>
static std::string map_cps(std::string_view s, F f) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out) c = char(f(uint32_t((unsigned char)c)));
    return out;
  }
  auto cps = decode(s);
  for (auto& c : cps) c = f(c);
  return encode(cps);
}

std::string upper(std::string_view s) { return map_cps(s, to_upper); }
std::string lower(std::string_view s) { return map_cps(s, to_lower); }

std::string capitalize(std::string_view s) {
  auto cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? to_upper(cps[i]) : to_lower(cps[i]);
  return encode(cps);
}

std::string title(std::string_view s) {
  auto cps = decode(s);
  bool prev_cased = false;
  for (auto& c : cps) {
    bool cased = is_cased(c);
    if (cased) c = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = cased;
  }
  return encode(cps);
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  auto cps = decode(s);
  std::vector<uint32_t> set;
  if (chars) set = decode(*chars);
  auto drop = [&](uint32_t c) {
    if (!chars) return is_space(c);
    for (uint32_t x : set)
      if (x == c) return true;
    return false;
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b])) ++b;
  if (right)
    while (e > b && drop(cps[e - 1])) --e;
  return encode(std::vector<uint32_t>(cps.begin() + b, cps.begin() + e));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      size_t f = s.find(*sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  auto cps = decode(s);
  size_t i = 0, n = cps.size();
  while (true) {
    while (i < n && is_space(cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) {
      out.push_back(encode(std::vector<uint32_t>(cps.begin() + i, cps.end())));  // keeps trailing space
      break;
    }
    size_t j = i;
    while (j < n && !is_space(cps[j])) ++j;
    out.push_back(encode(std::vector<uint32_t>(cps.begin() + i, cps.begin() + j)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (int64_t(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    auto cps = decode(s);
    size_t e = cps.size();
    while (true) {
      while (e > 0 && is_space(cps[e - 1])) --e;
      if (e == 0) break;
      if (int64_t(out.size()) >= maxsplit) {
        out.push_back(encode(std::vector<uint32_t>(cps.begin(), cps.begin() + e)));  // keeps leading space
        break;
      }
      size_t b = e;
      while (b > 0 && !is_space(cps[b - 1])) --b;
      out.push_back(encode(std::vector<uint32_t>(cps.begin() + b, cps.begin() + e)));
      e = b;
    }
  }
  return {out.rbegin(), out.rend()};
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  auto cps = decode(s);
  std::vector<std::string> out;
  size_t i = 0, start = 0, n = cps.size();
  while (i < n) {
    if (!is_linebreak(cps[i])) {
      ++i;
      continue;
    }
    size_t eol = i;
    if (cps[i] == '\r' && i + 1 < n && cps[i + 1] == '\n') ++i;
    ++i;
    out.push_back(encode(std::vector<uint32_t>(cps.begin() + start, cps.begin() + (keepends ? i : eol))));
    start = i;
  }
  if (start < n) out.push_back(encode(std::vector<uint32_t>(cps.begin() + start, cps.end())));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` before every code point and at the end.
    auto cps = decode(s);
    int64_t done = 0;
    for (uint32_t c : cps) {
      if (count < 0 || done < count) out += with, ++done;
      append_utf8(out, c);
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(with);
    pos = f + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return int64_t(length(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

static bool printable(uint32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD) return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F)) return false;
  if (c == 0x3000 || c == 0xFEFF || c == 0x1680 || (c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF))
    return false;
  return true;
}

std::string repr_string(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos, has_double = s.find('"') != std::string_view::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t c : decode(s)) {
    if (c == uint32_t(q) || c == '\\') {
      out.push_back('\\'), out.push_back(char(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (printable(c)) {
      append_utf8(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += fmt::format("\\U{:08x}", c);
    }
  }
  out.push_back(q);
  return out;
}

std::string float_str(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // fmt's shortest round-trip form switches to exponent notation at the same thresholds as Python's
  // repr (exponent < -4 or >= 16); Python adds ".0" to integral values.
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

static std::optional<std::string> strip_ascii_ws_and_underscores(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || (s[b] >= 9 && s[b] <= 13))) ++b;
  while (e > b && (s[e - 1] == ' ' || (s[e - 1] >= 9 && s[e - 1] <= 13))) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) {
    if (s[i] == '_') {
      // Python allows one underscore between two digits only.
      auto digit = [&](size_t k) { return k < e && k >= b && std::isalnum((unsigned char)s[k]); };
      if (!digit(i - 1) || !digit(i + 1) || i == b) return std::nullopt;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

std::optional<int64_t> parse_int(std::string_view s, int base) {
  auto t = strip_ascii_ws_and_underscores(s);
  if (!t || t->empty() || base == 1 || base < 0 || base > 36) return std::nullopt;
  size_t i = 0;
  bool neg = false;
  if ((*t)[0] == '+' || (*t)[0] == '-') neg = (*t)[0] == '-', ++i;
  // Prefixes 0x/0o/0b are allowed when they match the base; base 0 takes the base from the prefix.
  if (i + 1 < t->size() && (*t)[i] == '0') {
    char p = char((*t)[i + 1] | 0x20);
    int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (pb && (base == 0 || base == pb)) base = pb, i += 2;
  }
  if (base == 0) {
    if (t->find_first_not_of('0', i) != std::string::npos && (*t)[i] == '0') return std::nullopt;
    base = 10;
  }
  if (i >= t->size()) return std::nullopt;
  uint64_t v = 0;
  for (; i < t->size(); ++i) {
    char c = (*t)[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : c >= 'A' && c <= 'Z' ? c - 'A' + 10 : 99;
    if (d >= base) return std::nullopt;
    if (v > (uint64_t(INT64_MAX) + 1 - d) / uint64_t(base)) return std::nullopt;  // beyond int64: not supported
    v = v * base + d;
  }
  if (!neg && v > uint64_t(INT64_MAX)) return std::nullopt;
  return neg ? int64_t(0 - v) : int64_t(v);
}

std::optional<double> parse_float(std::string_view s) {
  auto t = strip_ascii_ws_and_underscores(s);
  if (!t || t->empty()) return std::nullopt;
  for (char c : *t)
    if (c == 'x' || c == 'X' || c == 'p' || c == 'P') return std::nullopt;  // strtod's hex floats
  std::string low = lower(*t);
  std::string_view body = low;
  bool neg = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) neg = body[0] == '-', body.remove_prefix(1);
  if (body == "inf" || body == "infinity") return neg ? -HUGE_VAL : HUGE_VAL;
  if (body == "nan") return std::nan("");
  if (body.find_first_not_of("0123456789.e+-") != std::string_view::npos) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(t->c_str(), &end);
  if (end != t->c_str() + t->size()) return std::nullopt;
  return v;
}

}  // namespace arbor::jinja::py
