// Paged KV bookkeeping on the host: a pool of fixed-size token blocks and per-sequence block tables.
// The backends own the KV memory ([n_blocks, block_size, n_kv_heads, head_dim] per layer); this owns
// which block belongs to whom. Prefix caching will key full blocks by token hashes here.
#pragma once
#include <cstdint>
#include <vector>

namespace arbor {

class BlockPool {
 public:
  BlockPool(int64_t n_blocks, int64_t block_size);
  int64_t block_size() const { return block_size_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t free_blocks() const { return int64_t(free_.size()); }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Takes n blocks; false (and nothing taken) when fewer are free.
  bool allocate(int64_t n, std::vector<int32_t>& out);
  void release(std::vector<int32_t>& blocks);  // returns them and clears the vector

 private:
  int64_t n_blocks_, block_size_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first (warm)
};

// One sequence's view of the KV cache: its block table and how many tokens are stored.
struct SequenceKV {
  std::vector<int32_t> blocks;
  int64_t length = 0;
  // Grows the table to hold `tokens` tokens; false if the pool is out of blocks.
  bool reserve(BlockPool& pool, int64_t tokens);
  void release(BlockPool& pool) {
    pool.release(blocks);
    length = 0;
  }
};

}  // namespace arbor
