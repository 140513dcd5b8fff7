// Pre-tokenizer implementations, following HF tokenizers' split semantics (behaviours, invert,
// empty pieces dropped).
#include "text/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <array>
#include <functional>

#include "core/error.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace arbor {

// ---- ByteLevel alphabet ----

namespace {
struct ByteAlphabet {
  std::array<std::string, 256> to_utf8;
  std::array<char32_t, 256> to_cp{};
  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      unicode::append_utf8(to_utf8[b], to_cp[b]);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}
}  // namespace

const std::string& byte_to_utf8(unsigned char b) { return alphabet().to_utf8[b]; }

int utf8_char_to_byte(char32_t c) {
  if ((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255)) return static_cast<int>(c);
  if (c >= 256 && c < 256 + 68) {
    // The 68 non-printable bytes in order: 0-32, 127-160, 173.
    int n = static_cast<int>(c - 256);
    if (n <= 32) return n;
    if (n <= 32 + 34) return 127 + (n - 33);
    return 173;
  }
  return -1;
}

namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const json& j, const char* where) {
  std::string b = j.get<std::string>();
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail("tokenizer: pre_tokenizer {}: unknown behavior '{}'", where, b);
}

struct Span {
  size_t a, b;
  bool match;
};

// Turns matches into a partition of [0, n) with is-match flags (HF Pattern::find_matches).
void fill_gaps(const std::vector<std::pair<size_t, size_t>>& m, size_t n, bool invert, std::vector<Span>& out) {
  out.clear();
  size_t prev = 0;
  for (auto [a, b] : m) {
    if (prev != a) out.push_back({prev, a, invert});
    out.push_back({a, b, !invert});
    prev = b;
  }
  if (prev != n) out.push_back({prev, n, invert});
}

// Applies a split behaviour to one piece (HF NormalizedString::split).
void split_piece(const PreToken& p, std::vector<Span>& spans, Behavior behavior, std::vector<PreToken>& out) {
  std::vector<std::pair<Span, bool>> parts;  // (span, remove)
  switch (behavior) {
    case Behavior::Isolated:
      for (auto& s : spans) parts.push_back({s, false});
      break;
    case Behavior::Removed:
      for (auto& s : spans) parts.push_back({s, s.match});
      break;
    case Behavior::Contiguous: {
      int prev = -1;
      for (auto& s : spans) {
        if (prev == static_cast<int>(s.match) && !parts.empty()) parts.back().first.b = s.b;
        else parts.push_back({s, false});
        prev = s.match;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (auto& s : spans) {
        if (s.match && !prev_match && !parts.empty()) parts.back().first.b = s.b;
        else parts.push_back({s, false});
        prev_match = s.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        auto& s = spans[i];
        if (s.match && !prev_match && !parts.empty()) parts.back().first.a = s.a;
        else parts.push_back({s, false});
        prev_match = s.match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    }
  }
  for (auto& [s, remove] : parts) {
    if (remove || s.b == s.a) continue;
    out.push_back({p.text.substr(s.a, s.b - s.a), p.at_start && s.a == 0});
  }
}

// Matches of a per-character predicate: each matching character is a match of its own.
void char_matches(const std::string& s, const std::function<bool(char32_t)>& pred,
                  std::vector<std::pair<size_t, size_t>>& m) {
  m.clear();
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    char32_t c = unicode::next_cp(s, j);
    if (pred(c)) m.emplace_back(i, j);
    i = j;
  }
}

template <typename MatchFn>
void split_all(std::vector<PreToken>& pieces, Behavior behavior, bool invert, MatchFn&& find) {
  std::vector<PreToken> out;
  out.reserve(pieces.size() * 2);
  std::vector<std::pair<size_t, size_t>> m;
  std::vector<Span> spans;
  for (auto& p : pieces) {
    m.clear();
    find(p.text, m);
    fill_gaps(m, p.text.size(), invert, spans);
    split_piece(p, spans, behavior, out);
  }
  pieces.swap(out);
}

bool is_bert_punct(char32_t c) {
  return (c < 0x80 && ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))) ||
         unicode::is_punctuation(c);
}

// The GPT-2 regex ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_ = std::make_unique<Regex>(kGpt2Pattern, "pre_tokenizer ByteLevel");
  }
  bool fast_stages(std::vector<const Regex*>& splits, bool& map_bytes) const override {
    if (add_prefix_space_ || map_bytes) return false;
    if (re_) splits.push_back(re_.get());
    map_bytes = true;
    return true;
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_)
      for (auto& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text = " " + p.text;
    if (re_) split_all(pieces, Behavior::Isolated, false, [&](const std::string& s, auto& m) { re_->find_all(s, m); });
    const auto& a = alphabet();
    for (auto& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (unsigned char b : p.text) mapped += a.to_utf8[b];
      p.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class Split : public PreTokenizer {
 public:
  Split(Regex re, Behavior behavior, bool invert) : re_(std::move(re)), behavior_(behavior), invert_(invert) {}
  bool fast_stages(std::vector<const Regex*>& splits, bool& map_bytes) const override {
    if (behavior_ != Behavior::Isolated || invert_ || map_bytes) return false;
    splits.push_back(&re_);
    return true;
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_all(pieces, behavior_, invert_, [&](const std::string& s, auto& m) { re_.find_all(s, m); });
  }

 private:
  Regex re_;
  Behavior behavior_;
  bool invert_;
};

class Metaspace : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  Metaspace(std::string replacement, Prepend scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {
    size_t i = 0;
    replacement_cp_ = replacement_.empty() ? 0 : unicode::next_cp(replacement_, i);
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (auto& p : pieces) {
      std::string s;
      s.reserve(p.text.size() + 3);
      for (char c : p.text) {
        if (c == ' ') s += replacement_;
        else s += c;
      }
      bool starts = s.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == Prepend::Always || (scheme_ == Prepend::First && p.at_start))) s = replacement_ + s;
      p.text.swap(s);
    }
    if (split_)
      split_all(pieces, Behavior::MergedWithNext, false,
                [&](const std::string& s, auto& m) { char_matches(s, [&](char32_t c) { return c == replacement_cp_; }, m); });
  }

 private:
  std::string replacement_;
  char32_t replacement_cp_;
  Prepend scheme_;
  bool split_;
};

class CharSplit : public PreTokenizer {
 public:
  CharSplit(std::function<bool(char32_t)> pred, Behavior behavior) : pred_(std::move(pred)), behavior_(behavior) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_all(pieces, behavior_, false, [&](const std::string& s, auto& m) { char_matches(s, pred_, m); });
  }

 private:
  std::function<bool(char32_t)> pred_;
  Behavior behavior_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> items) : items_(std::move(items)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (auto& p : items_) p->pre_tokenize(pieces);
  }
  bool fast_stages(std::vector<const Regex*>& splits, bool& map_bytes) const override {
    for (auto& p : items_)
      if (!p->fast_stages(splits, map_bytes)) return false;
    return true;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> items_;
};

// Whitespace: \w+|[^\w\s]+ kept, the rest removed (HF uses an inverted regex with Removed).
constexpr const char* kWhitespacePattern = R"(\w+|[^\w\s]+)";

}  // namespace

std::unique_ptr<FastPreTokenizer> FastPreTokenizer::from(const PreTokenizer& p) {
  auto f = std::make_unique<FastPreTokenizer>();
  if (!p.fast_stages(f->splits_, f->map_bytes_)) return nullptr;
  return f;
}

void FastPreTokenizer::for_each_piece(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  if (text.empty()) return;
  std::vector<std::vector<std::pair<size_t, size_t>>> matches(splits_.size());
  std::string scratch;
  run(0, text, matches, scratch, emit);
}

void FastPreTokenizer::run(size_t stage, std::string_view s, std::vector<std::vector<std::pair<size_t, size_t>>>& matches,
                           std::string& scratch, const std::function<void(std::string_view)>& emit) const {
  if (stage == splits_.size()) {
    if (!map_bytes_) return emit(s);
    const auto& a = alphabet();
    scratch.clear();
    for (unsigned char b : s) scratch += a.to_utf8[b];
    return emit(scratch);
  }
  // Isolated split: every match and every gap between matches is a piece; empty ones are dropped.
  auto& m = matches[stage];
  m.clear();
  splits_[stage]->find_all(s, m);
  std::vector<std::pair<size_t, size_t>> spans;  // copied: deeper stages reuse matches[stage + 1...] only
  spans.reserve(m.size() * 2 + 1);
  size_t prev = 0;
  for (auto [a, b] : m) {
    if (a > prev) spans.emplace_back(prev, a);
    if (b > a) spans.emplace_back(a, b);
    prev = b;
  }
  if (prev < s.size()) spans.emplace_back(prev, s.size());
  for (auto [a, b] : spans) run(stage + 1, s.substr(a, b - a), matches, scratch, emit);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j) {
  if (j.is_null()) return nullptr;
  ARBOR_CHECK(j.is_object() && j.contains("type"), "tokenizer: pre_tokenizer: expected an object with a \"type\", got {}",
              j.dump().substr(0, 200));
  std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(j.value("add_prefix_space", true), j.value("use_regex", true));
  if (type == "Split")
    return std::make_unique<Split>(make_pattern_regex(j.at("pattern"), "pre_tokenizer Split"),
                                   parse_behavior(j.at("behavior"), "Split"), j.value("invert", false));
  if (type == "Metaspace") {
    Metaspace::Prepend scheme = Metaspace::Prepend::Always;
    if (j.contains("prepend_scheme")) {
      std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "always") scheme = Metaspace::Prepend::Always;
      else if (s == "first") scheme = Metaspace::Prepend::First;
      else if (s == "never") scheme = Metaspace::Prepend::Never;
      else fail("tokenizer: pre_tokenizer Metaspace: unknown prepend_scheme '{}'", s);
    } else if (!j.value("add_prefix_space", true)) {
      scheme = Metaspace::Prepend::Never;
    }
    return std::make_unique<Metaspace>(j.value("replacement", std::string("\xE2\x96\x81")), scheme, j.value("split", true));
  }
  if (type == "Digits") {
    bool individual = j.value("individual_digits", false);
    return std::make_unique<CharSplit>([](char32_t c) { return unicode::is_number(c); },
                                       individual ? Behavior::Isolated : Behavior::Contiguous);
  }
  if (type == "Punctuation")
    return std::make_unique<CharSplit>(is_bert_punct,
                                       j.contains("behavior") ? parse_behavior(j["behavior"], "Punctuation") : Behavior::Isolated);
  if (type == "WhitespaceSplit") return std::make_unique<CharSplit>(unicode::is_whitespace, Behavior::Removed);
  if (type == "Whitespace")
    return std::make_unique<Split>(Regex(kWhitespacePattern, "pre_tokenizer Whitespace"), Behavior::Removed, true);
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> items;
    items.push_back(std::make_unique<CharSplit>(unicode::is_whitespace, Behavior::Removed));
    items.push_back(std::make_unique<CharSplit>(is_bert_punct, Behavior::Isolated));
    return std::make_unique<Sequence>(std::move(items));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> items;
    for (auto& p : j.at("pretokenizers")) items.push_back(make_pre_tokenizer(p));
    return std::make_unique<Sequence>(std::move(items));
  }
  fail("tokenizer: pre_tokenizer: unknown type '{}' (supported: ByteLevel, Split, Metaspace, Digits, Punctuation, "
       "Whitespace, WhitespaceSplit, BertPreTokenizer, Sequence)",
       type);
}

}  // namespace arbor
