// Decoder implementations, each a port of the reference's decode_chain for the same type.
#include "text/tokenizer/decoder.h"

#include "core/error.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace arbor {
namespace {

// ByteLevel: map every token's characters back to bytes (tokens with characters outside the byte
// alphabet keep their own UTF-8), concatenate, and repair invalid UTF-8 with U+FFFD.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (auto& t : tokens) {
      size_t start = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size();) {
        int b = utf8_char_to_byte(unicode::next_cp(t, i));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes += static_cast<char>(b);
      }
      if (!ok) {
        bytes.resize(start);
        bytes += t;
      }
    }
    tokens.assign(1, unicode::to_valid_utf8(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first) : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string out;
      out.reserve(t.size());
      for (size_t k = 0; k < t.size();) {
        if (!replacement_.empty() && t.compare(k, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && strip_first_)) out += ' ';  // the reference drops every replacement in token 0
          k += replacement_.size();
        } else {
          out += t[k++];
        }
      }
      t.swap(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

// ByteFallback: runs of "<0xAB>" tokens become the bytes they name when those form valid UTF-8,
// otherwise one U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (!run_len) return;
      if (unicode::is_valid_utf8(run)) out.push_back(run);
      else
        for (size_t k = 0; k < run_len; ++k) out.emplace_back("\xEF\xBF\xBD");
      run.clear();
      run_len = 0;
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
        int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
      }
      if (byte >= 0) {
        run += static_cast<char>(byte);
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Strip: removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  bool incremental() const override { return stop_ == 0; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<size_t> cuts;  // character boundaries
      for (size_t i = 0; i < t.size(); i += unicode::seq_len(static_cast<unsigned char>(t[i]))) cuts.push_back(i);
      size_t n = cuts.size();
      cuts.push_back(t.size());
      auto is_content = [&](size_t k) { return t.compare(cuts[k], cuts[k + 1] - cuts[k], content_) == 0; };
      size_t a = 0;
      while (a < std::min(start_, n) && is_content(a)) ++a;
      size_t b = n;
      for (size_t k = 0; k < stop_ && b > 0 && b - 1 >= a; ++k) {
        if (!is_content(b - 1)) break;
        --b;
      }
      if (b < a) b = a;
      t = t.substr(cuts[a], cuts[b] - cuts[a]);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Regex re, std::string content, bool single_char)
      : re_(std::move(re)), content_(std::move(content)), single_char_(single_char) {}
  bool incremental() const override { return single_char_; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::pair<size_t, size_t>> m;
    for (auto& t : tokens) {
      m.clear();
      re_.find_all(t, m);
      if (m.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (auto [a, b] : m) {
        out.append(t, prev, a - prev);
        out += content_;
        prev = b;
      }
      out.append(t, prev, std::string::npos);
      t.swap(out);
    }
  }

 private:
  Regex re_;
  std::string content_;
  bool single_char_;  // the pattern is one literal character
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> items) : items_(std::move(items)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& d : items_) d->decode_chain(tokens);
  }
  bool incremental() const override {
    for (auto& d : items_)
      if (!d->incremental()) return false;
    return true;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> items_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j) {
  if (j.is_null()) return nullptr;
  ARBOR_CHECK(j.is_object() && j.contains("type"), "tokenizer: decoder: expected an object with a \"type\", got {}",
              j.dump().substr(0, 200));
  std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    bool strip_first = true;
    if (j.contains("prepend_scheme")) strip_first = j["prepend_scheme"].get<std::string>() != "never";
    else strip_first = j.value("add_prefix_space", true);
    return std::make_unique<MetaspaceDecoder>(j.value("replacement", std::string("\xE2\x96\x81")), strip_first);
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip")
    return std::make_unique<StripDecoder>(j.at("content").get<std::string>(), j.value("start", size_t{0}), j.value("stop", size_t{0}));
  if (type == "Replace") {
    const json& p = j.at("pattern");
    bool single_char = false;
    if (p.is_object() && p.contains("String")) {
      std::string s = p["String"].get<std::string>();
      single_char = !s.empty() && unicode::seq_len(static_cast<unsigned char>(s[0])) == s.size();
    }
    return std::make_unique<ReplaceDecoder>(make_pattern_regex(p, "decoder Replace"), j.at("content").get<std::string>(), single_char);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> items;
    for (auto& d : j.at("decoders")) items.push_back(make_decoder(d));
    return std::make_unique<SequenceDecoder>(std::move(items));
  }
  fail("tokenizer: decoder: unknown type '{}' (supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, "
       "Sequence)",
       type);
}

}  // namespace arbor
