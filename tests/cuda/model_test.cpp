// Whole models, CUDA against the CPU path: synthetic checkpoints of several architectures (and every
// fixture under tests/fixtures/models/ when present) run teacher-forced through a prefill chunk and
// then one token per step; logits must agree (max|Δ| <= 2e-2 max|ref|) and so must the greedy ids on
// >= 99% of the steps whose top-2 gap exceeds that tolerance (the weights are random: see
// compare_model). Among them head_dims only the generic attention kernel takes, and longrope in both
// regimes (a prompt past original_max_position_embeddings, and decoding that crosses it). Skipped
// without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/json.h"
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

// Phi-3 longrope with original_max_position_embeddings 32: rotary dims 48 of 64 (24 factors, whole
// 8-dim lanes: the fused q/k prep and decode kernels).
json phi3_longrope() {
  json j = base_config("phi3", "Phi3ForCausalLM");
  std::vector<double> short_f, long_f;
  for (int i = 0; i < 24; ++i) short_f.push_back(1.0 + 0.05 * i), long_f.push_back(1.0 + 0.5 * i);
  j["partial_rotary_factor"] = 0.75, j["original_max_position_embeddings"] = 32;
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", short_f}, {"long_factor", long_f}};
  return j;
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
  m.push_back({"phi3_longrope", phi3_longrope()});
  // head_dims the tuned attention kernels do not take (the generic kernel): a sliding window, GQA 4
  // with per-head q/k norms.
  json hd40 = base_config("mistral", "MistralForCausalLM");
  hd40["head_dim"] = 40, hd40["sliding_window"] = 16;
  m.push_back({"mistral_hd40", hd40});
  json hd80 = base_config("qwen3", "Qwen3ForCausalLM");
  hd80["head_dim"] = 80, hd80["num_attention_heads"] = 8;
  m.push_back({"qwen3_hd80", hd80});
  return m;
}

struct Run {
  std::vector<float> logits;  // [n_tokens, vocab]
};

// Teacher-forced: the first `prefill` tokens in one forward (all logits), then one token per step;
// the prefill is the prompt that decides a longrope model's regime.
Run teacher_forced(Model& m, Backend& be, const std::vector<int32_t>& tokens, int64_t prefill) {
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  SequenceKV seq;
  seq.long_rope = m.long_rope_for(prefill);
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

void compare_model(const std::string& label, const LoadOptions& opt, bool step_graphs = true, int64_t prefill = 60) {
  SCOPED_TRACE(label);
  CpuBackend cpu(2, WeightPlacement::Mapped);
  CudaBackend gpu(0);
  gpu.set_step_graphs(step_graphs);
  Model mc(opt, cpu), mg(opt, gpu);
  const int64_t V = mc.config().vocab_size;
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(100);
  for (auto& t : tokens) t = int32_t(rng() % uint32_t(V));
  Run rc = teacher_forced(mc, cpu, tokens, prefill), rg = teacher_forced(mg, gpu, tokens, prefill);
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
    if (name == "phi3_longrope") compare_model(name + " crossing in decode", opt, true, 20);  // prompt 20 <= 32: short regime
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
    if (name != "qwen3" && name != "gemma2" && name != "phi3_longrope" && name != "mistral_hd40") continue;
    LoadOptions opt;
    opt.model_dir = temp_dir(name + "_eager");
    write_synthetic_checkpoint(cfg, opt.model_dir, DType::BF16);
    opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
    compare_model(name + " eager", opt, false);
    if (name == "phi3_longrope") compare_model(name + " eager crossing in decode", opt, false, 20);
  }
}

// Batched decode through the graphs: S sequences of different lengths prefilled, then decoded one
// token each per step while they finish one by one, so the step sizes walk through odd counts that
// are padded to buckets (S..1: 19 -> 24, 11 -> 16, 5, 3 ...). Every row must match the CPU running
// the same steps, and the recordings must be replayed (more steps than recordings).
TEST(CudaModel, BatchedDecodeGraphsMatchTheCpu) {
  ARBOR_REQUIRE_GPU();
  for (auto& [name, cfg] : synthetic_models()) {
    if (name != "llama" && name != "gemma2" && name != "phi3_longrope" && name != "qwen3_hd80") continue;
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
    // Step 0: every stream's first 5 tokens (prefill); then one token per unfinished stream. For
    // longrope, every other sequence in the long regime (decode graphs with rope rows, both regimes
    // in one step; the short ones cross position 32).
    std::vector<bool> long_rope(S, false);
    if (name == "phi3_longrope")
      for (int s = 0; s < S; s += 2) long_rope[size_t(s)] = true;
    auto run = [&](Model& m, Backend& be) {
      BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
      std::vector<std::vector<float>> out(S);
      test::run_mixed_batches(
          m, pool, streams, std::vector<std::vector<int64_t>>(S, {5, 1}),
          [&](int s, int64_t, const float* row) { out[size_t(s)].insert(out[size_t(s)].end(), row, row + V); }, long_rope);
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

// The fixtures for longrope past the original context and for untuned head_dims, by name (missing
// ones fail: tools/parity/make_fixtures.py makes them): CUDA against the CPU with decode graphs and
// eagerly; the longrope ones in both regimes.
TEST(CudaModel, LongRopeAndHeadDimFixturesMatchTheCpu) {
  ARBOR_REQUIRE_GPU();
  const fs::path dir = fs::path(source_dir()) / "tests" / "fixtures" / "models";
  for (const char* name : {"phi3_longrope_prompt", "phi3_longrope_cross", "llama_hd16", "llama_hd24", "qwen3_hd40", "mistral_hd48",
                           "llama_hd80", "llama_hd112"}) {
    const fs::path d = dir / name;
    if (!fs::exists(d / "config.json")) {
      ADD_FAILURE() << "fixture missing: " << d.string() << " (python3 tools/parity/make_fixtures.py OUT " << name << ")";
      continue;
    }
    LoadOptions opt;
    opt.model_dir = d.string();
    opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
    compare_model(name, opt);
    compare_model(std::string(name) + " eager", opt, false);
    if (std::string(name).find("longrope") != std::string::npos) compare_model(std::string(name) + " crossing in decode", opt, true, 20);
  }
}

// The longrope fixtures on CUDA against transformers' own logits (as the CPU parity test does, with
// CUDA's bf16 tolerance): the fixture's tokens teacher-forced, the prompt in one forward, then one
// token per step, which is how the goldens were made (generation with a KV cache).
TEST(CudaModel, LongRopeFixturesMatchTransformers) {
  ARBOR_REQUIRE_GPU();
  const fs::path dir = fs::path(source_dir()) / "tests" / "fixtures" / "models";
  for (const char* name : {"phi3_longrope_prompt", "phi3_longrope_cross"}) {
    SCOPED_TRACE(name);
    const fs::path d = dir / name;
    if (!fs::exists(d / "golden.json")) {
      ADD_FAILURE() << "fixture missing: " << d.string() << " (python3 tools/parity/make_fixtures.py OUT " << name << ")";
      continue;
    }
    json g = read_json_file((d / "golden.json").string());
    std::vector<int32_t> tokens = g["prompt_ids"].get<std::vector<int32_t>>();
    const int64_t prompt = int64_t(tokens.size());
    const auto gen = g["generated_ids"].get<std::vector<int32_t>>();
    tokens.insert(tokens.end(), gen.begin(), gen.end() - 1);
    const int64_t rows = g["rows"].get<int64_t>(), V = g["vocab"].get<int64_t>();
    ASSERT_EQ(int64_t(tokens.size()), rows);
    std::vector<float> ref(size_t(rows * V));
    std::ifstream in((d / "logits.bin").string(), std::ios::binary);
    in.read(reinterpret_cast<char*>(ref.data()), std::streamsize(ref.size() * sizeof(float)));
    ASSERT_TRUE(in.good()) << "logits.bin shorter than " << rows << " x " << V;
    for (bool graphs : {true, false}) {
      CudaBackend gpu(0);
      gpu.set_step_graphs(graphs);
      LoadOptions opt;
      opt.model_dir = d.string();
      opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
      Model m(opt, gpu);
      auto r = teacher_forced(m, gpu, tokens, prompt);
      const float ref_max = max_abs(ref), diff = max_diff(r.logits, ref);
      EXPECT_LE(diff, 2e-2f * ref_max) << (graphs ? "graphs" : "eager") << ": max|ref| " << ref_max;
      std::printf("[ %s vs transformers, %s ] max|Δ| %.3g of max|ref| %.3g (%.2f%%)\n", name, graphs ? "graphs" : "eager", double(diff),
                  double(ref_max), 100.0 * double(diff) / double(ref_max));
    }
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
