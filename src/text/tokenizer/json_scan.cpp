// The tokenizer.json scanner: strict JSON strings/objects/arrays, enough to stream the vocab and merges.
#include "text/tokenizer/json_scan.h"

#include "core/error.h"
#include "text/tokenizer/unicode.h"

namespace arbor {
namespace {

class Scanner {
 public:
  Scanner(std::string_view t, const std::string& src) : t_(t), src_(src) {}

  [[noreturn]] void error(std::string_view what) const { fail("tokenizer: {}: JSON error at byte {}: {}", src_, i_, what); }

  char peek() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) ++i_;
    if (i_ >= t_.size()) error("unexpected end of input");
    return t_[i_];
  }
  void expect(char c) {
    if (peek() != c) error(fmt::format("expected '{}', found '{}'", c, t_[i_]));
    ++i_;
  }
  // After an element: true when another follows (',' consumed), false at `close` (consumed).
  bool next(char close) {
    char c = peek();
    ++i_;
    if (c == ',') return true;
    if (c == close) return false;
    error(fmt::format("expected ',' or '{}', found '{}'", close, c));
  }
  bool empty_container(char close) {
    if (peek() == close) {
      ++i_;
      return true;
    }
    return false;
  }

  std::string string() {
    expect('"');
    std::string out;
    size_t start = i_;
    for (;;) {
      if (i_ >= t_.size()) error("unterminated string");
      char c = t_[i_];
      if (c == '"') {
        out.append(t_.substr(start, i_ - start));
        ++i_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
      if (c != '\\') {
        ++i_;
        continue;
      }
      out.append(t_.substr(start, i_ - start));
      if (i_ + 1 >= t_.size()) error("unterminated escape");
      char e = t_[i_ + 1];
      i_ += 2;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          char32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (i_ + 1 < t_.size() && t_[i_] == '\\' && t_[i_ + 1] == 'u') {
              i_ += 2;
              char32_t lo = hex4();
              if (lo < 0xDC00 || lo > 0xDFFF) error("invalid low surrogate");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              error("lone high surrogate");
            }
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            error("lone low surrogate");
          }
          unicode::append_utf8(out, cp);
          break;
        }
        default: error(fmt::format("bad escape '\\{}'", e));
      }
      start = i_;
    }
  }

  int64_t integer() {
    peek();
    size_t start = i_;
    bool neg = false;
    if (t_[i_] == '-') {
      neg = true;
      ++i_;
    }
    int64_t v = 0;
    size_t digits = 0;
    while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9' && digits < 18) {
      v = v * 10 + (t_[i_++] - '0');
      ++digits;
    }
    if (digits == 0 || (i_ < t_.size() && (t_[i_] == '.' || t_[i_] == 'e' || t_[i_] == 'E' || (t_[i_] >= '0' && t_[i_] <= '9')))) {
      i_ = start;
      error("expected an integer id");
    }
    return neg ? -v : v;
  }

  // Skips one value and returns its text.
  std::string_view skip_value() {
    peek();
    size_t start = i_;
    char c = t_[i_];
    if (c == '"') {
      skip_string();
    } else if (c == '{' || c == '[') {
      int depth = 0;
      do {
        char d = t_[i_];
        if (d == '"') {
          skip_string();
          continue;
        }
        if (d == '{' || d == '[') ++depth;
        if (d == '}' || d == ']') --depth;
        ++i_;
        if (depth > 0 && i_ >= t_.size()) error("unterminated container");
      } while (depth > 0);
    } else {
      while (i_ < t_.size() && t_[i_] != ',' && t_[i_] != '}' && t_[i_] != ']' && t_[i_] != ' ' && t_[i_] != '\n' &&
             t_[i_] != '\r' && t_[i_] != '\t')
        ++i_;
    }
    return t_.substr(start, i_ - start);
  }

  json value() {
    size_t at = i_;
    std::string_view v = skip_value();
    try {
      return json::parse(v);
    } catch (const json::exception& e) {
      i_ = at;
      error(e.what());
    }
  }

  bool at_end() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) ++i_;
    return i_ >= t_.size();
  }

 private:
  char32_t hex4() {
    if (i_ + 4 > t_.size()) error("short \\u escape");
    char32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = t_[i_++];
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) error("bad \\u escape");
      v = v * 16 + static_cast<char32_t>(d);
    }
    return v;
  }
  void skip_string() {
    ++i_;  // opening quote
    while (i_ < t_.size() && t_[i_] != '"') i_ += t_[i_] == '\\' ? 2 : 1;
    if (i_ >= t_.size()) error("unterminated string");
    ++i_;
  }

  std::string_view t_;
  const std::string& src_;
  size_t i_ = 0;
};

std::pair<std::string, std::string> split_merge(const std::string& s, size_t rank, const std::string& source) {
  size_t sp = s.find(' ');
  if (sp == std::string::npos)
    fail("tokenizer: {}: model.merges[{}] '{}' is not two tokens separated by a space", source, rank, s);
  return {s.substr(0, sp), s.substr(sp + 1)};
}

}  // namespace

TokenizerJson scan_tokenizer_json(std::string_view text, const std::string& source) {
  TokenizerJson out;
  out.rest = json::object();
  Scanner s(text, source);
  s.expect('{');
  if (s.empty_container('}')) return out;
  do {
    std::string key = s.string();
    s.expect(':');
    if (key != "model" || s.peek() != '{') {
      out.rest[key] = s.value();
      continue;
    }
    json model = json::object();
    s.expect('{');
    if (!s.empty_container('}')) {
      do {
        std::string mk = s.string();
        s.expect(':');
        if (mk == "vocab" && s.peek() == '{') {
          out.has_vocab = true;
          s.expect('{');
          if (s.empty_container('}')) continue;
          do {
            std::string tok = s.string();
            s.expect(':');
            int64_t id = s.integer();
            if (id < 0 || id >= (int64_t(1) << 30)) s.error(fmt::format("model.vocab['{}'] has id {} out of range", tok, id));
            out.vocab.emplace_back(std::move(tok), static_cast<int32_t>(id));
          } while (s.next('}'));
        } else if (mk == "merges" && s.peek() == '[') {
          out.has_merges = true;
          s.expect('[');
          if (s.empty_container(']')) continue;
          do {
            if (s.peek() == '[') {
              s.expect('[');
              std::string a = s.string();
              s.expect(',');
              std::string b = s.string();
              s.expect(']');
              out.merges.emplace_back(std::move(a), std::move(b));
            } else {
              out.merges.push_back(split_merge(s.string(), out.merges.size(), source));
            }
          } while (s.next(']'));
        } else {
          model[mk] = s.value();
        }
      } while (s.next('}'));
    }
    out.rest["model"] = std::move(model);
  } while (s.next('}'));
  if (!s.at_end()) s.error("trailing characters after the top-level object");
  return out;
}

TokenizerJson split_tokenizer_json(const json& j, const std::string& source) {
  TokenizerJson out;
  ARBOR_CHECK(j.is_object(), "tokenizer: {}: top level must be an object", source);
  out.rest = j;
  if (!j.contains("model") || !j["model"].is_object()) return out;
  json& model = out.rest["model"];
  if (model.contains("vocab") && model["vocab"].is_object()) {
    out.has_vocab = true;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      ARBOR_CHECK(it.value().is_number_integer(), "tokenizer: {}: model.vocab['{}'] is not an integer", source, it.key());
      int64_t id = it.value().get<int64_t>();
      ARBOR_CHECK(id >= 0 && id < (int64_t(1) << 30), "tokenizer: {}: model.vocab['{}'] has id {} out of range", source, it.key(), id);
      out.vocab.emplace_back(it.key(), static_cast<int32_t>(id));
    }
    model.erase("vocab");
  }
  if (model.contains("merges") && model["merges"].is_array()) {
    out.has_merges = true;
    for (const json& m : model["merges"]) {
      if (m.is_string()) {
        out.merges.push_back(split_merge(m.get<std::string>(), out.merges.size(), source));
      } else {
        ARBOR_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                    "tokenizer: {}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", source, out.merges.size());
        out.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      }
    }
    model.erase("merges");
  }
  return out;
}

}  // namespace arbor
