// Scheduler against generate() on a tiny synthetic Llama: batch-1 parity, concurrent requests with chunked
// prefill each giving their own generate() output, cancel freeing KV, admission limits; logit processing.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/generate.h"
#include "engine/scheduler.h"
#include "model/synth.h"

namespace arbor {
namespace {

namespace fs = std::filesystem;

struct Tiny {
  CpuBackend backend{1, WeightPlacement::Copy};
  std::unique_ptr<Model> model;
  std::unique_ptr<BlockPool> pool;
  explicit Tiny(int64_t kv_blocks, int64_t step_tokens = 16, int64_t max_position = 128) {
    json cfg{{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 97}, {"hidden_size", 32},
             {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
             {"rms_norm_eps", 1e-5}, {"max_position_embeddings", max_position}, {"tie_word_embeddings", false}};
    fs::path d = fs::path(testing::TempDir()) / ("arbor_scheduler_test_" + std::to_string(max_position));
    if (!fs::exists(d / "model.safetensors")) {
      fs::create_directories(d);
      write_synthetic_checkpoint(cfg, d.string(), DType::BF16);
    }
    LoadOptions o;
    o.model_dir = d.string();
    o.kv_blocks = kv_blocks;
    o.ctx_size = max_position;
    o.block_size = 16;
    o.max_step_tokens = step_tokens;
    o.show_progress = false;
    model = std::make_unique<Model>(o, backend);
    pool = std::make_unique<BlockPool>(kv_blocks, 16);
  }
};

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(int32_t((i * 31 + salt * 7 + 3) % 97));
  return p;
}

std::vector<int32_t> drain(Request& r) {
  std::vector<TokenEvent> evs;
  while (!r.wait(evs, std::chrono::milliseconds(100))) {
  }
  std::vector<int32_t> ids;
  for (auto& e : evs) ids.push_back(e.id);
  return ids;
}

std::shared_ptr<Request> make_request(std::vector<int32_t> prompt, int64_t max_tokens, float temperature, uint64_t seed) {
  auto r = std::make_shared<Request>();
  r->prompt = std::move(prompt);
  r->max_tokens = max_tokens;
  r->sampling.temperature = temperature;
  r->sampling.seed = seed;
  return r;
}

// The generate() request of a test case: prompt_of(prompt_len, salt), sampled at temperature with seed.
GenerateRequest generate_request(int prompt_len, int salt, int64_t max_tokens, float temperature, uint64_t seed) {
  GenerateRequest g;
  g.prompt = prompt_of(prompt_len, salt);
  g.max_tokens = max_tokens;
  g.sampling.temperature = temperature;
  g.sampling.seed = seed;
  return g;
}

TEST(Scheduler, ConcurrentRequestsEachMatchGenerate) {
  Tiny t(64);
  // Reference outputs, one at a time through generate().
  struct Case {
    int prompt_len, salt;
    int64_t max_tokens;
    float temperature;
  };
  std::vector<Case> cases = {{5, 1, 12, 0.0f}, {40, 2, 9, 0.8f}, {17, 3, 20, 1.2f}, {1, 4, 7, 0.0f}, {33, 5, 15, 0.9f}};
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < cases.size(); ++i)
    want.push_back(generate(*t.model, *t.pool, generate_request(cases[i].prompt_len, cases[i].salt, cases[i].max_tokens,
                                                                cases[i].temperature, 100 + i))
                       .tokens);
  // Alone through the scheduler (batch 1), then all at once: prompts of 33 and 40 tokens take several
  // 16-token steps, so prefill chunks interleave with the others' decode tokens.
  Scheduler s(*t.model, *t.pool, {8, 8});
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = make_request(prompt_of(cases[i].prompt_len, cases[i].salt), cases[i].max_tokens, cases[i].temperature, 100 + i);
    ASSERT_EQ(s.submit(r).status, Admission::Accepted);
    EXPECT_EQ(drain(*r), want[i]) << "alone, case " << i;
    EXPECT_EQ(r->finish_reason(), FinishReason::Length);
  }
  std::vector<std::shared_ptr<Request>> rs;
  for (size_t i = 0; i < cases.size(); ++i) {
    rs.push_back(make_request(prompt_of(cases[i].prompt_len, cases[i].salt), cases[i].max_tokens, cases[i].temperature, 100 + i));
    ASSERT_EQ(s.submit(rs.back()).status, Admission::Accepted);
  }
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(drain(*rs[i]), want[i]) << "batched, case " << i;
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
  EXPECT_GT(s.stats().steps, 0);
}

TEST(Scheduler, StopIdEndsWithStop) {
  Tiny t(16);
  GenerateRequest g;
  g.prompt = prompt_of(6, 9);
  g.max_tokens = 10;
  auto ref = generate(*t.model, *t.pool, g).tokens;
  Scheduler s(*t.model, *t.pool, {2, 2});
  auto r = make_request(g.prompt, 10, 0.0f, 0);
  r->stop_ids = {ref[3]};
  ASSERT_EQ(s.submit(r).status, Admission::Accepted);
  auto got = drain(*r);
  size_t first = size_t(std::find(ref.begin(), ref.end(), ref[3]) - ref.begin());
  EXPECT_EQ(got, std::vector<int32_t>(ref.begin(), ref.begin() + int64_t(first) + 1));
  EXPECT_EQ(r->finish_reason(), FinishReason::Stop);
}

// Steps queued ahead of their ids (SchedulerOptions::queue_ahead = 1; on a GPU the default): the CPU
// backend's picks run the same logic as the GPU's. Requests ending by max_tokens (1, 2, 5, ...) and by
// stop ids while a step is queued, beside a sampled request (whose steps take the host path), give
// generate()'s ids and the same finish reasons, alone and together.
TEST(Scheduler, StepsQueuedAheadMatchGenerate) {
  Tiny t(64);
  struct Case {
    int prompt_len, salt;
    int64_t max_tokens;
    float temperature;
    std::vector<int> stop_at;  // stop ids: the ids of an unstopped run at these indices
  };
  std::vector<Case> cases = {{5, 1, 1, 0.0f, {}}, {9, 2, 2, 0.0f, {}}, {14, 3, 5, 0.0f, {}}, {7, 4, 30, 0.0f, {6}},
                             {20, 5, 30, 0.0f, {10, 18}}, {11, 6, 12, 0.8f, {}}};
  std::vector<std::vector<int32_t>> want, stops;
  for (size_t i = 0; i < cases.size(); ++i) {
    GenerateRequest g = generate_request(cases[i].prompt_len, cases[i].salt, cases[i].max_tokens, cases[i].temperature, 300 + i);
    const auto free_run = generate(*t.model, *t.pool, g).tokens;
    stops.emplace_back();
    for (int k : cases[i].stop_at) stops.back().push_back(free_run[size_t(k)]);
    g.stop_ids = stops.back();
    want.push_back(generate(*t.model, *t.pool, g).tokens);
  }
  auto make = [&](size_t i) {
    auto r = make_request(prompt_of(cases[i].prompt_len, cases[i].salt), cases[i].max_tokens, cases[i].temperature, 300 + i);
    r->stop_ids = stops[i];
    return r;
  };
  auto reason = [&](size_t i) { return stops[i].empty() ? FinishReason::Length : FinishReason::Stop; };
  SchedulerOptions opt{4, 16, false};
  opt.queue_ahead = 1;
  Scheduler s(*t.model, *t.pool, opt);
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = make(i);
    ASSERT_EQ(s.submit(r).status, Admission::Accepted);
    EXPECT_EQ(drain(*r), want[i]) << "alone, case " << i;
    EXPECT_EQ(r->finish_reason(), reason(i)) << "alone, case " << i;
  }
  const int64_t ahead = s.stats().steps_queued_ahead;
  EXPECT_GT(ahead, 0) << "the greedy decodes should have queued steps ahead";
  std::vector<std::shared_ptr<Request>> rs;
  for (size_t i = 0; i < cases.size(); ++i) {
    rs.push_back(make(i));
    ASSERT_EQ(s.submit(rs.back()).status, Admission::Accepted);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(drain(*rs[i]), want[i]) << "together, case " << i;
    EXPECT_EQ(rs[i]->finish_reason(), reason(i)) << "together, case " << i;
  }
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
  // The greedy ones together (the sampled request's steps above took the host path).
  rs.clear();
  for (size_t i = 0; i + 1 < cases.size(); ++i) {
    rs.push_back(make(i));
    ASSERT_EQ(s.submit(rs.back()).status, Admission::Accepted);
  }
  for (size_t i = 0; i + 1 < cases.size(); ++i) EXPECT_EQ(drain(*rs[i]), want[i]) << "greedy together, case " << i;
  EXPECT_GT(s.stats().steps_queued_ahead, ahead) << "greedy decodes together should have queued steps ahead";
}

// A request stopped while its next step was queued leaves that step's KV row past its end; the prefix
// cache must not serve it: a follow-up whose prompt is the first request's prompt and output starts
// from cached blocks and still gives generate()'s ids.
TEST(Scheduler, APrefixAfterAStopQueuedAheadServesTheRightKV) {
  Tiny t(64);
  GenerateRequest g;
  g.prompt = prompt_of(37, 8);
  g.max_tokens = 40;
  const auto free_run = generate(*t.model, *t.pool, g).tokens;
  g.stop_ids = {free_run[21]};
  const auto want_first = generate(*t.model, *t.pool, g).tokens;
  // generate() shares the model and the pool: it runs only while no scheduler does.
  GenerateRequest f;
  f.prompt = g.prompt;
  f.prompt.insert(f.prompt.end(), want_first.begin(), want_first.end());
  f.max_tokens = 12;
  const auto want_follow = generate(*t.model, *t.pool, f).tokens;
  SchedulerOptions opt{4, 16, true};
  opt.queue_ahead = 1;
  Scheduler s(*t.model, *t.pool, opt);
  auto first = make_request(g.prompt, 40, 0.0f, 0);
  first->stop_ids = g.stop_ids;
  ASSERT_EQ(s.submit(first).status, Admission::Accepted);
  EXPECT_EQ(drain(*first), want_first);
  ASSERT_EQ(first->finish_reason(), FinishReason::Stop);
  EXPECT_GT(s.stats().steps_queued_ahead, 0);
  const int64_t cached0 = s.stats().cached_tokens;
  auto follow = make_request(f.prompt, 12, 0.0f, 0);
  ASSERT_EQ(s.submit(follow).status, Admission::Accepted);
  EXPECT_EQ(drain(*follow), want_follow);
  EXPECT_GT(s.stats().cached_tokens, cached0) << "the follow-up should start from cached blocks";
}

TEST(Scheduler, CancelFreesBlocksAndAdmissionLimits) {
  // ctx 8192, 600 blocks: the first request decodes ~8k tokens, long enough to still run while the
  // others are submitted (it is cancelled at the end).
  Tiny t(600, 16, 8192);
  Scheduler s(*t.model, *t.pool, {1, 1});
  auto too_big = make_request(prompt_of(4, 1), 100000, 0.0f, 0);  // clamped to the context: 512 blocks, fits
  EXPECT_EQ(s.submit(too_big).status, Admission::Accepted);
  EXPECT_EQ(too_big->max_tokens, 8188);
  while (s.stats().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto full_ctx = make_request(prompt_of(8192, 1), 4, 0.0f, 0);
  AdmissionResult a = s.submit(full_ctx);
  EXPECT_EQ(a.status, Admission::NeverFits);
  EXPECT_TRUE(a.context_exceeded);
  auto queued = make_request(prompt_of(4, 2), 100, 0.0f, 0);
  EXPECT_EQ(s.submit(queued).status, Admission::Accepted);  // waits: the one slot is taken
  auto rejected = make_request(prompt_of(4, 3), 4, 0.0f, 0);
  AdmissionResult q = s.submit(rejected);
  EXPECT_EQ(q.status, Admission::QueueFull);
  EXPECT_NE(q.message.find("1 waiting"), std::string::npos) << q.message;
  auto bad = make_request({1, 200}, 4, 0.0f, 0);
  EXPECT_EQ(s.submit(bad).status, Admission::BadRequest);

  too_big->cancel();
  queued->cancel();
  std::vector<TokenEvent> evs;
  while (!too_big->wait(evs, std::chrono::milliseconds(50))) {
  }
  while (!queued->wait(evs, std::chrono::milliseconds(50))) {
  }
  EXPECT_EQ(too_big->finish_reason(), FinishReason::Cancelled);
  EXPECT_EQ(queued->finish_reason(), FinishReason::Cancelled);
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
  EXPECT_EQ(t.pool->free_blocks(), 600);
  // A pool smaller than one full request: never fits, with the numbers.
  Tiny small(4);
  Scheduler s2(*small.model, *small.pool, {1, 1});
  AdmissionResult nf = s2.submit(make_request(prompt_of(10, 1), 100, 0.0f, 0));
  EXPECT_EQ(nf.status, Admission::NeverFits);
  EXPECT_FALSE(nf.context_exceeded);
  EXPECT_NE(nf.message.find("needs 7 KV blocks"), std::string::npos) << nf.message;
  EXPECT_NE(nf.message.find("has 4 in all"), std::string::npos) << nf.message;
}

TEST(LogitProcessing, PenaltiesAndBiasMatchTheirDefinitions) {
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  LogitProcessing p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.logit_bias = {{4, 10.0f}, {99, 5.0f}};  // out-of-vocab ids are ignored
  apply_logit_processing(p, {0, 1, 1}, {3, 3, 1}, l.data(), 5);
  EXPECT_FLOAT_EQ(l[0], 1.0f);                       // rep: 2 / 2
  EXPECT_FLOAT_EQ(l[1], -2.0f - 0.25f * 1 - 0.5f);   // rep: -1 * 2, then one generated occurrence
  EXPECT_FLOAT_EQ(l[2], 0.5f);                       // untouched
  EXPECT_FLOAT_EQ(l[3], 1.5f - 0.25f * 2 - 0.5f);    // rep 3 / 2, two generated occurrences
  EXPECT_FLOAT_EQ(l[4], 8.0f);
}

// Prompt scoring (prompt_logprobs): a 40-token prompt over chunks of 16, beside a request that reads the
// prefix cache, in a batch with it; every prompt token after the first gets the log-softmax of
// generate()'s logits row before it (keep_logits), its top alternatives included, and the sampled tokens
// do not change.
TEST(Scheduler, PromptLogprobsMatchGenerateLogits) {
  Tiny t(64, 16, 128);
  const int64_t V = 97;
  GenerateRequest g = generate_request(40, 4, 3, 0.0f, 0);
  g.keep_logits = true;
  const GenerateResult ref = generate(*t.model, *t.pool, g);
  Scheduler s(*t.model, *t.pool, {4, 4});
  auto warm = make_request(g.prompt, 2, 0.0f, 0);  // fills the prefix cache with this prompt's blocks
  ASSERT_EQ(s.submit(warm).status, Admission::Accepted);
  drain(*warm);
  auto r = make_request(g.prompt, 3, 0.0f, 0);
  r->prompt_logprobs = 2;
  auto other = make_request(prompt_of(23, 8), 4, 0.0f, 0);
  ASSERT_EQ(s.submit(r).status, Admission::Accepted);
  ASSERT_EQ(s.submit(other).status, Admission::Accepted);
  EXPECT_EQ(drain(*r), ref.tokens);
  drain(*other);
  EXPECT_EQ(r->cached_tokens(), 0);
  const std::vector<TokenEvent> scores = r->prompt_scores();
  ASSERT_EQ(scores.size(), g.prompt.size() - 1);
  for (size_t i = 0; i + 1 < g.prompt.size(); ++i) {
    TokenLogprob want;
    std::vector<TokenLogprob> want_top;
    compute_logprobs(ref.logits.data() + i * size_t(V), V, g.prompt[i + 1], 2, want, want_top);
    EXPECT_EQ(scores[i].id, g.prompt[i + 1]);
    EXPECT_NEAR(scores[i].logprob.logprob, want.logprob, 1e-4) << "prompt token " << i + 1;
    ASSERT_EQ(scores[i].top.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(scores[i].top[k].id, want_top[k].id) << "prompt token " << i + 1;
      EXPECT_NEAR(scores[i].top[k].logprob, want_top[k].logprob, 1e-4);
    }
  }
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
}

TEST(LogitProcessing, LogprobsAreALogSoftmax) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  TokenLogprob c;
  std::vector<TokenLogprob> top;
  compute_logprobs(l.data(), 4, 2, 3, c, top);
  double z = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(c.logprob, 2.0 - z, 1e-6);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 1);  // tie goes to the lower id
  EXPECT_EQ(top[1].id, 3);
  EXPECT_EQ(top[2].id, 2);
  EXPECT_NEAR(top[0].logprob, 3.0 - z, 1e-6);
}

}  // namespace
}  // namespace arbor
