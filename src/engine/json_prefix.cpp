// JsonPrefixScanner: RFC 8259 prefix validation one byte at a time (strings with escapes, surrogate pairs
// and UTF-8 checked), with events where values and keys begin and end.
#include "engine/json_prefix.h"

#include <string_view>

namespace arbor {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void JsonPrefixScanner::value_end(size_t start, size_t end, std::vector<Event>& ev) {
  ev.push_back({Event::Kind::End, int(stack_.size()), start, end});
  exp() = stack_.empty() ? Exp::After : Exp::CommaOrClose;
}

bool JsonPrefixScanner::structural(char c, size_t pos, std::vector<Event>& ev) {
  if (is_space(c)) return true;
  Exp& e = exp();
  auto begin_value = [&]() -> bool {
    if (c == '{' || c == '[') {
      ev.push_back({Event::Kind::Begin, int(stack_.size()), pos, 0});
      stack_.push_back({c, c == '{' ? Exp::KeyOrClose : Exp::ValueOrClose, pos});
      return true;
    }
    if (c == '"') {
      ev.push_back({Event::Kind::Begin, int(stack_.size()), pos, 0});
      lex_ = Lex::Str, lex_start_ = pos, key_ = false;
      return true;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      ev.push_back({Event::Kind::Begin, int(stack_.size()), pos, 0});
      lex_ = Lex::Num, lex_start_ = pos, num_ = c == '-' ? Num::Minus : c == '0' ? Num::Zero : Num::Int;
      return true;
    }
    if (c == 't' || c == 'f' || c == 'n') {
      ev.push_back({Event::Kind::Begin, int(stack_.size()), pos, 0});
      lex_ = Lex::Lit, lex_start_ = pos, lit_ = c == 't' ? "rue" : c == 'f' ? "alse" : "ull";
      return true;
    }
    return false;
  };
  auto close = [&](char want) -> bool {
    if (stack_.empty() || stack_.back().kind != want) return false;
    size_t start = stack_.back().start;
    stack_.pop_back();
    value_end(start, pos + 1, ev);
    return true;
  };
  switch (e) {
    case Exp::Value: return begin_value();
    case Exp::ValueOrClose: return c == ']' ? close('[') : begin_value();
    case Exp::KeyOrClose:
    case Exp::Key:
      if (c == '}' && e == Exp::KeyOrClose) return close('{');
      if (c != '"') return false;
      lex_ = Lex::Str, lex_start_ = pos, key_ = true;
      return true;
    case Exp::Colon:
      if (c != ':') return false;
      e = Exp::Value;
      return true;
    case Exp::CommaOrClose:
      if (c == ',') {
        e = stack_.back().kind == '{' ? Exp::Key : Exp::Value;
        return true;
      }
      if (c == '}' || c == ']') return close(c == '}' ? '{' : '[');
      return false;
    case Exp::After:
      if (multi_ && c == ';') {
        top_ = Exp::Value;
        return true;
      }
      return false;
  }
  return false;
}

bool JsonPrefixScanner::step(char c, size_t pos, std::vector<Event>& ev) {
  const auto uc = static_cast<unsigned char>(c);
  switch (lex_) {
    case Lex::None: return structural(c, pos, ev);
    case Lex::Lit:
      if (c != *lit_) return false;
      if (*++lit_ == '\0') {
        lex_ = Lex::None;
        value_end(lex_start_, pos + 1, ev);
      }
      return true;
    case Lex::Num: {
      const bool digit = c >= '0' && c <= '9';
      Num next = num_;
      bool ok = true;
      switch (num_) {
        case Num::Minus: ok = digit, next = c == '0' ? Num::Zero : Num::Int; break;
        case Num::Zero:
          if (c == '.') next = Num::Dot;
          else if (c == 'e' || c == 'E') next = Num::E;
          else ok = false;
          break;
        case Num::Int:
          if (digit) next = Num::Int;
          else if (c == '.') next = Num::Dot;
          else if (c == 'e' || c == 'E') next = Num::E;
          else ok = false;
          break;
        case Num::Dot: ok = digit, next = Num::Frac; break;
        case Num::Frac:
          if (digit) next = Num::Frac;
          else if (c == 'e' || c == 'E') next = Num::E;
          else ok = false;
          break;
        case Num::E: ok = digit || c == '+' || c == '-', next = digit ? Num::Exp : Num::ESign; break;
        case Num::ESign: ok = digit, next = Num::Exp; break;
        case Num::Exp: ok = digit, next = Num::Exp; break;
      }
      if (ok) {
        num_ = next;
        return true;
      }
      if (num_ == Num::Minus || num_ == Num::Dot || num_ == Num::E || num_ == Num::ESign) return false;
      // c ends the number; it must then be valid structurally, or nothing changes.
      JsonPrefixScanner saved = *this;
      size_t n_ev = ev.size();
      lex_ = Lex::None;
      value_end(lex_start_, pos, ev);
      if (structural(c, pos, ev)) return true;
      *this = std::move(saved);
      ev.resize(n_ev);
      return false;
    }
    case Lex::Str: break;
  }
  // Inside a string.
  if (utf8_need_ > 0) {
    if (uc < utf8_lo_ || uc > utf8_hi_) return false;
    --utf8_need_;
    utf8_lo_ = 0x80, utf8_hi_ = 0xBF;
    return true;
  }
  if (esc_ == 1) {
    if (c == 'u') {
      esc_ = 2, u_ = 0;
      return true;
    }
    if (want_low_ || std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos) return false;
    esc_ = 0;
    return true;
  }
  if (esc_ >= 2) {
    int h = hex_value(c);
    if (h < 0) return false;
    unsigned u = u_ * 16 + unsigned(h);
    if (esc_ < 5) {
      // A low surrogate must follow a high one: \uDC00..\uDFFF, so its first digit is D.
      if (esc_ == 2 && want_low_ && h != 0xD) return false;
      // Rule out a surrogate of the wrong kind as soon as its first two digits say so.
      if (esc_ == 3) {
        bool low = u >= 0xDC && u <= 0xDF;
        if (want_low_ ? !low : low) return false;
      }
      u_ = u, ++esc_;
      return true;
    }
    esc_ = 0, u_ = u;
    if (want_low_) want_low_ = false;
    else if (u >= 0xD800 && u <= 0xDBFF) want_low_ = true;
    return true;
  }
  if (want_low_) {
    if (c != '\\') return false;
    esc_ = 1;
    return true;
  }
  if (c == '"') {
    lex_ = Lex::None;
    if (key_) {
      ev.push_back({Event::Kind::Key, int(stack_.size()), lex_start_, pos + 1});
      stack_.back().exp = Exp::Colon;
    } else {
      value_end(lex_start_, pos + 1, ev);
    }
    return true;
  }
  if (c == '\\') {
    esc_ = 1;
    return true;
  }
  if (uc < 0x20) return false;
  if (uc >= 0x80) {
    if (uc >= 0xC2 && uc <= 0xDF) utf8_need_ = 1;
    else if (uc >= 0xE0 && uc <= 0xEF) utf8_need_ = 2, utf8_lo_ = uc == 0xE0 ? 0xA0 : 0x80, utf8_hi_ = uc == 0xED ? 0x9F : 0xBF;
    else if (uc >= 0xF0 && uc <= 0xF4) utf8_need_ = 3, utf8_lo_ = uc == 0xF0 ? 0x90 : 0x80, utf8_hi_ = uc == 0xF4 ? 0x8F : 0xBF;
    else return false;
  }
  return true;
}

bool JsonPrefixScanner::done() const { return lex_ == Lex::None && stack_.empty() && top_ == Exp::After; }

std::string JsonPrefixScanner::closing(int depth) const {
  std::string s;
  bool value_closed = false;  // the open token completed a value (or a key, given ':null')
  switch (lex_) {
    case Lex::None: break;
    case Lex::Lit: s += lit_, value_closed = true; break;
    case Lex::Num:
      if (num_ == Num::Minus || num_ == Num::Dot || num_ == Num::E || num_ == Num::ESign) s += '0';
      value_closed = true;
      break;
    case Lex::Str: {
      // A partial UTF-8 character cannot be completed meaningfully; the decoder never splits one.
      if (esc_ == 1) {
        s += want_low_ ? "udc00" : "\\";
      } else if (want_low_ && esc_ >= 2 && esc_ <= 3) {
        s += esc_ == 2 ? "dc00" : "c00";
      } else if (esc_ >= 2) {
        unsigned u = u_;
        for (int k = esc_; k < 6; ++k) s += '0', u *= 16;
        if (!want_low_ && u >= 0xD800 && u <= 0xDBFF) s += "\\udc00";
      } else if (want_low_) {
        s += "\\udc00";
      }
      s += '"';
      if (key_) s += ":null";
      value_closed = true;
      break;
    }
  }
  for (int i = int(stack_.size()) - 1; i >= depth && i >= 0; --i) {
    const Frame& f = stack_[size_t(i)];
    Exp e = f.exp;
    // An outer container's value is the inner container being closed; the innermost one's may be the open token.
    if (i < int(stack_.size()) - 1 || value_closed) e = Exp::CommaOrClose;
    if (e == Exp::Colon) s += ":null";
    else if (e == Exp::Value) s += "null";
    else if (e == Exp::Key) s += "\"\":null";
    s += f.kind == '{' ? '}' : ']';
  }
  return s;
}

}  // namespace arbor
