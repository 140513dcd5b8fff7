// The scheduler and generate() on the CUDA backend: when every row of a step is plain greedy, the ids
// are picked on the GPU (the logits never leave it); they must equal the ids the host path picks from
// the same logits (forced by asking for logprobs / keeping the logits). The shipped default model,
// several requests decoding together. Skipped without a GPU.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "engine/generate.h"
#include "engine/scheduler.h"

using namespace arbor;
using namespace arbor::cuda_test;

namespace {

std::vector<std::vector<int32_t>> run(Scheduler& s, const std::vector<std::vector<int32_t>>& prompts, bool logprobs) {
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& p : prompts) {
    auto r = std::make_shared<Request>();
    r->prompt = p;
    r->max_tokens = 24;
    r->sampling.temperature = 0.0f;
    r->logprobs = logprobs;
    EXPECT_EQ(s.submit(r).status, Admission::Accepted);
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& r : reqs) {
    std::vector<TokenEvent> evs;
    while (!r->wait(evs, std::chrono::milliseconds(100))) {
    }
    EXPECT_NE(r->finish_reason(), FinishReason::Error) << r->error();
    out.emplace_back();
    for (auto& e : evs) out.back().push_back(e.id);
  }
  return out;
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
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < 4; ++k) {
    prompts.emplace_back();
    for (int i = 0; i < 10 + 7 * k; ++i) prompts.back().push_back(int32_t((i * 37 + k * 101 + 5) % 8000));
  }
  auto device = run(s, prompts, false), host = run(s, prompts, true);
  EXPECT_EQ(device, host);
  for (auto& ids : device) EXPECT_EQ(ids.size(), 24u);
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
}

}  // namespace
