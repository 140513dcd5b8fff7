// PCRE2 wrapper and the Oniguruma -> PCRE2 translation of tokenizer.json split patterns.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer/regex.h"

#include <pcre2.h>

#include <cctype>

#include "core/error.h"
#include "text/tokenizer/unicode.h"

namespace arbor {

// Oniguruma's Unicode \s is the White_Space property; PCRE2's UCP \s also takes U+180E, so spell it out.
static constexpr const char* kSpaceSet = "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Oniguruma's and Rust regex's Unicode \w (UTS#18 word: Alphabetic, marks, decimal digits, connector
// punctuation, joiners); PCRE2 10.42's UCP \w lacks the marks and joiners.
static constexpr const char* kWordSet = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}";

std::string Regex::translate(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      ++i;
      if (n == 's') {
        out += in_class ? std::string(kSpaceSet) : fmt::format("[{}]", kSpaceSet);
      } else if (n == 'S' && !in_class) {
        out += fmt::format("[^{}]", kSpaceSet);
      } else if (n == 'w') {
        out += in_class ? std::string(kWordSet) : fmt::format("[{}]", kWordSet);
      } else if (n == 'W' && !in_class) {
        out += fmt::format("[^{}]", kWordSet);
      } else if (n == 'h') {  // Oniguruma \h is a hex digit (PCRE2's is horizontal space)
        out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
      } else if (n == 'H' && !in_class) {
        out += "[^0-9a-fA-F]";
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

std::string regex_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    // Any ASCII punctuation may be escaped in PCRE2; letters, digits and non-ASCII bytes must not be.
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && std::ispunct(u)) out += '\\';
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  std::string t = translate(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(t.data()), t.size(), PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    fail("tokenizer: {}: bad regex '{}' at offset {}: {}", where, pattern, off, reinterpret_cast<const char*>(buf));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex Regex::literal(std::string_view text) {
  Regex r;
  r.pattern_ = std::string(text);
  return r;
}

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

namespace {
// One match-data block per thread, so a const Regex can be used from many threads.
struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};
}  // namespace

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  if (!impl_) {
    if (pattern_.empty()) return;
    for (size_t p = s.find(pattern_); p != std::string_view::npos; p = s.find(pattern_, p + pattern_.size()))
      out.emplace_back(p, p + pattern_.size());
    return;
  }
  thread_local MatchData tmd;
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, s.size(), pos, 0, tmd.md, nullptr)
                        : pcre2_match(impl_->code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, tmd.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof buf);
      fail("tokenizer: regex '{}': match failed: {}", pattern_, reinterpret_cast<const char*>(buf));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tmd.md);
    size_t a = ov[0], b = ov[1];
    out.emplace_back(a, b);
    if (b == a) {  // empty match: step over one character
      if (b >= s.size()) break;
      pos = b + unicode::seq_len(static_cast<unsigned char>(s[b]));
    } else {
      pos = b;
    }
  }
}

Regex make_pattern_regex(const json& pattern, const std::string& where) {
  ARBOR_CHECK(pattern.is_object(), "tokenizer: {}: pattern must be an object {{\"String\"|\"Regex\": ...}}", where);
  if (pattern.contains("String")) return Regex::literal(pattern["String"].get<std::string>());
  if (pattern.contains("Regex")) return Regex(pattern["Regex"].get<std::string>(), where);
  fail("tokenizer: {}: pattern has neither \"String\" nor \"Regex\": {}", where, pattern.dump());
}

}  // namespace arbor
