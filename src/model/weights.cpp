// Weight specs, binding and dummy generation.
#include "model/weights.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/hash.h"
#include "core/thread_pool.h"

namespace arbor {

namespace {

std::string layer_name(const ArchDescriptor& a, int64_t i, const std::string& suffix) {
  return fmt::format(fmt::runtime(a.names.layer), i) + suffix;
}

bool has_norm_bias(const ArchDescriptor& a) { return a.norm == NormKind::LayerNorm; }

}  // namespace

void for_each_weight(const ModelConfig& c, const ArchDescriptor& a, ModelWeights* m, const std::function<void(const WeightSlot&)>& fn) {
  const int64_t H = c.hidden_size, F = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
  const bool qkv_bias = c.attention_bias || a.qkv_bias;
  if (m && m->layers.empty()) m->layers.resize(size_t(c.n_layers));
  ARBOR_CHECK(!m || int64_t(m->layers.size()) == c.n_layers, "model: weights for {} layers, the config has {}", m->layers.size(),
              c.n_layers);
  WeightSlot s;
  auto vec = [&](std::string name, int64_t dim, Tensor* dst) {
    s = WeightSlot{};
    s.kind = WeightSlot::Kind::Vector, s.name = std::move(name), s.rows = dim, s.vec = m ? dst : nullptr;
    fn(s);
  };
  // A matrix [sum of parts' rows, cols]; parts: (destination in the layer, rows).
  auto mat = [&](std::string name, int64_t cols, bool bias, std::initializer_list<std::pair<Linear*, int64_t>> parts) {
    s = WeightSlot{};
    s.kind = WeightSlot::Kind::Matrix, s.name = std::move(name), s.cols = cols, s.bias = bias;
    for (const auto& [dst, rows] : parts) {
      s.rows += rows;
      if (m) s.parts.emplace_back(dst, rows);
    }
    fn(s);
  };
  // Module path of a tensor name that ends in ".weight" (the descriptor names the embedding and head
  // by their tensors).
  auto module = [](const std::string& tensor) {
    ARBOR_CHECK(tensor.size() > 7 && tensor.compare(tensor.size() - 7, 7, ".weight") == 0,
                "model: descriptor tensor name '{}' does not end in .weight", tensor);
    return tensor.substr(0, tensor.size() - 7);
  };

  mat(module(a.names.embed), H, false, {{m ? &m->embed : nullptr, c.vocab_size}});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    LayerWeights* L = m ? &m->layers[size_t(i)] : nullptr;
    auto at = [&](Linear LayerWeights::*f) { return L ? &(L->*f) : nullptr; };
    auto vt = [&](Tensor LayerWeights::*f) { return L ? &(L->*f) : nullptr; };
    auto name = [&](const std::string& suffix) { return layer_name(a, i, suffix); };
    auto norm = [&](const std::string& n, int64_t dim, Tensor LayerWeights::*w, Tensor LayerWeights::*b) {
      if (n.empty()) return;
      vec(name(n + ".weight"), dim, vt(w));
      if (has_norm_bias(a)) vec(name(n + ".bias"), dim, b ? vt(b) : nullptr);
    };
    norm(a.names.attn_norm, H, &LayerWeights::attn_norm, &LayerWeights::attn_norm_b);
    if (!a.names.qkv.empty()) {
      mat(name(a.names.qkv), H, qkv_bias, {{at(&LayerWeights::q), Q}, {at(&LayerWeights::k), KV}, {at(&LayerWeights::v), KV}});
    } else {
      mat(name(a.names.q), H, qkv_bias, {{at(&LayerWeights::q), Q}});
      mat(name(a.names.k), H, qkv_bias, {{at(&LayerWeights::k), KV}});
      mat(name(a.names.v), H, qkv_bias, {{at(&LayerWeights::v), KV}});
    }
    mat(name(a.names.o), Q, c.attention_bias && a.o_bias_with_attention_bias, {{at(&LayerWeights::o), H}});
    if (a.qk_norm == QKNormKind::PerHead) {
      vec(name(a.names.q_norm + ".weight"), c.head_dim, vt(&LayerWeights::q_norm));
      vec(name(a.names.k_norm + ".weight"), c.head_dim, vt(&LayerWeights::k_norm));
    } else if (a.qk_norm == QKNormKind::Full) {
      vec(name(a.names.q_norm + ".weight"), Q, vt(&LayerWeights::q_norm));
      vec(name(a.names.k_norm + ".weight"), KV, vt(&LayerWeights::k_norm));
    }
    norm(a.names.post_attn_norm, H, &LayerWeights::post_attn_norm, nullptr);
    norm(a.names.mlp_norm, H, &LayerWeights::mlp_norm, &LayerWeights::mlp_norm_b);
    norm(a.names.pre_mlp_norm, H, &LayerWeights::mlp_norm, &LayerWeights::mlp_norm_b);
    norm(a.names.post_mlp_norm, H, &LayerWeights::post_mlp_norm, nullptr);
    if (a.mlp == MlpKind::Gated) {
      if (!a.names.gate_up.empty()) {
        mat(name(a.names.gate_up), H, c.mlp_bias, {{at(&LayerWeights::gate), F}, {at(&LayerWeights::up), F}});
      } else {
        mat(name(a.names.gate), H, c.mlp_bias, {{at(&LayerWeights::gate), F}});
        mat(name(a.names.up), H, c.mlp_bias, {{at(&LayerWeights::up), F}});
      }
    } else {
      mat(name(a.names.up), H, c.mlp_bias, {{at(&LayerWeights::up), F}});
    }
    mat(name(a.names.down), F, c.mlp_bias, {{at(&LayerWeights::down), H}});
  }
  vec(a.names.final_norm + ".weight", H, m ? &m->final_norm : nullptr);
  if (has_norm_bias(a)) vec(a.names.final_norm + ".bias", H, m ? &m->final_norm_b : nullptr);
  if (!c.tie_word_embeddings) mat(module(a.names.lm_head), H, false, {{m ? &m->lm_head : nullptr, c.vocab_size}});
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c, const ArchDescriptor& a) {
  std::vector<TensorSpec> out;
  for_each_weight(c, a, nullptr, [&](const WeightSlot& s) {
    if (s.kind == WeightSlot::Kind::Vector) {
      out.push_back({s.name, {s.rows}});
      return;
    }
    out.push_back({s.name + ".weight", {s.rows, s.cols}});
    if (s.bias) out.push_back({s.name + ".bias", {s.rows}});
  });
  return out;
}

namespace {

Tensor get_bias(const WeightSlot& s, const std::function<Tensor(const TensorSpec&)>& get) {
  Tensor b = get({s.name + ".bias", {s.rows}});
  ARBOR_CHECK(float_dtype(b.dtype), "model: tensor '{}.bias' has dtype {}; supported: F32, F16, BF16", s.name, dtype_name(b.dtype));
  return b;
}

// A trellis matrix: .weight U32 (axis 1 [out, in*k/32]; axis 0 [in, out*k/32], or k = 3 interleaved
// [out/512, in, 48]) and .scales F16 [coded rows], checked by quant::trellis_geometry (errors name the tensor).
Linear trellis_linear(const WeightSlot& s, const quant::TrellisConfig& tc, const std::function<Tensor(const TensorSpec&)>& get,
                      const QuantizedSource& q) {
  const std::string wname = s.name + ".weight", sname = s.name + ".scales";
  ARBOR_CHECK(!q.has(s.name + ".biases"), "model: tensor '{}.biases' is in the checkpoint but config.json makes '{}' a trellis module "
              "(a scale per coded row, no biases)", s.name, s.name);
  const int64_t coded_rows = tc.axis == 1 ? s.rows : s.cols, coded_cols = tc.axis == 1 ? s.cols : s.rows;
  std::vector<int64_t> wshape = {coded_rows, coded_cols * tc.bits / 32}, sshape = {coded_rows};
  if (q.shape) wshape = q.shape(wname), sshape = q.shape(sname);
  Linear l;
  l.format = WeightFormat::Trellis, l.bits = tc.bits, l.group_size = tc.group_size, l.axis = tc.axis;
  l.data = get({wname, wshape});
  l.scales = get({sname, sshape});
  quant::trellis_geometry(wname, tc, l.data, l.scales, s.rows, s.cols);
  if (l.scales.ndim == 2) l.scales = Tensor(l.scales.data, l.scales.dtype, {coded_rows});
  if (s.bias) l.bias = get_bias(s, get);
  l.n_rows = s.rows, l.n_cols = s.cols;
  return l;
}

// The host Linear of a matrix slot, from its tensors (dense: .weight [rows, cols]; affine: .weight U32
// [rows, cols*bits/32], .scales and .biases [rows, cols/group]; .bias [rows]). The one place that reads a
// matrix's tensors.
Linear host_linear(const WeightSlot& s, const std::function<Tensor(const TensorSpec&)>& get, const QuantizedSource& q) {
  const std::string wname = s.name + ".weight", sname = s.name + ".scales", bname = s.name + ".biases";
  Linear l;
  if (q.has && q.has(sname)) {
    ARBOR_CHECK(q.affine, "model: tensor '{}' is in the checkpoint but config.json has no quantization block", sname);
    if (const std::optional<quant::TrellisConfig> tc = q.affine->trellis_for(s.name)) return trellis_linear(s, *tc, get, q);
    const std::optional<quant::AffineParams> p = q.affine->for_module(s.name);
    ARBOR_CHECK(p, "model: tensor '{}' is in the checkpoint but config.json's quantization keeps '{}' dense (false)", sname, s.name);
    quant::check_affine_params(*p, fmt::format("model: {}", sname));
    ARBOR_CHECK(s.cols % p->group_size == 0, "model: {}: {} columns do not divide into groups of {}", wname, s.cols, p->group_size);
    ARBOR_CHECK(q.has(bname), "model: tensor '{}' is missing ('{}' is in the checkpoint: an affine module needs both)", bname, sname);
    l.format = WeightFormat::Affine, l.bits = p->bits, l.group_size = p->group_size;
    l.data = get({wname, {s.rows, s.cols * p->bits / 32}});
    ARBOR_CHECK(l.data.dtype == DType::U32, "model: tensor '{}' has dtype {}; an affine matrix's codes are U32", wname, dtype_name(l.data.dtype));
    l.scales = get({sname, {s.rows, s.cols / p->group_size}});
    l.biases = get({bname, {s.rows, s.cols / p->group_size}});
    for (const auto& [t, n] : {std::pair{&l.scales, &sname}, std::pair{&l.biases, &bname}})
      ARBOR_CHECK(float_dtype(t->dtype), "model: tensor '{}' has dtype {}; supported: F32, F16, BF16", *n, dtype_name(t->dtype));
  } else {
    l.data = get({wname, {s.rows, s.cols}});
    ARBOR_CHECK(float_dtype(l.data.dtype), "model: tensor '{}' has dtype {}; a dense matrix is F32, F16 or BF16 (there is no '{}')", wname,
                dtype_name(l.data.dtype), sname);
  }
  if (s.bias) l.bias = get_bias(s, get);
  l.n_rows = s.rows, l.n_cols = s.cols;
  return l;
}

// Rows [r0, r0 + n) of a host matrix (and of its per-row tensors), as a Linear of its own.
Linear linear_rows(const Linear& l, int64_t r0, int64_t n) {
  if (r0 == 0 && n == l.rows()) return l;
  ARBOR_CHECK(l.format == WeightFormat::Dense || l.format == WeightFormat::Affine || (l.format == WeightFormat::Trellis && l.axis == 1),
              "model: cannot split {} weights by rows (a fused matrix coded along its outputs)", l.describe());
  auto slice = [&](const Tensor& t) {
    if (t.empty()) return t;
    if (t.ndim == 1) return Tensor(static_cast<char*>(t.data) + r0 * int64_t(dtype_size(t.dtype)), t.dtype, {n});
    return t.row_slice(r0, n);
  };
  Linear p = l;
  p.n_rows = n;
  p.data = slice(l.data), p.scales = slice(l.scales), p.biases = slice(l.biases), p.bias = slice(l.bias);
  return p;
}

}  // namespace

ModelWeights bind_weights(const ModelConfig& c, const ArchDescriptor& a, const std::function<Tensor(const TensorSpec&)>& get,
                          Backend& backend, const QuantizedSource& quantized) {
  ModelWeights m;
  for_each_weight(c, a, &m, [&](const WeightSlot& s) {
    if (s.kind == WeightSlot::Kind::Vector) {
      Tensor t = get({s.name, {s.rows}});
      ARBOR_CHECK(float_dtype(t.dtype), "model: tensor '{}' has dtype {}; supported: F32, F16, BF16", s.name, dtype_name(t.dtype));
      if (s.vec) *s.vec = backend.load_weight(t);
      return;
    }
    const Linear host = host_linear(s, get, quantized);
    int64_t r0 = 0;
    for (const auto& [dst, n] : s.parts) {
      *dst = backend.load_linear(linear_rows(host, r0, n));
      r0 += n;
    }
  });
  if (c.tie_word_embeddings) m.lm_head = m.embed;
  return m;
}

void fill_dummy(const TensorSpec& s, const ArchDescriptor& a, DType dtype, void* out, ThreadPool* pool) {
  // SplitMix64 seeded by the tensor's name: the same name always gets the same values. Value i
  // depends only on (seed, i), so large tensors can be filled in chunks by the pool.
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (char ch : s.name) seed = (seed ^ uint8_t(ch)) * 0x100000001B3ull;
  auto value_bits = [seed](int64_t i) { return splitmix64_mix(seed + uint64_t(i + 1) * 0x9E3779B97F4A7C15ull); };
  int64_t n = 1;
  for (auto d : s.shape) n *= d;
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16) fail("dummy weights: unsupported dtype {}", dtype_name(dtype));
  const bool is_bias = s.name.size() > 5 && s.name.compare(s.name.size() - 5, 5, ".bias") == 0;
  float center = 0.0f, half_width;
  if (s.shape.size() == 1) {
    center = (is_bias || a.norm == NormKind::RMSPlusOne) ? 0.0f : 1.0f;
    half_width = 0.1f;
  } else {
    half_width = 1.0f / std::sqrt(float(s.shape[1]));
  }
  auto fill = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float u = float(value_bits(i) >> 40) * (1.0f / float(1 << 24));  // [0, 1)
      float v = center + (2 * u - 1) * half_width;
      if (v == 0.0f) v = half_width * 0.5f;
      if (dtype == DType::F32) static_cast<float*>(out)[i] = v;
      else if (dtype == DType::BF16) static_cast<uint16_t*>(out)[i] = f32_to_bf16(v);
      else static_cast<uint16_t*>(out)[i] = f32_to_f16(v);
    }
  };
  if (pool && n >= (int64_t(1) << 20)) pool->parallel_for(n, int64_t(1) << 16, [&](int, int64_t b, int64_t e) { fill(b, e); });
  else fill(0, n);
}

}  // namespace arbor
