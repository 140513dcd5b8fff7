// Whole models, CUDA against the CPU path: synthetic checkpoints of several architectures (and every
// fixture under tests/fixtures/models/ when present) run teacher-forced through a prefill chunk and
// then one token per step; logits must agree (max|Δ| <= 2e-2 max|ref|) and so must the greedy ids on
// >= 99% of the steps whose top-2 gap exceeds that tolerance (the weights are random: see
// compare_model). Skipped without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "core/error.h"
#include "../model/mixed_batches.h"
#include "cuda_test_util.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "model/synth.h"

using namespace arbor;
using namespace arbor::cuda_test;
namespace fs = std::filesystem;

namespace {

json base_config(const char* type, const char* arch) {
  return json{{"model_type", type}, {"architectures", {arch}}, {"vocab_size", 300}, {"hidden_size", 256}, {"intermediate_size", 512},
              {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64},
              {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 512}, {"tie_word_embeddings", false}, {"rope_theta", 10000.0}};
}

std::vector<std::pair<std::string, json>> synthetic_models() {
  std::vector<std::pair<std::string, json>> m;
  m.push_back({"llama", base_config("llama", "LlamaForCausalLM")});
  json q3 = base_config("qwen3", "Qwen3ForCausalLM");
  q3["num_attention_heads"] = 8, q3["num_key_value_heads"] = 1;  // GQA 8, q_dim 512 != hidden
  m.push_back({"qwen3", q3});
  m.push_back({"qwen2", base_config("qwen2", "Qwen2ForCausalLM")});
  json g2 = base_config("gemma2", "Gemma2ForCausalLM");
  g2["sliding_window"] = 8, g2["attn_logit_softcapping"] = 50.0, g2["final_logit_softcapping"] = 30.0, g2["query_pre_attn_scalar"] = 64;
  g2["hidden_activation"] = "gelu_pytorch_tanh", g2["tie_word_embeddings"] = true;
  m.push_back({"gemma2", g2});
  json phi = base_config("phi3", "Phi3ForCausalLM");
  phi["sliding_window"] = 16;
  phi["hidden_size"] = 128, phi["intermediate_size"] = 192;  // rows the streaming GEMV does not take
  m.push_back({"phi3", phi});
  json sc = base_config("starcoder2", "Starcoder2ForCausalLM");
  sc["use_bias"] = true, sc["norm_epsilon"] = 1e-5, sc["sliding_window"] = 24, sc["hidden_act"] = "gelu_pytorch_tanh";
  m.push_back({"starcoder2", sc});
  return m;
}

struct Run {
  std::vector<float> logits;  // [n_tokens, vocab]
};

// Teacher-forced: the first `prefill` tokens in one forward (all logits), then one token per step.
Run teacher_forced(Model& m, Backend& be, const std::vector<int32_t>& tokens, int64_t prefill) {
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  SequenceKV seq;
  EXPECT_TRUE(seq.reserve(pool, int64_t(tokens.size())));
  const int64_t V = m.config().vocab_size;
  Run r;
  std::vector<float> l;
  for (int64_t p0 = 0; p0 < int64_t(tokens.size());) {
    const int64_t n = p0 == 0 ? prefill : 1;
    std::vector<int32_t> chunk(tokens.begin() + p0, tokens.begin() + p0 + n);
    BatchInfo b = make_batch({chunk}, {p0}, {&seq}, true);
    l.resize(size_t(n * V));
    m.forward(b, l.data());
    r.logits.insert(r.logits.end(), l.begin(), l.end());
    seq.length = p0 + n;
    p0 += n;
  }
  seq.release(pool);
  return r;
}

void compare_model(const std::string& label, const LoadOptions& opt, bool step_graphs = true) {
  SCOPED_TRACE(label);
  CpuBackend cpu(2, WeightPlacement::Mapped);
  CudaBackend gpu(0);
  gpu.set_step_graphs(step_graphs);
  Model mc(opt, cpu), mg(opt, gpu);
  const int64_t V = mc.config().vocab_size;
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(100);
  for (auto& t : tokens) t = int32_t(rng() % uint32_t(V));
  Run rc = teacher_forced(mc, cpu, tokens, 60), rg = teacher_forced(mg, gpu, tokens, 60);
  const float ref = max_abs(rc.logits), diff = max_diff(rg.logits, rc.logits);
  EXPECT_LE(diff, 2e-2f * ref) << "max|ref| " << ref;
  // Greedy ids. A trained model's top two logits are far apart; a random one's (synthetic, and the
  // parity fixtures, which are randomly initialised too) often are not: top-2 gaps below the bf16
  // noise of ~1% of max|ref|. So the >= 99% bar applies to the decisive steps, those whose reference
  // top-2 gap exceeds the logit tolerance; the raw agreement is printed beside it.
  int64_t agree = 0, decisive = 0, decisive_agree = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const float* lc = rc.logits.data() + t * size_t(V);
    const int32_t ic = argmax(lc, V), ig = argmax(rg.logits.data() + t * size_t(V), V);
    float second = -INFINITY;
    for (int64_t i = 0; i < V; ++i)
      if (i != ic) second = std::max(second, lc[i]);
    const bool is_decisive = lc[ic] - second > 2e-2f * ref;
    agree += ic == ig, decisive += is_decisive, decisive_agree += is_decisive && ic == ig;
  }
  EXPECT_GE(double(decisive_agree), 0.99 * double(decisive)) << decisive_agree << " of " << decisive << " decisive steps agree";
  EXPECT_GE(decisive, int64_t(tokens.size()) / 4) << "too few decisive steps for the check to mean anything";
  std::printf("[ %s ] max|Δ| %.3g of max|ref| %.3g (%.2f%%), greedy agreement %lld/%zu (decisive steps %lld/%lld)\n", label.c_str(),
              double(diff), double(ref), 100.0 * double(diff) / double(ref), (long long)agree, tokens.size(), (long long)decisive_agree,
              (long long)decisive);
}

std::string temp_dir(const std::string& name) {
  fs::path p = fs::path(testing::TempDir()) / ("arbor_cuda_test_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

TEST(CudaModel, SyntheticArchitecturesMatchTheCpu) {
  ARBOR_REQUIRE_GPU();
  for (auto& [name, cfg] : synthetic_models()) {
    LoadOptions opt;
    opt.model_dir = temp_dir(name);
    write_synthetic_checkpoint(cfg, opt.model_dir, DType::BF16);
    opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
    compare_model(name, opt);
  }
}

TEST(CudaModel, F32AndF16CheckpointsMatchTheCpu) {
  ARBOR_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::F16}) {
    LoadOptions opt;
    opt.model_dir = temp_dir(std::string("llama_") + std::string(dtype_name(dt)));
    write_synthetic_checkpoint(base_config("llama", "LlamaForCausalLM"), opt.model_dir, dt);
    opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
    compare_model(std::string("llama ") + std::string(dtype_name(dt)), opt);
  }
}

// The same models with every decode step issued op by op (the tests above replay recorded graphs).
TEST(CudaModel, EagerDecodeMatchesTheCpu) {
  ARBOR_REQUIRE_GPU();
  for (auto& [name, cfg] : synthetic_models()) {
    if (name != "qwen3" && name != "gemma2") continue;
    LoadOptions opt;
    opt.model_dir = temp_dir(name + "_eager");
    write_synthetic_checkpoint(cfg, opt.model_dir, DType::BF16);
    opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
    compare_model(name + " eager", opt, false);
  }
}

// Batched decode through the graphs: S sequences of different lengths prefilled, then decoded one
// token each per step while they finish one by one, so the step sizes walk through odd counts that
// are padded to buckets (S..1: 19 -> 24, 11 -> 16, 5, 3 ...). Every row must match the CPU running
// the same steps, and the recordings must be replayed (more steps than recordings).
TEST(CudaModel, BatchedDecodeGraphsMatchTheCpu) {
  ARBOR_REQUIRE_GPU();
  for (auto& [name, cfg] : synthetic_models()) {
    if (name != "llama" && name != "gemma2") continue;
    SCOPED_TRACE(name);
    LoadOptions opt;
    opt.model_dir = temp_dir(name + "_batched");
    write_synthetic_checkpoint(cfg, opt.model_dir, DType::BF16);
    opt.ctx_size = 128, opt.max_step_tokens = 128, opt.show_progress = false, opt.kv_blocks = 200;
    CpuBackend cpu(2, WeightPlacement::Mapped);
    CudaBackend gpu(0);
    Model mc(opt, cpu), mg(opt, gpu);
    const int64_t V = mc.config().vocab_size;
    const int S = 19;
    std::mt19937 rng(11);
    std::vector<std::vector<int32_t>> streams(S);
    for (int s = 0; s < S; ++s) {
      streams[size_t(s)].resize(size_t(6 + 3 * s));  // 6..60 tokens: decode steps end at different times
      for (auto& t : streams[size_t(s)]) t = int32_t(rng() % uint32_t(V));
    }
    // Step 0: every stream's first 5 tokens (prefill); then one token per unfinished stream.
    auto run = [&](Model& m, Backend& be) {
      BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
      std::vector<std::vector<float>> out(S);
      test::run_mixed_batches(m, pool, streams, std::vector<std::vector<int64_t>>(S, {5, 1}),
                              [&](int s, int64_t, const float* row) { out[size_t(s)].insert(out[size_t(s)].end(), row, row + V); });
      return out;
    };
    auto rc = run(mc, cpu), rg = run(mg, gpu);
    float ref = 0, diff = 0;
    for (int s = 0; s < S; ++s) ref = std::max(ref, max_abs(rc[size_t(s)])), diff = std::max(diff, max_diff(rg[size_t(s)], rc[size_t(s)]));
    EXPECT_LE(diff, 2e-2f * ref) << "max|ref| " << ref;
    EXPECT_GT(gpu.graphs_recorded(), 0);
    std::printf("[ %s batched ] max|Δ| %.3g of max|ref| %.3g (%.2f%%), %lld graphs recorded\n", name.c_str(), double(diff), double(ref),
                100.0 * double(diff) / double(ref), (long long)gpu.graphs_recorded());
  }
}

TEST(CudaModel, FixturesMatchTheCpu) {
  ARBOR_REQUIRE_GPU();
  const fs::path dir = fs::path(source_dir()) / "tests" / "fixtures" / "models";
  if (!fs::exists(dir)) GTEST_SKIP() << "no fixtures at " << dir.string();
  int n = 0;
  for (auto& e : fs::directory_iterator(dir)) {
    if (!fs::exists(e.path() / "config.json")) continue;
    LoadOptions opt;
    opt.model_dir = e.path().string();
    opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
    {  // a fixture the CPU path cannot load is the model code's business (tests/model), not this test's
      CpuBackend probe(1, WeightPlacement::Mapped);
      try {
        Model m(opt, probe);
      } catch (const Error& err) {
        std::printf("[ %s ] not compared: the CPU path cannot load it: %s\n", e.path().filename().string().c_str(), err.what());
        continue;
      }
    }
    compare_model(e.path().filename().string(), opt);
    ++n;
  }
  if (n == 0) GTEST_SKIP() << "no fixture with a config.json under " << dir.string();
}

}  // namespace
