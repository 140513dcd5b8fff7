// Trellis entries in config.json's quantization block (parse_affine_quant_config: per-module and block-level
// trellis entries beside affine ones), the writers' recipe (bits, axis, --k-map, dense modules), and the
// synthetic matrices (valid geometry, deterministic, scales giving the dense dummy weights' spread).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/affine.h"
#include "quant/trellis.h"
#include "quant/trellis_convert.h"
#include "../test_util.h"

namespace arbor::quant {
namespace {

using test::error_of;

json entry(int k, int axis) {
  return json{{"mode", "trellis"}, {"bits", k}, {"group_size", 256}, {"trellis", {{"L", 12}, {"code", "1mad"}, {"axis", axis}}}};
}

TEST(TrellisConfig, TrellisAffineAndDenseModulesInOneBlock) {
  json c = {{"quantization",
             {{"group_size", 64}, {"bits", 4}, {"model.layers.0.mlp.down_proj", entry(3, 0)}, {"model.layers.0.mlp.up_proj", entry(2, 1)},
              {"model.layers.0.mlp.gate_proj", {{"group_size", 32}, {"bits", 8}}}, {"lm_head", false}}}};
  const auto q = parse_affine_quant_config(c, "config.json");
  ASSERT_TRUE(q);
  ASSERT_TRUE(q->trellis_for("model.layers.0.mlp.down_proj"));
  EXPECT_EQ(q->trellis_for("model.layers.0.mlp.down_proj")->bits, 3);
  EXPECT_EQ(q->trellis_for("model.layers.0.mlp.down_proj")->axis, 0);
  EXPECT_EQ(q->trellis_for("model.layers.0.mlp.up_proj")->axis, 1);
  EXPECT_FALSE(q->trellis_for("model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(q->trellis_for("model.layers.1.mlp.gate_proj"));  // affine default
  EXPECT_EQ(q->for_module("model.layers.0.mlp.gate_proj"), (AffineParams{32, 8}));
  EXPECT_EQ(q->for_module("lm_head"), std::nullopt);
  const json back = q->to_json();
  EXPECT_EQ(back["model.layers.0.mlp.down_proj"], entry(3, 0));
  EXPECT_EQ(parse_affine_quant_config(json{{"quantization", back}}, "c")->trellis_for("model.layers.0.mlp.down_proj")->bits, 3);
}

TEST(TrellisConfig, ATrellisBlockIsTheDefault) {
  json c = {{"quantization_config", entry(4, 1)}};
  c["quantization_config"]["model.layers.0.mlp.down_proj"] = entry(2, 0);
  c["quantization_config"]["lm_head"] = false;
  c["quantization_config"]["model.layers.3.mlp.up_proj"] = true;
  const auto q = parse_affine_quant_config(c, "config.json");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->trellis_for("model.layers.5.self_attn.q_proj")->bits, 4);
  EXPECT_EQ(q->trellis_for("model.layers.0.mlp.down_proj")->bits, 2);
  EXPECT_EQ(q->trellis_for("model.layers.3.mlp.up_proj")->bits, 4);
  EXPECT_FALSE(q->trellis_for("lm_head"));
  EXPECT_EQ(q->to_json()["mode"], "trellis");
}

TEST(TrellisConfig, BadTrellisEntriesNameTheModule) {
  auto err = [](json e) {
    return error_of([&] { parse_affine_quant_config(json{{"quantization", {{"group_size", 64}, {"bits", 4}, {"m.q_proj", e}}}}, "c"); });
  };
  json e = entry(5, 1);
  EXPECT_NE(err(e).find("module 'm.q_proj': bits 5"), std::string::npos) << err(e);
  e = entry(2, 2);
  EXPECT_NE(err(e).find("module 'm.q_proj': axis 2"), std::string::npos) << err(e);
  e = entry(2, 1);
  e["trellis"]["code"] = "3inst";
  EXPECT_NE(err(e).find("module 'm.q_proj'"), std::string::npos) << err(e);
  e = entry(2, 1);
  e["group_size"] = 128;
  EXPECT_NE(err(e).find("group_size 128"), std::string::npos) << err(e);
}

TEST(TrellisConfig, RecipeBitsAxisKMapAndDenseModules) {
  TrellisRecipe r;
  r.bits = 3;
  r.k_map = parse_trellis_k_map("down_proj=4,model.layers.1.self_attn.q_proj=2");
  r.dense = {"model.embed_tokens", "lm_head"};
  auto cfg = [&](const std::string& m, int64_t out, int64_t in) { return trellis_recipe_config(r, m, out, in); };
  EXPECT_EQ(cfg("model.layers.0.mlp.down_proj", 512, 1024)->bits, 4);
  EXPECT_EQ(cfg("model.layers.0.mlp.down_proj", 512, 1024)->axis, 0);
  EXPECT_EQ(cfg("model.layers.0.mlp.up_proj", 1024, 512)->axis, 1);
  EXPECT_EQ(cfg("model.layers.0.mlp.up_proj", 1024, 512)->bits, 3);
  EXPECT_EQ(cfg("model.layers.1.self_attn.q_proj", 512, 512)->bits, 2);
  EXPECT_EQ(cfg("model.layers.11.self_attn.q_proj", 512, 512)->bits, 3);  // "1.self_attn..." is not a suffix after a dot
  EXPECT_FALSE(cfg("lm_head", 1000, 512));
  std::string why;
  EXPECT_FALSE(trellis_recipe_config(r, "model.layers.0.mlp.down_proj", 500, 1024, &why));  // axis 0 codes the 500 outputs
  EXPECT_NE(why.find("500"), std::string::npos) << why;
  r.down_axis = 1;
  EXPECT_EQ(cfg("model.layers.0.mlp.down_proj", 500, 1024)->axis, 1);
  // --axis 0: the other linears along their outputs, but never a matrix the loader splits by rows.
  r.axis = 0;
  r.fused = {"self_attn.qkv_proj"};
  EXPECT_EQ(cfg("model.layers.0.mlp.up_proj", 1024, 512)->axis, 0);
  EXPECT_EQ(cfg("model.layers.0.mlp.down_proj", 512, 1024)->axis, 1);  // down keeps down_axis
  EXPECT_EQ(cfg("model.layers.0.self_attn.qkv_proj", 1536, 512)->axis, 1);
  EXPECT_FALSE(trellis_recipe_config(r, "model.layers.0.self_attn.k_proj", 200, 512, &why));  // 200 outputs on axis 0
  r.axis = 2;
  EXPECT_NE(error_of([&] { check_trellis_recipe(r, "quantize"); }).find("axis 2"), std::string::npos);
  r.axis = 1;
  EXPECT_NE(error_of([] { parse_trellis_k_map("down_proj=5"); }).find("down_proj=5"), std::string::npos);
  EXPECT_NE(error_of([] { parse_trellis_k_map("down_proj"); }).find("module=k"), std::string::npos);
  r.bits = 1;
  EXPECT_NE(error_of([&] { check_trellis_recipe(r, "quantize"); }).find("bits 1"), std::string::npos);
}

TEST(TrellisConfig, SynthMatrixIsValidDeterministicAndScaled) {
  for (int k : {2, 3, 4})
    for (int axis : {0, 1}) {
      TrellisConfig c;
      c.bits = k, c.axis = axis;
      const int64_t out = 512, in = 768;
      const auto ws = trellis_weight_shape(c, out, in), ss = trellis_scales_shape(c, out, in);
      std::vector<uint32_t> w(static_cast<size_t>(ws[0] * ws[1])), w2(w.size());
      std::vector<uint16_t> s(static_cast<size_t>(ss[0])), s2(s.size());
      trellis_synth_matrix("m.weight", c, out, in, w.data(), s.data());
      trellis_synth_matrix("m.weight", c, out, in, w2.data(), s2.data());
      EXPECT_EQ(w, w2);
      EXPECT_EQ(s, s2);
      const Tensor wt(w.data(), DType::U32, {ws[0], ws[1]}), st(s.data(), DType::F16, {ss[0]});
      const TrellisGeometry g = trellis_geometry("m.weight", c, wt, st, out, in);
      const std::vector<float> dec = trellis_decode_linear(g, wt, st);
      double sq = 0;
      for (float x : dec) sq += double(x) * x;
      const double rms = std::sqrt(sq / double(dec.size())), want = 1.0 / std::sqrt(3.0 * double(in));
      EXPECT_NEAR(rms, want, 0.08 * want) << "k=" << k << " axis=" << axis;
    }
}

}  // namespace
}  // namespace arbor::quant
