// Weight specs, binding and dummy generation.
#include "model/weights.h"

#include <fmt/format.h>

#include <cmath>

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

std::vector<TensorSpec> expected_tensors(const ModelConfig& c, const ArchDescriptor& a) {
  std::vector<TensorSpec> out;
  const int64_t H = c.hidden_size, F = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
  const bool qkv_bias = c.attention_bias || a.qkv_bias;
  auto add = [&](std::string n, std::vector<int64_t> s) { out.push_back({std::move(n), std::move(s)}); };
  auto norm = [&](int64_t i, const std::string& n, int64_t dim) {
    if (n.empty()) return;
    add(layer_name(a, i, n + ".weight"), {dim});
    if (has_norm_bias(a)) add(layer_name(a, i, n + ".bias"), {dim});
  };
  auto lin = [&](int64_t i, const std::string& n, int64_t rows, int64_t cols, bool bias) {
    add(layer_name(a, i, n + ".weight"), {rows, cols});
    if (bias) add(layer_name(a, i, n + ".bias"), {rows});
  };
  add(a.names.embed, {c.vocab_size, H});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    norm(i, a.names.attn_norm, H);
    if (!a.names.qkv.empty()) {
      lin(i, a.names.qkv, Q + 2 * KV, H, qkv_bias);
    } else {
      lin(i, a.names.q, Q, H, qkv_bias);
      lin(i, a.names.k, KV, H, qkv_bias);
      lin(i, a.names.v, KV, H, qkv_bias);
    }
    lin(i, a.names.o, H, Q, c.attention_bias && a.o_bias_with_attention_bias);
    if (a.qk_norm == QKNormKind::PerHead) {
      add(layer_name(a, i, a.names.q_norm + ".weight"), {c.head_dim});
      add(layer_name(a, i, a.names.k_norm + ".weight"), {c.head_dim});
    } else if (a.qk_norm == QKNormKind::Full) {
      add(layer_name(a, i, a.names.q_norm + ".weight"), {Q});
      add(layer_name(a, i, a.names.k_norm + ".weight"), {KV});
    }
    norm(i, a.names.post_attn_norm, H);
    norm(i, a.names.mlp_norm, H);
    norm(i, a.names.pre_mlp_norm, H);
    norm(i, a.names.post_mlp_norm, H);
    if (a.mlp == MlpKind::Gated) {
      if (!a.names.gate_up.empty()) {
        lin(i, a.names.gate_up, 2 * F, H, c.mlp_bias);
      } else {
        lin(i, a.names.gate, F, H, c.mlp_bias);
        lin(i, a.names.up, F, H, c.mlp_bias);
      }
    } else {
      lin(i, a.names.up, F, H, c.mlp_bias);
    }
    lin(i, a.names.down, H, F, c.mlp_bias);
  }
  add(a.names.final_norm + ".weight", {H});
  if (has_norm_bias(a)) add(a.names.final_norm + ".bias", {H});
  if (!c.tie_word_embeddings) add(a.names.lm_head, {c.vocab_size, H});
  return out;
}

ModelWeights bind_weights(const ModelConfig& c, const ArchDescriptor& a, const std::function<Tensor(const TensorSpec&)>& get,
                          Backend& backend) {
  const std::vector<TensorSpec> specs = expected_tensors(c, a);
  std::vector<Tensor> host;
  host.reserve(specs.size());
  for (const auto& s : specs) host.push_back(get(s));
  size_t next = 0;
  auto take = [&](const std::string& name) -> Tensor {
    ARBOR_CHECK(next < specs.size() && specs[next].name == name, "model: weight binding out of order at '{}'", name);
    return host[next++];
  };
  auto maybe = [&](const std::string& name) -> Tensor {
    if (next < specs.size() && specs[next].name == name) return host[next++];
    return Tensor{};
  };
  auto up = [&](const Tensor& t) { return t.empty() ? t : backend.load_weight(t); };
  // Rows [r0, r0+n) of a host matrix / vector, as its own tensor.
  auto rows = [](const Tensor& t, int64_t r0, int64_t n) {
    Tensor s = t.row_slice(r0, n);
    if (t.ndim == 1) s = Tensor(static_cast<char*>(t.data) + r0 * int64_t(dtype_size(t.dtype)), t.dtype, {n});
    return s;
  };
  auto linear = [&](const std::string& base, int64_t i) {
    Linear l;
    l.w = up(take(layer_name(a, i, base + ".weight")));
    l.bias = up(maybe(layer_name(a, i, base + ".bias")));
    return l;
  };
  auto split = [&](const std::string& base, int64_t i, std::vector<int64_t> sizes) {
    Tensor w = take(layer_name(a, i, base + ".weight"));
    Tensor b = maybe(layer_name(a, i, base + ".bias"));
    std::vector<Linear> parts;
    int64_t r0 = 0;
    for (int64_t n : sizes) {
      Linear l;
      l.w = up(rows(w, r0, n));
      if (!b.empty()) l.bias = up(rows(b, r0, n));
      parts.push_back(l);
      r0 += n;
    }
    return parts;
  };

  ModelWeights m;
  Tensor embed_host = take(a.names.embed);
  m.embed = up(embed_host);
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), F = c.intermediate_size;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    LayerWeights L;
    auto norm = [&](const std::string& n, Tensor& w, Tensor* b) {
      if (n.empty()) return;
      w = up(take(layer_name(a, i, n + ".weight")));
      if (b) *b = up(maybe(layer_name(a, i, n + ".bias")));
      else maybe(layer_name(a, i, n + ".bias"));
    };
    norm(a.names.attn_norm, L.attn_norm, &L.attn_norm_b);
    if (!a.names.qkv.empty()) {
      auto p = split(a.names.qkv, i, {Q, KV, KV});
      L.q = p[0], L.k = p[1], L.v = p[2];
    } else {
      L.q = linear(a.names.q, i);
      L.k = linear(a.names.k, i);
      L.v = linear(a.names.v, i);
    }
    L.o = linear(a.names.o, i);
    if (a.qk_norm != QKNormKind::None) {
      L.q_norm = up(take(layer_name(a, i, a.names.q_norm + ".weight")));
      L.k_norm = up(take(layer_name(a, i, a.names.k_norm + ".weight")));
    }
    norm(a.names.post_attn_norm, L.post_attn_norm, nullptr);
    norm(a.names.mlp_norm, L.mlp_norm, &L.mlp_norm_b);
    norm(a.names.pre_mlp_norm, L.mlp_norm, &L.mlp_norm_b);
    norm(a.names.post_mlp_norm, L.post_mlp_norm, nullptr);
    if (a.mlp == MlpKind::Gated) {
      if (!a.names.gate_up.empty()) {
        auto p = split(a.names.gate_up, i, {F, F});
        L.gate = p[0], L.up = p[1];
      } else {
        L.gate = linear(a.names.gate, i);
        L.up = linear(a.names.up, i);
      }
    } else {
      L.up = linear(a.names.up, i);
    }
    L.down = linear(a.names.down, i);
    m.layers.push_back(std::move(L));
  }
  m.final_norm = up(take(a.names.final_norm + ".weight"));
  m.final_norm_b = up(maybe(a.names.final_norm + ".bias"));
  if (c.tie_word_embeddings) {
    m.lm_head.w = m.embed;
  } else {
    m.lm_head.w = up(take(a.names.lm_head));
  }
  ARBOR_CHECK(next == specs.size(), "model: {} weight specs left unbound", specs.size() - next);
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
