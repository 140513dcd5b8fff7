// Model loading: config layouts, architecture table, the weight audit, dummy weights, sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/generate.h"
#include "io/safetensors.h"
#include "model/synth.h"

using namespace arbor;
namespace fs = std::filesystem;

namespace {

json tiny_llama() {
  return json{{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 97}, {"hidden_size", 32},
              {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 128}, {"tie_word_embeddings", false}};
}

std::string temp_dir(const std::string& name) {
  fs::path p = fs::path(testing::TempDir()) / ("arbor_model_test_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, HubAndTransformers5LayoutsAgree) {
  json hub = tiny_llama();
  hub["rope_theta"] = 500000.0;
  hub["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  json v5 = tiny_llama();
  v5["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  ModelConfig a = parse_model_config(hub, "hub"), b = parse_model_config(v5, "v5");
  EXPECT_EQ(a.rope.kind, RopeKind::Llama3);
  EXPECT_EQ(b.rope.kind, RopeKind::Llama3);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  RopeTable ta(a.rope, a.rotary_dim(), a.max_position), tb(b.rope, b.rotary_dim(), b.max_position);
  EXPECT_EQ(ta.inv_freq(), tb.inv_freq());
}

TEST(Config, Gemma3PerLayerTypeRopeAndPatterns) {
  json j = {{"model_type", "gemma3_text"}, {"vocab_size", 10}, {"hidden_size", 8}, {"num_hidden_layers", 6},
            {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 4}, {"sliding_window", 4},
            {"rope_parameters",
             {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
              {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}}}};
  ModelConfig c = parse_model_config(j, "x");
  apply_arch_defaults(c, find_arch(c));
  EXPECT_EQ(c.rope.kind, RopeKind::Linear);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope_local.theta, 1e4);
  ASSERT_EQ(c.layer_types.size(), 6u);  // default pattern 6: five sliding, then one full
  EXPECT_EQ(c.layer_types[4], LayerAttention::Sliding);
  EXPECT_EQ(c.layer_types[5], LayerAttention::Full);
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma ties by default
}

TEST(Config, ErrorsNameTheField) {
  json j = tiny_llama();
  j.erase("hidden_size");
  EXPECT_NE(error_of([&] { parse_model_config(j, "cfg.json"); }).find("'hidden_size'"), std::string::npos);
  j = tiny_llama();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of([&] { parse_model_config(j, "cfg.json"); }).find("num_key_value_heads 3"), std::string::npos);
  j = tiny_llama();
  j["rope_scaling"] = {{"type", "weird"}};
  EXPECT_NE(error_of([&] { parse_model_config(j, "cfg.json"); }).find("'weird'"), std::string::npos);
  j = tiny_llama();
  j["num_hidden_layers"] = "two";
  EXPECT_NE(error_of([&] { parse_model_config(j, "cfg.json"); }).find("'num_hidden_layers' must be an integer"), std::string::npos);
}

TEST(Archs, UnsupportedListsTheSupported) {
  json j = tiny_llama();
  j["model_type"] = "mamba";
  ModelConfig c = parse_model_config(j, "x");
  c.architecture = "MambaForCausalLM";
  std::string e = error_of([&] { find_arch(c); });
  EXPECT_NE(e.find("'mamba'"), std::string::npos);
  for (const char* n : {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "granite", "olmo2",
                        "starcoder2", "smollm3"})
    EXPECT_NE(e.find(n), std::string::npos) << n;
}

TEST(Rope, DynamicMatchesDefaultInsideTheTrainedContext) {
  RopeConfig def;
  def.theta = 10000;
  RopeConfig dyn = def;
  dyn.kind = RopeKind::Dynamic;
  dyn.factor = 2.0;
  RopeTable a(def, 16, 32), b(dyn, 16, 32);
  a.ensure(64), b.ensure(64);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(a.cos(31)[i], b.cos(31)[i]);
  // Past the trained context the base grows: base * (f*L/orig - (f-1))^(d/(d-2)), L = pos + 1.
  double base = 10000 * std::pow(2.0 * 48 / 32 - 1, 16.0 / 14.0);
  float f1 = float(1.0 / std::pow(base, 2.0 / 16));
  EXPECT_NEAR(b.cos(47)[1], std::cos(47.0f * f1), 2e-6);
  EXPECT_GT(std::fabs(a.cos(47)[1] - b.cos(47)[1]), 1e-4);
}

// Longrope, straight from the definition: inv_freq_i = 1 / (factor_i * theta^(2i/d)), cos/sin of
// pos * inv_freq scaled by sqrt(1 + ln(max / orig) / ln(orig)). The default regime (a prompt that fits
// original_max_position_embeddings) takes the short factors below it and the long ones from it on,
// token by token as decoding with a cache goes; the long regime (a longer prompt) the long factors at
// every position.
TEST(Rope, LongRopeRegimesFollowTheDefinition) {
  RopeConfig rc;
  rc.kind = RopeKind::LongRope;
  rc.theta = 10000;
  rc.original_max_position = 32;
  const int64_t d = 12, max_pos = 256;
  for (int i = 0; i < d / 2; ++i) rc.short_factor.push_back(1.0 + 0.1 * i), rc.long_factor.push_back(1.0 + 2.0 * i);
  RopeTable t(rc, d, max_pos);
  t.ensure(64);
  ASSERT_TRUE(t.has_long_regime());
  const double af = std::sqrt(1 + std::log(double(max_pos) / 32) / std::log(32.0));
  EXPECT_NEAR(t.attention_factor(), af, 1e-6);
  auto ref = [&](int64_t pos, int i, bool long_factors, bool sine) {
    const double f = (long_factors ? rc.long_factor : rc.short_factor)[size_t(i)];
    const double inv = 1.0 / (f * std::pow(10000.0, double(2 * i) / double(d)));
    return (sine ? std::sin(double(pos) * inv) : std::cos(double(pos) * inv)) * af;
  };
  double worst = 0;
  bool regimes_differ = false;
  for (int64_t pos = 0; pos < 64; ++pos)
    for (int i = 0; i < d / 2; ++i) {
      worst = std::max({worst, std::fabs(t.cos(pos)[i] - ref(pos, i, pos >= 32, false)),
                        std::fabs(t.sin(pos)[i] - ref(pos, i, pos >= 32, true)),
                        std::fabs(t.cos(pos, true)[i] - ref(pos, i, true, false)),
                        std::fabs(t.sin(pos, true)[i] - ref(pos, i, true, true))});
      regimes_differ = regimes_differ || std::fabs(t.cos(pos)[i] - t.cos(pos, true)[i]) > 1e-3;
    }
  EXPECT_LE(worst, 5e-5);  // float32 angles, as torch computes them
  EXPECT_TRUE(regimes_differ);
  EXPECT_FALSE(t.long_regime_for(32));  // transformers: long once max(position) + 1 > 32
  EXPECT_TRUE(t.long_regime_for(33));
  RopeConfig plain;
  plain.theta = 10000;
  RopeTable p(plain, d, max_pos);
  p.ensure(8);
  EXPECT_FALSE(p.has_long_regime());
  EXPECT_FALSE(p.long_regime_for(1000));
  EXPECT_THROW(p.cos(3, true), Error);
}

class Loaded : public testing::Test {
 protected:
  static std::string make(const std::string& name, const json& cfg) {
    std::string d = temp_dir(name);
    write_synthetic_checkpoint(cfg, d, DType::BF16, 20000);  // small shards: exercises the index
    return d;
  }
};

TEST_F(Loaded, SyntheticCheckpointEqualsDummyWeights) {
  std::string d = make("synth", tiny_llama());
  EXPECT_TRUE(fs::exists(d + "/model.safetensors.index.json"));
  CpuBackend be1(1, WeightPlacement::Mapped), be2(1, WeightPlacement::Copy);
  LoadOptions o1;
  o1.model_dir = d;
  LoadOptions o2 = o1;
  o2.dummy_weights = true;
  Model m1(o1, be1), m2(o2, be2);
  EXPECT_EQ(m1.parameter_count(), m2.parameter_count());
  BlockPool p1(be1.kv_layout().n_blocks, 16), p2(be2.kv_layout().n_blocks, 16);
  GenerateRequest req;
  req.prompt = {1, 5, 9, 77, 3};
  req.max_tokens = 6;
  req.keep_logits = true;
  GenerateResult r1 = generate(m1, p1, req), r2 = generate(m2, p2, req);
  EXPECT_EQ(r1.tokens, r2.tokens);
  EXPECT_EQ(r1.logits, r2.logits);
  for (float v : r1.logits) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(Loaded, AuditNamesMissingExtraAndMisshapenTensors) {
  std::string d = make("audit", tiny_llama());
  // Rewrite one shard without one tensor and with an extra one.
  json index = read_json_file(d + "/model.safetensors.index.json");
  std::string victim = "model.layers.1.mlp.up_proj.weight";
  std::string shard = index["weight_map"][victim];
  std::vector<TensorToWrite> keep;
  std::vector<std::string> owned;  // copies: the shard is rewritten below while this would be mapped
  {
    SafetensorsFile f(d + "/" + shard);
    owned.reserve(f.tensors().size());
    for (const auto& t : f.tensors()) {
      if (t.name == victim) continue;
      owned.emplace_back(reinterpret_cast<const char*>(t.data), t.nbytes);
      keep.push_back({t.name, t.dtype, t.shape, owned.back().data(), t.nbytes});
    }
  }
  std::vector<float> extra(4, 1.0f);
  keep.push_back({"model.layers.1.mlp.surprise.weight", DType::F32, {4}, extra.data(), 16});
  std::string bytes = serialize_safetensors(keep);
  index["weight_map"].erase(victim);
  index["weight_map"]["model.layers.1.mlp.surprise.weight"] = shard;
  {
    std::ofstream(d + "/" + shard, std::ios::binary) << bytes;
    std::ofstream(d + "/model.safetensors.index.json") << index.dump();
  }
  CpuBackend be(1, WeightPlacement::Mapped);
  LoadOptions o;
  o.model_dir = d;
  std::string e = error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find(victim), std::string::npos) << e;

  // Put the tensor back under its name: now only the extra one is left over.
  std::vector<uint16_t> up(48 * 32, 0x3f80);
  keep.push_back({victim, DType::BF16, {48, 32}, up.data(), up.size() * 2});
  std::ofstream(d + "/" + shard, std::ios::binary) << serialize_safetensors(keep);
  index["weight_map"][victim] = shard;
  std::ofstream(d + "/model.safetensors.index.json") << index.dump();
  e = error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("model.layers.1.mlp.surprise.weight"), std::string::npos) << e;

  // Wrong shape.
  keep.pop_back();
  keep.pop_back();
  keep.push_back({victim, DType::BF16, {32, 48}, up.data(), up.size() * 2});
  std::ofstream(d + "/" + shard, std::ios::binary) << serialize_safetensors(keep);
  index["weight_map"].erase("model.layers.1.mlp.surprise.weight");
  std::ofstream(d + "/model.safetensors.index.json") << index.dump();
  e = error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("[32, 48]"), std::string::npos) << e;
  EXPECT_NE(e.find("[48, 32]"), std::string::npos) << e;
}

TEST(Sampling, GreedySeededAndFilters) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  SamplingParams g;
  EXPECT_EQ(Sampler(g).sample(logits.data(), 5), 1);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler s1(p), s2(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s1.sample(logits.data(), 5), s2.sample(logits.data(), 5));
  p.top_k = 1;
  Sampler k1(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.sample(logits.data(), 5), 1);
  // Two tokens with probabilities 1/3 and 2/3: frequencies follow.
  std::vector<float> two = {0.0f, std::log(2.0f)};
  SamplingParams t;
  t.temperature = 1.0f;
  t.seed = 7;
  Sampler st(t);
  int ones = 0;
  for (int i = 0; i < 30000; ++i) ones += st.sample(two.data(), 2);
  EXPECT_NEAR(ones / 30000.0, 2.0 / 3.0, 0.02);
  // top_p 0.5 keeps only the 2/3 token; min_p 0.6 likewise (1/3 < 0.6 * 2/3).
  t.top_p = 0.5f;
  Sampler sp(t);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sp.sample(two.data(), 2), 1);
  t.top_p = 1.0f;
  t.min_p = 0.6f;
  Sampler sm(t);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sm.sample(two.data(), 2), 1);
}

}  // namespace
