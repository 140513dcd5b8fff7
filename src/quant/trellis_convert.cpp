// Trellis recipes, config entries and synthetic trellis checkpoints.
#include "quant/trellis_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors_writer.h"

namespace arbor::quant {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool module_matches(std::string_view module, std::string_view key) {
  return module == key || (module.size() > key.size() && ends_with(module, key) && module[module.size() - key.size() - 1] == '.');
}

namespace {

uint64_t mix(uint64_t z) {  // SplitMix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t name_seed(const std::string& name) {
  uint64_t seed = 0x7E11150000000000ull;
  for (char ch : name) seed = (seed ^ uint8_t(ch)) * 0x100000001B3ull;
  return seed;
}

}  // namespace

std::vector<std::pair<std::string, int>> parse_trellis_k_map(std::string_view spec) {
  std::vector<std::pair<std::string, int>> out;
  size_t a = 0;
  while (a < spec.size()) {
    size_t b = spec.find(',', a);
    if (b == std::string_view::npos) b = spec.size();
    const std::string_view item = spec.substr(a, b - a);
    a = b + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    ARBOR_CHECK(eq != std::string_view::npos && eq > 0 && eq + 1 < item.size(), "--k-map: '{}' is not module=k (e.g. down_proj=4)", item);
    const std::string_view kv = item.substr(eq + 1);
    ARBOR_CHECK(kv == "2" || kv == "3" || kv == "4", "--k-map: '{}': k must be 2, 3 or 4", item);
    out.emplace_back(std::string(item.substr(0, eq)), kv[0] - '0');
  }
  return out;
}

void check_trellis_recipe(const TrellisRecipe& r, std::string_view what) {
  ARBOR_CHECK(r.bits >= 2 && r.bits <= 4, "{}: trellis bits {} (supported: 2, 3, 4)", what, r.bits);
  ARBOR_CHECK(r.down_axis == 0 || r.down_axis == 1, "{}: down axis {} (0 or 1)", what, r.down_axis);
  ARBOR_CHECK(r.axis == 0 || r.axis == 1, "{}: axis {} (0 or 1)", what, r.axis);
  for (const auto& [m, k] : r.k_map) ARBOR_CHECK(k >= 2 && k <= 4, "{}: k-map {}={} (k: 2, 3, 4)", what, m, k);
}

std::optional<TrellisConfig> trellis_recipe_config(const TrellisRecipe& r, const std::string& module, int64_t out, int64_t in,
                                                   std::string* why) {
  if (r.dense.count(module)) {
    if (why) *why = "kept dense (embedding or head)";
    return std::nullopt;
  }
  TrellisConfig c;
  c.bits = r.bits;
  for (const auto& [key, k] : r.k_map)
    if (module_matches(module, key)) c.bits = k;  // the last matching entry wins
  const bool fused = std::any_of(r.fused.begin(), r.fused.end(), [&](const std::string& key) { return module_matches(module, key); });
  c.axis = module_matches(module, r.down_suffix) ? r.down_axis : fused ? 1 : r.axis;
  const int64_t coded = c.axis == 1 ? in : out;
  if (coded % c.group_size != 0) {
    if (why) *why = fmt::format("axis {}: coded length {} is not a multiple of {}", c.axis, coded, c.group_size);
    return std::nullopt;
  }
  return c;
}

json trellis_quant_block(int default_bits, const std::vector<std::pair<std::string, TrellisConfig>>& modules) {
  TrellisConfig d;
  d.bits = default_bits;
  json q = trellis_config_json(d);
  for (const auto& [m, c] : modules) q[m] = trellis_config_json(c);
  return q;
}

std::vector<int64_t> trellis_weight_shape(const TrellisConfig& c, int64_t out, int64_t in) {
  return c.axis == 1 ? std::vector<int64_t>{out, in * c.bits / 32} : std::vector<int64_t>{in, out * c.bits / 32};
}
std::vector<int64_t> trellis_scales_shape(const TrellisConfig& c, int64_t out, int64_t in) {
  return {c.axis == 1 ? out : in};
}

void trellis_synth_matrix(const std::string& weight_name, const TrellisConfig& c, int64_t out, int64_t in, uint32_t* words,
                          uint16_t* scales_f16, ThreadPool* pool) {
  const uint64_t seed = name_seed(weight_name);
  const int64_t rows = c.axis == 1 ? out : in, cols = c.axis == 1 ? in : out;
  if (words) {
    const int64_t n = rows * cols * c.bits / 32;
    auto fill = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) words[i] = uint32_t(mix(seed + uint64_t(i + 1) * 0x9E3779B97F4A7C15ull) >> 32);
    };
    if (pool && n >= (int64_t(1) << 20)) pool->parallel_for(n, int64_t(1) << 16, [&](int, int64_t b, int64_t e) { fill(b, e); });
    else fill(0, n);
  }
  if (scales_f16) {
    const double target = 1.0 / std::sqrt(3.0 * double(in)) / trellis_code_rms(c.L);
    const uint64_t sseed = mix(seed ^ 0x5CA1E5ull);
    for (int64_t r = 0; r < rows; ++r) {
      const double u = double(mix(sseed + uint64_t(r + 1) * 0x9E3779B97F4A7C15ull) >> 40) / double(1 << 24);
      scales_f16[r] = f32_to_f16(float(target * (0.9 + 0.2 * u)));
    }
  }
}

TrellisSynthStats write_trellis_synthetic_checkpoint(const json& config_json, const std::vector<TrellisSynthTensor>& tensors,
                                                     const std::string& out_dir, DType dtype, const TrellisRecipe& recipe,
                                                     uint64_t shard_bytes,
                                                     const std::function<void(const TrellisSynthTensor&, void*)>& fill_dense,
                                                     const std::function<void(uint64_t)>& progress, ThreadPool* pool) {
  check_trellis_recipe(recipe, "synth");
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) fail("synth: dense tensors cannot be {} (F32, F16 or BF16)", dtype_name(dtype));
  std::vector<TensorHeader> plan;
  std::vector<std::optional<TrellisConfig>> cfgs;
  std::vector<std::pair<std::string, TrellisConfig>> modules;
  TrellisSynthStats st;
  for (const auto& t : tensors) {
    std::optional<TrellisConfig> c;
    if (t.name.size() > 7 && ends_with(t.name, ".weight") && t.shape.size() == 2)
      c = trellis_recipe_config(recipe, t.name.substr(0, t.name.size() - 7), t.shape[0], t.shape[1]);
    if (c) {
      const std::string m = t.name.substr(0, t.name.size() - 7);
      plan.push_back({m + ".weight", DType::U32, trellis_weight_shape(*c, t.shape[0], t.shape[1])});
      plan.push_back({m + ".scales", DType::F16, trellis_scales_shape(*c, t.shape[0], t.shape[1])});
      modules.emplace_back(m, *c);
      st.modules_coded++;
    } else {
      plan.push_back({t.name, dtype, t.shape});
    }
    cfgs.push_back(c);
  }
  std::filesystem::create_directories(out_dir);
  json cfg = config_json;
  const json q = trellis_quant_block(recipe.bits, modules);
  cfg["quantization"] = q;
  cfg["quantization_config"] = q;
  {
    std::ofstream f(out_dir + "/config.json");
    f << cfg.dump(2) << "\n";
    if (!f) fail("synth: cannot write {}/config.json", out_dir);
  }
  ShardedSafetensorsWriter w(out_dir, plan, shard_bytes, json{{"format", "mlx"}});
  std::vector<uint8_t> buf;
  std::vector<uint16_t> scales;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (const auto& c = cfgs[i]) {
      const std::string m = t.name.substr(0, t.name.size() - 7);
      const auto ws = trellis_weight_shape(*c, t.shape[0], t.shape[1]);
      buf.resize(size_t(ws[0] * ws[1]) * 4);
      scales.resize(size_t(trellis_scales_shape(*c, t.shape[0], t.shape[1])[0]));
      trellis_synth_matrix(t.name, *c, t.shape[0], t.shape[1], reinterpret_cast<uint32_t*>(buf.data()), scales.data(), pool);
      w.write(m + ".weight", buf.data(), buf.size());
      w.write(m + ".scales", scales.data(), scales.size() * 2);
      st.tensors += 2;
      st.bytes += buf.size() + scales.size() * 2;
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
