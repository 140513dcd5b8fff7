// Parity with npm `tokenizers`: ids (with and without special tokens) and decodes (with and without
// skipping special tokens) for the generated corpus and random id sequences, for every tokenizer that
// has a golden file (tools/tokenizer/make_goldens.js).
#include <gtest/gtest.h>

#include "text/tokenizer/unicode.h"
#include "tokenizer_fixture.h"

namespace arbor::test {
namespace {

std::vector<std::string> golden_names() {
  std::vector<std::string> names = real_tokenizer_names();
  for (auto& e : std::filesystem::directory_iterator(fixture_dir() + "/synthetic"))
    if (e.path().extension() == ".json") names.push_back("synthetic_" + e.path().stem().string());
  return names;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

void check_encode(const Tokenizer* tok, const json& g) {
  auto corpus = load_corpus();
  ASSERT_GT(g["cases"].size(), 0u);
  int failures = 0;
  for (const json& c : g["cases"]) {
    if (failures >= 5) break;
    size_t i = c["i"].get<size_t>();
    ASSERT_LT(i, corpus.size()) << "golden out of date: rerun node tools/tokenizer/make_goldens.js";
    auto want = golden_ids(g, c, true);
    auto want_ns = golden_ids(g, c, false);
    auto got = tok->encode(corpus[i], true);
    auto got_ns = tok->encode(corpus[i], false);
    if (got != want) {
      ++failures;
      ADD_FAILURE() << "case " << i << " text '" << corpus[i] << "'\n want " << show(want) << "\n got  " << show(got);
    }
    if (got_ns != want_ns) {
      ++failures;
      ADD_FAILURE() << "case " << i << " (no special) text '" << corpus[i] << "'\n want " << show(want_ns) << "\n got  "
                    << show(got_ns);
    }
  }
}

void check_decode(const Tokenizer* tok, const json& g) {
  auto corpus = load_corpus();
  int failures = 0;
  auto check = [&](const json& c, const char* what, size_t i, bool corpus_case) {
    auto ids = corpus_case ? golden_ids(g, c, true) : c["ids"].get<std::vector<int32_t>>();
    // In corpus cases an absent decode means the reference decoded to exactly the text it was given.
    std::string text = corpus_case ? unicode::to_valid_utf8(corpus.at(c.at("i").get<size_t>())) : std::string();
    std::string want = c.contains("dec") ? c["dec"].get<std::string>() : text;
    std::string want_skip = c.contains("dec_skip") ? c["dec_skip"].get<std::string>() : corpus_case ? text : want;
    std::string got = tok->decode(ids, false), got_skip = tok->decode(ids, true);
    if (got != want || got_skip != want_skip) {
      ++failures;
      ADD_FAILURE() << what << " " << i << " ids " << show(ids) << "\n want '" << want << "' / '" << want_skip << "'\n got  '"
                    << got << "' / '" << got_skip << "'";
    }
  };
  for (const json& c : g["cases"])
    if (failures < 5) check(c, "case", c["i"].get<size_t>(), true);
  for (size_t i = 0; i < g["random_decodes"].size() && failures < 5; ++i) check(g["random_decodes"][i], "random ids", i, false);
}

// One test per tokenizer, so each tokenizer.json is loaded once per process (ctest runs every test in a
// process of its own, and gemma3's file is 33 MB).
class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, MatchesReference) {
  const Tokenizer* tok = load_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  json g = load_golden(GetParam());
  {
    SCOPED_TRACE("encode");
    check_encode(tok, g);
  }
  {
    SCOPED_TRACE("decode");
    check_decode(tok, g);
  }
  {
    SCOPED_TRACE("stream decode");
    check_stream_concatenation(tok, g);
  }
  {
    SCOPED_TRACE("stream stop strings");
    check_stream_stop_strings(tok, g);
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Parity, ::testing::ValuesIn(golden_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace arbor::test
