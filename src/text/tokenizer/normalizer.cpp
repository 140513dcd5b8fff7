// Normalizer implementations; Unicode normal forms come from utf8proc.
#include "text/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace arbor {

std::string utf8proc_form(std::string_view s, int options) {
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                        static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (n < 0) fail("tokenizer: normalizer: utf8proc: {}", utf8proc_errmsg(n));
  std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

namespace {


// Characters that no normal form changes, that never compose with a neighbour and that are starters
// (canonical combining class 0): ASCII and the CJK Unified Ideographs (plus Extension A). A string can be
// normalized piecewise at the start of each such character, since decomposition, reordering and
// composition never cross a starter that cannot be the second half of a composition.
inline bool nf_inert(char32_t c) { return c < 0x80 || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF); }

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(int options) : options_(options) {}
  void normalize(std::string& s, bool& first_kept) const override {
    // Copy runs of inert characters; hand each other run, with the inert character before it (it may
    // compose with what follows: e + U+0301), to utf8proc.
    std::string out;
    size_t i = 0, n = s.size();
    bool changed = false;
    while (i < n) {
      size_t j = i, last_inert = std::string::npos;
      while (j < n) {
        size_t k = j;
        if (!nf_inert(unicode::next_cp(s, k))) break;
        last_inert = j;
        j = k;
      }
      if (j == n) {
        if (changed) out.append(s, i, n - i);
        break;
      }
      size_t chunk = last_inert != std::string::npos ? last_inert : j;
      size_t e = j;
      while (e < n) {
        size_t k = e;
        if (nf_inert(unicode::next_cp(s, k))) break;
        e = k;
      }
      if (!changed) {
        out.reserve(n + 16);
        changed = true;
      }
      out.append(s, i, chunk - i);
      out += utf8proc_form(std::string_view(s).substr(chunk, e - chunk), options_);
      i = e;
    }
    if (changed) s.swap(out);
  }

 private:
  int options_;
};

class Lowercase : public Normalizer {
 public:
  void normalize(std::string& s, bool& first_kept) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) unicode::append_lowercase(out, unicode::next_cp(s, i));
    s.swap(out);
  }
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s, bool& first_kept) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class Replace : public Normalizer {
 public:
  Replace(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void normalize(std::string& s, bool& first_kept) const override {
    std::vector<std::pair<size_t, size_t>> m;
    re_.find_all(s, m);
    if (m.empty()) return;
    if (m[0].first == 0 && content_.empty()) first_kept = false;
    std::string out;
    size_t prev = 0;
    for (auto [a, b] : m) {
      out.append(s, prev, a - prev);
      out += content_;
      prev = b;
    }
    out.append(s, prev, std::string::npos);
    s.swap(out);
  }

 private:
  Regex re_;
  std::string content_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s, bool& first_kept) const override {
    size_t a = 0, b = s.size();
    if (left_) {
      while (a < b) {
        size_t j = a;
        if (!unicode::is_whitespace(unicode::next_cp(s, j))) break;
        a = j;
      }
    }
    if (right_) {
      while (b > a) {
        size_t k = b - 1;
        while (k > a && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!unicode::is_whitespace(unicode::next_cp(s, j))) break;
        b = k;
      }
    }
    if (a > 0) first_kept = false;
    s = s.substr(a, b - a);
  }

 private:
  bool left_, right_;
};

// Removes combining marks (categories Mn, Mc, Me), as HF's StripAccents does after NFD.
class StripAccents : public Normalizer {
 public:
  void normalize(std::string& s, bool& first_kept) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t j = i;
      char32_t c = unicode::next_cp(s, j);
      if (!unicode::is_mark(c)) out.append(s, i, j - i);
      else if (out.empty()) first_kept = false;
      i = j;
    }
    s.swap(out);
  }
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> items) : items_(std::move(items)) {}
  void normalize(std::string& s, bool& first_kept) const override {
    for (auto& n : items_) n->normalize(s, first_kept);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> items_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j) {
  if (j.is_null()) return nullptr;
  ARBOR_CHECK(j.is_object() && j.contains("type"), "tokenizer: normalizer: expected an object with a \"type\", got {}",
              j.dump().substr(0, 200));
  std::string type = j["type"].get<std::string>();
  if (type == "NFC") return std::make_unique<UnicodeForm>(UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeForm>(UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Prepend") return std::make_unique<Prepend>(j.at("prepend").get<std::string>());
  if (type == "Replace")
    return std::make_unique<Replace>(make_pattern_regex(j.at("pattern"), "normalizer Replace"),
                                     j.at("content").get<std::string>());
  if (type == "Strip") return std::make_unique<Strip>(j.value("strip_left", true), j.value("strip_right", true));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> items;
    for (auto& n : j.at("normalizers")) items.push_back(make_normalizer(n));
    return std::make_unique<Sequence>(std::move(items));
  }
  fail("tokenizer: normalizer: unknown type '{}' (supported: NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, "
       "Prepend, Replace, Strip, Sequence)",
       type);
}

}  // namespace arbor
