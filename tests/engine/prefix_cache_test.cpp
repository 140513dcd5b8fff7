// Prefix caching through the Scheduler on the shipped default model (models/arbor-tiny-sotu, CPU): cached
// token counts are the matched full blocks, greedy output is identical with and without the cache (same
// prompt twice, a shared system prompt, a second chat turn, sharing with a running request, eviction in a
// small pool), and no sequence ever writes into a block another one shares. Each test runs with the plain
// cache and with KV codecs (--kv-cache), whose blocks hold codes, scales and zero points.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "engine/scheduler.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace arbor {
namespace {

const std::string kDir = std::string(ARBOR_SOURCE_DIR) + "/models/arbor-tiny-sotu";
constexpr int64_t kBlock = 16;

struct Env {
  CpuBackend backend{2, WeightPlacement::Mapped};
  std::unique_ptr<Model> model;
  std::unique_ptr<BlockPool> pool;
  Env(int64_t kv_blocks, int64_t step_tokens, const std::string& kv_cache) {
    LoadOptions o;
    o.kv_cache = kv_cache;
    o.model_dir = kDir;
    o.ctx_size = 512;
    o.kv_blocks = kv_blocks;
    o.block_size = kBlock;
    o.max_step_tokens = step_tokens;  // small: prompts are prefilled in several chunks
    o.show_progress = false;
    model = std::make_unique<Model>(o, backend);
    pool = std::make_unique<BlockPool>(backend.kv_layout().n_blocks, backend.kv_layout().block_size);
  }
};

std::vector<int32_t> chat_prompt(const std::vector<std::pair<std::string, std::string>>& msgs) {
  static const Tokenizer tok = Tokenizer::from_file(kDir);
  static const ChatTemplate tmpl = ChatTemplate::from_model_dir(kDir);
  nlohmann::ordered_json m = nlohmann::ordered_json::array();
  for (const auto& [role, content] : msgs) m.push_back({{"role", role}, {"content", content}});
  return tok.encode(tmpl.render(m, nullptr, true, nlohmann::ordered_json::object()), false);
}

const std::string kSystem =
    "You are a speechwriter for the President of the United States. Write in the plain, hopeful style of the "
    "State of the Union addresses, with short sentences and concrete promises to the American people.";

struct Result {
  std::vector<int32_t> ids;
  int64_t cached = 0;
};

std::shared_ptr<Request> greedy(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  auto r = std::make_shared<Request>();
  r->prompt = prompt;
  r->max_tokens = max_tokens;
  r->sampling.temperature = 0.0f;
  return r;
}

class PrefixCache : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(KVCodecs, PrefixCache, ::testing::Values("bf16", "k8v3", "affine4", "k8v4,0:bf16,-1:affine8"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

Result drain(Request& r) {
  std::vector<TokenEvent> evs;
  while (!r.wait(evs, std::chrono::milliseconds(100))) {
  }
  EXPECT_EQ(r.finish_reason(), FinishReason::Length) << r.error();
  Result out;
  for (auto& e : evs) out.ids.push_back(e.id);
  out.cached = r.cached_tokens();
  return out;
}

// Runs the requests one after another through `s`.
Result run_one(Scheduler& s, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  auto r = greedy(prompt, max_tokens);
  EXPECT_EQ(s.submit(r).status, Admission::Accepted);
  return drain(*r);
}

int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return int64_t(n);
}

// Tokens the cache can serve to `prompt` when `cached` (a previous sequence's fed tokens) is in the pool.
int64_t expected_cached(const std::vector<int32_t>& cached, const std::vector<int32_t>& prompt) {
  const int64_t n = std::min<int64_t>(common_prefix(cached, prompt), int64_t(prompt.size()) - 1);
  return n / kBlock * kBlock;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The tokens a finished request left in its KV: the prompt and every generated id but the last.
std::vector<int32_t> fed(const std::vector<int32_t>& prompt, const std::vector<int32_t>& out) {
  return concat(prompt, std::vector<int32_t>(out.begin(), out.end() - 1));
}

TEST_P(PrefixCache, RepeatedSharedAndMultiTurnPromptsMatchTheUncachedOutput) {
  Env env(200, 32, GetParam());
  const auto a = chat_prompt({{"system", kSystem}, {"user", "What should we do about the economy?"}});
  const auto b = chat_prompt({{"system", kSystem}, {"user", "Tell the Congress about our schools."}});
  ASSERT_GE(common_prefix(a, b), 3 * kBlock) << "the system prompt should span several blocks";
  const int64_t n_gen = 40;

  std::map<std::string, Result> ref;
  {
    Scheduler s(*env.model, *env.pool, {4, 16, false});
    ref["a"] = run_one(s, a, n_gen);
    ref["a2"] = run_one(s, a, n_gen);
    ref["b"] = run_one(s, b, n_gen);
    EXPECT_EQ(ref["a"].ids, ref["a2"].ids);
    EXPECT_EQ(ref["a"].cached, 0);
    EXPECT_EQ(ref["a2"].cached, 0);
    EXPECT_EQ(s.stats().cached_tokens, 0);
  }
  EXPECT_EQ(env.pool->cached_blocks(), 0) << "without the cache nothing is published";
  // Second turn: the first answer (as the model wrote it) and a new question.
  const auto turn2 = concat(concat(a, ref["a"].ids), chat_prompt({{"user", "And what about jobs?"}}));
  {
    Scheduler s(*env.model, *env.pool, {4, 16, false});
    ref["turn2"] = run_one(s, turn2, n_gen);
  }

  Scheduler s(*env.model, *env.pool, {4, 16, true});
  Result r1 = run_one(s, a, n_gen);
  EXPECT_EQ(r1.cached, 0);
  EXPECT_EQ(r1.ids, ref["a"].ids);
  EXPECT_GT(env.pool->cached_blocks(), 0);
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
  EXPECT_EQ(s.stats().kv_blocks_cached, env.pool->cached_blocks());

  Result r2 = run_one(s, a, n_gen);  // the same prompt: every full block but the one holding the last token
  EXPECT_EQ(r2.cached, (int64_t(a.size()) - 1) / kBlock * kBlock);
  EXPECT_GT(r2.cached, 0);
  EXPECT_EQ(r2.ids, ref["a"].ids);

  Result rb = run_one(s, b, n_gen);  // shares the system prompt's blocks
  EXPECT_EQ(rb.cached, expected_cached(a, b));
  EXPECT_GE(rb.cached, 3 * kBlock);
  EXPECT_EQ(rb.ids, ref["b"].ids);

  Result rt = run_one(s, turn2, n_gen);  // reuses the blocks that held the first answer's generated ids
  EXPECT_EQ(rt.cached, expected_cached(fed(a, r2.ids), turn2));
  EXPECT_GT(rt.cached, int64_t(a.size()) / kBlock * kBlock);
  // The blocks that held the first answer were written by decode steps, the reference wrote the same
  // tokens' K/V in a prefill: the two agree to float rounding, not bitwise, and 4-bit keys turn an
  // element that sits on a rounding edge into a whole code step. With them the cached run must agree
  // for the first 16 ids (a wrong block diverges at once) rather than all 40.
  if (GetParam() == "affine4")
    EXPECT_GE(common_prefix(rt.ids, ref["turn2"].ids), 16) << ::testing::PrintToString(rt.ids) << " vs "
                                                           << ::testing::PrintToString(ref["turn2"].ids);
  else
    EXPECT_EQ(rt.ids, ref["turn2"].ids);

  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.cached_tokens, r2.cached + rb.cached + rt.cached);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

TEST_P(PrefixCache, PromptOfWholeBlocksStillComputesItsLastToken) {
  Env env(100, 32, GetParam());
  auto p = chat_prompt({{"system", kSystem}, {"user", "Say something about the Union."}});
  p.resize(size_t(p.size() / kBlock * kBlock));  // exactly 4+ full blocks
  ASSERT_GE(p.size(), size_t(4 * kBlock));
  Result ref;
  {
    Scheduler s(*env.model, *env.pool, {2, 4, false});
    ref = run_one(s, p, 20);
  }
  Scheduler s(*env.model, *env.pool, {2, 4, true});
  EXPECT_EQ(run_one(s, p, 20).ids, ref.ids);
  Result again = run_one(s, p, 20);
  EXPECT_EQ(again.cached, int64_t(p.size()) - kBlock);  // the last block is computed again, privately
  EXPECT_EQ(again.ids, ref.ids);
}

// Shares cached blocks with requests running at the same time (one sharing with a request that is itself
// still decoding); every block published before stays byte-identical, so nobody wrote into a shared block.
TEST_P(PrefixCache, SharedBlocksAreNeverWritten) {
  Env env(300, 48, GetParam());
  const auto a = chat_prompt({{"system", kSystem}, {"user", "What should we do about the economy?"}});
  const auto b = chat_prompt({{"system", kSystem}, {"user", "Speak to the soldiers overseas."}});
  const auto c = chat_prompt({{"system", kSystem}, {"user", "Thank the farmers."}});
  std::map<std::string, Result> ref;
  {
    Scheduler s(*env.model, *env.pool, {4, 16, false});
    ref["a"] = run_one(s, a, 30);
    ref["b"] = run_one(s, b, 60);
    ref["c"] = run_one(s, c, 60);
  }
  const auto turn2 = concat(concat(a, ref["a"].ids), chat_prompt({{"user", "More, please."}}));
  {
    Scheduler s(*env.model, *env.pool, {4, 16, false});
    ref["turn2"] = run_one(s, turn2, 50);
  }

  {
    Scheduler s(*env.model, *env.pool, {4, 16, true});
    EXPECT_EQ(run_one(s, a, 30).ids, ref["a"].ids);
  }  // the engine thread has stopped: the pool can be read from here
  const KVLayout& L = env.backend.kv_layout();
  // A block's bytes in every layer's K and V pool (codes, scales and zero points when coded).
  auto block_bytes = [&](int32_t blk) {
    std::vector<uint8_t> v;
    for (int64_t l = 0; l < L.n_layers; ++l) {
      const KVCodecPair& c = L.codec(l);
      const size_t kb = size_t(L.block_size * L.n_kv_heads * c.k.row_bytes(L.head_dim, 4));
      const size_t vb = size_t(L.block_size * L.n_kv_heads * c.v.row_bytes(L.head_dim, 4));
      const uint8_t* k = env.backend.k_pool_bytes(l) + size_t(blk) * kb;
      const uint8_t* vv = env.backend.v_pool_bytes(l) + size_t(blk) * vb;
      v.insert(v.end(), k, k + kb);
      v.insert(v.end(), vv, vv + vb);
    }
    return v;
  };
  std::map<int32_t, std::vector<uint8_t>> snapshot;
  for (int32_t blk = 0; blk < int32_t(env.pool->n_blocks()); ++blk)
    if (env.pool->published(blk)) snapshot[blk] = block_bytes(blk);
  ASSERT_GE(snapshot.size(), 3u);

  {
    Scheduler s(*env.model, *env.pool, {4, 16, true});
    // b and c share a's system-prompt blocks with each other; the second turn shares a's answer blocks.
    auto rb = greedy(b, 60), rc = greedy(c, 60), rt = greedy(turn2, 50);
    ASSERT_EQ(s.submit(rb).status, Admission::Accepted);
    ASSERT_EQ(s.submit(rc).status, Admission::Accepted);
    // Wait until b decodes, then a request with b's prompt joins it while it runs: it shares b's blocks.
    std::vector<TokenEvent> first;
    while (first.empty() && !rb->wait(first, std::chrono::milliseconds(5))) {
    }
    auto rb2 = greedy(b, 60);
    ASSERT_EQ(s.submit(rb2).status, Admission::Accepted);
    ASSERT_EQ(s.submit(rt).status, Admission::Accepted);
    Result xb = drain(*rb), xc = drain(*rc), xb2 = drain(*rb2), xt = drain(*rt);
    std::vector<int32_t> head;
    for (const auto& e : first) head.push_back(e.id);
    xb.ids = concat(head, xb.ids);
    EXPECT_EQ(xb.ids, ref["b"].ids);
    EXPECT_EQ(xc.ids, ref["c"].ids);
    EXPECT_EQ(xb2.ids, ref["b"].ids);
    EXPECT_EQ(xt.ids, ref["turn2"].ids);
    EXPECT_EQ(xb.cached, expected_cached(a, b));
    EXPECT_EQ(xc.cached, expected_cached(a, c));
    EXPECT_EQ(xb2.cached, (int64_t(b.size()) - 1) / kBlock * kBlock);  // b's own blocks, published while it ran
    EXPECT_EQ(xt.cached, expected_cached(fed(a, ref["a"].ids), turn2));
    EXPECT_EQ(s.stats().kv_blocks_used, 0);
  }
  for (const auto& [blk, want] : snapshot) {
    ASSERT_TRUE(env.pool->published(blk)) << "block " << blk << " left the cache in a pool with room to spare";
    EXPECT_TRUE(block_bytes(blk) == want) << "shared block " << blk << " was written";
  }
}

// A pool that holds little more than one request: cached blocks are evicted (LRU) to admit others, requests
// that need the whole pool are admitted by evicting, and every output matches the uncached run.
TEST_P(PrefixCache, EvictionInASmallPoolKeepsOutputIdentical) {
  std::vector<std::vector<int32_t>> prompts = {
      chat_prompt({{"system", kSystem}, {"user", "Jobs."}}),
      chat_prompt({{"system", "You speak for the nation."}, {"user", "What is the state of our Union?"}}),
      chat_prompt({{"user", "Tell us about the war and the peace that must follow it, and about the men who fought."}}),
  };
  int64_t most = 0;
  for (auto& p : prompts) most = std::max<int64_t>(most, (int64_t(p.size()) + 24 + kBlock - 1) / kBlock);
  const int64_t n_blocks = most + 1;  // room for one request and a block: every new prompt evicts
  Env env(n_blocks, 32, GetParam());
  ASSERT_EQ(env.pool->n_blocks(), n_blocks);
  const std::vector<int> order = {0, 0, 1, 2, 0, 1, 1, 2, 0};
  std::vector<Result> ref;
  {
    Scheduler s(*env.model, *env.pool, {2, 8, false});
    for (int i : order) ref.push_back(run_one(s, prompts[size_t(i)], 24));
  }
  // A request that needs every block of the pool.
  const int64_t big_gen = n_blocks * kBlock - int64_t(prompts[0].size());
  Result big_ref;
  {
    Scheduler s(*env.model, *env.pool, {2, 8, false});
    big_ref = run_one(s, prompts[0], big_gen);
  }

  Scheduler s(*env.model, *env.pool, {2, 8, true});
  std::vector<Result> got;
  for (size_t k = 0; k < order.size(); ++k) {
    got.push_back(run_one(s, prompts[size_t(order[k])], 24));
    EXPECT_EQ(got.back().ids, ref[k].ids) << "request " << k;
    EXPECT_LE(s.stats().kv_blocks_cached, n_blocks);
  }
  auto full_hit = [&](int i) { return (int64_t(prompts[size_t(i)].size()) - 1) / kBlock * kBlock; };
  EXPECT_EQ(got[0].cached, 0);
  EXPECT_EQ(got[1].cached, full_hit(0));  // just computed: its blocks are held before the rest is allocated
  EXPECT_EQ(got[6].cached, full_hit(1));
  EXPECT_LT(got[4].cached, full_hit(0));  // prompts 1 and 2 pushed (some of) prompt 0's blocks out
  EXPECT_LT(got[8].cached, full_hit(0));
  EXPECT_EQ(env.pool->free_blocks(), n_blocks);
  EXPECT_GT(env.pool->cached_blocks(), 0);

  // Concurrent requests that do not all fit: the third waits for blocks, then matches what is cached.
  std::vector<std::shared_ptr<Request>> rs;
  for (int i : {1, 2, 0}) {
    rs.push_back(greedy(prompts[size_t(i)], 24));
    ASSERT_EQ(s.submit(rs.back()).status, Admission::Accepted);
  }
  EXPECT_EQ(drain(*rs[0]).ids, ref[2].ids);
  EXPECT_EQ(drain(*rs[1]).ids, ref[3].ids);
  EXPECT_EQ(drain(*rs[2]).ids, ref[0].ids);

  // Cached blocks count as free: the whole-pool request is admitted and evicts them.
  ASSERT_GT(env.pool->cached_blocks(), 0);
  Result big = run_one(s, prompts[0], big_gen);
  EXPECT_EQ(big.ids, big_ref.ids);
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
  // One block more than the pool is never admitted, cache or not.
  auto too_big = greedy(prompts[0], big_gen + 1);
  EXPECT_EQ(s.submit(too_big).status, Admission::NeverFits);
}

}  // namespace
}  // namespace arbor
