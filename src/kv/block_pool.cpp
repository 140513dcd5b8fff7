// Block pool (reference counts, blank stack, LRU of cached blocks, hash table) and per-sequence block tables.
#include "kv/block_pool.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/hash.h"

namespace arbor {


BlockPool::BlockPool(int64_t n_blocks, int64_t block_size) : n_blocks_(n_blocks), block_size_(block_size) {
  ARBOR_CHECK(n_blocks > 0 && block_size > 0, "kv: need a positive block count and size, got {} x {}", n_blocks, block_size);
  ARBOR_CHECK(n_blocks <= INT32_MAX, "kv: at most {} blocks, got {}", INT32_MAX, n_blocks);
  blank_.reserve(size_t(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) blank_.push_back(int32_t(b));
  meta_.resize(size_t(n_blocks));
  tokens_.resize(size_t(n_blocks * block_size));
}

void BlockPool::lru_push_back(int32_t b) {
  Meta& m = meta_[size_t(b)];
  m.prev = lru_tail_;
  m.next = -1;
  if (lru_tail_ >= 0) meta_[size_t(lru_tail_)].next = b;
  else lru_head_ = b;
  lru_tail_ = b;
  lru_size_ += 1;
}

void BlockPool::lru_remove(int32_t b) {
  Meta& m = meta_[size_t(b)];
  if (m.prev >= 0) meta_[size_t(m.prev)].next = m.next;
  else lru_head_ = m.next;
  if (m.next >= 0) meta_[size_t(m.next)].prev = m.prev;
  else lru_tail_ = m.prev;
  m.prev = m.next = -1;
  lru_size_ -= 1;
}

void BlockPool::unhash(int32_t b) {
  Meta& m = meta_[size_t(b)];
  if (!m.hashed) return;
  auto it = table_.find(m.hash);
  if (it != table_.end() && it->second == b) table_.erase(it);
  m.hashed = false;
  m.hash = m.parent = 0;
}

bool BlockPool::allocate(int64_t n, std::vector<int32_t>& out) {
  if (n > free_blocks()) return false;
  for (int64_t i = 0; i < n; ++i) {
    int32_t b;
    if (!blank_.empty()) {
      b = blank_.back();
      blank_.pop_back();
    } else {  // evict the least recently used cached block
      b = lru_head_;
      lru_remove(b);
      unhash(b);
    }
    meta_[size_t(b)].ref = 1;
    out.push_back(b);
  }
  return true;
}

void BlockPool::release(std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    ARBOR_CHECK(b >= 0 && b < n_blocks_ && meta_[size_t(b)].ref > 0, "kv: releasing block {} that is not held", b);
    Meta& m = meta_[size_t(b)];
    if (--m.ref > 0) continue;
    if (m.hashed) lru_push_back(b);
    else blank_.push_back(b);
  }
  blocks.clear();
}

BlockPool::Hash BlockPool::chain_hash(Hash prev, const int32_t* tokens) const {
  uint64_t h = splitmix64_mix(prev ^ 0x9e3779b97f4a7c15ull);
  for (int64_t i = 0; i < block_size_; ++i) h = splitmix64_mix(h ^ (uint64_t(uint32_t(tokens[i])) + 0x632be59bd9b4e019ull * uint64_t(i + 1)));
  return h;
}

int32_t BlockPool::lookup(Hash h, Hash prev, const int32_t* tokens) const {
  auto it = table_.find(h);
  if (it == table_.end()) return -1;
  const int32_t b = it->second;
  const Meta& m = meta_[size_t(b)];
  if (m.parent != prev) return -1;
  if (std::memcmp(tokens_.data() + size_t(int64_t(b) * block_size_), tokens, size_t(block_size_) * sizeof(int32_t)) != 0) return -1;
  return b;
}

void BlockPool::acquire(int32_t b) {
  ARBOR_CHECK(b >= 0 && b < n_blocks_ && meta_[size_t(b)].hashed, "kv: acquiring block {} that is not cached", b);
  Meta& m = meta_[size_t(b)];
  if (m.ref == 0) lru_remove(b);
  m.ref += 1;
}

void BlockPool::publish(int32_t b, Hash h, Hash prev, const int32_t* tokens) {
  ARBOR_CHECK(b >= 0 && b < n_blocks_ && meta_[size_t(b)].ref > 0, "kv: publishing block {} that is not held", b);
  Meta& m = meta_[size_t(b)];
  if (m.hashed || table_.count(h)) return;
  m.hashed = true;
  m.hash = h;
  m.parent = prev;
  std::memcpy(tokens_.data() + size_t(int64_t(b) * block_size_), tokens, size_t(block_size_) * sizeof(int32_t));
  table_.emplace(h, b);
}

void BlockPool::clear_cache() {
  while (lru_head_ >= 0) {
    const int32_t b = lru_head_;
    lru_remove(b);
    unhash(b);
    blank_.push_back(b);
  }
}

bool SequenceKV::reserve(BlockPool& pool, int64_t tokens) {
  int64_t need = pool.blocks_for(tokens) - int64_t(blocks.size());
  return need <= 0 || pool.allocate(need, blocks);
}

int64_t SequenceKV::match_prefix(BlockPool& pool, const std::vector<int32_t>& tokens, int64_t max_tokens) {
  ARBOR_CHECK(blocks.empty() && length == 0, "kv: match_prefix on a sequence that already holds {} blocks", blocks.size());
  const int64_t bs = pool.block_size();
  const int64_t full = std::min<int64_t>(max_tokens, int64_t(tokens.size())) / bs;
  BlockPool::Hash prev = chain_root();
  for (int64_t i = 0; i < full; ++i) {
    const int32_t* t = tokens.data() + i * bs;
    const BlockPool::Hash h = pool.chain_hash(prev, t);
    const int32_t b = pool.lookup(h, prev, t);
    if (b < 0) break;
    pool.acquire(b);
    blocks.push_back(b);
    prev = h;
  }
  cached_blocks = hashed_blocks = int64_t(blocks.size());
  last_hash = prev;
  length = cached_blocks * bs;
  return length;
}

void SequenceKV::publish(BlockPool& pool, const std::vector<int32_t>& head, const std::vector<int32_t>& tail) {
  const int64_t bs = pool.block_size();
  const int64_t full = std::min<int64_t>(length / bs, int64_t(blocks.size()));
  if (hashed_blocks >= full) return;
  ARBOR_CHECK(int64_t(head.size() + tail.size()) >= full * bs, "kv: publish needs {} token ids, got {}", full * bs, head.size() + tail.size());
  std::vector<int32_t> t(static_cast<size_t>(bs));
  if (hashed_blocks == 0) last_hash = chain_root();
  for (; hashed_blocks < full; ++hashed_blocks) {
    for (int64_t i = 0; i < bs; ++i) {
      const size_t pos = size_t(hashed_blocks * bs + i);
      t[size_t(i)] = pos < head.size() ? head[pos] : tail[pos - head.size()];
    }
    const BlockPool::Hash h = pool.chain_hash(last_hash, t.data());
    pool.publish(blocks[size_t(hashed_blocks)], h, last_hash, t.data());
    last_hash = h;
  }
}

}  // namespace arbor
