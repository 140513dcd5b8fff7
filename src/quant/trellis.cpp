// Trellis config parsing, tensor geometry checks, the k = 3 interleave, and the host decode reference.
#include "quant/trellis.h"

#include <cmath>

#include "core/error.h"

namespace arbor::quant {

void check_trellis_params(const TrellisParams& p, bool packed) {
  ARBOR_CHECK(p.k >= 1 && p.L >= p.k && p.L <= 16 && p.T >= 2 && p.T * p.k >= p.L,
              "trellis: unsupported code shape k={} L={} T={} (need 1 <= k <= L <= 16, T*k >= L)", p.k, p.L, p.T);
  ARBOR_CHECK(!packed || p.T * p.k % 32 == 0, "trellis: a block of T={} weights at k={} is {} bits, not whole 32-bit words",
              p.T, p.k, p.T * p.k);
}

std::vector<float> trellis_code_table(int L) {
  std::vector<float> v(size_t(1) << L);
  for (uint32_t s = 0; s < v.size(); ++s) v[s] = trellis_1mad_value(s);
  return v;
}

double trellis_code_rms(int L) {
  double sum = 0;
  const uint32_t n = 1u << L;
  for (uint32_t s = 0; s < n; ++s) {
    const double v = trellis_1mad_value(s);
    sum += v * v;
  }
  return std::sqrt(sum / n);
}

void trellis_decode_block(const uint32_t* block, const TrellisParams& p, float scale, float* out) {
  for (int t = 0; t < p.T; ++t) out[t] = trellis_1mad_value(trellis_state(block, p, t)) * scale;
}

void trellis_decode_row(const uint32_t* row, int64_t cols, const TrellisParams& p, float scale, float* out) {
  const int64_t blocks = cols / p.T;
  for (int64_t b = 0; b < blocks; ++b) trellis_decode_block(row + b * p.words_per_block(), p, scale, out + b * p.T);
}

bool is_trellis_entry(const json& entry) {
  return entry.is_object() && entry.contains("mode") && entry["mode"].is_string() && entry["mode"] == "trellis";
}

namespace {

int int_field(const json& obj, const char* key, const std::string& where, const std::string& module) {
  ARBOR_CHECK(obj.contains(key), "trellis: module '{}': {} has no \"{}\"", module, where, key);
  const json& v = obj[key];
  ARBOR_CHECK(v.is_number_integer(), "trellis: module '{}': {}\"{}\" is {}, expected an integer", module, where, key,
              v.dump());
  return v.get<int>();
}

}  // namespace

TrellisConfig parse_trellis_config(const json& entry, const std::string& module) {
  ARBOR_CHECK(entry.is_object(), "trellis: module '{}': quantization entry is {}, expected an object", module,
              entry.dump());
  ARBOR_CHECK(is_trellis_entry(entry), "trellis: module '{}': quantization entry has mode {}, expected \"trellis\"",
              module, entry.contains("mode") ? entry["mode"].dump() : std::string("(none)"));
  TrellisConfig c;
  c.bits = int_field(entry, "bits", "entry", module);
  ARBOR_CHECK(c.bits >= 2 && c.bits <= 4, "trellis: module '{}': bits {} (supported: 2, 3, 4)", module, c.bits);
  c.group_size = int_field(entry, "group_size", "entry", module);
  ARBOR_CHECK(c.group_size == 256, "trellis: module '{}': group_size {} (the trellis block is 256 weights)", module,
              c.group_size);
  ARBOR_CHECK(entry.contains("trellis") && entry["trellis"].is_object(),
              "trellis: module '{}': entry has no \"trellis\" object (L, code, axis)", module);
  const json& tr = entry["trellis"];
  c.L = int_field(tr, "L", "\"trellis\" ", module);
  ARBOR_CHECK(c.L == 12, "trellis: module '{}': L {} (supported: 12)", module, c.L);
  ARBOR_CHECK(tr.contains("code") && tr["code"].is_string() && tr["code"] == "1mad",
              "trellis: module '{}': code {} (supported: \"1mad\")", module,
              tr.contains("code") ? tr["code"].dump() : std::string("(none)"));
  c.axis = int_field(tr, "axis", "\"trellis\" ", module);
  ARBOR_CHECK(c.axis == 0 || c.axis == 1, "trellis: module '{}': axis {} (supported: 0, 1)", module, c.axis);
  return c;
}

json trellis_config_json(const TrellisConfig& c) {
  return json{{"mode", "trellis"}, {"bits", c.bits}, {"group_size", c.group_size},
              {"trellis", {{"L", c.L}, {"code", "1mad"}, {"axis", c.axis}}}};
}

TrellisGeometry trellis_geometry(const std::string& name, const TrellisConfig& cfg, const Tensor& weight,
                                 const Tensor& scales, int64_t expect_out, int64_t expect_in) {
  TrellisGeometry g;
  g.params = cfg.params();
  g.axis = cfg.axis;
  check_trellis_params(g.params, true);
  const int k = g.params.k, T = g.params.T, wpb = g.params.words_per_block();
  ARBOR_CHECK(weight.dtype == DType::U32, "trellis: '{}': weight is {}, expected U32 codes", name,
              dtype_name(weight.dtype));
  if (weight.ndim == 3) {
    // Interleaved k = 3 axis-0 layout: [cols/512, rows, 48], a 48-word row holding two 24-word blocks.
    ARBOR_CHECK(k == 3 && cfg.axis == 0 && T == 256 && weight.shape[2] == 2 * wpb,
                "trellis: '{}': weight {} is 3-D; only the k=3 axis-0 interleaved layout [cols/512, rows, 48] is "
                "3-D (this module: k={} axis={})",
                name, weight.shape_str(), k, cfg.axis);
    ARBOR_CHECK(weight.shape[0] >= 1 && weight.shape[1] >= 1, "trellis: '{}': interleaved weight {} is empty", name,
                weight.shape_str());
    g.interleaved = true;
    g.rows = weight.shape[1];
    g.cols = weight.shape[0] * 2 * T;
  } else {
    ARBOR_CHECK(weight.ndim == 2, "trellis: '{}': weight {} must be 2-D [rows, cols*{}/32]", name, weight.shape_str(), k);
    const int64_t words = weight.shape[1];
    ARBOR_CHECK(weight.shape[0] >= 1 && words >= 1, "trellis: '{}': weight {} is empty", name, weight.shape_str());
    ARBOR_CHECK(words % wpb == 0,
                "trellis: '{}': weight {} has {} words per row, not a whole number of {}-word blocks ({} weights at "
                "k={}); the coded columns must be a multiple of {}",
                name, weight.shape_str(), words, wpb, T, k, T);
    g.rows = weight.shape[0];
    g.cols = words / wpb * T;
  }
  g.in_features = cfg.axis == 1 ? g.cols : g.rows;
  g.out_features = cfg.axis == 1 ? g.rows : g.cols;
  ARBOR_CHECK(scales.dtype == DType::F16, "trellis: '{}': scales are {}, expected F16", name, dtype_name(scales.dtype));
  ARBOR_CHECK(scales.numel() == g.rows && (scales.ndim == 1 || (scales.ndim == 2 && scales.shape[1] == 1)),
              "trellis: '{}': scales {} do not match the {} coded rows of weight {} (expected [{}])", name,
              scales.shape_str(), g.rows, weight.shape_str(), g.rows);
  if (expect_out >= 0 || expect_in >= 0) {
    ARBOR_CHECK(g.out_features == expect_out && g.in_features == expect_in,
                "trellis: '{}': weight {} at k={} axis={} decodes to [{}, {}], expected [{}, {}]", name,
                weight.shape_str(), k, cfg.axis, g.out_features, g.in_features, expect_out, expect_in);
  }
  return g;
}

namespace {

// Copies between the interleaved [cols/512, rows, 48] and plain [rows, cols*3/32] layouts.
template <bool ToPlain>
std::vector<uint32_t> reorder_k3(const uint32_t* src, int64_t rows, int64_t cols) {
  constexpr int64_t kPair = 48;  // two 24-word k=3 blocks
  ARBOR_CHECK(rows >= 1 && cols >= 512 && cols % 512 == 0,
              "trellis: k=3 interleave needs whole 512-column block pairs, got [{}, {}]", rows, cols);
  const int64_t groups = cols / 512, row_words = groups * kPair;
  std::vector<uint32_t> dst(size_t(rows * row_words));
  for (int64_t gi = 0; gi < groups; ++gi)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t inter = (gi * rows + r) * kPair, plain = r * row_words + gi * kPair;
      for (int64_t w = 0; w < kPair; ++w) {
        if (ToPlain)
          dst[size_t(plain + w)] = src[inter + w];
        else
          dst[size_t(inter + w)] = src[plain + w];
      }
    }
  return dst;
}

}  // namespace

std::vector<uint32_t> trellis_deinterleave_k3(const uint32_t* interleaved, int64_t rows, int64_t cols) {
  return reorder_k3<true>(interleaved, rows, cols);
}

std::vector<uint32_t> trellis_interleave_k3(const uint32_t* plain, int64_t rows, int64_t cols) {
  return reorder_k3<false>(plain, rows, cols);
}

std::vector<float> trellis_decode_linear(const TrellisGeometry& g, const uint32_t* words, const uint16_t* scales_f16) {
  std::vector<float> out(size_t(g.rows * g.cols));
  std::vector<float> row(g.axis == 0 ? size_t(g.cols) : 0);
  const int64_t wpr = g.words_per_row();
  for (int64_t r = 0; r < g.rows; ++r) {
    const float scale = f16_to_f32(scales_f16[r]);
    if (g.axis == 1) {
      trellis_decode_row(words + r * wpr, g.cols, g.params, scale, out.data() + r * g.cols);
    } else {  // stored row r is input column r of the [out = cols, in = rows] weight
      trellis_decode_row(words + r * wpr, g.cols, g.params, scale, row.data());
      for (int64_t c = 0; c < g.cols; ++c) out[size_t(c * g.rows + r)] = row[size_t(c)];
    }
  }
  return out;
}

std::vector<float> trellis_decode_linear(const TrellisGeometry& g, const Tensor& weight, const Tensor& scales) {
  const auto* scale_bits = scales.as<const uint16_t>();
  if (!g.interleaved) return trellis_decode_linear(g, weight.as<const uint32_t>(), scale_bits);
  const std::vector<uint32_t> plain = trellis_deinterleave_k3(weight.as<const uint32_t>(), g.rows, g.cols);
  return trellis_decode_linear(g, plain.data(), scale_bits);
}

}  // namespace arbor::quant
