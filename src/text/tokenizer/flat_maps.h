// Open-addressing hash tables for the BPE hot paths: token string -> id over a vector of token
// strings, and (left id, right id) -> merge. std::unordered_map's node per entry made loading a 262k
// vocab with 514k merges cache-miss bound (seconds); these keep one probe array of 8-byte slots.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/hash.h"

namespace arbor {

inline uint64_t hash_bytes(std::string_view s) {
  // FNV-1a over 8-byte words, then a final avalanche (splitmix64); tokens are short.
  uint64_t h = 0xcbf29ce484222325ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    __builtin_memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < s.size(); ++k) tail |= uint64_t(static_cast<unsigned char>(s[i + k])) << (8 * k);
  h = (h ^ tail) * 0x100000001b3ull;
  return splitmix64_mix(h);
}

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Maps strings to int32 ids; the strings live in a caller-owned vector indexed by id.
class TokenIndex {
 public:
  // tokens[id] is the string of id; ids whose `present` flag is 0 are not indexed.
  void build(const std::vector<std::string>& tokens, const std::vector<uint8_t>& present) {
    tokens_ = &tokens;
    size_t n = 0;
    for (uint8_t p : present) n += p;
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, Slot{0, -1});
    for (size_t id = 0; id < tokens.size(); ++id) {
      if (!present[id]) continue;
      uint64_t h = hash_bytes(tokens[id]);
      uint32_t tag = static_cast<uint32_t>(h >> 32);
      for (size_t i = h & mask_;; i = (i + 1) & mask_) {
        if (slots_[i].id < 0) {
          slots_[i] = Slot{tag, static_cast<int32_t>(id)};
          break;
        }
        if (slots_[i].tag == tag && tokens[slots_[i].id] == tokens[id]) break;  // duplicate string: first id wins
      }
    }
  }
  int32_t find(std::string_view s) const {
    if (slots_.empty()) return -1;
    uint64_t h = hash_bytes(s);
    uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& sl = slots_[i];
      if (sl.id < 0) return -1;
      if (sl.tag == tag && (*tokens_)[sl.id] == s) return sl.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;  // high hash bits, to skip most string compares
    int32_t id;
  };
  const std::vector<std::string>* tokens_ = nullptr;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id).
class PairMap {
 public:
  struct Value {
    uint32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, Slot{kEmpty, {0, -1}});
  }
  // Inserts or overwrites (a later duplicate wins, as in the reference).
  void set(uint64_t key, Value v) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{key, v};
        ++size_;
        return;
      }
      if (slots_[i].key == key) {
        slots_[i].value = v;
        return;
      }
    }
  }
  const Value* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;  // ids are < 2^30, so no real key is all ones
  struct Slot {
    uint64_t key;
    Value value;
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    reserve(old.empty() ? 8 : old.size());
    size_ = 0;
    for (auto& s : old)
      if (s.key != kEmpty) set(s.key, s.value);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

}  // namespace arbor

namespace arbor {

// Word -> ids cache for BPE: one probe array plus two arenas, cleared when half full (the reference
// bounds its cache the same way). Not thread-safe; Bpe guards it with a mutex.
class WordCache {
 public:
  explicit WordCache(size_t slots = 1 << 16) : slots_(slots) { mask_ = slots - 1; }

  // Appends the cached ids of `word` to out and returns true, or returns false on a miss.
  bool get(std::string_view word, uint64_t h, std::vector<int32_t>& out) const {
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return false;
      if (s.hash == h && s.key_len == word.size() && keys_.compare(s.key_off, s.key_len, word) == 0) {
        out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.n_ids);
        return true;
      }
    }
  }
  void put(std::string_view word, uint64_t h, const int32_t* ids, size_t n) {
    if ((size_ + 1) * 2 > slots_.size()) clear();
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.hash == h && s.key_len == word.size() && keys_.compare(s.key_off, s.key_len, word) == 0) return;
      if (s.hash != 0) continue;
      s = Slot{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(word.size()), static_cast<uint32_t>(ids_.size()),
               static_cast<uint32_t>(n)};
      keys_.append(word);
      ids_.insert(ids_.end(), ids, ids + n);
      ++size_;
      return;
    }
  }
  // A hash that is never 0 (0 marks an empty slot).
  static uint64_t hash(std::string_view word) { return hash_bytes(word) | 1; }

 private:
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    size_ = 0;
  }
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0, key_len = 0, ids_off = 0, n_ids = 0;
  };
  std::vector<Slot> slots_;
  size_t mask_, size_ = 0;
  std::string keys_;
  std::vector<int32_t> ids_;
};

}  // namespace arbor
