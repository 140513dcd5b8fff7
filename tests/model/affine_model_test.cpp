// MLX affine checkpoints through the whole model on the CPU: a quantized checkpoint (arbor synth --bits, or
// arbor quantize with a mixed recipe: per-module overrides) gives the logits of a dense f32 checkpoint holding
// its dequantized weights (quant::affine_dequantize), quantized embedding and head included, tied or not; and
// the loader's errors name the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/generate.h"
#include "golden_logits.h"
#include "io/safetensors.h"
#include "model/synth.h"
#include "model/weights.h"
#include "quant/affine.h"
#include "quant/affine_convert.h"
#include "quant/affine_synth.h"

using namespace arbor;
namespace fs = std::filesystem;

namespace {

json small_llama(bool tied) {
  return json{{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 97}, {"hidden_size", 64},
              {"intermediate_size", 128}, {"num_hidden_layers", 3}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 128}, {"tie_word_embeddings", tied}, {"torch_dtype", "bfloat16"}};
}

std::string temp_dir(const std::string& name) {
  fs::path p = fs::path(testing::TempDir()) / ("arbor_affine_model_test_" + name);
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

std::vector<std::string> shard_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Writes a dense checkpoint next to an affine one: every affine matrix dequantized to f32, every other tensor
// as it is, config.json without the quantization blocks. Returns the number of matrices dequantized.
int write_dequantized(const std::string& qdir, const std::string& ddir) {
  json cfg = read_json_file(qdir + "/config.json");
  const std::optional<quant::AffineQuantConfig> qc = quant::parse_affine_quant_config(cfg, "config.json");
  EXPECT_TRUE(qc.has_value());
  cfg.erase("quantization"), cfg.erase("quantization_config");
  std::ofstream(ddir + "/config.json") << cfg.dump(2);
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const TensorInfo*> all;
  for (const std::string& f : shard_files(qdir)) {
    files.push_back(std::make_unique<SafetensorsFile>(f));
    for (const auto& t : files.back()->tensors()) all[t.name] = &t;
  }
  std::vector<TensorToWrite> out;
  std::vector<std::vector<float>> owned;
  owned.reserve(all.size());
  int n = 0;
  for (const auto& [name, t] : all) {
    auto ends = [&](const char* s) { return name.size() > strlen(s) && name.compare(name.size() - strlen(s), strlen(s), s) == 0; };
    if (ends(".scales") || ends(".biases")) continue;
    const std::string module = ends(".weight") ? name.substr(0, name.size() - 7) : "";
    if (!module.empty() && all.count(module + ".scales")) {
      const TensorInfo& s = *all.at(module + ".scales");
      const TensorInfo& b = *all.at(module + ".biases");
      const quant::AffineParams p = *qc->for_module(module);
      const int64_t rows = t->shape[0], cols = t->shape[1] * 32 / p.bits;
      EXPECT_EQ(s.shape[1] * p.group_size, cols) << module;
      const quant::AffineShape sh = quant::affine_shape(rows, cols, p, module);
      owned.emplace_back(size_t(rows * cols));
      quant::affine_dequantize(reinterpret_cast<const uint32_t*>(t->data), s.data, b.data, s.dtype, sh, owned.back().data());
      out.push_back({name, DType::F32, {rows, cols}, owned.back().data(), owned.back().size() * 4});
      ++n;
    } else {
      out.push_back({name, t->dtype, t->shape, t->data, t->nbytes});
    }
  }
  write_safetensors(ddir + "/model.safetensors", out, json{{"format", "pt"}});
  return n;
}

// Greedy generation on both, every step's logits kept: the ids equal and the logits within 1e-4 of max|ref|.
void expect_same_logits(const std::string& qdir, const std::string& ddir) {
  CpuBackend bq(2, WeightPlacement::Copy), bd(2, WeightPlacement::Mapped);
  LoadOptions oq, od;
  oq.model_dir = qdir, od.model_dir = ddir;
  Model mq(oq, bq), md(od, bd);
  BlockPool pq(bq.kv_layout().n_blocks, 16), pd(bd.kv_layout().n_blocks, 16);
  GenerateRequest req;
  req.prompt = {1, 5, 9, 77, 3, 96, 0, 41, 12, 8, 60};  // 11 tokens: the prompt takes the GEMM paths
  req.max_tokens = 6;
  req.keep_logits = true;
  const GenerateResult rq = generate(mq, pq, req), rd = generate(md, pd, req);
  EXPECT_EQ(rq.tokens, rd.tokens);
  ASSERT_EQ(rq.logits.size(), rd.logits.size());
  ASSERT_FALSE(rd.logits.empty());
  float worst = 0, scale = 0;
  for (size_t i = 0; i < rd.logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(rq.logits[i]));
    worst = std::max(worst, std::fabs(rq.logits[i] - rd.logits[i])), scale = std::max(scale, std::fabs(rd.logits[i]));
  }
  EXPECT_GT(scale, 0.0f);
  EXPECT_LE(worst, 1e-4f * scale) << "worst " << worst << " of max " << scale;
}

void synth_affine(const json& cfg, const std::string& dir, const quant::AffineParams& p) {
  ModelConfig c = parse_model_config(cfg, "test config");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  std::vector<quant::SynthTensor> ts;
  for (const TensorSpec& s : expected_tensors(c, a)) ts.push_back({s.name, s.shape});
  quant::write_affine_synthetic_checkpoint(cfg, ts, dir, DType::BF16, p, uint64_t(1) << 30,
                                           [&](const quant::SynthTensor& t, void* dst) { fill_dummy(TensorSpec{t.name, t.shape}, a, DType::BF16, dst); });
}

TEST(AffineModel, SynthCheckpointMatchesItsDequantizedWeights) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const std::string q = temp_dir(tied ? "synth_tied" : "synth"), d = temp_dir(tied ? "synth_tied_dense" : "synth_dense");
    synth_affine(small_llama(tied), q, {64, 4});
    // Every matrix: 7 per layer, the embedding, and the head when untied.
    EXPECT_EQ(write_dequantized(q, d), 3 * 7 + 1 + (tied ? 0 : 1));
    expect_same_logits(q, d);
  }
}

TEST(AffineModel, QuantizedRecipeWithPerModuleOverridesMatches) {
  // arbor quantize of a dense checkpoint with mixed_3_6 at group 32: 3-bit modules, 6-bit head and
  // v_proj/down_proj in the "more bits" layers (per-module overrides in config.json).
  const std::string src = temp_dir("recipe_src"), q = temp_dir("recipe_q"), d = temp_dir("recipe_dense");
  const json cfg = small_llama(false);
  write_synthetic_checkpoint(cfg, src, DType::BF16);
  ModelConfig c = parse_model_config(cfg, "test config");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  quant::AffineConvertOptions o;
  o.in_dir = src, o.out_dir = q + "/out", o.params = {32, 3}, o.recipe = quant::AffineRecipe::Mixed_3_6, o.num_layers = 3;
  for (const TensorSpec& s : expected_tensors(c, a)) o.tensors.push_back({s.name, s.shape});
  quant::affine_convert_checkpoint(o, nullptr);
  const json qc = read_json_file(q + "/out/config.json");
  ASSERT_TRUE(qc["quantization"].contains("lm_head"));
  EXPECT_EQ(qc["quantization"]["lm_head"]["bits"], 6);
  EXPECT_EQ(write_dequantized(q + "/out", d), 3 * 7 + 2);
  expect_same_logits(q + "/out", d);
}

// --dummy-weights with an affine format (LoadOptions::dummy_quant) makes, in memory and packed, exactly what
// `arbor synth --bits` writes: the same bytes, the same logits bit for bit; parameters count weights (rows x cols),
// not packed words, as for the dense model of the config.
TEST(AffineModel, DummyWeightsAreWhatSynthWrites) {
  for (bool tied : {false, true})
    for (const quant::AffineParams p : {quant::AffineParams{64, 4}, quant::AffineParams{32, 3}, quant::AffineParams{128, 8}}) {
      SCOPED_TRACE(fmt::format("{} {}-bit g{}", tied ? "tied" : "untied", p.bits, p.group_size));
      const std::string q = temp_dir(fmt::format("dummy_{}_{}_{}", tied, p.bits, p.group_size));
      json cfg = small_llama(tied);
      cfg["hidden_size"] = 128, cfg["intermediate_size"] = 192;  // g128: the down projection (192) stays dense
      synth_affine(cfg, q, p);
      const std::string plain = q + "/plain_config.json";
      std::ofstream(plain) << cfg.dump();
      CpuBackend bq(2, WeightPlacement::Mapped), bd(2, WeightPlacement::Copy), bdense(1, WeightPlacement::Mapped);
      LoadOptions oq, od, odense;
      oq.model_dir = q;
      od.config_path = plain, od.dummy_weights = true, od.dummy_quant.format = WeightFormat::Affine, od.dummy_quant.affine = p;
      odense.config_path = plain, odense.dummy_weights = true;
      Model mq(oq, bq), md(od, bd), mdense(odense, bdense);
      EXPECT_EQ(md.weight_bytes(), mq.weight_bytes());
      EXPECT_EQ(md.embed_bytes(), mq.embed_bytes());
      EXPECT_EQ(md.weight_dtypes(), "BF16, U32");
      EXPECT_EQ(md.weight_formats(), mq.weight_formats());
      EXPECT_EQ(md.parameter_count(), mdense.parameter_count());
      EXPECT_EQ(mq.parameter_count(), mdense.parameter_count());
      // Packed: codes take bits/8 bytes a weight, scales and biases 2 x 2 bytes a group.
      const int64_t V = 97, H = 128, F = 192, L = 3, Q = 128, KV = 64;  // 4 heads of 32, 2 KV heads
      const bool down_dense = F % p.group_size != 0;
      auto affine_bytes = [&](int64_t rows, int64_t cols) { return uint64_t(rows * cols * p.bits / 8 + rows * (cols / p.group_size) * 4); };
      // The embedding (and head), two bf16 norms a layer and the final norm, the layers' matrices.
      uint64_t want = affine_bytes(V, H) * (tied ? 1 : 2) + uint64_t((2 * L + 1) * H * 2);
      want += uint64_t(L) * (affine_bytes(Q, H) + 2 * affine_bytes(KV, H) + affine_bytes(H, Q) + 2 * affine_bytes(F, H) +
                             (down_dense ? uint64_t(H * F * 2) : affine_bytes(H, F)));
      EXPECT_EQ(md.weight_bytes(), want);
      EXPECT_EQ(md.embed_bytes(), affine_bytes(V, H));
      const std::string formats = md.weight_formats();
      EXPECT_NE(formats.find(fmt::format("affine {}-bit g{} x", p.bits, p.group_size)), std::string::npos) << formats;
      EXPECT_EQ(formats.find("dense") != std::string::npos, down_dense) << formats;
      test::expect_identical_generation(mq, bq, md, bd);
    }
}

TEST(AffineModel, DummyWeightsRejectUnsupportedParams) {
  CpuBackend be(1, WeightPlacement::Mapped);
  const std::string d = temp_dir("dummy_bad");
  std::ofstream(d + "/config.json") << small_llama(false).dump();
  LoadOptions o;
  o.config_path = d + "/config.json", o.dummy_weights = true, o.dummy_quant.format = WeightFormat::Affine, o.dummy_quant.affine = {64, 7};
  const std::string e = error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("bits 7"), std::string::npos) << e;
}

TEST(AffineModel, LoadErrorsNameTheTensor) {
  const std::string q = temp_dir("errors");
  synth_affine(small_llama(false), q, {64, 4});
  CpuBackend be(1, WeightPlacement::Mapped);
  LoadOptions o;
  o.model_dir = q;
  EXPECT_NO_THROW({ Model m(o, be); });
  const std::string file = shard_files(q).at(0);
  std::vector<TensorToWrite> keep;
  std::vector<std::string> owned;
  {
    SafetensorsFile f(file);
    owned.reserve(f.tensors().size());
    for (const auto& t : f.tensors()) {
      owned.emplace_back(reinterpret_cast<const char*>(t.data), t.nbytes);
      keep.push_back({t.name, t.dtype, t.shape, owned.back().data(), t.nbytes});
    }
  }
  auto rewrite = [&](const std::vector<TensorToWrite>& ts) { std::ofstream(file, std::ios::binary) << serialize_safetensors(ts); };

  // A missing .biases.
  const std::string victim = "model.layers.1.mlp.up_proj.biases";
  std::vector<TensorToWrite> v;
  for (const auto& t : keep)
    if (t.name != victim) v.push_back(t);
  rewrite(v);
  std::string e = error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find(victim), std::string::npos) << e;

  // Scales of the wrong dtype.
  v = keep;
  for (auto& t : v)
    if (t.name == "model.layers.0.self_attn.k_proj.scales") t.dtype = DType::I16;
  rewrite(v);
  e = error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("model.layers.0.self_attn.k_proj.scales"), std::string::npos) << e;

  // A group that does not divide the row (the config says 128, rows of 64).
  rewrite(keep);
  json cfg = read_json_file(q + "/config.json");
  cfg["quantization"]["group_size"] = 128, cfg["quantization_config"]["group_size"] = 128;
  std::ofstream(q + "/config.json") << cfg.dump();
  e = error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("model.embed_tokens.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("groups of 128"), std::string::npos) << e;

  // A module the config keeps dense while its .scales is stored.
  cfg["quantization"]["group_size"] = 64, cfg["quantization_config"]["group_size"] = 64;
  cfg["quantization"]["model.layers.2.self_attn.o_proj"] = false;
  cfg["quantization_config"]["model.layers.2.self_attn.o_proj"] = false;
  std::ofstream(q + "/config.json") << cfg.dump();
  e = error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("model.layers.2.self_attn.o_proj.scales"), std::string::npos) << e;
}

}  // namespace
