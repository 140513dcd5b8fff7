// The scheduler and generate() on the CUDA backend: when every row of a step is plain greedy, the ids
// are picked on the GPU (the logits never leave it) and the next step is queued before they reach the
// host; the ids must equal the ids the host path picks from the same logits (forced by asking for
// logprobs / keeping the logits), and requests must end at the same token for the same reason (stop
// ids and max_tokens that end them while a next step is already queued). The shipped default model,
// several requests decoding together. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda_test_util.h"
#include "engine/generate.h"
#include "engine/scheduler.h"

using namespace arbor;
using namespace arbor::cuda_test;

namespace {

struct Ask {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 24;
  std::vector<int32_t> stop_ids;
  float temperature = 0.0f;  // > 0: sampled, with seed 1000 + the ask's index
};

// Every request submitted at once; each one's ids, and its finish reason in `reasons`.
std::vector<std::vector<int32_t>> run(Scheduler& s, const std::vector<Ask>& asks, bool logprobs, std::vector<FinishReason>* reasons = nullptr) {
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& a : asks) {
    auto r = std::make_shared<Request>();
    r->prompt = a.prompt;
    r->max_tokens = a.max_tokens;
    r->stop_ids = a.stop_ids;
    r->sampling.temperature = a.temperature;
    r->sampling.seed = 1000 + reqs.size();
    r->logprobs = logprobs;
    EXPECT_EQ(s.submit(r).status, Admission::Accepted);
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> out;
  if (reasons) reasons->clear();
  for (auto& r : reqs) {
    std::vector<TokenEvent> evs;
    while (!r->wait(evs, std::chrono::milliseconds(100))) {
    }
    EXPECT_NE(r->finish_reason(), FinishReason::Error) << r->error();
    if (reasons) reasons->push_back(r->finish_reason());
    out.emplace_back();
    for (auto& e : evs) out.back().push_back(e.id);
  }
  return out;
}

std::vector<int32_t> prompt_of(int n, int k) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(int32_t((i * 37 + k * 101 + 5) % 8000));
  return p;
}

// The shipped default model on the GPU with a KV pool of its own.
struct TinyOnGpu {
  static LoadOptions options() {
    LoadOptions o;
    o.model_dir = source_dir() + "/models/arbor-tiny-sotu";
    o.ctx_size = 256, o.kv_blocks = 64, o.max_step_tokens = 64, o.show_progress = false;
    return o;
  }
  CudaBackend gpu{0};
  Model m{options(), gpu};
  BlockPool pool{gpu.kv_layout().n_blocks, gpu.kv_layout().block_size};
};

TEST(CudaScheduler, GreedyIdsPickedOnTheGpuMatchTheHostPath) {
  ARBOR_REQUIRE_GPU();
  TinyOnGpu t;
  Scheduler s(t.m, t.pool, {4, 16, false});
  std::vector<Ask> asks;
  for (int k = 0; k < 4; ++k) asks.push_back({prompt_of(10 + 7 * k, k), 24, {}, 0.0f});
  const int64_t ahead0 = s.stats().steps_queued_ahead;
  auto device = run(s, asks, false);
  const int64_t ahead1 = s.stats().steps_queued_ahead;
  auto host = run(s, asks, true);
  EXPECT_EQ(device, host);
  for (auto& ids : device) EXPECT_EQ(ids.size(), 24u);
  EXPECT_GT(ahead1 - ahead0, 10) << "the greedy run should queue most decode steps ahead";
  EXPECT_EQ(s.stats().steps_queued_ahead, ahead1) << "the host path (logprobs) cannot queue ahead";
}

// Requests that end at different steps, by max_tokens (1, 2, 5, ...) and by stop ids taken from an
// unstopped run (so a stop lands mid-run, while the next step is already queued): the same ids and
// reasons as the host path.
TEST(CudaScheduler, RequestsEndingWhileAStepIsQueuedEndLikeTheHostPath) {
  ARBOR_REQUIRE_GPU();
  TinyOnGpu t;
  Scheduler s(t.m, t.pool, {4, 16, false});
  std::vector<Ask> asks;
  const int64_t max_tokens[] = {1, 2, 5, 30, 30, 17};
  for (int k = 0; k < 6; ++k) asks.push_back({prompt_of(9 + 5 * k, k), max_tokens[k], {}, 0.0f});
  const auto free_run = run(s, asks, true);
  asks[3].stop_ids = {free_run[3][6]};
  asks[4].stop_ids = {free_run[4][12], free_run[4][20]};
  std::vector<FinishReason> rd, rh;
  const int64_t ahead0 = s.stats().steps_queued_ahead;
  const auto device = run(s, asks, false, &rd);
  EXPECT_GT(s.stats().steps_queued_ahead, ahead0);
  const auto host = run(s, asks, true, &rh);
  EXPECT_EQ(device, host);
  EXPECT_EQ(rd, rh);
  EXPECT_EQ(rd[3], FinishReason::Stop);
  EXPECT_LE(device[3].size(), 7u);
  for (int k : {0, 1, 2, 5}) EXPECT_EQ(int64_t(device[size_t(k)].size()), max_tokens[k]) << "request " << k;
}

// A request stopped while its next step was queued leaves that step's KV row past its end; the
// prefix cache must not serve it: a follow-up whose prompt is the first request's prompt and output
// gets the ids of the same follow-up on a scheduler without the cache.
TEST(CudaScheduler, APrefixAfterAStoppedRequestServesTheRightKV) {
  ARBOR_REQUIRE_GPU();
  TinyOnGpu t;
  Ask first{prompt_of(45, 3), 40, {}, 0.0f};
  std::vector<int32_t> follow;
  std::vector<int32_t> cached_ids;
  {
    Scheduler s(t.m, t.pool, {4, 16, true});
    const auto free_run = run(s, {first}, true);
    first.stop_ids = {free_run[0][18]};
    const auto out = run(s, {first}, false);
    ASSERT_FALSE(out[0].empty());
    follow = first.prompt;
    follow.insert(follow.end(), out[0].begin(), out[0].end());
    const int64_t cached0 = s.stats().cached_tokens;
    cached_ids = run(s, {Ask{follow, 12, {}, 0.0f}}, false)[0];
    EXPECT_GT(s.stats().cached_tokens, cached0) << "the follow-up should start from cached blocks";
  }
  Scheduler cold(t.m, t.pool, {4, 16, false});
  EXPECT_EQ(cached_ids, run(cold, {Ask{follow, 12, {}, 0.0f}}, false)[0]);
}

// Sampled requests draw on the GPU (queued ahead like greedy ones): beside greedy requests, which keep
// the ids of the host path; a request alone draws the same ids from the same seed every time (beside
// others its logits may differ in the last bits with the batch's kernels, and so may a draw); and
// sampling leaves the greedy path.
TEST(CudaScheduler, SampledRequestsDrawOnTheGpuReproducibly) {
  ARBOR_REQUIRE_GPU();
  TinyOnGpu t;
  Scheduler s(t.m, t.pool, {4, 16, false});
  std::vector<Ask> mixed;
  for (int k = 0; k < 4; ++k) mixed.push_back({prompt_of(12 + 3 * k, k), 20, {}, k % 2 ? 1.5f : 0.0f});
  const int64_t ahead0 = s.stats().steps_queued_ahead;
  const auto a = run(s, mixed, false);
  EXPECT_GT(s.stats().steps_queued_ahead - ahead0, 10) << "sampled steps should be queued ahead too";
  for (auto& ids : a) EXPECT_EQ(ids.size(), 20u);
  const auto greedy_host = run(s, {mixed[0], mixed[2]}, true);
  EXPECT_EQ(a[0], greedy_host[0]);
  EXPECT_EQ(a[2], greedy_host[1]);
  bool differs = false;  // sampling at temperature 1.5 leaves the greedy path somewhere in 2 x 20 tokens
  for (int k : {1, 3}) {
    const auto once = run(s, {mixed[size_t(k)]}, false), twice = run(s, {mixed[size_t(k)]}, false);
    EXPECT_EQ(once, twice) << "request " << k << ": the same seed must give the same draws";
    std::vector<Ask> g{mixed[size_t(k)]};
    g[0].temperature = 0.0f;
    differs = differs || run(s, g, false)[0] != once[0];
  }
  EXPECT_TRUE(differs);
}

TEST(CudaGenerate, GreedyIdsPickedOnTheGpuMatchTheHostPath) {
  ARBOR_REQUIRE_GPU();
  TinyOnGpu t;
  GenerateRequest req;
  for (int i = 0; i < 20; ++i) req.prompt.push_back(int32_t((i * 53 + 7) % 8000));
  req.max_tokens = 40;
  req.sampling.temperature = 0.0f;
  const auto device = generate(t.m, t.pool, req, nullptr);
  req.keep_logits = true;  // the host path: every logits row comes back
  const auto host = generate(t.m, t.pool, req, nullptr);
  EXPECT_EQ(device.tokens, host.tokens);
  EXPECT_EQ(device.tokens.size(), 40u);
  // Ends while the next step is queued: a stop id, a callback that says stop, and max_tokens of 1 and 2.
  req.stop_ids = {host.tokens[15]};
  const auto stop_at = std::find(host.tokens.begin(), host.tokens.end(), host.tokens[15]);
  for (bool keep : {false, true}) {
    req.keep_logits = keep;
    EXPECT_EQ(generate(t.m, t.pool, req, nullptr).tokens, std::vector<int32_t>(host.tokens.begin(), stop_at + 1));
  }
  req.stop_ids.clear(), req.keep_logits = false;
  int seen = 0;
  EXPECT_EQ(generate(t.m, t.pool, req, [&](int32_t) { return ++seen < 9; }).tokens,
            std::vector<int32_t>(host.tokens.begin(), host.tokens.begin() + 9));
  for (int64_t n : {1, 2}) {
    req.max_tokens = n;
    EXPECT_EQ(generate(t.m, t.pool, req, nullptr).tokens, std::vector<int32_t>(host.tokens.begin(), host.tokens.begin() + n));
  }
  // Sampled on the GPU: a seed gives the same ids twice; another seed other ids.
  req.max_tokens = 30;
  req.sampling.temperature = 1.5f, req.sampling.seed = 5;
  const auto s1 = generate(t.m, t.pool, req, nullptr), s2 = generate(t.m, t.pool, req, nullptr);
  EXPECT_EQ(s1.tokens, s2.tokens);
  EXPECT_EQ(s1.tokens.size(), 30u);
  req.sampling.seed = 6;
  EXPECT_NE(generate(t.m, t.pool, req, nullptr).tokens, s1.tokens);
}

}  // namespace
