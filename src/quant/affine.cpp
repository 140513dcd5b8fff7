// MLX affine quantization: reference quantize/dequantize and the config block.
#include "quant/affine.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace arbor::quant {

bool affine_bits_supported(int bits) { return std::find(std::begin(kAffineBits), std::end(kAffineBits), bits) != std::end(kAffineBits); }
bool affine_group_supported(int g) {
  return std::find(std::begin(kAffineGroupSizes), std::end(kAffineGroupSizes), g) != std::end(kAffineGroupSizes);
}

void check_affine_params(const AffineParams& p, std::string_view what) {
  if (!affine_bits_supported(p.bits)) fail("{}: bits {} is not supported (MLX affine: 2, 3, 4, 5, 6 or 8)", what, p.bits);
  if (!affine_group_supported(p.group_size))
    fail("{}: group_size {} is not supported (MLX affine: 32, 64 or 128)", what, p.group_size);
}

AffineShape affine_shape(int64_t rows, int64_t cols, const AffineParams& p, std::string_view what) {
  check_affine_params(p, what);
  if (rows < 0 || cols <= 0) fail("{}: shape [{}, {}] cannot be quantized", what, rows, cols);
  if (cols % p.group_size != 0)
    fail("{}: a row of {} values does not divide into groups of {} ({} left over)", what, cols, p.group_size, cols % p.group_size);
  return AffineShape{rows, cols, p};
}

AffineGroup affine_group_params(const float* w, int n, int bits) {
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  float w_min = FLT_MAX, w_max = 0.0f;  // as MLX's Metal and CUDA kernels start them
  for (int i = 0; i < n; ++i) {
    w_min = std::min(w_min, w[i]);
    w_max = std::max(w_max, w[i]);
  }
  float scale = std::max((w_max - w_min) / n_bins, eps);
  const bool side = std::fabs(w_min) > std::fabs(w_max);
  scale = side ? scale : -scale;
  const float edge = side ? w_min : w_max;
  const float q0 = std::round(edge / scale);
  AffineGroup g;
  if (q0 != 0.0f) {
    g.scale = edge / q0;
    g.bias = edge;
  } else {
    g.scale = scale;
    g.bias = 0.0f;
  }
  return g;
}

uint32_t affine_code(float w, const AffineGroup& g, int bits) {
  const float n_bins = float((1 << bits) - 1);
  float v = std::round((w - g.bias) / g.scale);
  v = std::min(v, n_bins);
  v = std::max(v, 0.0f);  // only ever turns -0 into 0: the edge anchoring keeps (w - bias) / scale >= 0
  return uint32_t(v);
}

void affine_quantize_row(const float* w, int64_t cols, const AffineParams& p, uint32_t* packed, float* scales, float* biases) {
  std::fill(packed, packed + cols * p.bits / 32, 0u);
  for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += p.group_size, ++gi) {
    const AffineGroup g = affine_group_params(w + g0, p.group_size, p.bits);
    scales[gi] = g.scale;
    biases[gi] = g.bias;
    for (int i = 0; i < p.group_size; ++i) affine_or_code(packed, g0 + i, p.bits, affine_code(w[g0 + i], g, p.bits));
  }
}

namespace {

// x rounded to `t` and back (the cast mlx-lm applies to a model's weights before it quantizes them).
float round_to(float x, DType t) {
  switch (t) {
    case DType::F16: return f16_to_f32(f32_to_f16(x));
    case DType::BF16: return bf16_to_f32(f32_to_bf16(x));
    default: return x;
  }
}

void store(void* p, DType t, int64_t i, float x) {
  if (t == DType::F32) {
    std::memcpy(static_cast<uint8_t*>(p) + 4 * i, &x, 4);
  } else {
    const uint16_t h = t == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
    std::memcpy(static_cast<uint8_t*>(p) + 2 * i, &h, 2);
  }
}

}  // namespace

void affine_quantize(const void* src, DType src_dtype, const AffineShape& s, uint32_t* packed, void* scales, void* biases,
                     DType out_dtype, std::string_view what, ThreadPool* pool) {
  if (!float_dtype(src_dtype)) fail("{}: cannot quantize a {} tensor (F32, F16 or BF16)", what, dtype_name(src_dtype));
  if (!float_dtype(out_dtype)) fail("{}: scales and biases cannot be {} (F32, F16 or BF16)", what, dtype_name(out_dtype));
  affine_shape(s.rows, s.cols, s.p, what);
  const int64_t words = s.words_per_row(), groups = s.groups_per_row();
  auto rows = [&](int64_t r0, int64_t r1) {
    std::vector<float> w(static_cast<size_t>(s.cols)), sc(static_cast<size_t>(groups)), bi(static_cast<size_t>(groups));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < s.cols; ++j) {
        const float x = load_float(src, src_dtype, r * s.cols + j);
        if (!std::isfinite(x)) fail("{}: value [{}, {}] is {}; only finite weights can be quantized", what, r, j, x);
        w[size_t(j)] = src_dtype == out_dtype ? x : round_to(x, out_dtype);
      }
      affine_quantize_row(w.data(), s.cols, s.p, packed + r * words, sc.data(), bi.data());
      for (int64_t g = 0; g < groups; ++g) {
        store(scales, out_dtype, r * groups + g, sc[size_t(g)]);
        store(biases, out_dtype, r * groups + g, bi[size_t(g)]);
      }
    }
  };
  if (pool && s.rows > 1) pool->parallel_for(s.rows, 1, [&](int, int64_t a, int64_t b) { rows(a, b); });
  else rows(0, s.rows);
}

void affine_dequantize(const uint32_t* packed, const void* scales, const void* biases, DType dtype, const AffineShape& s,
                       float* out) {
  const int64_t words = s.words_per_row(), groups = s.groups_per_row();
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t j = 0; j < s.cols; ++j) {
      const int64_t g = r * groups + j / s.p.group_size;
      const float q = float(affine_get_code(packed + r * words, j, s.p.bits));
      const float prod = load_float(scales, dtype, g) * q;  // a separate rounding: this file is built without FMA contraction
      out[r * s.cols + j] = prod + load_float(biases, dtype, g);
    }
}

std::optional<AffineParams> AffineQuantConfig::for_module(std::string_view path) const {
  auto it = modules.find(path);
  if (it != modules.end()) return it->second;
  return defaults;
}

std::optional<TrellisConfig> AffineQuantConfig::trellis_for(std::string_view path) const {
  if (auto it = trellis.find(path); it != trellis.end()) return it->second;
  if (modules.find(path) != modules.end()) return std::nullopt;
  return trellis_default;
}

json AffineQuantConfig::to_json() const {
  json j = trellis_default ? trellis_config_json(*trellis_default)
                           : json{{"group_size", defaults.group_size}, {"bits", defaults.bits}, {"mode", "affine"}};
  for (const auto& [k, v] : modules)
    j[k] = v ? json{{"group_size", v->group_size}, {"bits", v->bits}, {"mode", "affine"}} : json(false);
  for (const auto& [k, v] : trellis) j[k] = trellis_config_json(v);
  return j;
}

namespace {

int int_field(const json& o, const char* key, std::string_view where) {
  auto it = o.find(key);
  if (it == o.end()) fail("{}: '{}' is missing", where, key);
  if (!it->is_number_integer()) fail("{}: '{}' is a JSON {} ({}), not an integer", where, key, it->type_name(), it->dump());
  return it->get<int>();
}

void check_mode(const json& o, std::string_view where) {
  auto it = o.find("mode");
  if (it == o.end()) return;
  if (!it->is_string() || it->get<std::string>() != "affine")
    fail("{}: mode {} is not supported (only \"affine\")", where, it->dump());
}

AffineParams params_of(const json& o, std::string_view where) {
  AffineParams p{int_field(o, "group_size", where), int_field(o, "bits", where)};
  check_mode(o, where);
  check_affine_params(p, where);
  return p;
}

}  // namespace

std::optional<AffineQuantConfig> parse_affine_quant_config(const json& config, std::string_view where) {
  if (!config.is_object()) return std::nullopt;
  const char* key = config.contains("quantization") ? "quantization" : config.contains("quantization_config") ? "quantization_config" : nullptr;
  if (!key) return std::nullopt;
  const json& q = config[key];
  const std::string at = fmt::format("{}: {}", where, key);
  if (!q.is_object()) fail("{}: is a JSON {}, not an object", at, q.type_name());
  if (auto m = q.find("quant_method"); m != q.end())
    fail("{}: quant_method {} is another format (arbor reads MLX affine blocks: group_size, bits, mode \"affine\")", at, m->dump());
  AffineQuantConfig c;
  if (is_trellis_entry(q)) c.trellis_default = parse_trellis_config(q, fmt::format("(default; {})", at));
  else c.defaults = params_of(q, at);
  for (auto it = q.begin(); it != q.end(); ++it) {
    const std::string& k = it.key();
    if (k == "group_size" || k == "bits" || k == "mode" || (c.trellis_default && k == "trellis")) continue;
    const std::string mat = fmt::format("{}: module '{}'", at, k);
    if (is_trellis_entry(*it)) {
      c.trellis[k] = parse_trellis_config(*it, k);
    } else if (it->is_boolean() && it->get<bool>() && c.trellis_default) {
      c.trellis[k] = *c.trellis_default;
    } else if (it->is_boolean()) {
      c.modules[k] = it->get<bool>() ? std::optional<AffineParams>(c.defaults) : std::nullopt;
    } else if (it->is_object()) {
      c.modules[k] = params_of(*it, mat);
    } else {
      fail("{}: is a JSON {} ({}); a module entry is an object with group_size and bits, or false", mat, it->type_name(),
           it->dump());
    }
  }
  return c;
}

}  // namespace arbor::quant
