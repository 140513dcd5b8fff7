// Block pool and per-sequence block tables.
#include "kv/block_pool.h"

#include "core/error.h"

namespace arbor {

BlockPool::BlockPool(int64_t n_blocks, int64_t block_size) : n_blocks_(n_blocks), block_size_(block_size) {
  ARBOR_CHECK(n_blocks > 0 && block_size > 0, "kv: need a positive block count and size, got {} x {}", n_blocks, block_size);
  free_.reserve(size_t(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

bool BlockPool::allocate(int64_t n, std::vector<int32_t>& out) {
  if (n > int64_t(free_.size())) return false;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockPool::release(std::vector<int32_t>& blocks) {
  for (auto b : blocks) free_.push_back(b);
  blocks.clear();
}

bool SequenceKV::reserve(BlockPool& pool, int64_t tokens) {
  int64_t need = pool.blocks_for(tokens) - int64_t(blocks.size());
  return need <= 0 || pool.allocate(need, blocks);
}

}  // namespace arbor
