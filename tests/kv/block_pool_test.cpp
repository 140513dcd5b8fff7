// BlockPool and SequenceKV: allocation, reference counts, chain hashes, publishing and matching cached
// prefixes, LRU eviction order, and that cached blocks count as free.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "kv/block_pool.h"

namespace arbor {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t start) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Fills a sequence as the scheduler does: allocate for all tokens, mark them computed, publish.
SequenceKV computed(BlockPool& pool, const std::vector<int32_t>& tokens) {
  SequenceKV s;
  EXPECT_TRUE(s.reserve(pool, int64_t(tokens.size())));
  s.length = int64_t(tokens.size());
  s.publish(pool, tokens, {});
  return s;
}

TEST(BlockPool, AllocateAndReleaseCountBlocks) {
  BlockPool pool(5, 4);
  EXPECT_EQ(pool.free_blocks(), 5);
  EXPECT_EQ(pool.blocks_for(0), 0);
  EXPECT_EQ(pool.blocks_for(4), 1);
  EXPECT_EQ(pool.blocks_for(5), 2);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.allocate(3, a));
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_EQ(pool.used_blocks(), 3);
  EXPECT_FALSE(pool.allocate(3, b));  // all or nothing
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.free_blocks(), 2);
  for (auto x : a) EXPECT_EQ(pool.ref_count(x), 1);
  pool.release(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(pool.free_blocks(), 5);
  EXPECT_EQ(pool.cached_blocks(), 0);  // never published: blank again
  std::vector<int32_t> bad = {2};
  EXPECT_THROW(pool.release(bad), Error);  // not held
  EXPECT_THROW(BlockPool(0, 16), Error);
}

TEST(BlockPool, ChainHashDependsOnPrefixAndEveryToken) {
  BlockPool pool(1, 4);
  std::vector<int32_t> x = {1, 2, 3, 4}, y = {1, 2, 3, 5}, z = {2, 1, 3, 4};
  const auto hx = pool.chain_hash(0, x.data());
  EXPECT_EQ(hx, pool.chain_hash(0, x.data()));
  EXPECT_NE(hx, pool.chain_hash(0, y.data()));
  EXPECT_NE(hx, pool.chain_hash(0, z.data()));  // order matters
  EXPECT_NE(hx, pool.chain_hash(hx, x.data())); // same block after another prefix
  EXPECT_NE(pool.chain_hash(pool.chain_hash(0, x.data()), y.data()), pool.chain_hash(pool.chain_hash(0, z.data()), y.data()));
}

TEST(BlockPool, PublishedBlocksStayCachedAndMatchInOrder) {
  BlockPool pool(8, 4);
  const auto toks = iota_tokens(10, 100);  // blocks [100..103] [104..107], then a partial block [108, 109]
  SequenceKV a = computed(pool, toks);
  ASSERT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(a.hashed_blocks, 2);  // the partial block is never published
  EXPECT_TRUE(pool.published(a.blocks[0]));
  EXPECT_TRUE(pool.published(a.blocks[1]));
  EXPECT_FALSE(pool.published(a.blocks[2]));
  const auto kept = a.blocks;
  a.release(pool);
  EXPECT_EQ(pool.free_blocks(), 8);   // cached blocks are free for allocation...
  EXPECT_EQ(pool.cached_blocks(), 2); // ...but keep their contents
  EXPECT_EQ(pool.used_blocks(), 0);

  // The same tokens: both full blocks match; the partial one does not exist.
  SequenceKV b;
  EXPECT_EQ(b.match_prefix(pool, toks, int64_t(toks.size())), 8);
  EXPECT_EQ(b.blocks, std::vector<int32_t>(kept.begin(), kept.begin() + 2));
  EXPECT_EQ(b.cached_blocks, 2);
  EXPECT_EQ(b.length, 8);
  EXPECT_EQ(pool.cached_blocks(), 0);  // held again
  EXPECT_EQ(pool.ref_count(kept[0]), 1);

  // A second holder shares them (ref 2); max_tokens caps the match at whole blocks below it.
  SequenceKV c;
  EXPECT_EQ(c.match_prefix(pool, toks, 7), 4);
  EXPECT_EQ(pool.ref_count(kept[0]), 2);
  EXPECT_EQ(pool.ref_count(kept[1]), 1);

  // A prefix that differs in the first block matches nothing, even though block 2's tokens are equal.
  auto other = toks;
  other[0] = 7;
  SequenceKV d;
  EXPECT_EQ(d.match_prefix(pool, other, int64_t(other.size())), 0);
  // Differs in the second block: only the first matches.
  auto half = toks;
  half[5] = 7;
  EXPECT_EQ(d.match_prefix(pool, half, int64_t(half.size())), 4);
  EXPECT_EQ(pool.ref_count(kept[0]), 3);
  d.release(pool);
  c.release(pool);
  EXPECT_EQ(pool.ref_count(kept[0]), 1);
  b.release(pool);
  EXPECT_EQ(pool.cached_blocks(), 2);
  EXPECT_EQ(pool.free_blocks(), 8);
}

// Keys rotated in longrope's long regime are not the default regime's keys of the same tokens: a
// sequence matches only blocks its own regime published.
TEST(BlockPool, LongRopeBlocksMatchOnlyTheirRegime) {
  BlockPool pool(8, 4);
  const auto toks = iota_tokens(9, 100);
  SequenceKV a;
  a.long_rope = true;
  ASSERT_TRUE(a.reserve(pool, 9));
  a.length = 9;
  a.publish(pool, toks, {});
  const auto long_blocks = std::vector<int32_t>(a.blocks.begin(), a.blocks.begin() + 2);
  a.release(pool);
  EXPECT_FALSE(a.long_rope);  // a released sequence starts over in the default regime
  EXPECT_EQ(pool.cached_blocks(), 2);

  SequenceKV plain;
  EXPECT_EQ(plain.match_prefix(pool, toks, 9), 0);
  plain.release(pool);
  SequenceKV lng;
  lng.long_rope = true;
  EXPECT_EQ(lng.match_prefix(pool, toks, 9), 8);
  EXPECT_EQ(lng.blocks, long_blocks);
  lng.release(pool);

  // The default regime's blocks of the same tokens live beside them; each regime finds its own.
  SequenceKV b = computed(pool, toks);
  const auto short_blocks = std::vector<int32_t>(b.blocks.begin(), b.blocks.begin() + 2);
  b.release(pool);
  EXPECT_EQ(pool.cached_blocks(), 4);
  SequenceKV c, d;
  d.long_rope = true;
  EXPECT_EQ(c.match_prefix(pool, toks, 9), 8);
  EXPECT_EQ(d.match_prefix(pool, toks, 9), 8);
  EXPECT_EQ(c.blocks, short_blocks);
  EXPECT_EQ(d.blocks, long_blocks);
  c.release(pool), d.release(pool);
}

TEST(BlockPool, LookupChecksTokensAndParent) {
  BlockPool pool(4, 4);
  const auto toks = iota_tokens(8, 0);
  SequenceKV a = computed(pool, toks);
  const auto h0 = pool.chain_hash(0, toks.data());
  const auto h1 = pool.chain_hash(h0, toks.data() + 4);
  EXPECT_EQ(pool.lookup(h0, 0, toks.data()), a.blocks[0]);
  EXPECT_EQ(pool.lookup(h1, h0, toks.data() + 4), a.blocks[1]);
  // The right hash with other contents or another parent (what a hash collision would look like) is a miss.
  EXPECT_EQ(pool.lookup(h1, h0, toks.data()), -1);
  EXPECT_EQ(pool.lookup(h1, 12345, toks.data() + 4), -1);
  EXPECT_EQ(pool.lookup(h1 ^ 1, h0, toks.data() + 4), -1);
  a.release(pool);
}

TEST(BlockPool, DuplicateContentStaysPrivate) {
  BlockPool pool(6, 4);
  const auto toks = iota_tokens(8, 0);
  SequenceKV a = computed(pool, toks), b = computed(pool, toks);  // computed side by side, not shared
  EXPECT_TRUE(pool.published(a.blocks[0]));
  EXPECT_FALSE(pool.published(b.blocks[0]));  // the hash already names a's block
  EXPECT_EQ(b.hashed_blocks, 2);              // but b's chain goes on
  b.release(pool);
  EXPECT_EQ(pool.cached_blocks(), 0);  // b's copies went blank
  a.release(pool);
  EXPECT_EQ(pool.cached_blocks(), 2);
}

TEST(BlockPool, AllocationTakesBlankBlocksBeforeEvicting) {
  BlockPool pool(4, 2);
  SequenceKV a = computed(pool, {1, 2, 3, 4});
  a.release(pool);
  ASSERT_EQ(pool.cached_blocks(), 2);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(2, got));  // the two blank blocks
  EXPECT_EQ(pool.cached_blocks(), 2);
  SequenceKV b;
  EXPECT_EQ(b.match_prefix(pool, {1, 2, 3, 4, 5}, 5), 4);
  b.release(pool);
  ASSERT_TRUE(pool.allocate(2, got));  // now the cache has to go
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_EQ(pool.free_blocks(), 0);
  for (auto x : got) EXPECT_FALSE(pool.published(x));
  pool.release(got);
  SequenceKV c;
  EXPECT_EQ(c.match_prefix(pool, {1, 2, 3, 4, 5}, 5), 0);  // evicted blocks are no longer found
}

TEST(BlockPool, EvictsLeastRecentlyUsedAndLaterBlocksFirst) {
  BlockPool pool(4, 2);
  const std::vector<int32_t> x = {1, 2, 3, 4}, y = {5, 6, 7, 8};
  SequenceKV a = computed(pool, x);
  a.release(pool);  // x's blocks: older
  SequenceKV b = computed(pool, y);
  b.release(pool);  // y's blocks: newer
  ASSERT_EQ(pool.cached_blocks(), 4);
  ASSERT_EQ(pool.free_blocks(), 4);

  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(1, got));  // evicts x's second block (a sequence's tail goes before its head)
  SequenceKV m;
  EXPECT_EQ(m.match_prefix(pool, x, 4), 2);
  m.release(pool);  // x's first block is now the most recently used
  EXPECT_EQ(m.match_prefix(pool, y, 4), 4);
  m.release(pool);  // y's blocks now newest: y0 newest, then y1, then x0
  ASSERT_TRUE(pool.allocate(1, got));  // evicts x's first block, the least recently used
  EXPECT_EQ(m.match_prefix(pool, x, 4), 0);
  EXPECT_EQ(m.match_prefix(pool, y, 4), 4);
  m.release(pool);
  ASSERT_TRUE(pool.allocate(1, got));  // y's tail
  EXPECT_EQ(m.match_prefix(pool, y, 4), 2);
  m.release(pool);
  pool.release(got);
}

TEST(BlockPool, PublishSpansPromptAndGeneratedTokens) {
  BlockPool pool(8, 4);
  const std::vector<int32_t> prompt = iota_tokens(6, 10), gen = {90, 91, 92, 93, 94, 95};
  SequenceKV s;
  ASSERT_TRUE(s.reserve(pool, 12));
  s.length = 6;
  s.publish(pool, prompt, gen);
  EXPECT_EQ(s.hashed_blocks, 1);
  s.length = 11;  // the last generated id is sampled but not fed
  s.publish(pool, prompt, gen);
  EXPECT_EQ(s.hashed_blocks, 2);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), gen.begin(), gen.end());
  SequenceKV t;
  EXPECT_EQ(t.match_prefix(pool, all, 12), 8);
  t.release(pool);
  s.release(pool);
  SequenceKV u;
  ASSERT_TRUE(u.reserve(pool, 8));
  u.length = 8;
  EXPECT_THROW(u.publish(pool, iota_tokens(4, 0), {1, 2}), Error);  // fewer ids than computed positions
  u.release(pool);
}

TEST(BlockPool, ClearCacheBlanksUnheldBlocksOnly) {
  BlockPool pool(4, 2);
  SequenceKV a = computed(pool, {1, 2}), b = computed(pool, {3, 4});
  a.release(pool);
  pool.clear_cache();
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_TRUE(pool.published(b.blocks[0]));
  SequenceKV m;
  EXPECT_EQ(m.match_prefix(pool, {1, 2, 9}, 3), 0);
  EXPECT_EQ(m.match_prefix(pool, {3, 4, 9}, 3), 2);
  m.release(pool);
  b.release(pool);
  EXPECT_EQ(pool.cached_blocks(), 1);
}

}  // namespace
}  // namespace arbor
