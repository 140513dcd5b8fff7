// The BPE model of tokenizer.json: vocab, ranked merges, byte fallback, unk handling and a word cache.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/json.h"
#include "text/tokenizer/flat_maps.h"

namespace arbor {

class Bpe {
 public:
  // j is tokenizer.json's "model" object (type BPE) without its vocab and merges, which come separately
  // (see json_scan.h).
  Bpe(const json& j, std::vector<std::pair<std::string, int32_t>> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges);

  // Appends the ids of one pre-token (already in the model's alphabet) to out.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;
  // The same without the cache: the reference for the cached path.
  void tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the id is not in the vocab
  size_t size() const { return n_tokens_; }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  using Merge = PairMap::Value;
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> has_id_;
  size_t n_tokens_ = 0;
  TokenIndex vocab_;  // over id_to_token_
  PairMap merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_token_id_{};  // id of "<0xAB>" per byte, -1 when absent (byte_fallback)
  std::array<int32_t, 128> ascii_id_{};       // id of each single ASCII character, -1 when absent

  // Word cache: pre-token -> ids, up to kCacheCapacity words, then cleared (HF bounds its cache too).
  static constexpr size_t kCacheCapacity = 1 << 15;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mu_;
  mutable WordCache cache_{kCacheCapacity * 2};
};

}  // namespace arbor
