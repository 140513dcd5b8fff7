// KV-cache codecs (quant/kv_codec): names and the per-layer spec, row sizes, exact codes on known rows,
// error bounds on random rows, the rotation, and the Lloyd-Max tables against an independent iteration.
#include "quant/kv_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/dtype.h"
#include "core/error.h"

namespace arbor {
namespace {

float f16_at(const uint8_t* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return f16_to_f32(h);
}

std::vector<uint8_t> encode(const KVCodec& c, const std::vector<float>& x) {
  std::vector<uint8_t> row(size_t(c.row_bytes(int64_t(x.size()), 0)) + 1, 0xEE);  // +1: a guard byte
  kv_encode_row(c, x.data(), int64_t(x.size()), row.data());
  EXPECT_EQ(row.back(), 0xEE) << "encoder wrote past the row";
  row.pop_back();
  return row;
}
std::vector<float> decode(const KVCodec& c, const std::vector<uint8_t>& row, int64_t d) {
  std::vector<float> x(static_cast<size_t>(d));
  kv_decode_row(c, row.data(), d, x.data());
  return x;
}

TEST(KVCodec, NamesAndRowBytes) {
  EXPECT_TRUE(parse_kv_codec("bf16").plain());
  EXPECT_EQ(parse_kv_codec("affine8").k, KVCodec::affine(8));
  EXPECT_EQ(parse_kv_codec("k8v3").k, KVCodec::turbo_key(8));
  EXPECT_EQ(parse_kv_codec("k8v3").v, KVCodec::turbo_value(3));
  for (const char* n : {"bf16", "affine8", "affine4", "k8v4", "k8v3", "k4v2"}) EXPECT_EQ(parse_kv_codec(n).name(), n);
  for (const char* bad : {"", "f32", "affine", "affine9", "affine1", "k8", "k7v3", "k8v5", "k8v1", "kxv3", "v3k8"})
    EXPECT_THROW(parse_kv_codec(bad), Error) << bad;
  // formats.md: k8v3 at d = 128 is 200 bytes per token per head (K 128 + 4*(2+2), V 48 + 4*2), bf16 512.
  EXPECT_EQ(parse_kv_codec("k8v3").token_bytes(1, 128, 2), 200);
  EXPECT_EQ(parse_kv_codec("bf16").token_bytes(1, 128, 2), 512);
  EXPECT_EQ(parse_kv_codec("k8v4").token_bytes(1, 128, 2), 144 + 64 + 8);
  EXPECT_EQ(parse_kv_codec("affine8").token_bytes(1, 128, 2), 2 * (128 + 2 * 4));
  EXPECT_EQ(parse_kv_codec("affine4").token_bytes(1, 128, 2), 2 * (64 + 2 * 4));
  EXPECT_EQ(parse_kv_codec("affine4").token_bytes(8, 64, 2), 8 * 2 * (32 + 4));
}

TEST(KVCodec, PerLayerSpec) {
  auto v = resolve_kv_cache_spec("k8v3,0:bf16,-1:bf16", 4, 128);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].name(), "bf16");
  EXPECT_EQ(v[1].name(), "k8v3");
  EXPECT_EQ(v[2].name(), "k8v3");
  EXPECT_EQ(v[3].name(), "bf16");
  v = resolve_kv_cache_spec("affine4,1..2:affine8,2:k8v4", 4, 128);
  EXPECT_EQ(v[0].name(), "affine4");
  EXPECT_EQ(v[1].name(), "affine8");
  EXPECT_EQ(v[2].name(), "k8v4");  // later entries win
  EXPECT_EQ(v[3].name(), "affine4");
  v = resolve_kv_cache_spec("0:affine8", 2, 64);  // no default: bf16
  EXPECT_EQ(v[0].name(), "affine8");
  EXPECT_EQ(v[1].name(), "bf16");
  for (const char* bad : {"k8v3,affine8", "k8v3,4:bf16", "k8v3,-5:bf16", "k8v3,x:bf16", "k8v3,2..1:bf16", "k8v3,0:nope", "k8v3,"})
    EXPECT_THROW(resolve_kv_cache_spec(bad, 4, 128), Error) << bad;
  // TurboQuant needs head_dim 64/128/256/512; affine a multiple of 64.
  for (int64_t d : {64, 128, 256, 512}) EXPECT_NO_THROW(resolve_kv_cache_spec("k8v3", 2, d));
  try {
    resolve_kv_cache_spec("k8v3", 2, 96);
    ADD_FAILURE() << "head_dim 96 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("64, 128, 256 or 512"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_kv_cache_spec("affine8", 2, 96), Error);
  EXPECT_NO_THROW(resolve_kv_cache_spec("k8v3,0:affine8", 1, 64));
  EXPECT_NO_THROW(resolve_kv_cache_spec("bf16", 2, 96));
}

TEST(KVCodec, BitStream) {
  // 3-bit: 8 values in 3 bytes, element j at bit 3j, little-endian.
  uint8_t b[4] = {0, 0, 0, 0};
  for (int j = 0; j < 8; ++j) kv_set_code(b, j, 3, uint32_t(j));
  EXPECT_EQ(b[0], 0x88);
  EXPECT_EQ(b[1], 0xC6);
  EXPECT_EQ(b[2], 0xFA);
  EXPECT_EQ(b[3], 0);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(kv_get_code(b, j, 3), uint32_t(j));
  std::mt19937 rng(3);
  for (int bits = 2; bits <= 8; ++bits) {
    std::vector<uint32_t> v(64);
    std::vector<uint8_t> s(64 + 1, 0);
    for (auto& x : v) x = rng() & ((1u << bits) - 1);
    for (int j = 0; j < 64; ++j) kv_set_code(s.data(), j, bits, v[size_t(j)]);
    for (int j = 0; j < 64; ++j) ASSERT_EQ(kv_get_code(s.data(), j, bits), v[size_t(j)]) << bits << " bits, element " << j;
  }
}

TEST(KVCodec, AffineKnownRows) {
  const int64_t d = 128;
  // Group 0: -4 + 0.5 (i % 16): scale 0.5, bias -4 (the larger-magnitude extreme), codes i % 16.
  // Group 1: constant 3: code 0, bias 3.
  std::vector<float> x(static_cast<size_t>(d));
  for (int64_t i = 0; i < 64; ++i) x[size_t(i)] = -4.0f + 0.5f * float(i % 16), x[size_t(64 + i)] = 3.0f;
  const KVCodec c4 = KVCodec::affine(4);
  auto row = encode(c4, x);
  ASSERT_EQ(row.size(), size_t(64 + 8));
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(kv_get_code(row.data(), i, 4), uint32_t(i % 16)) << i;
  for (int64_t i = 64; i < 128; ++i) EXPECT_EQ(kv_get_code(row.data(), i, 4), 0u) << i;
  EXPECT_EQ(f16_at(row.data() + 64, 0), 0.5f);
  EXPECT_EQ(f16_at(row.data() + 64, 2), -4.0f);
  EXPECT_EQ(f16_at(row.data() + 64, 3), 3.0f);
  EXPECT_EQ(decode(c4, row, d), x);  // exact

  // Zeros: every code 0, bias 0, decodes to 0.
  std::vector<float> z(size_t(d), 0.0f);
  const KVCodec c8 = KVCodec::affine(8);
  row = encode(c8, z);
  for (int64_t i = 0; i < d; ++i) EXPECT_EQ(row[size_t(i)], 0) << i;
  EXPECT_EQ(f16_at(row.data() + d, 2), 0.0f);
  EXPECT_EQ(decode(c8, row, d), z);

  // +-max (8-bit): 1, 0 and -127/128 span 255 steps of 1/128 exactly, so the edge +1 is the bias,
  // scale -1/128, and the codes are 0, 128, 255, decoding exactly.
  std::vector<float> pm(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) pm[size_t(i)] = i % 3 == 2 ? 0.0f : (i % 3 == 0 ? 1.0f : -0.9921875f);
  row = encode(c8, pm);
  EXPECT_EQ(f16_at(row.data() + d, 0), -0.0078125f);
  EXPECT_EQ(f16_at(row.data() + d, 2), 1.0f);
  for (int64_t i = 0; i < d; ++i) EXPECT_EQ(row[size_t(i)], i % 3 == 2 ? 128u : (i % 3 == 0 ? 0u : 255u)) << i;
  EXPECT_EQ(decode(c8, row, d), pm);
  // +-1 exactly: 255 steps cannot hold 0 and both ends, MLX's rule keeps +1 (the bias) and 0 on codes
  // (up to the f16 scale) and -1 within a step.
  for (int64_t i = 0; i < d; ++i) pm[size_t(i)] = i % 3 == 2 ? 0.0f : (i % 3 == 0 ? 1.0f : -1.0f);
  row = encode(c8, pm);
  const float step = std::fabs(f16_at(row.data() + d, 0));
  const auto back = decode(c8, row, d);
  for (int64_t i = 0; i < d; ++i) {
    if (i % 3 == 0) {
      EXPECT_EQ(back[size_t(i)], 1.0f) << i;
    }
    EXPECT_LE(std::fabs(back[size_t(i)] - pm[size_t(i)]), i % 3 == 1 ? step : 0.01f * step) << i;
  }
}

TEST(KVCodec, TurboKeyKnownRows) {
  const int64_t d = 64;
  const KVCodec k8 = KVCodec::turbo_key(8);
  // Group 0: multiples of 0.25 spanning +-31.75: scale 0.25, zero 0, code = x / 0.25 (+-127 at the ends).
  // Group 1: constant 3: scale 3/1024, zero 1024, code 0 (the zero-point floor keeps it an exact f16).
  std::vector<float> x(static_cast<size_t>(d));
  for (int64_t i = 0; i < 32; ++i) x[size_t(i)] = 0.25f * float((i * 37) % 255 - 127);
  x[0] = -31.75f, x[1] = 31.75f;
  for (int64_t i = 32; i < 64; ++i) x[size_t(i)] = 3.0f;
  auto row = encode(k8, x);
  ASSERT_EQ(row.size(), size_t(64 + 8));
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(int(int8_t(row[size_t(i)])), int(x[size_t(i)] * 4)) << i;
  EXPECT_EQ(int8_t(row[0]), -127);
  EXPECT_EQ(int8_t(row[1]), 127);
  for (int64_t i = 32; i < 64; ++i) EXPECT_EQ(row[size_t(i)], 0) << i;
  const uint8_t* sc = row.data() + 64;
  EXPECT_EQ(f16_at(sc, 0), 0.25f);
  EXPECT_EQ(f16_at(sc, 1), 3.0f / 1024);
  EXPECT_EQ(f16_at(sc, 2), 0.0f);
  EXPECT_EQ(f16_at(sc, 3), 1024.0f);
  EXPECT_EQ(decode(k8, row, d), x);

  // Zeros: scale 0, zero 0, codes 0.
  std::vector<float> z(size_t(d), 0.0f);
  row = encode(k8, z);
  for (uint8_t b : row) EXPECT_EQ(b, 0);
  EXPECT_EQ(decode(k8, row, d), z);

  // 4-bit unsigned: 2 + 0.5 k, k = 0..15: scale 0.5, zero round(2 / 0.5) = 4, code k.
  const KVCodec k4 = KVCodec::turbo_key(4);
  for (int64_t i = 0; i < d; ++i) x[size_t(i)] = 2.0f + 0.5f * float((i * 7) % 16);
  row = encode(k4, x);
  ASSERT_EQ(row.size(), size_t(32 + 8));
  for (int64_t i = 0; i < d; ++i) EXPECT_EQ(kv_get_code(row.data(), i, 4), uint32_t((i * 7) % 16)) << i;
  EXPECT_EQ(f16_at(row.data() + 32, 0), 0.5f);
  EXPECT_EQ(f16_at(row.data() + 32, 2), 4.0f);
  EXPECT_EQ(decode(k4, row, d), x);
}

// The Sylvester Hadamard matrix, entry (i, j) = (-1)^popcount(i & j): what fwht multiplies by.
float hadamard(int64_t i, int64_t j) { return __builtin_popcountll(uint64_t(i & j)) % 2 ? -1.0f : 1.0f; }

TEST(KVCodec, Rotation) {
  for (int64_t d : {64, 128, 256, 512}) {
    // fwht is the Hadamard matrix: unit vectors come out as its columns (so H Hᵀ = d I).
    std::vector<float> e(static_cast<size_t>(d));
    for (int64_t j = 0; j < d; j += 7) {
      std::fill(e.begin(), e.end(), 0.0f);
      e[size_t(j)] = 1.0f;
      fwht(e.data(), d);
      for (int64_t i = 0; i < d; ++i) ASSERT_EQ(e[size_t(i)], hadamard(i, j)) << d << " " << i << " " << j;
    }
    // Signs: +-1, both present.
    const float* s = turbo_signs(d);
    int neg = 0;
    for (int64_t i = 0; i < d; ++i) {
      ASSERT_TRUE(s[i] == 1.0f || s[i] == -1.0f);
      neg += s[i] < 0;
    }
    EXPECT_GT(neg, d / 4);
    EXPECT_LT(neg, 3 * d / 4);
    // rotate is orthonormal: norms kept, unrotate inverts it.
    std::mt19937 rng(static_cast<uint32_t>(d));
    std::normal_distribution<float> N;
    std::vector<float> x(static_cast<size_t>(d)), y(static_cast<size_t>(d)), back(static_cast<size_t>(d));
    for (auto& v : x) v = N(rng);
    turbo_rotate(x.data(), d, y.data());
    turbo_unrotate(y.data(), d, back.data());
    double nx = 0, ny = 0;
    for (int64_t i = 0; i < d; ++i) {
      nx += double(x[size_t(i)]) * x[size_t(i)], ny += double(y[size_t(i)]) * y[size_t(i)];
      EXPECT_NEAR(back[size_t(i)], x[size_t(i)], 1e-5f);
    }
    EXPECT_NEAR(ny / nx, 1.0, 1e-5);
  }
}

// Lloyd-Max for a unit Gaussian, computed here from scratch (double, erf): cells at midpoints, centroids
// at the conditional means, iterated from a uniform start.
std::vector<double> lloyd_max(int bits) {
  const int n = 1 << bits;
  auto pdf = [](double x) { return std::exp(-x * x / 2) / std::sqrt(2 * M_PI); };
  auto cdf = [](double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))); };
  std::vector<double> c(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) c[size_t(i)] = -3.0 + 6.0 * (i + 0.5) / n;
  for (int it = 0; it < 5000; ++it) {
    std::vector<double> t(static_cast<size_t>(n + 1));
    t[0] = -INFINITY, t[size_t(n)] = INFINITY;
    for (int i = 1; i < n; ++i) t[size_t(i)] = 0.5 * (c[size_t(i - 1)] + c[size_t(i)]);
    for (int i = 0; i < n; ++i) {
      const double a = t[size_t(i)], b = t[size_t(i + 1)];
      const double pa = std::isinf(a) ? 0 : pdf(a), pb = std::isinf(b) ? 0 : pdf(b);
      c[size_t(i)] = (pa - pb) / (cdf(b) - cdf(a));
    }
  }
  return c;
}

TEST(KVCodec, LloydMaxTables) {
  for (int bits = 2; bits <= 4; ++bits) {
    const auto want = lloyd_max(bits);
    const float* got = lloyd_max_centroids(bits);
    for (int i = 0; i < (1 << bits); ++i) EXPECT_NEAR(got[i], want[size_t(i)], 2e-6) << bits << " bits, centroid " << i;
  }
  // formats.md's 3-bit centroids and boundaries.
  const float* c3 = lloyd_max_centroids(3);
  const float spec[4] = {0.24509f, 0.75601f, 1.34391f, 2.15195f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(c3[4 + i], spec[i], 1e-5f);
    EXPECT_NEAR(c3[3 - i], -spec[i], 1e-5f);
  }
  EXPECT_NEAR(0.5f * (c3[4] + c3[5]), 0.50055f, 1e-5f);
  EXPECT_NEAR(0.5f * (c3[5] + c3[6]), 1.04996f, 1e-5f);
  EXPECT_NEAR(0.5f * (c3[6] + c3[7]), 1.74793f, 1e-5f);
  EXPECT_THROW(lloyd_max_centroids(5), Error);
}

TEST(KVCodec, TurboValueCodesMatchDenseComputation) {
  // Codes checked against a dense computation: y = H (x ⊙ s) / sqrt(d) with H built entry by entry,
  // scale = RMS per group of 32 (f16), code = argmin over centroids of |y / scale - c|.
  std::mt19937 rng(11);
  std::normal_distribution<float> N;
  for (int64_t d : {64, 128, 256, 512})
    for (int bits = 2; bits <= 4; ++bits) {
      const KVCodec c = KVCodec::turbo_value(bits);
      std::vector<float> x(static_cast<size_t>(d));
      for (auto& v : x) v = N(rng) * 0.7f + 0.1f;
      const auto row = encode(c, x);
      ASSERT_EQ(int64_t(row.size()), d * bits / 8 + 2 * d / 32);
      const float* s = turbo_signs(d);
      std::vector<double> y(size_t(d), 0.0);
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t j = 0; j < d; ++j) y[size_t(i)] += hadamard(i, j) * s[j] * x[size_t(j)];
        y[size_t(i)] /= std::sqrt(double(d));
      }
      const float* cent = lloyd_max_centroids(bits);
      int mismatches = 0;
      for (int64_t g = 0; g < d / 32; ++g) {
        double ss = 0;
        for (int64_t i = 0; i < 32; ++i) ss += y[size_t(g * 32 + i)] * y[size_t(g * 32 + i)];
        const float scale = f16_at(row.data() + d * bits / 8, g);
        EXPECT_NEAR(scale, std::sqrt(ss / 32), 1e-3 * std::sqrt(ss / 32));
        for (int64_t i = 0; i < 32; ++i) {
          const double u = y[size_t(g * 32 + i)] / (scale + 1e-8);
          int best = 0;
          for (int k = 1; k < (1 << bits); ++k)
            if (std::fabs(u - cent[k]) < std::fabs(u - cent[best])) best = k;
          // a value within float rounding of a boundary may fall either way
          const uint32_t got = kv_get_code(row.data(), g * 32 + i, bits);
          if (got != uint32_t(best)) {
            ++mismatches;
            EXPECT_NEAR(std::fabs(u - cent[got]), std::fabs(u - cent[best]), 1e-5) << d << " " << bits << " " << g * 32 + i;
          }
        }
      }
      EXPECT_LE(mismatches, 1);
    }
  // Zeros: scale 0, every code the first centroid at or above 0 (ties go up), decodes to 0.
  const KVCodec c3 = KVCodec::turbo_value(3);
  std::vector<float> z(128, 0.0f);
  const auto row = encode(c3, z);
  for (int64_t i = 0; i < 128; ++i) EXPECT_EQ(kv_get_code(row.data(), i, 3), 4u);
  for (int64_t g = 0; g < 4; ++g) EXPECT_EQ(f16_at(row.data() + 48, g), 0.0f);
  for (float v : decode(c3, row, 128)) EXPECT_EQ(v, 0.0f);
}

TEST(KVCodec, RandomRowErrorBounds) {
  std::mt19937 rng(5);
  std::normal_distribution<float> N;
  for (int64_t d : {64, 128, 256, 512}) {
    std::vector<float> x(static_cast<size_t>(d));
    // Affine and TurboQuant keys: every element within one step (|scale|) of its input.
    for (const KVCodec& c : {KVCodec::affine(8), KVCodec::affine(4), KVCodec::affine(2), KVCodec::turbo_key(8), KVCodec::turbo_key(4),
                             KVCodec::turbo_key(2), KVCodec::turbo_key(5)}) {
      for (int rep = 0; rep < 20; ++rep) {
        for (auto& v : x) v = N(rng) * 2.0f + (rep % 3 == 0 ? 5.0f : 0.0f);
        const auto row = encode(c, x);
        const auto back = decode(c, row, d);
        for (int64_t i = 0; i < d; ++i) {
          const float step = std::fabs(f16_at(row.data() + d * c.bits / 8, i / c.group));
          ASSERT_LE(std::fabs(back[size_t(i)] - x[size_t(i)]), step * 1.1f + 1e-6f)
              << "kind " << int(c.kind) << " bits " << c.bits << " d " << d << " element " << i;
        }
      }
    }
    // TurboQuant values: relative squared error near the Lloyd-Max distortion of a unit Gaussian
    // (0.1175, 0.03454, 0.009497 at 2/3/4 bits; the per-group RMS scale costs a little).
    const double bound[5] = {0, 0, 0.135, 0.042, 0.0125};
    for (int bits = 2; bits <= 4; ++bits) {
      const KVCodec c = KVCodec::turbo_value(bits);
      double err = 0, ref = 0;
      for (int rep = 0; rep < 200; ++rep) {
        for (auto& v : x) v = N(rng);
        x[size_t(rep % d)] += 6.0f;  // an outlier channel: the rotation spreads it
        const auto back = decode(c, encode(c, x), d);
        for (int64_t i = 0; i < d; ++i) err += std::pow(back[size_t(i)] - x[size_t(i)], 2), ref += double(x[size_t(i)]) * x[size_t(i)];
      }
      EXPECT_LT(err / ref, bound[bits]) << "d " << d << " bits " << bits;
      EXPECT_GT(err / ref, bound[bits] * 0.5) << "d " << d << " bits " << bits;  // not suspiciously exact
    }
  }
}

}  // namespace
}  // namespace arbor
