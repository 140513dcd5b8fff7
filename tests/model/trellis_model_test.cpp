// Trellis checkpoints through the whole model on the CPU: a synthetic trellis checkpoint (arbor synth
// --format trellis: random code words, k = 2/3/4, down projection on axis 0 or 1) gives the logits of a
// dense f32 checkpoint holding its decoded weights (quant::trellis_decode_linear); so does one mixing
// trellis (k 2 and 4 by module, the interleaved k = 3 axis-0 layout), affine and dense modules; a
// checkpoint written by the quantize path (the CPU Viterbi) holds exactly what the encoder chose, loads
// and runs; the loader's errors name the tensor. Calibration (engine/calibration.h) sums each linear's inputs
// (layer 0's attention input against the normed embedding rows computed here), and `quantize --calib`'s path
// codes every linear with LDLQ into a checkpoint that loads and runs. The residual rotation (model/rotate.h) gives
// the logits of the checkpoint it rotated (tied and untied, biases, per-head q/k norms) and refuses what it cannot fold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/calibration.h"
#include "engine/generate.h"
#include "engine/perplexity.h"
#include "golden_logits.h"
#include "io/safetensors.h"
#include "model/rotate.h"
#include "model/synth.h"
#include "model/weights.h"
#include "quant/affine.h"
#include "quant/affine_convert.h"
#include "quant/trellis.h"
#include "quant/trellis_convert.h"
#include "quant/trellis_encode.h"
#include "quant/trellis_ldlq.h"
#include "../test_util.h"

using namespace arbor;
namespace fs = std::filesystem;

namespace {

// hidden 512 (two k = 3 blocks for the interleaved down projection), q_dim 512, kv_dim 256, ffn 768.
json small_llama() {
  return json{{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 97}, {"hidden_size", 512},
              {"intermediate_size", 768}, {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
              {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 128}, {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}};
}

std::string temp_dir(const std::string& name) {
  fs::path p = fs::path(testing::TempDir()) / ("arbor_trellis_model_test_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<std::string> shard_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = strlen(suffix);
  return s.size() > n && s.compare(s.size() - n, n, suffix) == 0;
}

// All tensors of a checkpoint, copied (so the files may be rewritten).
struct Tensors {
  std::map<std::string, TensorInfo> info;
  std::map<std::string, std::string> bytes;
  explicit Tensors(const std::string& dir) {
    for (const std::string& f : shard_files(dir)) {
      SafetensorsFile sf(f);
      for (const auto& t : sf.tensors()) {
        bytes[t.name] = std::string(reinterpret_cast<const char*>(t.data), t.nbytes);
        info[t.name] = t;
        info[t.name].data = nullptr;
      }
    }
  }
  const uint8_t* data(const std::string& n) const { return reinterpret_cast<const uint8_t*>(bytes.at(n).data()); }
};

// A stored trellis pair as a Tensor view (the loader's geometry check runs on it).
Tensor view(const Tensors& ts, const std::string& n) {
  const TensorInfo& t = ts.info.at(n);
  Tensor v(const_cast<uint8_t*>(ts.data(n)), t.dtype, {});
  v.ndim = int(t.shape.size());
  for (size_t i = 0; i < t.shape.size(); ++i) v.shape[i] = t.shape[i];
  return v;
}

// The dense checkpoint of a quantized one: trellis and affine matrices decoded to f32 (the format references),
// every other tensor as it is; config.json without the quantization blocks. Returns the matrices decoded.
int write_decoded(const std::string& qdir, const std::string& ddir) {
  json cfg = read_json_file(qdir + "/config.json");
  const std::optional<quant::AffineQuantConfig> qc = quant::parse_affine_quant_config(cfg, "config.json");
  EXPECT_TRUE(qc.has_value());
  cfg.erase("quantization"), cfg.erase("quantization_config");
  std::ofstream(ddir + "/config.json") << cfg.dump(2);
  ModelConfig c = parse_model_config(cfg, "config");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorSpec& s : expected_tensors(c, a)) shapes[s.name] = s.shape;
  const Tensors ts(qdir);
  std::vector<TensorToWrite> out;
  std::vector<std::vector<float>> owned;
  owned.reserve(ts.info.size());
  int n = 0;
  for (const auto& [name, t] : ts.info) {
    if (ends_with(name, ".scales") || ends_with(name, ".biases")) continue;
    const std::string module = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : "";
    if (!module.empty() && ts.info.count(module + ".scales")) {
      const std::vector<int64_t>& shape = shapes.at(name);
      if (const auto tc = qc->trellis_for(module)) {
        const quant::TrellisGeometry g = quant::trellis_geometry(name, *tc, view(ts, name), view(ts, module + ".scales"), shape[0], shape[1]);
        owned.push_back(quant::trellis_decode_linear(g, view(ts, name), view(ts, module + ".scales")));
      } else {
        const quant::AffineParams p = *qc->for_module(module);
        const quant::AffineShape sh = quant::affine_shape(shape[0], shape[1], p, module);
        const TensorInfo& s = ts.info.at(module + ".scales");
        owned.emplace_back(size_t(shape[0] * shape[1]));
        quant::affine_dequantize(reinterpret_cast<const uint32_t*>(ts.data(name)), ts.data(module + ".scales"), ts.data(module + ".biases"),
                                 s.dtype, sh, owned.back().data());
      }
      out.push_back({name, DType::F32, shape, owned.back().data(), owned.back().size() * 4});
      ++n;
    } else {
      out.push_back({name, t.dtype, t.shape, ts.data(name), t.nbytes});
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
  req.prompt = {1, 5, 9, 77, 3, 96, 0, 41, 12, 8, 60};  // 11 tokens: the prompt takes the tiled paths
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

quant::TrellisRecipe recipe(int bits, int down_axis) {
  quant::TrellisRecipe r;
  r.bits = bits, r.down_axis = down_axis;
  r.dense = {"model.embed_tokens", "lm_head"};
  return r;
}

void synth_trellis(const json& cfg, const std::string& dir, const quant::TrellisRecipe& r) {
  ModelConfig c = parse_model_config(cfg, "test config");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  std::vector<quant::TrellisSynthTensor> ts;
  for (const TensorSpec& s : expected_tensors(c, a)) ts.push_back({s.name, s.shape});
  quant::write_trellis_synthetic_checkpoint(cfg, ts, dir, DType::BF16, r, uint64_t(1) << 30, [&](const quant::TrellisSynthTensor& t, void* dst) {
    fill_dummy(TensorSpec{t.name, t.shape}, a, DType::BF16, dst);
  });
}

TEST(TrellisModel, SynthCheckpointMatchesItsDecodedWeights) {
  for (int k : {2, 3, 4})
    for (int down_axis : {0, 1}) {
      if (k != 3 && down_axis == 1) continue;
      SCOPED_TRACE("k=" + std::to_string(k) + " down axis " + std::to_string(down_axis));
      const std::string tag = std::to_string(k) + "_" + std::to_string(down_axis);
      const std::string q = temp_dir("synth" + tag), d = temp_dir("synth_dense" + tag);
      synth_trellis(small_llama(), q, recipe(k, down_axis));
      const json qc = read_json_file(q + "/config.json")["quantization"];
      EXPECT_EQ(qc["model.layers.1.mlp.down_proj"]["trellis"]["axis"], down_axis);
      EXPECT_EQ(qc["model.layers.1.mlp.up_proj"]["trellis"]["axis"], 1);
      EXPECT_EQ(qc["model.layers.0.self_attn.q_proj"]["bits"], k);
      EXPECT_FALSE(qc.contains("lm_head"));
      EXPECT_EQ(write_decoded(q, d), 2 * 7);
      expect_same_logits(q, d);
    }
}

// Trellis k = 2 and 4 (--k-map), the interleaved k = 3 axis-0 layout, an affine module and dense ones in one
// checkpoint.
TEST(TrellisModel, MixedTrellisAffineDenseCheckpointMatches) {
  const std::string q = temp_dir("mixed"), d = temp_dir("mixed_dense");
  quant::TrellisRecipe r = recipe(2, 0);
  r.k_map = quant::parse_trellis_k_map("down_proj=3,model.layers.1.self_attn.o_proj=4");
  synth_trellis(small_llama(), q, r);
  json cfg = read_json_file(q + "/config.json");
  EXPECT_EQ(cfg["quantization"]["model.layers.1.self_attn.o_proj"]["bits"], 4);
  EXPECT_EQ(cfg["quantization"]["model.layers.1.self_attn.q_proj"]["bits"], 2);
  EXPECT_EQ(cfg["quantization"]["model.layers.0.mlp.down_proj"]["bits"], 3);
  Tensors ts(q);
  std::vector<TensorToWrite> out;
  std::vector<std::vector<uint32_t>> words;
  std::vector<std::vector<uint8_t>> bytes;
  words.reserve(8), bytes.reserve(8);
  // Layer 0's down projection interleaved ([out/512, in, 48]); layer 1's gate projection MLX affine 4-bit g64
  // from its decoded weights; layer 0's up projection dense f32.
  const std::string down = "model.layers.0.mlp.down_proj", gate = "model.layers.1.mlp.gate_proj", up = "model.layers.0.mlp.up_proj";
  for (const auto& [name, t] : ts.info) {
    if (name == down + ".weight") {
      words.push_back(quant::trellis_interleave_k3(reinterpret_cast<const uint32_t*>(ts.data(name)), 768, 512));
      out.push_back({name, DType::U32, {1, 768, 48}, words.back().data(), words.back().size() * 4});
    } else if (name == gate + ".weight" || name == up + ".weight") {
      const auto tc = quant::parse_affine_quant_config(cfg, "c")->trellis_for(name.substr(0, name.size() - 7));
      ASSERT_TRUE(tc);
      const std::string m = name.substr(0, name.size() - 7);
      const quant::TrellisGeometry g = quant::trellis_geometry(name, *tc, view(ts, name), view(ts, m + ".scales"), 768, 512);
      const std::vector<float> w = quant::trellis_decode_linear(g, view(ts, name), view(ts, m + ".scales"));
      if (name == up + ".weight") {
        bytes.emplace_back(w.size() * 4);
        std::memcpy(bytes.back().data(), w.data(), w.size() * 4);
        out.push_back({name, DType::F32, {768, 512}, bytes.back().data(), bytes.back().size()});
        cfg["quantization"].erase(m), cfg["quantization_config"].erase(m);
        continue;
      }
      const quant::AffineShape sh{768, 512, {64, 4}};
      words.emplace_back(size_t(768 * 512 * 4 / 32));
      bytes.emplace_back(size_t(768 * 8 * 2)), bytes.emplace_back(size_t(768 * 8 * 2));
      uint8_t* s = bytes[bytes.size() - 2].data();
      uint8_t* b = bytes.back().data();
      quant::affine_quantize(w.data(), DType::F32, sh, words.back().data(), s, b, DType::BF16, "test");
      out.push_back({name, DType::U32, {768, 64}, words.back().data(), words.back().size() * 4});
      out.push_back({m + ".scales", DType::BF16, {768, 8}, s, 768 * 8 * 2});
      out.push_back({m + ".biases", DType::BF16, {768, 8}, b, 768 * 8 * 2});
      cfg["quantization"][m] = cfg["quantization_config"][m] = json{{"group_size", 64}, {"bits", 4}, {"mode", "affine"}};
    } else if (name == gate + ".scales" || name == up + ".scales") {
      continue;
    } else {
      out.push_back({name, t.dtype, t.shape, ts.data(name), t.nbytes});
    }
  }
  for (const std::string& f : shard_files(q)) fs::remove(f);
  fs::remove(q + "/model.safetensors.index.json");
  write_safetensors(q + "/model.safetensors", out, json{{"format", "mlx"}});
  std::ofstream(q + "/config.json") << cfg.dump(2);
  EXPECT_EQ(write_decoded(q, d), 2 * 7 - 1);
  expect_same_logits(q, d);
}

// The quantize path: a dense checkpoint through the CPU Viterbi. The file holds what the encoder chooses (the
// same encode, run again here, gives the same words and scales), and the checkpoint runs like its decoded weights.
TEST(TrellisModel, QuantizedCheckpointHoldsTheEncodersChoiceAndRuns) {
  const std::string src = temp_dir("quant_src"), q = temp_dir("quant_q"), d = temp_dir("quant_dense");
  json cfg = small_llama();  // one layer, hidden 256, ffn 512 (the CPU Viterbi is the slow part)
  cfg["num_hidden_layers"] = 1, cfg["hidden_size"] = 256, cfg["intermediate_size"] = 512;
  cfg["num_attention_heads"] = 4, cfg["num_key_value_heads"] = 2;
  write_synthetic_checkpoint(cfg, src, DType::BF16);
  ModelConfig c = parse_model_config(cfg, "test config");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  quant::AffineConvertOptions o;
  o.in_dir = src, o.out_dir = q + "/out";
  quant::TrellisRecipe r = recipe(2, 0);
  r.k_map = {{"v_proj", 4}, {"down_proj", 3}};
  o.trellis = r;
  for (const TensorSpec& s : expected_tensors(c, a)) o.tensors.push_back({s.name, s.shape});
  ThreadPool pool(2);
  const quant::AffineConvertStats st = quant::affine_convert_checkpoint(o, nullptr, &pool);
  EXPECT_EQ(st.modules_quantized, 7u);
  EXPECT_EQ(st.weights_encoded, uint64_t(256 * 256 * 2 + 128 * 256 * 2 + 512 * 256 * 3));
  const json qc = read_json_file(q + "/out/config.json")["quantization"];
  EXPECT_EQ(qc["mode"], "trellis");
  EXPECT_EQ(qc["model.layers.0.mlp.down_proj"]["trellis"]["axis"], 0);
  EXPECT_EQ(qc["model.layers.0.mlp.down_proj"]["bits"], 3);
  EXPECT_EQ(qc["model.layers.0.self_attn.v_proj"]["bits"], 4);
  EXPECT_EQ(qc["model.layers.0.mlp.gate_proj"]["trellis"]["axis"], 1);

  const Tensors in(src), outp(q + "/out");
  for (const char* m : {"model.layers.0.self_attn.v_proj", "model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_proj"}) {
    SCOPED_TRACE(m);
    const std::string w = std::string(m) + ".weight";
    const TensorInfo& t = in.info.at(w);
    std::vector<float> f(size_t(t.numel()));
    for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(reinterpret_cast<const uint16_t*>(in.data(w))[i]);
    const int k = qc[m]["bits"], axis = qc[m]["trellis"]["axis"];
    const quant::TrellisEncoded e = quant::trellis_encode_linear(w, f.data(), t.shape[0], t.shape[1], k, axis, &pool);
    ASSERT_EQ(outp.bytes.at(w).size(), e.words.size() * 4);
    EXPECT_EQ(std::memcmp(outp.data(w), e.words.data(), e.words.size() * 4), 0);
    ASSERT_EQ(outp.bytes.at(std::string(m) + ".scales").size(), e.scales.size() * 2);
    EXPECT_EQ(std::memcmp(outp.data(std::string(m) + ".scales"), e.scales.data(), e.scales.size() * 2), 0);
    // And the codes are close to the source: relative MSE within the encoder's bound for the bits.
    const quant::TrellisGeometry g =
        quant::trellis_geometry(w, *quant::parse_affine_quant_config(read_json_file(q + "/out/config.json"), "c")->trellis_for(m),
                                view(outp, w), view(outp, std::string(m) + ".scales"), t.shape[0], t.shape[1]);
    const std::vector<float> dec = quant::trellis_decode_linear(g, view(outp, w), view(outp, std::string(m) + ".scales"));
    double err = 0, ref = 0;
    for (size_t i = 0; i < f.size(); ++i) err += (dec[i] - f[i]) * double(dec[i] - f[i]), ref += double(f[i]) * f[i];
    EXPECT_LT(err / ref, k == 2 ? 0.12 : k == 3 ? 0.04 : 0.012) << "relative MSE";
  }
  EXPECT_EQ(write_decoded(q + "/out", d), 7);
  expect_same_logits(q + "/out", d);
}

// The calibration tests' model: a bf16 Llama of `layers` layers (4 heads, 2 KV heads) written to a temp dir, and
// options for windows of 32 ids, 48 a forward, 2 threads over it; ids i·mul + add (mod 97).
struct CalibrationCase {
  json cfg;
  std::string src;
  CalibrationOptions co;
  CalibrationCase(const std::string& name, int layers, int hidden, int ffn) : cfg(small_llama()), src(temp_dir(name)) {
    cfg["num_hidden_layers"] = layers, cfg["hidden_size"] = hidden, cfg["intermediate_size"] = ffn;
    cfg["num_attention_heads"] = 4, cfg["num_key_value_heads"] = 2;
    write_synthetic_checkpoint(cfg, src, DType::BF16);
    co.model_dir = src, co.ctx = 32, co.step_tokens = 48, co.threads = 2;
  }
  static std::vector<int32_t> ids(size_t n, int mul, int add) {
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = int32_t((i * mul + add) % 97);
    return v;
  }
};

// A pass over some layers (arbor quantize --calib-layers: a model whose Hessians do not fit at once) sums exactly those
// layers' linears, to the same values as the pass over all of them; an empty range is refused.
TEST(TrellisModel, CalibrationOfALayerRangeIsThatPartOfTheWhole) {
  CalibrationCase c("calib_range_src", 3, 128, 256);
  const std::vector<int32_t> ids = CalibrationCase::ids(77, 29, 5);
  CalibrationOptions& co = c.co;
  Calibration all = calibrate_input_hessians(ids, co);
  ASSERT_EQ(all.hessians.size(), 21u);
  const auto whole = all.take_means();
  for (auto [first, end] : {std::pair<int64_t, int64_t>{1, 3}, {0, 1}, {2, -1}}) {
    co.first_layer = first, co.end_layer = end;
    Calibration part = calibrate_input_hessians(ids, co);
    const int64_t last = end < 0 ? 3 : end;
    EXPECT_EQ(part.hessians.size(), size_t(7 * (last - first))) << first << ".." << end;
    const auto means = part.take_means();
    for (const auto& [m, h] : means) {
      const int64_t layer = std::stoll(m.substr(std::string("model.layers.").size()));
      EXPECT_TRUE(layer >= first && layer < last) << m;
      EXPECT_EQ(*h, *whole.at(m)) << m;  // the same sums, in the same order
    }
    EXPECT_EQ(means.at("model.layers." + std::to_string(first) + ".self_attn.q_proj"),
              means.at("model.layers." + std::to_string(first) + ".self_attn.v_proj"));  // still shared
  }
  co.first_layer = 3, co.end_layer = -1;
  EXPECT_THROW(calibrate_input_hessians(ids, co), Error);
}

TEST(TrellisModel, CalibrationSumsEachLinearsInputsAndLdlqCodesRun) {
  CalibrationCase cc("calib_src", 1, 256, 512);  // one layer, hidden 256, ffn 512
  const std::string& src = cc.src;
  const json& cfg = cc.cfg;
  const std::string q = temp_dir("calib_q");
  const std::vector<int32_t> ids = CalibrationCase::ids(101, 37, 11);
  Calibration cal = calibrate_input_hessians(ids, cc.co);
  const std::string L = "model.layers.0.";
  ASSERT_EQ(cal.hessians.size(), 7u);
  const auto& h = cal.hessians;
  EXPECT_EQ(h.at(L + "self_attn.q_proj"), h.at(L + "self_attn.k_proj"));  // one input, one sum
  EXPECT_EQ(h.at(L + "self_attn.q_proj"), h.at(L + "self_attn.v_proj"));
  EXPECT_EQ(h.at(L + "mlp.gate_proj"), h.at(L + "mlp.up_proj"));
  EXPECT_NE(h.at(L + "self_attn.o_proj"), h.at(L + "self_attn.q_proj"));
  EXPECT_NE(h.at(L + "mlp.down_proj"), h.at(L + "mlp.gate_proj"));
  EXPECT_EQ(h.at(L + "mlp.down_proj")->n(), 512);
  const int64_t fed = predicted_tokens(perplexity_windows(101, 32));  // each window feeds all but its last id
  for (const auto& [m, hm] : h) EXPECT_EQ(int64_t(hm->rows()), fed) << m;

  // Layer 0's attention input is the normed embedding row of each fed id: E[x xᵀ] from here.
  const Tensors in(src);
  const auto* emb = reinterpret_cast<const uint16_t*>(in.data("model.embed_tokens.weight"));
  const auto* g = reinterpret_cast<const uint16_t*>(in.data(L + "input_layernorm.weight"));
  const int64_t H = 256;
  std::vector<double> ref(size_t(H * H), 0.0);
  std::vector<double> x(static_cast<size_t>(H));
  for (const PplWindow& w : perplexity_windows(101, 32))
    for (int64_t t = w.begin; t < w.begin + w.length - 1; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < H; ++i) ss += double(bf16_to_f32(emb[ids[size_t(t)] * H + i])) * bf16_to_f32(emb[ids[size_t(t)] * H + i]);
      const double r = 1.0 / std::sqrt(ss / double(H) + 1e-5);
      for (int64_t i = 0; i < H; ++i) x[size_t(i)] = bf16_to_f32(emb[ids[size_t(t)] * H + i]) * r * bf16_to_f32(g[i]);
      for (int64_t i = 0; i < H; ++i)
        for (int64_t j = 0; j < H; ++j) ref[size_t(i * H + j)] += x[size_t(i)] * x[size_t(j)];
    }
  const std::vector<double> mq = h.at(L + "self_attn.q_proj")->mean();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::fabs(mq[i] - ref[i] / double(fed)));
    scale = std::max(scale, std::fabs(ref[i] / double(fed)));
  }
  EXPECT_LT(worst, 1e-4 * scale);

  // Every linear coded against its Hessian: the checkpoint loads, runs, and the codes follow the inputs.
  ModelConfig c = parse_model_config(cfg, "test config");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  quant::AffineConvertOptions o;
  o.in_dir = src, o.out_dir = q + "/out";
  o.trellis = recipe(2, 0);
  for (const TensorSpec& s : expected_tensors(c, a)) o.tensors.push_back({s.name, s.shape});
  const auto means = cal.take_means();
  EXPECT_TRUE(cal.hessians.empty());
  EXPECT_EQ(means.at(L + "self_attn.q_proj"), means.at(L + "self_attn.v_proj"));  // shared as the sums were
  EXPECT_EQ(*means.at(L + "self_attn.q_proj"), mq);
  o.input_hessian = [&](const std::string& m) { return means.at(m).get(); };
  ThreadPool pool(2);
  const quant::AffineConvertStats st = quant::affine_convert_checkpoint(o, nullptr, &pool);
  EXPECT_EQ(st.modules_quantized, 7u);
  EXPECT_EQ(st.modules_ldlq, 7u);
  const Tensors outp(q + "/out");
  const std::string w = L + "mlp.down_proj.weight";
  const TensorInfo& t = in.info.at(w);
  std::vector<float> f(size_t(t.numel()));
  for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(reinterpret_cast<const uint16_t*>(in.data(w))[i]);
  const quant::TrellisEncoded e = quant::trellis_encode_linear_ldlq(w, f.data(), t.shape[0], t.shape[1], 2, 0, *means.at(L + "mlp.down_proj"), &pool);
  ASSERT_EQ(outp.bytes.at(w).size(), e.words.size() * 4);
  EXPECT_EQ(std::memcmp(outp.data(w), e.words.data(), e.words.size() * 4), 0);
  const std::string d = temp_dir("calib_dense");
  EXPECT_EQ(write_decoded(q + "/out", d), 7);
  expect_same_logits(q + "/out", d);
}

TEST(TrellisModel, RotationIsOrthogonal) {
  for (int64_t n : {1, 2, 8, 256}) {
    SCOPED_TRACE(n);
    const std::vector<float> s = rotation_signs(n, 7);
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) a[size_t(i)] = float(std::sin(0.7 * double(i) + 1.0)), b[size_t(i)] = float(std::cos(1.3 * double(i)));
    double ab = 0, aa = 0;
    for (int64_t i = 0; i < n; ++i) ab += double(a[size_t(i)]) * b[size_t(i)], aa += double(a[size_t(i)]) * a[size_t(i)];
    rotate_vector(a.data(), n, s);
    rotate_vector(b.data(), n, s);
    double ab2 = 0, aa2 = 0;
    for (int64_t i = 0; i < n; ++i) ab2 += double(a[size_t(i)]) * b[size_t(i)], aa2 += double(a[size_t(i)]) * a[size_t(i)];
    EXPECT_NEAR(ab2, ab, 1e-5 * (1 + aa));
    EXPECT_NEAR(aa2, aa, 1e-5 * (1 + aa));
  }
  // n = 2 by hand: Q = diag(s) [[1, 1], [1, -1]] / sqrt(2); v·Q = (s0 v0 + s1 v1, s0 v0 - s1 v1) / sqrt(2).
  const std::vector<float> s = rotation_signs(2, 3);
  std::vector<float> v = {3.0f, -1.0f};
  rotate_vector(v.data(), 2, s);
  EXPECT_NEAR(v[0], (3.0 * s[0] - s[1]) / std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(v[1], (3.0 * s[0] + s[1]) / std::sqrt(2.0), 1e-6);
  EXPECT_NE(test::error_of([] {
              std::vector<float> x(6);
              rotate_vector(x.data(), 6, std::vector<float>(6, 1.0f));
            }).find("not a power of two"),
            std::string::npos);
}

TEST(TrellisModel, RotatedCheckpointComputesTheSameLogits) {
  json tied = small_llama();
  tied["num_hidden_layers"] = 2, tied["hidden_size"] = 256, tied["intermediate_size"] = 512;
  tied["num_attention_heads"] = 4, tied["num_key_value_heads"] = 2, tied["tie_word_embeddings"] = true;
  json biased = tied;  // untied, with q/k/v/o biases
  biased["tie_word_embeddings"] = false, biased["attention_bias"] = true;
  json qwen3 = tied;  // per-head q/k norms
  qwen3["model_type"] = "qwen3", qwen3["architectures"] = {"Qwen3ForCausalLM"}, qwen3["head_dim"] = 64;
  qwen3.erase("torch_dtype"), qwen3["dtype"] = "bfloat16";  // transformers 5's spelling
  int i = 0;
  for (const json& cfg : {tied, biased, qwen3}) {
    SCOPED_TRACE(cfg.dump());
    const std::string src = temp_dir("rot_src" + std::to_string(i)), rot = temp_dir("rot_out" + std::to_string(i));
    ++i;
    write_synthetic_checkpoint(cfg, src, DType::BF16);
    const RotateStats st = rotate_residual_checkpoint(src, rot, 11);
    EXPECT_EQ(st.untied, cfg["tie_word_embeddings"].get<bool>());
    const json rc = read_json_file(rot + "/config.json");
    EXPECT_FALSE(rc["tie_word_embeddings"].get<bool>());
    EXPECT_EQ(rc["torch_dtype"], "bfloat16");  // what the quantizer casts the dense tensors back to
    const Tensors r(rot);
    EXPECT_EQ(r.info.at("model.layers.0.input_layernorm.weight").dtype, DType::F32);
    for (int j = 0; j < 256; ++j) EXPECT_EQ(reinterpret_cast<const float*>(r.data("model.norm.weight"))[j], 1.0f);
    EXPECT_TRUE(r.info.count("lm_head.weight"));
    expect_same_logits(rot, src);
  }
  const std::string src = temp_dir("rot_bad"), rot = temp_dir("rot_bad_out");
  json gemma = tied;
  gemma["model_type"] = "gemma3_text", gemma["architectures"] = {"Gemma3ForCausalLM"}, gemma["head_dim"] = 64;
  write_synthetic_checkpoint(gemma, src, DType::BF16);
  EXPECT_NE(test::error_of([&] { rotate_residual_checkpoint(src, rot, 0); }).find("is not a pre-norm RMSNorm model"), std::string::npos);
  json wide = tied;
  wide["hidden_size"] = 384;
  const std::string src2 = temp_dir("rot_bad2");
  write_synthetic_checkpoint(wide, src2, DType::BF16);
  EXPECT_NE(test::error_of([&] { rotate_residual_checkpoint(src2, rot, 0); }).find("hidden_size 384 is not a power of two"),
            std::string::npos);
}

TEST(TrellisModel, LoadErrorsNameTheTensor) {
  const std::string q = temp_dir("errors");
  synth_trellis(small_llama(), q, recipe(3, 0));
  CpuBackend be(1, WeightPlacement::Mapped);
  LoadOptions o;
  o.model_dir = q;
  EXPECT_NO_THROW({ Model m(o, be); });
  const Tensors ts(q);
  std::vector<TensorToWrite> keep;
  for (const auto& [name, t] : ts.info) keep.push_back({name, t.dtype, t.shape, ts.data(name), t.nbytes});
  for (const std::string& f : shard_files(q)) fs::remove(f);
  fs::remove(q + "/model.safetensors.index.json");
  auto rewrite = [&](const std::vector<TensorToWrite>& v) { write_safetensors(q + "/model.safetensors", v, json{{"format", "mlx"}}); };

  // Scales of the wrong length.
  std::vector<TensorToWrite> v = keep;
  for (auto& t : v)
    if (t.name == "model.layers.1.mlp.up_proj.scales") t.shape = {700}, t.nbytes = 1400;
  rewrite(v);
  std::string e = test::error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("model.layers.1.mlp.up_proj"), std::string::npos) << e;
  EXPECT_NE(e.find("scales"), std::string::npos) << e;

  // Words that are not whole blocks (a column dropped).
  v = keep;
  std::vector<uint32_t> cut;
  for (auto& t : v)
    if (t.name == "model.layers.0.self_attn.k_proj.weight") {
      cut.assign(size_t(256 * 47), 0);
      t.shape = {256, 47}, t.data = cut.data(), t.nbytes = cut.size() * 4;
    }
  rewrite(v);
  e = test::error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("not a whole number of 24-word blocks"), std::string::npos) << e;

  // A trellis module with .biases.
  v = keep;
  std::vector<uint16_t> biases(1024, 0);
  v.push_back({"model.layers.0.self_attn.o_proj.biases", DType::F16, {512, 2}, biases.data(), biases.size() * 2});
  rewrite(v);
  e = test::error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("model.layers.0.self_attn.o_proj.biases"), std::string::npos) << e;

  // A config entry the layout contradicts: bits 4 for a 3-bit tensor.
  rewrite(keep);
  json cfg = read_json_file(q + "/config.json");
  cfg["quantization"]["model.layers.1.self_attn.q_proj"]["bits"] = 4;
  cfg["quantization_config"] = cfg["quantization"];
  std::ofstream(q + "/config.json") << cfg.dump(2);
  e = test::error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("model.layers.1.self_attn.q_proj"), std::string::npos) << e;

  // A bad entry: L 16.
  cfg["quantization"]["model.layers.1.self_attn.q_proj"]["bits"] = 3;
  cfg["quantization"]["model.layers.1.self_attn.q_proj"]["trellis"]["L"] = 16;
  cfg["quantization_config"] = cfg["quantization"];
  std::ofstream(q + "/config.json") << cfg.dump(2);
  e = test::error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("model.layers.1.self_attn.q_proj"), std::string::npos) << e;
  EXPECT_NE(e.find("L 16"), std::string::npos) << e;
}

}  // namespace

// --dummy-weights --format trellis (LoadOptions::dummy_quant) makes, in memory, exactly what `arbor synth --format
// trellis` writes (trellis_arch_recipe): the same bytes, the same formats, the same logits bit for bit; parameters
// count weights, as for the dense model of the config. With ffn 640 and the down projection on axis 1 its coded
// length (640) is not whole blocks: it stays dense in both.
TEST(TrellisModel, DummyWeightsAreWhatSynthWrites) {
  struct Case {
    int k, down_axis, axis;  // axis: the linears other than down (--axis)
  };
  for (const auto& [k, down_axis, axis] : {Case{2, 0, 1}, Case{3, 0, 1}, Case{4, 0, 1}, Case{3, 1, 1}, Case{2, 0, 0}}) {
    SCOPED_TRACE(fmt::format("k={} down axis {} others axis {}", k, down_axis, axis));
    const std::string q = temp_dir(fmt::format("dummy_{}_{}_{}", k, down_axis, axis));
    json cfg = small_llama();
    if (down_axis == 1) cfg["intermediate_size"] = 640;
    ModelConfig c = parse_model_config(cfg, "test config");
    const ArchDescriptor& a = find_arch(c);
    apply_arch_defaults(c, a);
    synth_trellis(cfg, q, trellis_arch_recipe(a, k, down_axis, axis));
    const std::string plain = q + "/plain_config.json";
    std::ofstream(plain) << cfg.dump();
    CpuBackend bq(2, WeightPlacement::Mapped), bd(2, WeightPlacement::Copy), bdense(1, WeightPlacement::Mapped);
    LoadOptions oq, od, odense;
    oq.model_dir = q;
    od.config_path = plain, od.dummy_weights = true, od.dummy_quant.format = WeightFormat::Trellis;
    od.dummy_quant.trellis_bits = k, od.dummy_quant.trellis_down_axis = down_axis, od.dummy_quant.trellis_axis = axis;
    odense.config_path = plain, odense.dummy_weights = true;
    Model mq(oq, bq), md(od, bd), mdense(odense, bdense);
    EXPECT_EQ(md.weight_bytes(), mq.weight_bytes());
    EXPECT_EQ(md.embed_bytes(), mq.embed_bytes());
    EXPECT_EQ(md.weight_dtypes(), "BF16, F16, U32");
    EXPECT_EQ(md.weight_formats(), mq.weight_formats());
    EXPECT_EQ(md.parameter_count(), mdense.parameter_count());
    // Words take k/8 bytes a weight, scales 2 bytes a coded row; embedding, head and norms bf16.
    const int64_t V = 97, H = 512, F = down_axis == 1 ? 640 : 768, L = 2, Q = 512, KV = 256;
    auto coded = [&](int64_t rows, int64_t cols) { return uint64_t(rows * cols * k / 8 + rows * 2); };  // rows: coded rows
    auto linear = [&](int64_t out, int64_t in) { return axis == 1 ? coded(out, in) : coded(in, out); };  // not down
    uint64_t want = uint64_t(2 * V * H * 2 + (2 * L + 1) * H * 2);
    want += uint64_t(L) * (linear(Q, H) + 2 * linear(KV, H) + linear(H, Q) + 2 * linear(F, H) +
                           (down_axis == 1 ? uint64_t(H * F * 2) : coded(F, H)));
    EXPECT_EQ(md.weight_bytes(), want);
    const std::string formats = md.weight_formats();
    const int64_t on_axis0 = (down_axis == 0 ? L : 0) + (axis == 0 ? 6 * L : 0);
    EXPECT_EQ(formats.find(fmt::format("trellis {}-bit axis 1 x", k)) != std::string::npos, axis == 1) << formats;
    EXPECT_EQ(formats.find(fmt::format("trellis {}-bit axis 0", k)) != std::string::npos, on_axis0 > 0) << formats;
    if (on_axis0 > 0) {
      EXPECT_NE(formats.find(fmt::format("trellis {}-bit axis 0 x{}", k, on_axis0)), std::string::npos) << formats;
    }
    EXPECT_EQ(formats.find("dense BF16 x4") != std::string::npos, down_axis == 1) << formats;  // + embedding, head
    test::expect_identical_generation(mq, bq, md, bd);
  }
}

TEST(TrellisModel, DummyWeightsRejectUnsupportedBits) {
  CpuBackend be(1, WeightPlacement::Mapped);
  const std::string d = temp_dir("dummy_bad");
  std::ofstream(d + "/config.json") << small_llama().dump();
  LoadOptions o;
  o.config_path = d + "/config.json", o.dummy_weights = true, o.dummy_quant.format = WeightFormat::Trellis;
  o.dummy_quant.trellis_bits = 5;
  std::string e = test::error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("trellis bits 5"), std::string::npos) << e;
  o.dummy_quant.trellis_bits = 2, o.dummy_quant.trellis_down_axis = 2;
  e = test::error_of([&] { Model m(o, be); });
  EXPECT_NE(e.find("down axis 2"), std::string::npos) << e;
}
