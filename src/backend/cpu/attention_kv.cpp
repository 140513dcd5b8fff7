// CPU attention over the paged KV cache, plain (f32) or holding a codec's codes (quant/kv_codec.h). One
// work item per (token, KV head): each key and value row is read (and dequantized, in the inner loop)
// once and shared by the GQA group's query heads. TurboQuant values stay in the rotated domain: p·V is accumulated there and each output
// head is rotated back once at the end (the rotation is linear, so Σ p_j R⁻¹y_j = R⁻¹ Σ p_j y_j).
// The reference is quant/kv_codec's decoder followed by float attention (tests/cpu/attention_kv_test).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/vec.h"
#include "core/dtype.h"
#include "core/error.h"

namespace arbor {

namespace {

inline float f16_at(const uint8_t* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return f16_to_f32(h);
}

// The codes of a row as floats (TurboQuant 8-bit keys signed). These helpers are inlined into one
// dequant_row per ISA level below, which the compiler vectorizes for that level.
[[gnu::always_inline]] inline void unpack_codes(const KVCodec& c, const uint8_t* r, int64_t d, float* x) {
  switch (c.bits) {
    case 8:
      if (c.kind == KVCodecKind::TurboKey)
        for (int64_t i = 0; i < d; ++i) x[i] = float(int8_t(r[i]));
      else
        for (int64_t i = 0; i < d; ++i) x[i] = float(r[i]);
      return;
    case 4:
      for (int64_t i = 0; i < d / 2; ++i) x[2 * i] = float(r[i] & 15), x[2 * i + 1] = float(r[i] >> 4);
      return;
    case 3:
      for (int64_t i = 0; i < d / 8; ++i) {  // 8 codes in 3 bytes
        const uint32_t w = uint32_t(r[3 * i]) | uint32_t(r[3 * i + 1]) << 8 | uint32_t(r[3 * i + 2]) << 16;
        for (int k = 0; k < 8; ++k) x[8 * i + k] = float((w >> (3 * k)) & 7);
      }
      return;
    case 2:
      for (int64_t i = 0; i < d / 4; ++i)
        for (int k = 0; k < 4; ++k) x[4 * i + k] = float((r[i] >> (2 * k)) & 3);
      return;
    default:
      for (int64_t i = 0; i < d; ++i) x[i] = float(kv_get_code(r, i, c.bits));
  }
}

// One coded row to floats: affine code*scale + bias, TurboQuant keys (code + zero)*scale (as the
// reference decodes them), TurboQuant values centroid*scale in the rotated domain.
[[gnu::always_inline]] inline void dequant_row_body(const KVCodec& c, const uint8_t* r, int64_t d, float* x) {
  const int64_t G = d / c.group;
  const uint8_t* scales = r + d * c.bits / 8;
  const uint8_t* zeros = scales + 2 * G;
  if (c.kind == KVCodecKind::TurboValue) {
    const float* cent = lloyd_max_centroids(c.bits);
    if (c.bits == 3) {
      for (int64_t g = 0; g < G; ++g) {
        const float s = f16_at(scales, g);
        const uint8_t* rg = r + g * 12;  // 32 codes in 12 bytes
        float* xg = x + g * 32;
        for (int64_t i = 0; i < 4; ++i) {
          const uint32_t w = uint32_t(rg[3 * i]) | uint32_t(rg[3 * i + 1]) << 8 | uint32_t(rg[3 * i + 2]) << 16;
          for (int k = 0; k < 8; ++k) xg[8 * i + k] = cent[(w >> (3 * k)) & 7] * s;
        }
      }
      return;
    }
    unpack_codes(c, r, d, x);
    for (int64_t g = 0; g < G; ++g) {
      const float s = f16_at(scales, g);
      for (int64_t i = g * c.group; i < (g + 1) * c.group; ++i) x[i] = cent[int(x[i])] * s;
    }
    return;
  }
  unpack_codes(c, r, d, x);
  if (c.kind == KVCodecKind::Affine) {
    for (int64_t g = 0; g < G; ++g) {
      const float s = f16_at(scales, g), b = f16_at(zeros, g);
      for (int64_t i = g * c.group; i < (g + 1) * c.group; ++i) x[i] = x[i] * s + b;
    }
  } else {
    for (int64_t g = 0; g < G; ++g) {
      const float s = f16_at(scales, g), z = f16_at(zeros, g);
      for (int64_t i = g * c.group; i < (g + 1) * c.group; ++i) x[i] = (x[i] + z) * s;
    }
  }
}

void dequant_row_scalar(const KVCodec& c, const uint8_t* r, int64_t d, float* x) { dequant_row_body(c, r, d, x); }
__attribute__((target("avx2,fma,f16c"))) void dequant_row_avx2(const KVCodec& c, const uint8_t* r, int64_t d, float* x) {
  dequant_row_body(c, r, d, x);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void dequant_row_avx512(const KVCodec& c, const uint8_t* r, int64_t d, float* x) {
  dequant_row_body(c, r, d, x);
}

using DequantFn = void (*)(const KVCodec&, const uint8_t*, int64_t, float*);
DequantFn pick_dequant() {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  return f.avx512 ? dequant_row_avx512 : f.avx2 ? dequant_row_avx2 : dequant_row_scalar;
}

}  // namespace

void CpuBackend::attention_kv(int64_t layer, const Tensor& q, const AttentionParams& p, Tensor out) {
  const auto& b = *batch_;
  const KVCodecPair& c = kv_.codec(layer);
  const int64_t hd = p.head_dim, group = p.n_heads / p.n_kv_heads, bs = kv_.block_size, H = p.n_kv_heads;
  ARBOR_CHECK(hd == kv_.head_dim && H == kv_.n_kv_heads, "cpu: attention: heads {}x{} but the KV cache holds {}x{}", H, hd, kv_.n_kv_heads,
              kv_.head_dim);
  const int64_t kb = c.k.row_bytes(hd, sizeof(float)), vb = c.v.row_bytes(hd, sizeof(float));
  const uint8_t* K = k_pools_[size_t(layer)];
  const uint8_t* V = v_pools_[size_t(layer)];
  const bool deferred_v = c.v.kind == KVCodecKind::TurboValue;
  const cpu::VecOps& vec = cpu::vec_ops();
  static const DequantFn dequant_row = pick_dequant();
  pool_.parallel_for(b.n_tokens() * H, 1, [&](int, int64_t i0, int64_t i1) {
    thread_local std::vector<float> scores, row;
    row.resize(size_t(hd));
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / H, g = item % H;
      const int32_t s = b.seq[size_t(t)];
      const int64_t pos = b.pos[size_t(t)];
      const int64_t lo = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
      const int64_t n = pos - lo + 1;
      const int32_t* table = b.block_tables.data() + int64_t(s) * b.max_blocks;
      scores.resize(size_t(group * n));
      const float* q0 = q.as<float>() + t * p.n_heads * hd + g * group * hd;
      float* o0 = out.as<float>() + t * p.n_heads * hd + g * group * hd;
      auto slot = [&](int64_t kp) { return (int64_t(table[kp / bs]) * bs + kp % bs) * H + g; };
      // Scores: each key row dequantized once for the group's heads.
      for (int64_t j = 0; j < n; ++j) {
        const uint8_t* kr = K + slot(lo + j) * kb;
        const float* kf = reinterpret_cast<const float*>(kr);
        if (!c.k.plain()) dequant_row(c.k, kr, hd, row.data()), kf = row.data();
        for (int64_t h = 0; h < group; ++h) {
          float dot = vec.dot(q0 + h * hd, kf, hd) * p.scale;
          if (p.softcap > 0) dot = p.softcap * std::tanh(dot / p.softcap);
          scores[size_t(h * n + j)] = dot;
        }
      }
      for (int64_t h = 0; h < group; ++h) {
        float* sc = scores.data() + h * n;
        float mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, sc[j]);
        for (int64_t j = 0; j < n; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) sc[j] *= inv;
      }
      std::fill(o0, o0 + group * hd, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const uint8_t* vr = V + slot(lo + j) * vb;
        const float* vf = reinterpret_cast<const float*>(vr);
        if (!c.v.plain()) dequant_row(c.v, vr, hd, row.data()), vf = row.data();
        for (int64_t h = 0; h < group; ++h) vec.axpy(o0 + h * hd, scores[size_t(h * n + j)], vf, hd);
      }
      if (deferred_v)  // the inverse rotation, once per output head
        for (int64_t h = 0; h < group; ++h) turbo_unrotate(o0 + h * hd, hd, o0 + h * hd);
    }
  });
}

}  // namespace arbor
