// Flattened batches: for every architecture (small configs, deterministic dummy weights), several
// sequences of different lengths, cut into different prefill chunks and mixed with other sequences'
// decode tokens in each step, give the same logits and greedy ids as each sequence run alone.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "engine/generate.h"
#include "mixed_batches.h"

using namespace arbor;

namespace {

json base(const char* type, int64_t layers, int64_t heads, int64_t kv, int64_t head_dim) {
  return json{{"model_type", type}, {"vocab_size", 211}, {"hidden_size", 64}, {"intermediate_size", 96},
              {"num_hidden_layers", layers}, {"num_attention_heads", heads}, {"num_key_value_heads", kv},
              {"head_dim", head_dim}, {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-6}};
}

std::vector<std::pair<std::string, json>> arch_configs() {
  std::vector<std::pair<std::string, json>> v;
  json j = base("llama", 2, 4, 2, 16);
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 64}};
  v.push_back({"llama", j});
  j = base("mistral", 2, 4, 1, 16);
  j["sliding_window"] = 7;
  v.push_back({"mistral", j});
  j = base("qwen2", 2, 4, 2, 16);
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024}};
  v.push_back({"qwen2", j});
  v.push_back({"qwen3", base("qwen3", 2, 4, 2, 32)});
  v.push_back({"gemma", base("gemma", 2, 2, 1, 64)});
  j = base("gemma2", 3, 4, 2, 32);
  j.update({{"sliding_window", 6}, {"attn_logit_softcapping", 50.0}, {"final_logit_softcapping", 30.0},
            {"query_pre_attn_scalar", 24}});
  v.push_back({"gemma2", j});
  j = base("gemma3_text", 4, 4, 1, 32);
  j.update({{"sliding_window", 5}, {"sliding_window_pattern", 2}, {"rope_local_base_freq", 10000.0}, {"rope_theta", 1e6}});
  v.push_back({"gemma3", j});
  j = base("phi3", 2, 2, 1, 32);
  j.update({{"partial_rotary_factor", 0.75}, {"original_max_position_embeddings", 1024},
            {"rope_scaling", {{"type", "longrope"}, {"short_factor", std::vector<double>(12, 1.1)},
                              {"long_factor", std::vector<double>(12, 3.0)}}}});
  v.push_back({"phi3", j});
  j = base("granite", 2, 4, 2, 16);
  j.update({{"embedding_multiplier", 12.0}, {"residual_multiplier", 0.22}, {"attention_multiplier", 0.0625},
            {"logits_scaling", 8.0}});
  v.push_back({"granite", j});
  v.push_back({"olmo2", base("olmo2", 2, 4, 4, 16)});
  j = base("starcoder2", 2, 4, 2, 16);
  j.update({{"use_bias", true}, {"sliding_window", 9}, {"norm_epsilon", 1e-5}});
  v.push_back({"starcoder2", j});
  j = base("smollm3", 4, 4, 2, 16);
  j["no_rope_layer_interval"] = 4;
  v.push_back({"smollm3", j});
  return v;
}

class Batch : public testing::TestWithParam<std::pair<std::string, json>> {};

TEST_P(Batch, MixedChunksMatchSequencesAlone) {
  std::string cfg_path = testing::TempDir() + "arbor_batch_" + GetParam().first + ".json";
  std::ofstream(cfg_path) << GetParam().second.dump();
  CpuBackend be(2, WeightPlacement::Mapped);
  LoadOptions opt;
  opt.config_path = cfg_path;
  opt.dummy_weights = true;
  opt.ctx_size = 64;
  opt.max_step_tokens = 64;
  opt.kv_blocks = 32;
  opt.block_size = 8;  // several blocks per sequence
  Model m(opt, be);
  const int64_t V = m.config().vocab_size;
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);

  // Three streams of different lengths, each alone first (logits for every token).
  std::vector<std::vector<int32_t>> streams(3);
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < 23 - 6 * s; ++i) streams[size_t(s)].push_back(int32_t((i * 37 + s * 11 + 5) % V));
  std::vector<std::vector<float>> alone;
  for (const auto& st : streams) {
    GenerateRequest req;
    req.prompt = st;
    req.max_tokens = 0;
    req.keep_logits = true;
    alone.push_back(generate(m, pool, req).logits);
  }
  ASSERT_EQ(pool.free_blocks(), pool.n_blocks());

  float max_abs = 0;
  for (const auto& a : alone)
    for (float x : a) max_abs = std::max(max_abs, std::fabs(x));
  double worst = 0;
  int64_t rows_checked = test::run_mixed_batches(
      m, pool, streams, {{5, 9, 1, 1, 3, 100}, {100}, {1, 1, 1, 2, 100}}, [&](int s, int64_t p, const float* got) {
        const float* want = alone[size_t(s)].data() + p * V;
        for (int64_t t = 0; t < V; ++t) worst = std::max(worst, double(std::fabs(got[t] - want[t])));
        EXPECT_EQ(argmax(got, V), argmax(want, V)) << "sequence " << s << " position " << p;
      });
  EXPECT_EQ(rows_checked, int64_t(streams[0].size() + streams[1].size() + streams[2].size()));
  EXPECT_GT(max_abs, 0.0f);
  EXPECT_LE(worst, 1e-3 * max_abs) << GetParam().first;
  EXPECT_EQ(pool.free_blocks(), pool.n_blocks());
}

// Longrope's two regimes in one batch: sequences whose prompt passes original_max_position_embeddings
// (16 here) take the long factors at every position, the others the short ones until decoding
// reaches position 16. Mixed in steps with each other, each gives the logits it gives alone (its
// prompt in one forward, then a token per step), and the regimes do differ.
TEST(BatchLongRope, RegimesPerSequenceInMixedBatches) {
  json j = base("phi3", 2, 2, 1, 32);
  j.update({{"partial_rotary_factor", 0.75}, {"original_max_position_embeddings", 16}, {"max_position_embeddings", 256},
            {"rope_scaling", {{"type", "longrope"}, {"short_factor", std::vector<double>(12, 1.1)},
                              {"long_factor", std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}}}});
  std::string cfg_path = testing::TempDir() + "arbor_batch_phi3_longrope.json";
  std::ofstream(cfg_path) << j.dump();
  CpuBackend be(2, WeightPlacement::Mapped);
  LoadOptions opt;
  opt.config_path = cfg_path;
  opt.dummy_weights = true;
  opt.ctx_size = 64;
  opt.max_step_tokens = 64;
  opt.kv_blocks = 32;
  opt.block_size = 8;
  Model m(opt, be);
  const int64_t V = m.config().vocab_size;
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  // (tokens, prompt length): long regime, long regime, short prompt crossing 16 while decoding.
  const std::vector<int64_t> lens = {30, 20, 26}, prompts = {24, 17, 10};
  std::vector<std::vector<int32_t>> streams(3);
  for (size_t s = 0; s < 3; ++s)
    for (int64_t i = 0; i < lens[s]; ++i) streams[s].push_back(int32_t((i * 37 + int64_t(s) * 11 + 5) % V));
  std::vector<bool> long_rope;
  for (auto p : prompts) long_rope.push_back(m.long_rope_for(p));
  ASSERT_EQ(long_rope, (std::vector<bool>{true, true, false}));
  auto alone = [&](const std::vector<int32_t>& st, int64_t prompt, bool long_regime) {
    SequenceKV seq;
    seq.long_rope = long_regime;
    EXPECT_TRUE(seq.reserve(pool, int64_t(st.size())));
    std::vector<float> out, l;
    for (int64_t p0 = 0; p0 < int64_t(st.size());) {
      const int64_t n = p0 == 0 ? prompt : 1;
      BatchInfo b = make_batch({std::vector<int32_t>(st.begin() + p0, st.begin() + p0 + n)}, {p0}, {&seq}, true);
      l.resize(size_t(n * V));
      m.forward(b, l.data());
      out.insert(out.end(), l.begin(), l.end());
      seq.length = p0 += n;
    }
    seq.release(pool);
    return out;
  };
  std::vector<std::vector<float>> ref;
  for (size_t s = 0; s < 3; ++s) ref.push_back(alone(streams[s], prompts[s], long_rope[s]));
  float max_abs = 0;
  for (const auto& r : ref)
    for (float x : r) max_abs = std::max(max_abs, std::fabs(x));
  // The same tokens in the other regime: different logits (the flag is not ignored).
  const std::vector<float> short0 = alone(streams[0], prompts[0], false);
  double regime_gap = 0;
  for (size_t i = 0; i < short0.size(); ++i) regime_gap = std::max(regime_gap, double(std::fabs(short0[i] - ref[0][i])));
  EXPECT_GT(regime_gap, 1e-2 * max_abs);
  double worst = 0;
  int64_t rows = test::run_mixed_batches(
      m, pool, streams, {{5, 9, 1, 1, 3, 100}, {2, 100}, {1, 1, 4, 1, 100}},
      [&](int s, int64_t p, const float* got) {
        const float* want = ref[size_t(s)].data() + p * V;
        for (int64_t t = 0; t < V; ++t) worst = std::max(worst, double(std::fabs(got[t] - want[t])));
      },
      long_rope);
  EXPECT_EQ(rows, lens[0] + lens[1] + lens[2]);
  EXPECT_LE(worst, 1e-3 * max_abs);
  EXPECT_EQ(pool.free_blocks(), pool.n_blocks());
}

INSTANTIATE_TEST_SUITE_P(Archs, Batch, testing::ValuesIn(arch_configs()),
                         [](const testing::TestParamInfo<std::pair<std::string, json>>& i) { return i.param.first; });

}  // namespace
