// Synthetic MLX affine checkpoint writer.
#include "quant/affine_synth.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors_writer.h"

namespace arbor::quant {

namespace {

uint64_t mix(uint64_t z) {  // SplitMix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t name_seed(const std::string& name) {
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (char ch : name) seed = (seed ^ uint8_t(ch)) * 0x100000001B3ull;
  return seed;
}

bool quantizable(const SynthTensor& t, const AffineParams& p) {
  const bool weight = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
  return weight && t.shape.size() == 2 && affine_synth_quantizes(t.shape[1], p);
}

void store(void* out, DType t, int64_t i, float x) {
  if (t == DType::F32) std::memcpy(static_cast<uint8_t*>(out) + 4 * i, &x, 4);
  else {
    const uint16_t h = t == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
    std::memcpy(static_cast<uint8_t*>(out) + 2 * i, &h, 2);
  }
}

}  // namespace

bool affine_synth_quantizes(int64_t cols, const AffineParams& p) { return cols > 0 && cols % p.group_size == 0; }

void affine_synth_matrix(const std::string& weight_name, const AffineShape& s, DType dtype, uint32_t* codes, void* scales,
                         void* biases, ThreadPool* pool) {
  const uint64_t seed = name_seed(weight_name);
  if (codes) {
    const int64_t words = s.rows * s.words_per_row();
    auto fill_words = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)  // every bit random: every code uniform over its levels
        codes[i] = uint32_t(mix(seed + uint64_t(i + 1) * 0x9E3779B97F4A7C15ull) >> 32);
    };
    if (pool && words >= (int64_t(1) << 20)) pool->parallel_for(words, int64_t(1) << 16, [&](int, int64_t b, int64_t e) { fill_words(b, e); });
    else fill_words(0, words);
  }
  if (!scales && !biases) return;
  const int64_t groups = s.rows * s.groups_per_row();
  const float h = 1.0f / std::sqrt(float(s.cols));
  const float levels = float((1 << s.p.bits) - 1);
  const uint64_t gseed = mix(seed ^ 0x5CA1E5ull);
  for (int64_t g = 0; g < groups; ++g) {
    const float u = float(mix(gseed + uint64_t(g + 1) * 0x9E3779B97F4A7C15ull) >> 40) * (1.0f / float(1 << 24));
    const float half = h * (0.9f + 0.2f * u);
    if (scales) store(scales, dtype, g, 2 * half / levels);
    if (biases) store(biases, dtype, g, -half);
  }
}

AffineSynthStats write_affine_synthetic_checkpoint(const json& config_json, const std::vector<SynthTensor>& tensors,
                                                   const std::string& out_dir, DType dtype, const AffineParams& p,
                                                   uint64_t shard_bytes,
                                                   const std::function<void(const SynthTensor&, void*)>& fill_dense,
                                                   const std::function<void(uint64_t)>& progress, ThreadPool* pool) {
  check_affine_params(p, "synth");
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16)
    fail("synth: scales and biases cannot be {} (F32, F16 or BF16)", dtype_name(dtype));
  std::vector<TensorHeader> plan;
  AffineSynthStats st;
  for (const auto& t : tensors) {
    if (quantizable(t, p)) {
      const AffineShape s{t.shape[0], t.shape[1], p};
      const std::string m = t.name.substr(0, t.name.size() - 7);
      plan.push_back({m + ".weight", DType::U32, {s.rows, s.words_per_row()}});
      plan.push_back({m + ".scales", dtype, {s.rows, s.groups_per_row()}});
      plan.push_back({m + ".biases", dtype, {s.rows, s.groups_per_row()}});
      st.modules_quantized++;
    } else {
      plan.push_back({t.name, dtype, t.shape});
    }
  }
  std::filesystem::create_directories(out_dir);
  json cfg = config_json;
  const json q = {{"group_size", p.group_size}, {"bits", p.bits}, {"mode", "affine"}};
  cfg["quantization"] = q;
  cfg["quantization_config"] = q;
  {
    std::ofstream f(out_dir + "/config.json");
    f << cfg.dump(2) << "\n";
    if (!f) fail("synth: cannot write {}/config.json", out_dir);
  }
  ShardedSafetensorsWriter w(out_dir, plan, shard_bytes, json{{"format", "mlx"}});
  std::vector<uint8_t> buf, scales, biases;
  for (const auto& t : tensors) {
    if (quantizable(t, p)) {
      const AffineShape s{t.shape[0], t.shape[1], p};
      const std::string m = t.name.substr(0, t.name.size() - 7);
      const int64_t words = s.rows * s.words_per_row(), groups = s.rows * s.groups_per_row();
      buf.resize(size_t(words) * 4);
      scales.resize(size_t(groups) * dtype_size(dtype));
      biases.resize(scales.size());
      affine_synth_matrix(t.name, s, dtype, reinterpret_cast<uint32_t*>(buf.data()), scales.data(), biases.data(), pool);
      w.write(m + ".weight", buf.data(), buf.size());
      w.write(m + ".scales", scales.data(), scales.size());
      w.write(m + ".biases", biases.data(), biases.size());
      st.tensors += 3;
      st.bytes += buf.size() + 2 * scales.size();
    } else {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      buf.resize(size_t(n) * dtype_size(dtype));
      fill_dense(t, buf.data());
      w.write(t.name, buf.data(), buf.size());
      st.tensors++;
      st.bytes += buf.size();
    }
    if (progress) progress(buf.size());
  }
  w.finish();
  st.shards = w.shard_count();
  return st;
}

}  // namespace arbor::quant
