// Jinja lexer (see lexer.h). Mirrors jinja2/lexer.py: the root state finds the next "{{", "{%", "{#"
// (or a raw block), applies "-" stripping or lstrip_blocks to the text before it, then lexes the tag.
#include "text/jinja/lexer.h"

#include <cstring>

#include "text/jinja/error.h"
#include "text/jinja/pystr.h"

namespace arbor::jinja {
namespace {

// Whitespace as Python's regex \s and str.isspace() see it, on UTF-8.
size_t space_len_at(const std::string& s, size_t i) {
  unsigned char c = s[i];
  if (c < 0x80) return py::is_space(c) ? 1 : 0;
  size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  if (i + len > s.size()) return 0;
  auto cps = py::decode(std::string_view(s).substr(i, len));
  return cps.size() == 1 && py::is_space(cps[0]) ? len : 0;
}

size_t skip_space(const std::string& s, size_t i) {
  while (i < s.size()) {
    size_t n = space_len_at(s, i);
    if (!n) break;
    i += n;
  }
  return i;
}

// Start of the whitespace suffix of s[0, end).
size_t space_suffix_start(const std::string& s, size_t end) {
  size_t e = end;
  while (e > 0) {
    size_t b = e - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80 && e - b < 4) --b;
    if (space_len_at(s, b) != e - b) break;
    e = b;
  }
  return e;
}

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name, const LexOptions& opt) : name_(name), opt_(opt) {
    // Newlines become "\n" and one trailing newline goes (keep_trailing_newline=False).
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_.push_back(src[i]);
      }
    }
    if (!opt_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        emit(Tok::Data, src_.substr(pos_), pos_);
        break;
      }
      char kind = src_[start + 1];  // '{', '%', '#'
      size_t after = start + 2;
      char sign = after < src_.size() && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
      bool raw = kind == '%' && match_raw_begin(start);
      std::string text = src_.substr(pos_, start - pos_);
      if (sign == '-') {
        text.resize(space_suffix_start(text, text.size()));
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        size_t l = text.rfind('\n');
        size_t l_pos = l == std::string::npos ? 0 : l + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && space_suffix_start(text, text.size()) <= l_pos)
          text.resize(l_pos);
      }
      if (!text.empty()) emit(Tok::Data, text, pos_);
      size_t tag_end;
      if (raw) {
        tag_end = lex_raw(start);
      } else if (kind == '#') {
        tag_end = lex_comment(start, after + (sign ? 1 : 0));
      } else {
        tag_end = lex_tag(start, kind, after + (sign ? 1 : 0));
      }
      line_starting = tag_end > 0 && src_[tag_end - 1] == '\n';
      pos_ = tag_end;
    }
    toks_.push_back(Token{Tok::Eof, "", line_of(src_.size()), col_of(src_.size())});
    return std::move(toks_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  int line_of(size_t p) {
    // Lines are counted incrementally: positions only move forward except for error reports.
    if (p < line_pos_) line_pos_ = 0, line_ = 1, line_start_ = 0;
    for (; line_pos_ < p && line_pos_ < src_.size(); ++line_pos_)
      if (src_[line_pos_] == '\n') ++line_, line_start_ = line_pos_ + 1;
    return line_;
  }
  int col_of(size_t p) {
    line_of(p);
    // Columns count code points from the line start, incrementally (long one-line templates).
    if (col_line_start_ != line_start_ || p < col_pos_) col_line_start_ = line_start_, col_pos_ = line_start_, col_ = 1;
    col_ += int(py::length(std::string_view(src_).substr(col_pos_, p - col_pos_)));
    col_pos_ = p;
    return col_;
  }

  [[noreturn]] void error(size_t p, const std::string& msg) {
    throw TemplateError("syntax", name_, line_of(p), col_of(p), msg);
  }

  void emit(Tok t, std::string text, size_t p) { toks_.push_back(Token{t, std::move(text), line_of(p), col_of(p)}); }

  // After a closing "%}" / "#}": "\n" is eaten with trim_blocks; "-%}" eats all whitespace; "+%}" none.
  size_t after_end(size_t end_pos, char sign) {
    if (sign == '-') return skip_space(src_, end_pos);
    if (sign == 0 && opt_.trim_blocks && end_pos < src_.size() && src_[end_pos] == '\n') return end_pos + 1;
    return end_pos;
  }

  bool word_at(size_t p, const char* w) const {
    size_t n = std::strlen(w);
    if (src_.compare(p, n, w) != 0) return false;
    char c = p + n < src_.size() ? src_[p + n] : ' ';
    return !(std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  }

  // "{%" ["-"|"+"] \s* "raw" \s* ("-%}" | "%}")
  bool match_raw_begin(size_t start) {
    size_t p = start + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_space(src_, p);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = skip_space(src_, p + 3);
    return src_.compare(p, 3, "-%}") == 0 || src_.compare(p, 2, "%}") == 0;
  }

  size_t lex_raw(size_t start) {
    size_t p = start + 2;
    if (src_[p] == '-' || src_[p] == '+') ++p;
    p = skip_space(src_, skip_space(src_, p) + 3);
    bool minus = src_[p] == '-';
    p = minus ? skip_space(src_, p + 3) : p + 2;  // raw begin: no trim_blocks newline removal
    // Find "{%" [-+] \s* "endraw" \s* ("+%}" | "-%}" | "%}").
    for (size_t q = src_.find("{%", p); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t r = q + 2;
      char sign = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r] : 0;
      if (sign) ++r;
      r = skip_space(src_, r);
      if (!word_at(r, "endraw")) continue;
      r = skip_space(src_, r + 6);
      char esign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) esign = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string text = src_.substr(p, q - p);
      if (sign == '-') {
        text.resize(space_suffix_start(text, text.size()));
      } else if (sign != '+' && opt_.lstrip_blocks) {
        size_t l = text.rfind('\n');
        size_t l_pos = l == std::string::npos ? 0 : l + 1;
        if (l_pos > 0 && l_pos < text.size() && space_suffix_start(text, text.size()) <= l_pos) text.resize(l_pos);
      }
      if (!text.empty()) emit(Tok::Data, text, p);
      return after_end(r + 2, esign);
    }
    error(start, "Missing end of raw directive");
  }

  size_t lex_comment(size_t start, size_t p) {
    for (size_t q = src_.find("#}", p); q != std::string::npos; q = src_.find("#}", q + 1)) {
      // The earliest of "+#}", "-#}", "#}" wins; a sign belongs to the end marker.
      char sign = q > p && (src_[q - 1] == '-' || src_[q - 1] == '+') ? src_[q - 1] : 0;
      return after_end(q + 2, sign);
    }
    error(start, "Missing end of comment tag");
  }

  size_t lex_tag(size_t start, char kind, size_t p) {
    bool var = kind == '{';
    emit(var ? Tok::VarBegin : Tok::BlockBegin, "", start);
    std::vector<char> brackets;
    while (true) {
      p = skip_space(src_, p);
      if (p >= src_.size()) error(start, var ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      if (brackets.empty()) {
        if (var) {
          if (src_.compare(p, 3, "-}}") == 0) {
            emit(Tok::VarEnd, "", p);
            return skip_space(src_, p + 3);
          }
          if (src_.compare(p, 2, "}}") == 0) {
            emit(Tok::VarEnd, "", p);
            return p + 2;
          }
        } else {
          char sign = src_[p] == '-' || src_[p] == '+' ? src_[p] : 0;
          if (src_.compare(p + (sign ? 1 : 0), 2, "%}") == 0) {
            emit(Tok::BlockEnd, "", p);
            return after_end(p + (sign ? 3 : 2), sign);
          }
        }
      }
      p = lex_token(p, brackets);
    }
  }

  size_t lex_token(size_t p, std::vector<char>& brackets) {
    char c = src_[p];
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(p);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = p;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      emit(Tok::Name, src_.substr(p, e - p), p);
      return e;
    }
    if (c == '\'' || c == '"') return lex_string(p);
    static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : two)
      if (src_.compare(p, 2, op) == 0) {
        emit(Tok::Op, op, p);
        return p + 2;
      }
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) && c != 0) {
      if (c == '(' || c == '[' || c == '{') {
        brackets.push_back(c);
      } else if (c == ')' || c == ']' || c == '}') {
        char open = c == ')' ? '(' : c == ']' ? '[' : '{';
        if (brackets.empty()) error(p, fmt::format("unexpected '{}'", c));
        if (brackets.back() != open)
          error(p, fmt::format("unexpected '{}', expected '{}'", c, brackets.back() == '(' ? ')' : brackets.back() == '[' ? ']' : '}'));
        brackets.pop_back();
      }
      emit(Tok::Op, std::string(1, c), p);
      return p + 1;
    }
    error(p, fmt::format("unexpected char {} at {}", py::repr_string(src_.substr(p, 1)), p));
  }

  size_t digits(size_t p, bool (*ok)(char)) const {
    // (_?D)* after a first digit: underscores only between digits.
    while (p < src_.size()) {
      if (ok(src_[p])) {
        ++p;
      } else if (src_[p] == '_' && p + 1 < src_.size() && ok(src_[p + 1])) {
        p += 2;
      } else {
        break;
      }
    }
    return p;
  }

  size_t lex_number(size_t p) {
    static auto dec = [](char ch) { return ch >= '0' && ch <= '9'; };
    bool after_dot = p > 0 && src_[p - 1] == '.';  // "x.0.1" is attribute access, not a float
    if (src_[p] == '0' && p + 2 < src_.size() && std::strchr("xXoObB", src_[p + 1])) {
      char b = src_[p + 1] | 0x20;
      static auto hex = [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) != 0; };
      static auto oct = [](char ch) { return ch >= '0' && ch <= '7'; };
      static auto bin = [](char ch) { return ch == '0' || ch == '1'; };
      bool (*ok)(char) = b == 'x' ? +hex : b == 'o' ? +oct : +bin;
      size_t q = p + 2;
      if (q < src_.size() && src_[q] == '_') ++q;
      if (q < src_.size() && ok(src_[q])) {
        size_t e = digits(q, ok);
        std::string digs;
        for (size_t i = q; i < e; ++i)
          if (src_[i] != '_') digs.push_back(src_[i]);
        auto v = py::parse_int(digs, b == 'x' ? 16 : b == 'o' ? 8 : 2);
        if (!v) error(p, "integer literal too large");
        emit(Tok::Int, std::to_string(*v), p);
        return e;
      }
    }
    size_t e = digits(p, +dec);
    size_t f = e;
    bool is_float = false;
    if (!after_dot) {
      if (f + 1 < src_.size() && src_[f] == '.' && dec(src_[f + 1])) f = digits(f + 1, +dec), is_float = true;
      if (f < src_.size() && (src_[f] == 'e' || src_[f] == 'E')) {
        size_t g = f + 1;
        if (g < src_.size() && (src_[g] == '+' || src_[g] == '-')) ++g;
        if (g < src_.size() && dec(src_[g])) f = digits(g, +dec), is_float = true;
      }
    }
    std::string text;
    for (size_t i = p; i < (is_float ? f : e); ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    if (is_float) {
      emit(Tok::Float, text, p);
      return f;
    }
    // Jinja's integer rule is [1-9](_?\d)* | 0(_?0)*: "012" lexes as "0" then "12".
    if (text.size() > 1 && text[0] == '0') {
      size_t z = p;
      while (z < e && (src_[z] == '0' || src_[z] == '_')) ++z;
      if (z < e) {
        while (z > p && src_[z - 1] == '_') --z;
        emit(Tok::Int, "0", p);
        return z;
      }
    }
    if (!py::parse_int(text, 10)) error(p, "integer literal too large");
    emit(Tok::Int, text, p);
    return e;
  }

  size_t lex_string(size_t p) {
    char q = src_[p];
    std::string out;
    size_t i = p + 1;
    // Validate the extent first, as Jinja's regex does: an unterminated string is an unexpected char.
    size_t end = i;
    while (end < src_.size() && src_[end] != q) end += src_[end] == '\\' ? 2 : 1;
    if (end >= src_.size()) error(p, fmt::format("unexpected char {} at {}", py::repr_string(std::string(1, q)), p));
    while (i < end) {
      char c = src_[i];
      if (c != '\\') {
        out.push_back(c), ++i;
        continue;
      }
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k, ++i) {
            if (i >= end || !std::isxdigit(static_cast<unsigned char>(src_[i])))
              error(p, fmt::format("truncated \\{} escape in string literal", e));
            char h = src_[i];
            cp = cp * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          if (cp > 0x10FFFF) error(p, "illegal Unicode character in string literal");
          py::append_utf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int k = 0; k < 2 && i < end && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i) cp = cp * 8 + uint32_t(src_[i] - '0');
            py::append_utf8(out, cp);
          } else {
            out.push_back('\\'), out.push_back(e);  // unknown escapes stay as written
          }
      }
    }
    emit(Tok::String, out, p);
    return end + 1;
  }

  std::string src_;
  std::string name_;
  LexOptions opt_;
  size_t pos_ = 0;
  std::vector<Token> toks_;
  size_t line_pos_ = 0, line_start_ = 0;
  int line_ = 1;
  size_t col_line_start_ = 0, col_pos_ = 0;
  int col_ = 1;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name, const LexOptions& opt) {
  return Lexer(source, name, opt).run();
}

}  // namespace arbor::jinja
