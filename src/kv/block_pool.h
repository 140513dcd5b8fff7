// Paged KV bookkeeping on the host: a pool of fixed-size token blocks, per-sequence block tables, and the
// prefix cache. The backends own the KV memory ([n_blocks, block_size, n_kv_heads, head_dim] per layer);
// this owns which block belongs to whom and which full blocks hold which tokens.
//
// Prefix cache (vLLM-style, block granularity): a full block is named by a hash chained over the previous
// block's hash and its own token ids, so equal hashes mean equal token prefixes. Blocks carry a reference
// count. A block whose KV has been computed is published under its hash; when its last holder releases
// it, it stays in the pool as *cached* (ref 0, contents kept, evictable, least recently used first) rather
// than going back blank. A new sequence takes the longest run of cached blocks matching its leading full
// blocks (ref++). allocate() hands out blank blocks first, then evicts cached ones, so cached blocks count
// as free for admission. Only full blocks are ever shared, and a sequence only writes past its shared
// prefix, so no one writes into a block another sequence reads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace arbor {

class BlockPool {
 public:
  using Hash = uint64_t;

  BlockPool(int64_t n_blocks, int64_t block_size);
  int64_t block_size() const { return block_size_; }
  int64_t n_blocks() const { return n_blocks_; }
  // Blocks allocate() can hand out: blank ones plus cached ones nobody holds (evicted on demand).
  int64_t free_blocks() const { return int64_t(blank_.size()) + lru_size_; }
  // Cached blocks nobody holds: their KV is kept until allocate() needs the room.
  int64_t cached_blocks() const { return lru_size_; }
  // Blocks held by at least one sequence.
  int64_t used_blocks() const { return n_blocks_ - free_blocks(); }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Takes n blocks (reference count 1 each): blank ones first, then the least recently used cached ones,
  // which leave the cache. False (and nothing taken) when fewer than n are free.
  bool allocate(int64_t n, std::vector<int32_t>& out);
  // Drops one reference to each block and clears the vector. A block nobody holds any more becomes cached
  // if it was published, blank otherwise. Blocks are released last to first, so a sequence's later blocks
  // are evicted before its earlier ones (an early block is worth more: every longer prefix needs it).
  void release(std::vector<int32_t>& blocks);

  // The chain hash of one full block: `prev` is the previous block's hash (0 for the first block).
  Hash chain_hash(Hash prev, const int32_t* tokens) const;
  // The cached block holding `tokens` (block_size ids) after a prefix whose last block hashed to `prev`,
  // or -1. The stored ids and parent are compared too, so only a full 64-bit hash collision of both could
  // give a wrong block.
  int32_t lookup(Hash h, Hash prev, const int32_t* tokens) const;
  // Adds a reference to a block found by lookup() (a cached block nobody holds leaves the LRU list).
  void acquire(int32_t block);
  // Publishes `block` (held by the caller, all block_size slots written and computed) as holding `tokens`
  // under hash `h` with parent `prev`. When another block already holds that hash, or this block is
  // already published, nothing changes (the block stays private and goes blank when released).
  void publish(int32_t block, Hash h, Hash prev, const int32_t* tokens);
  bool published(int32_t block) const { return meta_[size_t(block)].hashed; }
  int32_t ref_count(int32_t block) const { return meta_[size_t(block)].ref; }
  // Drops every cached block nobody holds (they go blank); held blocks keep their hashes.
  void clear_cache();

 private:
  struct Meta {
    int32_t ref = 0;
    bool hashed = false;
    Hash hash = 0, parent = 0;
    int32_t prev = -1, next = -1;  // LRU links while cached and unheld
  };
  void lru_push_back(int32_t b);
  void lru_remove(int32_t b);
  void unhash(int32_t b);

  int64_t n_blocks_, block_size_;
  std::vector<int32_t> blank_;  // a stack: the most recently freed block is reused first (warm)
  std::vector<Meta> meta_;
  std::vector<int32_t> tokens_;  // [n_blocks, block_size]: the ids a published block holds
  std::unordered_map<Hash, int32_t> table_;  // published hash -> block
  int32_t lru_head_ = -1, lru_tail_ = -1;   // head = least recently used
  int64_t lru_size_ = 0;
};

// One sequence's view of the KV cache: its block table and how many tokens are stored.
struct SequenceKV {
  std::vector<int32_t> blocks;
  int64_t length = 0;
  int64_t cached_blocks = 0;  // leading blocks taken from the prefix cache by match_prefix()
  int64_t hashed_blocks = 0;  // leading full blocks whose chain hash is known (matched or published)
  BlockPool::Hash last_hash = 0;  // chain hash of block hashed_blocks - 1
  // Keys rotated in longrope's long regime (Model::long_rope_for the prompt). Such KV differs from
  // the same tokens' KV in the default regime, so the two regimes' blocks hash apart (chain_root).
  bool long_rope = false;
  BlockPool::Hash chain_root() const { return long_rope ? kLongRopeRoot : 0; }
  static constexpr BlockPool::Hash kLongRopeRoot = 0x6c6f6e67726f7065ull;  // "longrope"

  // Grows the table to hold `tokens` tokens; false if the pool is out of blocks.
  bool reserve(BlockPool& pool, int64_t tokens);
  // On an empty sequence: takes the longest run of cached blocks matching the full blocks of
  // tokens[0, max_tokens) and sets length to the tokens they hold. Returns that token count.
  int64_t match_prefix(BlockPool& pool, const std::vector<int32_t>& tokens, int64_t max_tokens);
  // Publishes the full blocks among the first `length` tokens not yet published. The sequence's tokens are
  // `head` followed by `tail` (a prompt and the generated ids fed so far); together they hold >= length ids.
  void publish(BlockPool& pool, const std::vector<int32_t>& head, const std::vector<int32_t>& tail);
  void release(BlockPool& pool) {
    pool.release(blocks);
    length = cached_blocks = hashed_blocks = 0;
    last_hash = 0;
    long_rope = false;
  }
};

}  // namespace arbor
