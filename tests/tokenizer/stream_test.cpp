// StreamDecoder and StopMatcher: streamed text equals decode() of all ids for the golden corpus of every
// tokenizer; stop strings across token boundaries are cut exactly and never emitted.
#include <gtest/gtest.h>

#include <random>

#include "text/tokenizer/stream_decoder.h"
#include "text/tokenizer/unicode.h"
#include "tokenizer_fixture.h"

namespace arbor::test {
namespace {

// Reference for stop strings on a whole text: the occurrence that ends first (then starts first) cuts it.
std::string cut_at_stop(const std::string& text, const std::vector<std::string>& stops, bool* matched) {
  size_t best_end = std::string::npos, best_start = 0;
  for (auto& s : stops) {
    if (s.empty()) continue;
    size_t p = text.find(s);
    if (p == std::string::npos) continue;
    size_t e = p + s.size();
    if (e < best_end || (e == best_end && p < best_start)) best_end = e, best_start = p;
  }
  *matched = best_end != std::string::npos;
  return *matched ? text.substr(0, best_start) : text;
}

struct Streamed {
  std::string text;
  bool stopped;
  bool whole_chars = true;  // every chunk was valid UTF-8 on its own
};

Streamed stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip, std::vector<std::string> stops = {}) {
  StreamDecoder d(tok, skip, std::move(stops));
  Streamed r;
  auto take = [&](const std::string& s) {
    r.whole_chars = r.whole_chars && unicode::is_valid_utf8(s);
    r.text += s;
  };
  for (int32_t id : ids) take(d.push(id));
  take(d.flush());
  r.stopped = d.stopped();
  return r;
}

}  // namespace

// Called by parity_test.cpp for every tokenizer with a golden file.
void check_stream_concatenation(const Tokenizer* tok, const json& g) {
  int failures = 0;
  for (const json& c : g["cases"]) {
    if (failures >= 5) break;
    auto ids = golden_ids(g, c, true);
    for (bool skip : {false, true}) {
      std::string want = tok->decode(ids, skip);
      Streamed got = stream(*tok, ids, skip);
      EXPECT_TRUE(got.whole_chars) << "case " << c["i"];
      if (got.text != want) {
        ++failures;
        ADD_FAILURE() << "case " << c["i"] << " skip=" << skip << "\n want '" << want << "'\n got  '" << got.text << "'";
      }
    }
  }
}

void check_stream_stop_strings(const Tokenizer* tok, const json& g) {
  std::mt19937 rng(1234);
  int checked = 0;
  for (const json& c : g["cases"]) {
    auto ids = golden_ids(g, c, true);
    std::string full = tok->decode(ids, true);
    // Character boundaries of the decoded text.
    std::vector<size_t> cuts;
    for (size_t i = 0; i < full.size(); i += unicode::seq_len(static_cast<unsigned char>(full[i]))) cuts.push_back(i);
    cuts.push_back(full.size());
    if (cuts.size() < 6) continue;
    // A stop string taken from the text (2..5 characters, so it usually spans tokens), a decoy that shares
    // its first character but never occurs, and one that never occurs at all.
    size_t a = rng() % (cuts.size() - 5), n = 2 + rng() % 4;
    std::string stop = full.substr(cuts[a], cuts[a + n] - cuts[a]);
    std::string decoy = full.substr(cuts[a], cuts[a + 1] - cuts[a]) + "\x01\x02";
    std::vector<std::string> stops = {decoy, stop, "never occurs \x03"};
    bool matched = false;
    std::string want = cut_at_stop(full, stops, &matched);
    ASSERT_TRUE(matched);
    Streamed got = stream(*tok, ids, true, stops);
    EXPECT_TRUE(got.stopped) << "case " << c["i"];
    EXPECT_EQ(got.text, want) << "case " << c["i"] << " stop '" << stop << "'";
    EXPECT_EQ(got.text.find(stop), std::string::npos);
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

namespace {

TEST(StreamDecoder, ByteFallbackRunEmitsWholeCharacterOnce) {
  const Tokenizer* tok = load_tokenizer("llama2");
  ASSERT_NE(tok, nullptr);
  // "中" as byte-fallback tokens: nothing is emitted until the third byte completes it.
  std::vector<int32_t> ids = {*tok->token_to_id("<0xE4>"), *tok->token_to_id("<0xB8>"), *tok->token_to_id("<0xAD>")};
  StreamDecoder d(*tok);
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.push(ids[2]), "中");
  EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, SentencePieceLeadingSpace) {
  const Tokenizer* tok = load_tokenizer("llama2");
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids = tok->encode("Hello world again", false);
  ASSERT_GE(ids.size(), 3u);
  StreamDecoder d(*tok);
  std::string first = d.push(ids[0]);
  EXPECT_EQ(first, "Hello");  // the first piece is "▁Hello"; its space is stripped only at the start
  std::string rest;
  for (size_t i = 1; i < ids.size(); ++i) rest += d.push(ids[i]);
  rest += d.flush();
  EXPECT_EQ(rest, " world again");
}

// StopMatcher against the whole-text reference, on random text fed in random chunks.
TEST(StopMatcher, MatchesWholeTextReferenceOnRandomChunking) {
  std::mt19937 rng(7);
  const std::string alphabet = "abc \xC3\xA9";  // includes a two-byte character
  auto random_string = [&](size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) {
      size_t k = rng() % 5;
      s += k < 4 ? std::string(1, alphabet[k]) : std::string("\xC3\xA9");
    }
    return s;
  };
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = random_string(rng() % 40);
    std::vector<std::string> stops;
    for (int k = 0, n = 1 + rng() % 3; k < n; ++k) stops.push_back(random_string(1 + rng() % 4));
    bool matched = false;
    std::string want = cut_at_stop(text, stops, &matched);
    StopMatcher m(stops);
    std::string got;
    for (size_t i = 0; i < text.size();) {
      size_t n = std::min(text.size() - i, size_t(1 + rng() % 5));
      got += m.push(std::string_view(text).substr(i, n));
      // Never emit anything the reference would not have emitted.
      ASSERT_EQ(want.compare(0, got.size(), got), 0) << "text '" << text << "'";
      i += n;
    }
    got += m.flush();
    ASSERT_EQ(got, want) << "text '" << text << "' stops " << stops.size();
    ASSERT_EQ(m.stopped(), matched);
  }
}

}  // namespace
}  // namespace arbor::test
