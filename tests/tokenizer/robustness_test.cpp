// Untrusted input never crashes the tokenizer: random bytes, huge runs, malformed tokenizer.json text.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "core/error.h"
#include "text/tokenizer/json_scan.h"
#include "text/tokenizer/stream_decoder.h"
#include "text/tokenizer/unicode.h"
#include "tokenizer_fixture.h"

namespace arbor::test {
namespace {

// Random bytes (biased towards UTF-8 lead/continuation bytes and ASCII specials) encode without error,
// the ids are in the vocab, and decode(encode(x)) is valid UTF-8. Encoding x equals encoding its
// U+FFFD-repaired form, which is what the reference sees.
TEST(Robustness, RandomBytesEncodeAndDecode) {
  for (const char* name : {"qwen3", "llama2"}) {
    const Tokenizer* tok = load_tokenizer(name);
    ASSERT_NE(tok, nullptr);
    std::mt19937 rng(42);
    const std::string pool = "<|>s/ \n\t\xE2\x96\x81" "abc";
    for (int iter = 0; iter < 300; ++iter) {
      std::string s;
      for (int k = 0, n = rng() % 64; k < n; ++k) {
        unsigned r = rng() % 4;
        s += r == 0 ? static_cast<char>(rng() % 256) : r == 1 ? static_cast<char>(0x80 + rng() % 64) : pool[rng() % pool.size()];
      }
      std::vector<int32_t> ids = tok->encode(s, true);
      for (int32_t id : ids) ASSERT_LT(static_cast<size_t>(id), tok->vocab_size());
      EXPECT_EQ(ids, tok->encode(unicode::to_valid_utf8(s), true));
      EXPECT_TRUE(unicode::is_valid_utf8(tok->decode(ids)));
    }
  }
}

TEST(Robustness, RandomIdsDecodeAndStream) {
  const Tokenizer* tok = load_tokenizer("llama3");
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(5);
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<int32_t> ids;
    for (int k = 0, n = 1 + rng() % 20; k < n; ++k)
      ids.push_back(static_cast<int32_t>(rng() % (tok->vocab_size() + 50)) - 10);  // some out of range
    std::string all = tok->decode(ids);
    EXPECT_TRUE(unicode::is_valid_utf8(all));
    StreamDecoder d(*tok);
    std::string streamed;
    for (int32_t id : ids) streamed += d.push(id);
    streamed += d.flush();
    EXPECT_EQ(streamed, all);  // byte-level decoding is always incremental
  }
}

TEST(Robustness, LongRunsEncodeQuickly) {
  const Tokenizer* tok = load_tokenizer("llama3");
  ASSERT_NE(tok, nullptr);
  // 30 kB of one character class each: no pathological regex backtracking or quadratic merging (either
  // would take seconds here).
  for (std::string s : {std::string(30000, ' '), std::string(30000, 'a'), std::string(30000, '7'), std::string(30000, '\n') + "x"}) {
    std::vector<int32_t> ids = tok->encode(s, false);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tok->decode(ids), s);
  }
}

// Truncations and byte flips of a real tokenizer.json give an arbor::Error, never a crash.
TEST(Robustness, MalformedTokenizerJson) {
  std::string text = read_text_file(tokenizer_path("synthetic_metaspace_fallback"));
  std::mt19937 rng(9);
  int errors = 0;
  for (int iter = 0; iter < 60; ++iter) {
    std::string t = text;
    if (iter % 2) t.resize(rng() % t.size());
    else t[rng() % t.size()] = "{}[]\",:\\x0"[rng() % 11];
    try {
      Tokenizer tk = Tokenizer::from_json(json::parse(t, nullptr, false).is_discarded() ? json() : json::parse(t), "mutated.json");
      (void)tk.encode("hello world", true);
    } catch (const Error&) {
      ++errors;
    }
    try {
      TokenizerJson parts = scan_tokenizer_json(t, "mutated.json");
      (void)parts;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(errors, 20);
}

}  // namespace
}  // namespace arbor::test

namespace arbor::test {
namespace {

// encode() is const and shared by server threads: concurrent encodes (sharing the word cache and the
// per-thread regex match data) give the single-threaded ids.
TEST(Robustness, ConcurrentEncodeMatchesSerial) {
  const Tokenizer* tok = load_tokenizer("qwen3");
  ASSERT_NE(tok, nullptr);
  auto corpus = load_corpus();
  std::vector<std::vector<int32_t>> serial;
  for (auto& s : corpus) serial.push_back(tok->encode(s));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = (t * 37) % corpus.size(), k = 0; k < corpus.size(); ++k, i = (i + 1) % corpus.size())
          if (tok->encode(corpus[i]) != serial[i]) ++mismatches;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace arbor::test
