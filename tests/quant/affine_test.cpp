// Tests of MLX affine quantization (quant/affine.h): codes, scales and biases on inputs worked out by hand
// (the edge anchoring, rounding half away from zero, the clamp), the bit stream against an independent
// LSB-first byte stream for every width, round-trip error bounds for every bit width and group size, constant
// and zero groups, dtype handling, threads, the config block and mlx-lm's recipes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/affine.h"
#include "quant/affine_convert.h"
#include "../test_util.h"

namespace arbor::quant {
namespace {

using test::error_of;

std::vector<uint32_t> codes_of(const std::vector<uint32_t>& packed, int64_t cols, int bits) {
  std::vector<uint32_t> c;
  for (int64_t j = 0; j < cols; ++j) c.push_back(affine_get_code(packed.data(), j, bits));
  return c;
}

TEST(Affine, PositiveRampAnchorsAtTheMax) {
  // 0..31 at 2 bits: |min| <= |max|, so the scale is negative and anchored at the max: scale = 31 / -3, bias 31,
  // code = round((31 - j) * 3 / 31) (no ties: the fractions are k/31).
  std::vector<float> w(32);
  for (int j = 0; j < 32; ++j) w[size_t(j)] = float(j);
  std::vector<uint32_t> packed(2);
  float s, b;
  affine_quantize_row(w.data(), 32, {32, 2}, packed.data(), &s, &b);
  EXPECT_EQ(s, 31.0f / -3.0f);
  EXPECT_EQ(b, 31.0f);
  const auto c = codes_of(packed, 32, 2);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(c[size_t(j)], uint32_t(std::lround((31 - j) * 3.0 / 31))) << j;
  EXPECT_EQ(c[0], 3u);
  EXPECT_EQ(c[31], 0u);
}

TEST(Affine, NegativeDominantRoundsHalfAwayFromZeroAndClamps) {
  // j - 20 at 4 bits: min -20 dominates; scale 31/15 gives q0 = round(-9.68) = -10, so scale = 2, bias = -20 and
  // code = round(j / 2): 0.5 -> 1, 1.5 -> 2 (half away from zero; MLX's CPU rint would give 0, 2), and
  // j = 31 -> 15.5 -> 16 is clamped to 15.
  std::vector<float> w(32);
  for (int j = 0; j < 32; ++j) w[size_t(j)] = float(j - 20);
  std::vector<uint32_t> packed(4);
  float s, b;
  affine_quantize_row(w.data(), 32, {32, 4}, packed.data(), &s, &b);
  EXPECT_EQ(s, 2.0f);
  EXPECT_EQ(b, -20.0f);
  const auto c = codes_of(packed, 32, 4);
  for (int j = 0; j < 31; ++j) EXPECT_EQ(c[size_t(j)], uint32_t((j + 1) / 2)) << j;
  EXPECT_EQ(c[31], 15u);
  EXPECT_EQ(packed[0], 0x43322110u);  // codes 0 1 1 2 2 3 3 4, code j at bits 4j
}

TEST(Affine, ZeroAndConstantGroups) {
  std::vector<uint32_t> packed(8);
  float s, b;
  std::vector<float> zeros(64, 0.0f);
  affine_quantize_row(zeros.data(), 64, {64, 4}, packed.data(), &s, &b);
  EXPECT_EQ(s, -1e-7f);  // the eps scale, negated (|min| > |max| is false), and q0 = 0 leaves the bias at 0
  EXPECT_EQ(b, 0.0f);
  for (uint32_t x : packed) EXPECT_EQ(x, 0u);
  for (float c : {0.5f, -0.5f, 3.25f, -1e-3f}) {
    std::vector<float> w(64, c);
    affine_quantize_row(w.data(), 64, {64, 3}, packed.data(), &s, &b);
    EXPECT_EQ(b, c) << c;
    for (int j = 0; j < 64; ++j) EXPECT_EQ(affine_get_code(packed.data(), j, 3), 0u) << c;
    std::vector<float> out(64);
    affine_dequantize(packed.data(), &s, &b, DType::F32, AffineShape{1, 64, {64, 3}}, out.data());
    for (float x : out) EXPECT_EQ(x, c);
  }
  // A negative constant: MLX's GPU kernels start the max at 0, so the range is [c, 0] and the scale c / -7.
  std::vector<float> w(32, -0.5f);
  affine_quantize_row(w.data(), 32, {32, 3}, packed.data(), &s, &b);
  EXPECT_EQ(s, -0.5f / -7.0f);
  EXPECT_EQ(b, -0.5f);
}

// An independent writer of the format's bit stream: bytes, least significant bit first.
std::vector<uint32_t> reference_pack(const std::vector<uint32_t>& codes, int bits) {
  std::vector<uint8_t> bytes(codes.size() * size_t(bits) / 8, 0);
  size_t bit = 0;
  for (uint32_t c : codes)
    for (int k = 0; k < bits; ++k, ++bit)
      if ((c >> k) & 1) bytes[bit / 8] |= uint8_t(1u << (bit % 8));
  std::vector<uint32_t> words(bytes.size() / 4);
  for (size_t i = 0; i < words.size(); ++i)
    words[i] = uint32_t(bytes[4 * i]) | uint32_t(bytes[4 * i + 1]) << 8 | uint32_t(bytes[4 * i + 2]) << 16 |
               uint32_t(bytes[4 * i + 3]) << 24;
  return words;
}

TEST(Affine, BitStreamForEveryWidth) {
  std::mt19937 rng(7);
  for (int bits : kAffineBits) {
    const int64_t cols = 128;
    std::vector<uint32_t> codes(cols);
    for (auto& c : codes) c = rng() & ((1u << bits) - 1);
    std::vector<uint32_t> packed(size_t(cols * bits / 32), 0);
    for (int64_t j = 0; j < cols; ++j) affine_or_code(packed.data(), j, bits, codes[size_t(j)]);
    EXPECT_EQ(packed, reference_pack(codes, bits)) << bits;
    EXPECT_EQ(codes_of(packed, cols, bits), codes) << bits;
  }
  // 3 bits: codes 0..7 fill 3 bytes, 0x88 0xC6 0xFA (code 2 straddles the first two bytes).
  std::vector<uint32_t> p(3, 0);
  for (int j = 0; j < 32; ++j) affine_or_code(p.data(), j, 3, uint32_t(j % 8));
  EXPECT_EQ(p[0] & 0xffffffu, 0xFAC688u);
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Affine, RoundTripBoundsEveryBitWidthAndGroupSize) {
  const int64_t rows = 5;
  for (int g : kAffineGroupSizes)
    for (int bits : kAffineBits) {
      const int64_t cols = 3 * g;
      auto w = gaussian(size_t(rows * cols), uint32_t(g * 10 + bits), 0.02f);
      for (int64_t j = 0; j < g; ++j) w[size_t(j)] += 0.05f;  // an offset group: all positive values
      const AffineShape s = affine_shape(rows, cols, {g, bits}, "t");
      std::vector<uint32_t> packed(size_t(rows * s.words_per_row()));
      std::vector<float> sc(size_t(rows * s.groups_per_row())), bi(sc.size()), out(w.size());
      affine_quantize(w.data(), DType::F32, s, packed.data(), sc.data(), bi.data(), DType::F32, "t");
      affine_dequantize(packed.data(), sc.data(), bi.data(), DType::F32, s, out.data());
      const uint32_t top = (1u << bits) - 1;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) {
          const size_t i = size_t(r * cols + j);
          const float scale = std::fabs(sc[size_t(r * s.groups_per_row() + j / g)]);
          const uint32_t code = affine_get_code(packed.data() + r * s.words_per_row(), j, bits);
          // Half a step, except at the clamped end, where the anchored scale may fall short by up to one step.
          const float bound = (code == top ? 1.0f : 0.5f) * scale * 1.0001f + 1e-7f;
          ASSERT_LE(std::fabs(out[i] - w[i]), bound) << "bits " << bits << " group " << g << " at " << r << "," << j;
        }
    }
}

TEST(Affine, Bf16InputsAndOutputsThreadsAndF32Cast) {
  const int64_t rows = 9, cols = 256;
  const auto w = gaussian(size_t(rows * cols), 3, 1.0f);
  std::vector<uint16_t> wb(w.size());
  std::vector<float> wr(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]), wr[i] = bf16_to_f32(wb[i]);
  const AffineShape s = affine_shape(rows, cols, {64, 4}, "t");
  const size_t nw = size_t(rows * s.words_per_row()), ng = size_t(rows * s.groups_per_row());
  // bf16 in -> bf16 scales: the f32 computation on the widened values, scales rounded to bf16 at the end.
  std::vector<uint32_t> p1(nw), p2(nw), p3(nw);
  std::vector<uint16_t> s1(ng), b1(ng), s2(ng), b2(ng);
  affine_quantize(wb.data(), DType::BF16, s, p1.data(), s1.data(), b1.data(), DType::BF16, "t");
  ThreadPool pool(3);
  affine_quantize(wb.data(), DType::BF16, s, p2.data(), s2.data(), b2.data(), DType::BF16, "t", &pool);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(b1, b2);
  std::vector<float> sf(ng), bf(ng);
  for (int64_t r = 0; r < rows; ++r)
    affine_quantize_row(wr.data() + r * cols, cols, {64, 4}, p3.data() + r * s.words_per_row(), sf.data() + r * 4, bf.data() + r * 4);
  EXPECT_EQ(p1, p3);
  for (size_t i = 0; i < ng; ++i) {
    EXPECT_EQ(s1[i], f32_to_bf16(sf[i]));
    EXPECT_EQ(b1[i], f32_to_bf16(bf[i]));
  }
  // f32 in, bf16 out: the values are rounded to bf16 first (mlx-lm casts the model before quantizing).
  std::vector<uint32_t> p4(nw);
  std::vector<uint16_t> s4(ng), b4(ng);
  affine_quantize(w.data(), DType::F32, s, p4.data(), s4.data(), b4.data(), DType::BF16, "t");
  EXPECT_EQ(p4, p1);
  EXPECT_EQ(s4, s1);
}

TEST(Affine, Errors) {
  EXPECT_EQ(error_of([] { affine_shape(4, 96, {64, 4}, "quantize: tensor 'x.weight'"); }),
            "quantize: tensor 'x.weight': a row of 96 values does not divide into groups of 64 (32 left over)");
  EXPECT_EQ(error_of([] { check_affine_params({64, 7}, "q"); }), "q: bits 7 is not supported (MLX affine: 2, 3, 4, 5, 6 or 8)");
  EXPECT_EQ(error_of([] { check_affine_params({48, 4}, "q"); }), "q: group_size 48 is not supported (MLX affine: 32, 64 or 128)");
  std::vector<float> w(64, 1.0f);
  w[37] = NAN;
  std::vector<uint32_t> p(8);
  std::vector<float> sc(1), bi(1);
  EXPECT_EQ(error_of([&] { affine_quantize(w.data(), DType::F32, affine_shape(1, 64, {64, 4}, "t"), p.data(), sc.data(), bi.data(), DType::F32, "t"); }),
            "t: value [0, 37] is nan; only finite weights can be quantized");
  EXPECT_EQ(error_of([&] { affine_quantize(w.data(), DType::I32, affine_shape(1, 64, {64, 4}, "t"), p.data(), sc.data(), bi.data(), DType::F32, "t"); }),
            "t: cannot quantize a I32 tensor (F32, F16 or BF16)");
}

TEST(AffineConfig, ParsesDefaultsOverridesAndFalse) {
  json c = json::parse(R"({"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
      "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
      "lm_head": false, "model.embed_tokens": true}})");
  auto q = parse_affine_quant_config(c, "config.json");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->defaults, (AffineParams{64, 4}));
  EXPECT_EQ(q->for_module("model.layers.0.mlp.down_proj"), (AffineParams{32, 8}));
  EXPECT_EQ(q->for_module("model.layers.1.mlp.down_proj"), (AffineParams{64, 4}));
  EXPECT_EQ(q->for_module("lm_head"), std::nullopt);
  EXPECT_EQ(q->for_module("model.embed_tokens"), (AffineParams{64, 4}));
  EXPECT_EQ(q->to_json()["lm_head"], false);
  EXPECT_EQ(q->to_json()["model.layers.0.mlp.down_proj"]["bits"], 8);
  // quantization_config alone (some repos carry only that one); neither: not quantized.
  auto q2 = parse_affine_quant_config(json::parse(R"({"quantization_config": {"group_size": 128, "bits": 3}})"), "c");
  ASSERT_TRUE(q2);
  EXPECT_EQ(q2->defaults, (AffineParams{128, 3}));
  EXPECT_FALSE(parse_affine_quant_config(json::parse(R"({"hidden_size": 8})"), "c"));
}

TEST(AffineConfig, ErrorsNameTheKey) {
  auto err = [](const char* text) { return error_of([&] { parse_affine_quant_config(json::parse(text), "config.json"); }); };
  EXPECT_EQ(err(R"({"quantization": 4})"), "config.json: quantization: is a JSON number, not an object");
  EXPECT_EQ(err(R"({"quantization": {"group_size": 64}})"), "config.json: quantization: 'bits' is missing");
  EXPECT_EQ(err(R"({"quantization": {"group_size": 64, "bits": "4"}})"),
            "config.json: quantization: 'bits' is a JSON string (\"4\"), not an integer");
  EXPECT_EQ(err(R"({"quantization": {"group_size": 64, "bits": 7}})"),
            "config.json: quantization: bits 7 is not supported (MLX affine: 2, 3, 4, 5, 6 or 8)");
  EXPECT_EQ(err(R"({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}})"),
            "config.json: quantization: mode \"mxfp4\" is not supported (only \"affine\")");
  EXPECT_EQ(err(R"({"quantization": {"group_size": 64, "bits": 4, "model.layers.3.mlp.up_proj": {"group_size": 96, "bits": 4}}})"),
            "config.json: quantization: module 'model.layers.3.mlp.up_proj': group_size 96 is not supported (MLX affine: 32, 64 or 128)");
  EXPECT_EQ(err(R"({"quantization": {"group_size": 64, "bits": 4, "lm_head": 8}})"),
            "config.json: quantization: module 'lm_head': is a JSON number (8); a module entry is an object with group_size and bits, or false");
  EXPECT_EQ(err(R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}})"),
            "config.json: quantization_config: quant_method \"gptq\" is another format (arbor reads MLX affine blocks: group_size, bits, mode \"affine\")");
}

TEST(AffineRecipe, MoreBitsLayersAsMlxLm) {
  // 16 layers: n/8 = 2, 7n/8 = 14: layers 0, 1, 14, 15 and (i - 2) % 3 == 2, i.e. 4, 7, 10, 13.
  const std::vector<int> more = {0, 1, 4, 7, 10, 13, 14, 15};
  for (int i = 0; i < 16; ++i) {
    const bool m = std::find(more.begin(), more.end(), i) != more.end();
    const std::string l = fmt::format("model.layers.{}", i);
    EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_3_6, l + ".self_attn.v_proj", 2, 16, 64).bits, m ? 6 : 3) << i;
    EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_3_6, l + ".mlp.down_proj", 2, 16, 64).bits, m ? 6 : 3) << i;
    EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_3_6, l + ".self_attn.q_proj", 2, 16, 64).bits, 3) << i;
    EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_3_6, l + ".mlp.gate_proj", 2, 16, 64).bits, 3) << i;
  }
  EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_2_6, "lm_head", 2, 16, 32), (AffineParams{32, 6}));
  EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_2_6, "model.embed_tokens", 2, 16, 32), (AffineParams{32, 2}));
  EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_3_4, "lm_head", 2, 16, 64).bits, 4);
  EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_4_6, "model.layers.5.mlp.up_proj", 2, 16, 64).bits, 4);
  // 4 layers: n/8 = 0 and 7n/8 = 3: layers 2 ((2 - 0) % 3 == 2) and 3.
  EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_2_6, "model.layers.0.mlp.down_proj", 2, 4, 64).bits, 2);
  EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_2_6, "model.layers.2.mlp.down_proj", 2, 4, 64).bits, 6);
  EXPECT_EQ(affine_recipe_params(AffineRecipe::Mixed_2_6, "model.layers.3.mlp.down_proj", 2, 4, 64).bits, 6);
  EXPECT_EQ(error_of([] { parse_affine_recipe("mixed_5_8"); }),
            "quantize: unknown recipe 'mixed_5_8' (mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6)");
  EXPECT_EQ(parse_affine_recipe(""), AffineRecipe::None);
}

}  // namespace
}  // namespace arbor::quant
