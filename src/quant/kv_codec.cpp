// KV-cache codecs: names, the per-layer spec, and the scalar reference encoders/decoders (kv_codec.h).
#include "quant/kv_codec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace arbor {

namespace {

constexpr float kF16Max = 65504.0f;

uint16_t to_f16(float f) { return f32_to_f16(std::clamp(f, -kF16Max, kF16Max)); }
float f16_round(float f) { return f16_to_f32(to_f16(f)); }

void put_f16(uint8_t* p, int64_t i, float f) {
  const uint16_t h = to_f16(f);
  std::memcpy(p + 2 * i, &h, 2);
}
float get_f16(const uint8_t* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return f16_to_f32(h);
}

// Lloyd-Max centroids (ascending) of a unit Gaussian, from the Lloyd iteration (centroid = conditional
// mean of its cell, boundaries = midpoints) run to convergence; the 3-bit ones are formats.md's.
constexpr float kLM2[4] = {-1.510418f, -0.452780f, 0.452780f, 1.510418f};
constexpr float kLM3[8] = {-2.151946f, -1.343909f, -0.756005f, -0.245094f, 0.245094f, 0.756005f, 1.343909f, 2.151946f};
constexpr float kLM4[16] = {-2.732590f, -2.069017f, -1.618046f, -1.256231f, -0.942340f, -0.656759f, -0.388048f, -0.128395f,
                            0.128395f,  0.388048f,  0.656759f,  0.942340f,  1.256231f,  1.618046f,  2.069017f,  2.732590f};

bool parse_int(const std::string& s, int64_t& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

// Key scale floor: a group far from 0 relative to its range gets scale >= |centre| / 1024, so the zero
// point (an integer, stored f16) stays within +-1025, where f16 holds every integer exactly.
constexpr float kZeroRange = 1024.0f;

}  // namespace

KVCodecPair parse_kv_codec(const std::string& name) {
  KVCodecPair p;
  if (name == "bf16") return p;
  int64_t b = 0;
  if (name.rfind("affine", 0) == 0 && parse_int(name.substr(6), b)) {
    if (b < 2 || b > 8) fail("kv codec '{}': affine takes 2 to 8 bits", name);
    p.k = p.v = KVCodec::affine(int(b));
    return p;
  }
  if (name.size() >= 4 && name[0] == 'k') {
    const size_t vpos = name.find('v');
    int64_t kb = 0, vb = 0;
    if (vpos != std::string::npos && parse_int(name.substr(1, vpos - 1), kb) && parse_int(name.substr(vpos + 1), vb)) {
      if (!((kb >= 2 && kb <= 6) || kb == 8)) fail("kv codec '{}': TurboQuant keys take 2 to 6 or 8 bits", name);
      if (vb < 2 || vb > 4) fail("kv codec '{}': TurboQuant values take 2 to 4 bits", name);
      p.k = KVCodec::turbo_key(int(kb));
      p.v = KVCodec::turbo_value(int(vb));
      return p;
    }
  }
  fail("kv codec '{}' is not one of bf16, affine8, affine4 (affine2..affine8), k8v4, k8v3 (k<2..6|8>v<2..4>)", name);
}

void check_kv_codec(const KVCodecPair& c, int64_t head_dim) {
  for (const KVCodec* s : {&c.k, &c.v}) {
    if (s->plain()) continue;
    if (s->kind == KVCodecKind::Affine && head_dim % s->group != 0)
      fail("kv codec {}: head_dim {} is not a multiple of the affine group size {}", c.name(), head_dim, s->group);
    if ((s->kind == KVCodecKind::TurboKey || s->kind == KVCodecKind::TurboValue) &&
        !(head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512))
      fail("kv codec {}: TurboQuant needs head_dim 64, 128, 256 or 512 (the model's is {}); use affine8 or affine4", c.name(),
           head_dim);
  }
}

std::vector<KVCodecPair> resolve_kv_cache_spec(const std::string& spec, int64_t n_layers, int64_t head_dim) {
  std::vector<std::pair<std::string, std::string>> entries;  // (layers or "", codec)
  size_t i = 0;
  while (i <= spec.size()) {
    size_t j = spec.find(',', i);
    if (j == std::string::npos) j = spec.size();
    std::string e = spec.substr(i, j - i);
    const size_t colon = e.find(':');
    if (colon == std::string::npos)
      entries.emplace_back("", e);
    else
      entries.emplace_back(e.substr(0, colon), e.substr(colon + 1));
    i = j + 1;
  }
  KVCodecPair base;
  int bare = 0;
  for (const auto& [layers, codec] : entries)
    if (layers.empty()) {
      if (++bare > 1) fail("--kv-cache '{}': more than one codec without a layer (give one default, then LAYERS:codec)", spec);
      base = parse_kv_codec(codec);
    }
  std::vector<KVCodecPair> out(size_t(n_layers), base);
  auto layer_index = [&](const std::string& s, const std::string& entry) {
    int64_t v = 0;
    if (!parse_int(s, v)) fail("--kv-cache '{}': '{}' is not a layer index (N, -N from the end, or A..B)", spec, entry);
    const int64_t l = v < 0 ? n_layers + v : v;
    if (l < 0 || l >= n_layers) fail("--kv-cache '{}': layer {} in '{}' is outside the model's {} layers", spec, v, entry, n_layers);
    return l;
  };
  for (const auto& [layers, codec] : entries) {
    if (layers.empty()) continue;
    const std::string entry = layers + ":" + codec;
    const size_t dots = layers.find("..");
    const int64_t a = layer_index(dots == std::string::npos ? layers : layers.substr(0, dots), entry);
    const int64_t b = dots == std::string::npos ? a : layer_index(layers.substr(dots + 2), entry);
    if (b < a) fail("--kv-cache '{}': the range in '{}' runs backwards", spec, entry);
    const KVCodecPair c = parse_kv_codec(codec);
    for (int64_t l = a; l <= b; ++l) out[size_t(l)] = c;
  }
  for (const auto& c : out) check_kv_codec(c, head_dim);
  return out;
}

void kv_set_code(uint8_t* codes, int64_t j, int bits, uint32_t code) {
  const int64_t bit = j * bits;
  uint8_t* p = codes + (bit >> 3);
  const uint32_t w = code << (bit & 7);
  p[0] |= uint8_t(w);
  if ((bit & 7) + bits > 8) p[1] |= uint8_t(w >> 8);
}

void fwht(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

const float* turbo_signs(int64_t d) {
  static const std::vector<float> signs = [] {
    std::vector<float> s(512);
    uint64_t state = 0x7475726271756174ull;  // "turbquat"
    for (auto& v : s) {                      // splitmix64, top bit
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      v = (z >> 63) ? -1.0f : 1.0f;
    }
    return s;
  }();
  ARBOR_CHECK(d > 0 && d <= 512, "turbo_signs: head_dim {} outside 1..512", d);
  return signs.data();
}

void turbo_rotate(const float* x, int64_t d, float* y) {
  const float* s = turbo_signs(d);
  for (int64_t i = 0; i < d; ++i) y[i] = x[i] * s[i];
  fwht(y, d);
  const float inv = 1.0f / std::sqrt(float(d));
  for (int64_t i = 0; i < d; ++i) y[i] *= inv;
}

void turbo_unrotate(const float* y, int64_t d, float* x) {
  if (x != y) std::memcpy(x, y, size_t(d) * sizeof(float));
  fwht(x, d);
  const float* s = turbo_signs(d);
  const float inv = 1.0f / std::sqrt(float(d));
  for (int64_t i = 0; i < d; ++i) x[i] *= inv * s[i];
}

const float* lloyd_max_centroids(int bits) {
  switch (bits) {
    case 2: return kLM2;
    case 3: return kLM3;
    case 4: return kLM4;
    default: fail("lloyd_max_centroids: no table for {} bits (2..4)", bits);
  }
}

void kv_encode_row(const KVCodec& c, const float* x, int64_t d, uint8_t* out) {
  ARBOR_CHECK(!c.plain() && d % c.group == 0, "kv_encode_row: codec kind {} group {} cannot code a row of {}", int(c.kind), c.group, d);
  const int64_t G = d / c.group, code_bytes = d * c.bits / 8;
  uint8_t* codes = out;
  uint8_t* scales = out + code_bytes;
  uint8_t* zeros = scales + 2 * G;
  std::memset(out, 0, size_t(c.row_bytes(d, 0)));
  const int maxq = (1 << c.bits) - 1;
  switch (c.kind) {
    case KVCodecKind::Affine:
      for (int64_t g = 0; g < G; ++g) {
        const float* xg = x + g * c.group;
        float mn = xg[0], mx = xg[0];
        for (int64_t i = 1; i < c.group; ++i) mn = std::min(mn, xg[i]), mx = std::max(mx, xg[i]);
        // MLX's affine quantize: the larger-magnitude extreme (edge) is the bias, the scale is adjusted
        // so that edge / scale is a whole number of steps: edge and 0 both land on codes.
        const bool neg_edge = std::fabs(mn) > std::fabs(mx);
        float scale = std::max((mx - mn) / float(maxq), 1e-7f);
        if (!neg_edge) scale = -scale;
        const float edge = neg_edge ? mn : mx;
        const float q0 = std::nearbyint(edge / scale);
        if (q0 != 0) scale = edge / q0;
        const float bias = q0 == 0 ? 0.0f : edge;
        put_f16(scales, g, scale);
        put_f16(zeros, g, bias);
        const float s = get_f16(scales, g), b = get_f16(zeros, g);
        for (int64_t i = 0; i < c.group; ++i) {
          const float q = s == 0 ? 0.0f : std::clamp(std::nearbyint((xg[i] - b) / s), 0.0f, float(maxq));
          kv_set_code(codes, g * c.group + i, c.bits, uint32_t(q));
        }
      }
      return;
    case KVCodecKind::TurboKey:
      for (int64_t g = 0; g < G; ++g) {
        const float* xg = x + g * c.group;
        float mn = xg[0], mx = xg[0];
        for (int64_t i = 1; i < c.group; ++i) mn = std::min(mn, xg[i]), mx = std::max(mx, xg[i]);
        const bool sign8 = c.bits == 8;
        const float centre = sign8 ? 0.5f * (mx + mn) : mn;
        const float s = f16_round(std::max((mx - mn) / (sign8 ? 254.0f : float(maxq)), std::fabs(centre) / kZeroRange));
        const float zero = s == 0 ? 0.0f : std::nearbyint(centre / s);
        put_f16(scales, g, s);
        put_f16(zeros, g, zero);
        const float lo = sign8 ? -127.0f : 0.0f, hi = sign8 ? 127.0f : float(maxq);
        for (int64_t i = 0; i < c.group; ++i) {
          const float q = s == 0 ? 0.0f : std::clamp(std::nearbyint(xg[i] / s - zero), lo, hi);
          if (sign8)
            codes[g * c.group + i] = uint8_t(int8_t(q));
          else
            kv_set_code(codes, g * c.group + i, c.bits, uint32_t(q));
        }
      }
      return;
    case KVCodecKind::TurboValue: {
      ARBOR_CHECK(d <= 512, "kv_encode_row: TurboQuant value row of {} (at most 512)", d);
      float y[512];
      turbo_rotate(x, d, y);
      const int n = 1 << c.bits;
      const float* cent = lloyd_max_centroids(c.bits);
      for (int64_t g = 0; g < G; ++g) {
        const float* yg = y + g * c.group;
        double ss = 0;
        for (int64_t i = 0; i < c.group; ++i) ss += double(yg[i]) * yg[i];
        put_f16(scales, g, float(std::sqrt(ss / double(c.group))));
        const float inv = 1.0f / (get_f16(scales, g) + 1e-8f);
        for (int64_t i = 0; i < c.group; ++i) {
          const float u = yg[i] * inv;
          int q = 0;  // the nearest centroid: count the cell boundaries (midpoints) at or below u
          for (int k = 0; k + 1 < n; ++k) q += u >= 0.5f * (cent[k] + cent[k + 1]);
          kv_set_code(codes, g * c.group + i, c.bits, uint32_t(q));
        }
      }
      return;
    }
    case KVCodecKind::Plain: break;
  }
}

void kv_decode_row_rotated(const KVCodec& c, const uint8_t* in, int64_t d, float* y) {
  ARBOR_CHECK(c.kind == KVCodecKind::TurboValue && d % c.group == 0, "kv_decode_row_rotated: not a TurboQuant value row of {}", d);
  const int64_t G = d / c.group;
  const uint8_t* scales = in + d * c.bits / 8;
  const float* cent = lloyd_max_centroids(c.bits);
  for (int64_t g = 0; g < G; ++g) {
    const float s = get_f16(scales, g);
    for (int64_t i = 0; i < c.group; ++i) y[g * c.group + i] = cent[kv_get_code(in, g * c.group + i, c.bits)] * s;
  }
}

void kv_decode_row(const KVCodec& c, const uint8_t* in, int64_t d, float* x) {
  ARBOR_CHECK(!c.plain() && d % c.group == 0, "kv_decode_row: codec kind {} group {} cannot code a row of {}", int(c.kind), c.group, d);
  const int64_t G = d / c.group, code_bytes = d * c.bits / 8;
  const uint8_t* scales = in + code_bytes;
  const uint8_t* zeros = scales + 2 * G;
  switch (c.kind) {
    case KVCodecKind::Affine:
      for (int64_t g = 0; g < G; ++g) {
        const float s = get_f16(scales, g), b = get_f16(zeros, g);
        for (int64_t i = 0; i < c.group; ++i) x[g * c.group + i] = float(kv_get_code(in, g * c.group + i, c.bits)) * s + b;
      }
      return;
    case KVCodecKind::TurboKey:
      for (int64_t g = 0; g < G; ++g) {
        const float s = get_f16(scales, g), z = get_f16(zeros, g);
        for (int64_t i = 0; i < c.group; ++i) {
          const int64_t j = g * c.group + i;
          const float q = c.bits == 8 ? float(int8_t(in[j])) : float(kv_get_code(in, j, c.bits));
          x[j] = (q + z) * s;
        }
      }
      return;
    case KVCodecKind::TurboValue:
      kv_decode_row_rotated(c, in, d, x);
      turbo_unrotate(x, d, x);
      return;
    case KVCodecKind::Plain: break;
  }
}

}  // namespace arbor
