// Tests of the trellis format (quant/trellis.h) and encoder (quant/trellis_encode.h): the 1MAD values
// against hand computation, the wrapping state window against an independent bit array, config and
// geometry errors, the k=3 interleave, the Viterbi against exhaustive search on small codes, every
// ISA against the scalar step, encode -> pack -> decode, and the distortion on a Gaussian source.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/trellis.h"
#include "quant/trellis_encode.h"
#include "../test_util.h"

namespace arbor::quant {
namespace {

using test::error_of;

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint32_t> random_words(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> v(n);
  for (uint32_t& w : v) w = rng();
  return v;
}

std::vector<TrellisIsa> isas() {
  std::vector<TrellisIsa> v;
  for (TrellisIsa i : {TrellisIsa::scalar, TrellisIsa::avx2, TrellisIsa::avx512})
    if (trellis_isa_supported(i)) v.push_back(i);
  return v;
}

// ---------------------------------------------------------------------------------------------------
// Decode reference

TEST(Trellis, OneMadValuesMatchHandComputation) {
  // Worked by hand: x = s*34038481 + 76625530 mod 2^32, bytes little-end first, y = sum - 510.
  struct Case {
    uint32_t state, x;
    int bytes[4];
    int y;
  };
  const Case cases[] = {
      {0, 0x0491367Au, {0x7A, 0x36, 0x91, 0x04}, 122 + 54 + 145 + 4 - 510},       // -185
      {1, 0x0698994Bu, {0x4B, 0x99, 0x98, 0x06}, 75 + 153 + 152 + 6 - 510},       // -124
      {1234, 0xCC2B89ECu, {0xEC, 0x89, 0x2B, 0xCC}, 236 + 137 + 43 + 204 - 510},  // 110
      {4095, 0x78B6E3A9u, {0xA9, 0xE3, 0xB6, 0x78}, 169 + 227 + 182 + 120 - 510},  // 188
  };
  for (const Case& c : cases) {
    // The same arithmetic in 64 bits with division instead of shifts and masks.
    const uint64_t x = (uint64_t(c.state) * 34038481ull + 76625530ull) % 4294967296ull;
    ASSERT_EQ(x, c.x) << c.state;
    int sum = 0;
    for (int i = 0; i < 4; ++i) {
      const int byte = int(x / (uint64_t(1) << (8 * i)) % 256);
      ASSERT_EQ(byte, c.bytes[i]) << c.state << " byte " << i;
      sum += byte;
    }
    ASSERT_EQ(sum - 510, c.y);
    EXPECT_EQ(trellis_1mad_y(c.state), c.y) << c.state;
    // The f32 product y * (1/std) is within one ulp of the exact quotient.
    const double exact = double(c.y) / 147.800537109375;
    const float v = trellis_1mad_value(c.state);
    EXPECT_EQ(v, float(c.y) * (1.0f / 147.800537109375f));
    EXPECT_LE(std::fabs(double(v) - exact), std::fabs(exact) * 1.2e-7) << c.state;
  }
}

TEST(Trellis, CodeTable) {
  const std::vector<float> table = trellis_code_table(12);
  ASSERT_EQ(table.size(), 4096u);
  double sum = 0, sq = 0;
  std::set<int> ys;
  for (uint32_t s = 0; s < 4096; ++s) {
    EXPECT_EQ(table[s], trellis_1mad_value(s));
    sum += table[s];
    sq += double(table[s]) * table[s];
    ys.insert(trellis_1mad_y(s));
  }
  EXPECT_NEAR(std::sqrt(sq / 4096), trellis_code_rms(12), 1e-12);
  EXPECT_NEAR(trellis_code_rms(12), 1.0041072, 1e-6);  // measured: not exactly 1 at L = 12
  EXPECT_NEAR(sum / 4096, -1.0498046875 / 147.800537109375, 1e-6);
  EXPECT_EQ(ys.size(), 713u);  // of the 1021 possible y in [-510, 510]
}

TEST(Trellis, StateWindowWrapsAtTheBlockEnd) {
  // k = 2, T = 256: state 0 starts at bit 510 (symbol b_0 in bits 510, 511) and wraps to bits 0..9.
  const TrellisParams p{2, 12, 256};
  std::vector<uint32_t> block(16, 0);
  block[15] = 3u << 30;  // b_0 = 3
  block[0] = 0x3FF;      // b_255..b_251 = 3 (bits 0..9)
  EXPECT_EQ(trellis_state(block.data(), p, 0), 0xFFFu);    // bits 510, 511, then 0..9
  EXPECT_EQ(trellis_state(block.data(), p, 1), 0xFFCu);    // bits 508..511 (0, 0, 1, 1), then 0..7
  EXPECT_EQ(trellis_state(block.data(), p, 255), 0x3FFu);  // bits 0..11
  EXPECT_EQ(trellis_state(block.data(), p, 251), 0x003u);  // bits 8..19
  EXPECT_EQ(trellis_state(block.data(), p, 250), 0x000u);  // bits 10..21
}

// The state of every t read from an independent bit array, for random blocks at every k.
TEST(Trellis, StateWindowMatchesABitArray) {
  for (int k : {2, 3, 4}) {
    const TrellisParams p{k, 12, 256};
    const std::vector<uint32_t> block = random_words(size_t(p.words_per_block()), 7 + k);
    std::vector<int> bits(size_t(p.block_bits()));
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = (block[i / 32] >> (i % 32)) & 1;
    for (int t = 0; t < p.T; ++t) {
      uint32_t s = 0;
      for (int i = 0; i < p.L; ++i) s |= uint32_t(bits[size_t(((p.T - 1 - t) * k + i) % p.block_bits())]) << i;
      ASSERT_EQ(trellis_state(block.data(), p, t), s) << "k=" << k << " t=" << t;
    }
  }
}

TEST(Trellis, DecodeBlockAndRow) {
  const TrellisParams p{3, 12, 256};
  const std::vector<uint32_t> words = random_words(size_t(2 * p.words_per_block()), 3);
  std::vector<float> row(512);
  trellis_decode_row(words.data(), 512, p, 0.25f, row.data());
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 256; ++t)
      ASSERT_EQ(row[size_t(b * 256 + t)],
                trellis_1mad_value(trellis_state(words.data() + b * p.words_per_block(), p, t)) * 0.25f);
}

// ---------------------------------------------------------------------------------------------------
// Config and geometry

json entry(int bits, int axis) {
  return json{{"mode", "trellis"}, {"bits", bits}, {"group_size", 256}, {"trellis", {{"L", 12}, {"code", "1mad"}, {"axis", axis}}}};
}

TEST(Trellis, ParsesTheConfigEntry) {
  const TrellisConfig c = parse_trellis_config(entry(3, 0), "m.down_proj");
  EXPECT_EQ(c.bits, 3);
  EXPECT_EQ(c.axis, 0);
  EXPECT_EQ(c.L, 12);
  EXPECT_EQ(c.group_size, 256);
  EXPECT_TRUE(is_trellis_entry(entry(2, 1)));
  EXPECT_FALSE(is_trellis_entry(json{{"group_size", 64}, {"bits", 4}}));
  EXPECT_FALSE(is_trellis_entry(json(false)));

  const std::string mod = "model.layers.3.mlp.up_proj";
  auto err = [&](json e) { return error_of([&] { parse_trellis_config(e, mod); }); };
  json e = entry(5, 1);
  const std::string m = err(e);
  EXPECT_NE(m.find(mod), std::string::npos) << m;
  EXPECT_NE(m.find("bits 5"), std::string::npos) << m;
  e = entry(2, 1), e["group_size"] = 128;
  EXPECT_NE(err(e).find("group_size 128"), std::string::npos);
  e = entry(2, 1), e["trellis"]["L"] = 16;
  EXPECT_NE(err(e).find("L 16"), std::string::npos);
  e = entry(2, 1), e["trellis"]["code"] = "3inst";
  EXPECT_NE(err(e).find("3inst"), std::string::npos);
  e = entry(2, 1), e["trellis"]["axis"] = 2;
  EXPECT_NE(err(e).find("axis 2"), std::string::npos);
  e = entry(2, 1), e.erase("trellis");
  EXPECT_NE(err(e).find("no \"trellis\""), std::string::npos);
  e = entry(2, 1), e["bits"] = "2";
  EXPECT_NE(err(e).find("expected an integer"), std::string::npos);
  e = entry(2, 1), e["mode"] = "affine";
  EXPECT_NE(err(e).find(mod), std::string::npos);
}

struct Pair {
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales;
  Tensor weight, scale;
};

Pair pair(std::initializer_list<int64_t> wshape, int64_t n_scales, DType scale_type = DType::F16) {
  Pair p;
  int64_t n = 1;
  for (int64_t d : wshape) n *= d;
  p.words = random_words(size_t(n), 11);
  p.scales.resize(size_t(n_scales));
  for (int64_t i = 0; i < n_scales; ++i) p.scales[size_t(i)] = f32_to_f16(0.01f * float(i % 7 + 1));
  p.weight = Tensor(p.words.data(), DType::U32, wshape);
  p.scale = Tensor(p.scales.data(), scale_type, {n_scales});
  return p;
}

TEST(Trellis, GeometryFollowsTheShape) {
  for (int k : {2, 3, 4}) {
    Pair a = pair({96, 512 * k / 32}, 96);  // axis 1: [out, in*k/32]
    TrellisConfig c = parse_trellis_config(entry(k, 1), "gate");
    TrellisGeometry g = trellis_geometry("gate", c, a.weight, a.scale, 96, 512);
    EXPECT_EQ(g.rows, 96);
    EXPECT_EQ(g.cols, 512);
    EXPECT_EQ(g.out_features, 96);
    EXPECT_EQ(g.in_features, 512);
    EXPECT_EQ(g.params.words_per_block(), 8 * k);
    EXPECT_FALSE(g.interleaved);
    c.axis = 0;  // axis 0: stored [in, out*k/32]
    g = trellis_geometry("down", c, a.weight, a.scale, 512, 96);
    EXPECT_EQ(g.out_features, 512);
    EXPECT_EQ(g.in_features, 96);
  }
}

TEST(Trellis, GeometryErrorsNameTheTensor) {
  const TrellisConfig c3 = parse_trellis_config(entry(3, 1), "x");
  auto msg = [&](const Pair& p, const TrellisConfig& c, int64_t out = -1, int64_t in = -1) {
    return error_of([&] { trellis_geometry("layers.0.mlp.gate_proj", c, p.weight, p.scale, out, in); });
  };
  std::string m = msg(pair({4, 30}, 4), c3);  // 30 words: not whole 24-word blocks
  EXPECT_NE(m.find("layers.0.mlp.gate_proj"), std::string::npos) << m;
  EXPECT_NE(m.find("24-word"), std::string::npos) << m;
  m = msg(pair({4, 24}, 5), c3);
  EXPECT_NE(m.find("scales [5]"), std::string::npos) << m;
  m = msg(pair({4, 24}, 4, DType::BF16), c3);
  EXPECT_NE(m.find("expected F16"), std::string::npos) << m;
  m = msg(pair({4, 24}, 4), c3, 4, 512);
  EXPECT_NE(m.find("decodes to [4, 256], expected [4, 512]"), std::string::npos) << m;
  Pair f = pair({4, 24}, 4);
  f.weight.dtype = DType::I32;
  EXPECT_NE(msg(f, c3).find("expected U32"), std::string::npos);
  // 3-D weights are only the k=3 axis-0 interleaved layout.
  m = msg(pair({1, 4, 48}, 4), c3);
  EXPECT_NE(m.find("interleaved"), std::string::npos) << m;
  TrellisConfig c2 = parse_trellis_config(entry(2, 0), "x");
  EXPECT_NE(msg(pair({1, 4, 32}, 4), c2).find("k=2 axis=0"), std::string::npos);
  TrellisConfig c3a0 = parse_trellis_config(entry(3, 0), "x");
  EXPECT_NE(msg(pair({1, 4, 24}, 4), c3a0).find("3-D"), std::string::npos);
}

TEST(Trellis, InterleavedK3Axis0IsRecognisedAndDecodesLikeThePlainLayout) {
  const int64_t rows = 5, cols = 1024;  // two block pairs
  const TrellisConfig c = parse_trellis_config(entry(3, 0), "down");
  Pair plain = pair({rows, cols * 3 / 32}, rows);
  const TrellisGeometry gp = trellis_geometry("down", c, plain.weight, plain.scale, cols, rows);
  std::vector<uint32_t> inter = trellis_interleave_k3(plain.words.data(), rows, cols);
  // interleaved[g][r][h*24 + w] = plain[r][(2g + h)*24 + w]
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t w = 0; w < 24; ++w)
          ASSERT_EQ(inter[size_t((g * rows + r) * 48 + h * 24 + w)], plain.words[size_t(r * 96 + (2 * g + h) * 24 + w)]);
  EXPECT_EQ(trellis_deinterleave_k3(inter.data(), rows, cols), plain.words);
  Tensor iw(inter.data(), DType::U32, {cols / 512, rows, 48});
  const TrellisGeometry gi = trellis_geometry("down", c, iw, plain.scale, cols, rows);
  EXPECT_TRUE(gi.interleaved);
  EXPECT_EQ(gi.rows, rows);
  EXPECT_EQ(gi.cols, cols);
  EXPECT_EQ(trellis_decode_linear(gi, iw, plain.scale), trellis_decode_linear(gp, plain.weight, plain.scale));
}

TEST(Trellis, Axis0DecodesToTheTranspose) {
  const int64_t rows = 7, cols = 768;
  Pair a = pair({rows, cols * 4 / 32}, rows);
  TrellisConfig c = parse_trellis_config(entry(4, 1), "m");
  const std::vector<float> w1 = trellis_decode_linear(trellis_geometry("m", c, a.weight, a.scale), a.weight, a.scale);
  c.axis = 0;
  const std::vector<float> w0 = trellis_decode_linear(trellis_geometry("m", c, a.weight, a.scale), a.weight, a.scale);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = f16_to_f32(a.scales[size_t(r)]);
    for (int64_t col = 0; col < cols; ++col) {
      const uint32_t* block = a.words.data() + r * (cols / 8) + col / 256 * 32;
      const float v = trellis_1mad_value(trellis_state(block, TrellisParams{4, 12, 256}, int(col % 256))) * scale;
      ASSERT_EQ(w1[size_t(r * cols + col)], v);
      ASSERT_EQ(w0[size_t(col * rows + r)], v);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Viterbi

// Exhaustive search on a small code: every cyclic bit string of T*k bits is one tail-biting path.
struct BruteForce {
  double best = INFINITY;            // over all tail-biting paths
  std::vector<double> best_overlap;  // per overlap
  double best_open = INFINITY;       // over all paths without the wrap constraint
};

BruteForce brute_force(const TrellisParams& p, const float* x) {
  const int n = p.block_bits(), Q = 1 << (p.L - p.k);
  const uint32_t mask = (1u << p.L) - 1u;
  BruteForce r;
  r.best_overlap.assign(size_t(Q), INFINITY);
  for (uint64_t bits = 0; bits < (uint64_t(1) << n); ++bits) {
    double err = 0;
    uint32_t s0 = 0;
    for (int t = 0; t < p.T; ++t) {
      uint32_t s = 0;
      for (int i = 0; i < p.L; ++i) s |= uint32_t((bits >> (((p.T - 1 - t) * p.k + i) % n)) & 1) << i;
      if (t == 0) s0 = s;
      const double d = double(x[t]) - trellis_1mad_value(s & mask);
      err += d * d;
    }
    r.best = std::min(r.best, err);
    double& o = r.best_overlap[size_t(s0 >> p.k)];
    o = std::min(o, err);
  }
  // Open paths: any start state, then T-1 free symbols.
  for (uint32_t s0 = 0; s0 <= mask; ++s0)
    for (uint64_t sym = 0; sym < (uint64_t(1) << (p.k * (p.T - 1))); ++sym) {
      uint32_t s = s0;
      double d = double(x[0]) - trellis_1mad_value(s);
      double err = d * d;
      for (int t = 1; t < p.T; ++t) {
        s = ((s << p.k) | uint32_t((sym >> (p.k * (t - 1))) & ((1u << p.k) - 1))) & mask;
        d = double(x[t]) - trellis_1mad_value(s);
        err += d * d;
      }
      r.best_open = std::min(r.best_open, err);
    }
  return r;
}

TEST(TrellisViterbi, MatchesExhaustiveSearchOnSmallCodes) {
  // (k, L, T): small enough to enumerate; L - k spans the scalar, AVX2 and AVX-512 steps.
  const TrellisParams shapes[] = {{2, 4, 8}, {2, 6, 8}, {3, 6, 6}, {4, 8, 4}, {1, 3, 14}, {2, 7, 7}};
  for (const TrellisParams& p : shapes)
    for (uint32_t seed = 0; seed < 3; ++seed) {
      const std::vector<float> x = gaussian(size_t(p.T), 100 + seed);
      const BruteForce bf = brute_force(p, x.data());
      const int Q = 1 << (p.L - p.k);
      for (TrellisIsa isa : isas()) {
        TrellisViterbi vit(p, isa);
        std::vector<uint16_t> states(size_t(p.T));
        const std::string where = fmt::format("k={} L={} T={} isa={} seed={}", p.k, p.L, p.T, trellis_isa_name(isa), seed);
        EXPECT_NEAR(vit.path(x.data(), -1, states.data()), bf.best_open, 1e-4) << where;
        for (int c = 0; c < Q; ++c) {
          const double err = vit.path(x.data(), c, states.data());
          ASSERT_TRUE(trellis_is_tail_biting(states.data(), p)) << where << " overlap " << c;
          ASSERT_EQ(states[0] >> p.k, c) << where;
          ASSERT_NEAR(err, bf.best_overlap[size_t(c)], 1e-4) << where << " overlap " << c;
        }
        const double exact = vit.encode_block(x.data(), states.data(), TailBiting::exact);
        EXPECT_TRUE(trellis_is_tail_biting(states.data(), p)) << where;
        EXPECT_NEAR(exact, bf.best, 1e-4) << where;
        const double rotated = vit.encode_block(x.data(), states.data(), TailBiting::rotate);
        EXPECT_TRUE(trellis_is_tail_biting(states.data(), p)) << where;
        EXPECT_GE(rotated, exact - 1e-6) << where;
        // The returned error is the error of the returned path.
        double err = 0;
        for (int t = 0; t < p.T; ++t) err += std::pow(double(x[size_t(t)]) - trellis_1mad_value(states[size_t(t)]), 2);
        EXPECT_NEAR(rotated, err, 1e-9) << where;
      }
    }
}

TEST(TrellisViterbi, EveryIsaChoosesTheScalarPath) {
  for (int k : {2, 3, 4}) {
    const TrellisParams p{k, 12, 256};
    TrellisViterbi ref(p, TrellisIsa::scalar);
    for (TrellisIsa isa : isas()) {
      TrellisViterbi vit(p, isa);
      for (uint32_t seed = 0; seed < 3; ++seed) {
        const std::vector<float> x = gaussian(256, 40 + seed);
        std::vector<uint16_t> a(256), b(256);
        EXPECT_EQ(ref.encode_block(x.data(), a.data()), vit.encode_block(x.data(), b.data()));
        EXPECT_EQ(a, b) << "k=" << k << " isa=" << trellis_isa_name(isa);
      }
    }
  }
}

// Packing: every window of the packed block decodes to the path's state (the wrap included).
TEST(TrellisViterbi, PackedBlockDecodesToTheChosenPath) {
  for (int k : {2, 3, 4}) {
    const TrellisParams p{k, 12, 256};
    TrellisViterbi vit(p);
    for (uint32_t seed = 0; seed < 4; ++seed) {
      const std::vector<float> x = gaussian(256, 60 + seed);
      std::vector<uint16_t> states(256);
      vit.encode_block(x.data(), states.data());
      ASSERT_TRUE(trellis_is_tail_biting(states.data(), p));
      EXPECT_EQ(states[0] >> k, states[255] & ((1 << (12 - k)) - 1));  // the first and last state agree
      std::vector<uint32_t> block(size_t(p.words_per_block()));
      trellis_pack_block(states.data(), p, block.data());
      std::vector<float> out(256);
      trellis_decode_block(block.data(), p, 0.5f, out.data());
      for (int t = 0; t < 256; ++t) {
        ASSERT_EQ(trellis_state(block.data(), p, t), states[size_t(t)]) << "k=" << k << " t=" << t;
        ASSERT_EQ(out[size_t(t)], trellis_1mad_value(states[size_t(t)]) * 0.5f);
      }
    }
  }
}

TEST(TrellisViterbi, RejectsBadShapes) {
  EXPECT_NE(error_of([] { TrellisViterbi v(TrellisParams{5, 4, 8}); }).find("k=5 L=4"), std::string::npos);
  EXPECT_NE(error_of([] { TrellisViterbi v(TrellisParams{2, 12, 4}); }).find("T*k >= L"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------
// Matrix encode

TEST(TrellisEncode, RowScale) {
  const double rms = trellis_code_rms(12);
  std::vector<float> zero(256, 0.0f);
  EXPECT_EQ(f16_to_f32(trellis_row_scale(zero.data(), 256, rms)), 1.0f);
  std::vector<float> tiny(256, 1e-12f);
  EXPECT_EQ(trellis_row_scale(tiny.data(), 256, rms), 1);  // smallest f16 subnormal, not 0
  const std::vector<float> g = gaussian(512, 5, 0.03f);
  double sq = 0;
  for (float v : g) sq += double(v) * v;
  EXPECT_EQ(trellis_row_scale(g.data(), 512, rms), f32_to_f16(float(std::sqrt(sq / 512) / rms)));
  EXPECT_EQ(trellis_row_scale(g.data(), 512, rms, 1.14f), f32_to_f16(float(1.14 * std::sqrt(sq / 512) / rms)));
  // The encoder stores the default gain's scale unless told otherwise; gain 1 is formats.md's RMS ratio.
  for (int k : {2, 3, 4}) {
    const TrellisEncoded d = trellis_encode_stored("s", g.data(), 2, 256, k, 1, nullptr);
    EXPECT_EQ(d.scales[1], trellis_row_scale(g.data() + 256, 256, rms, trellis_default_scale_gain(k)));
    TrellisEncodeOptions o;
    o.scale_gain = 1.0f;
    const TrellisEncoded r = trellis_encode_stored("s", g.data(), 2, 256, k, 1, nullptr, o);
    EXPECT_EQ(r.scales[1], trellis_row_scale(g.data() + 256, 256, rms));
  }
}

// The written words and scales decode to exactly what the encoder chose, for both axes.
TEST(TrellisEncode, LinearDecodesToTheEncodersChoice) {
  const int64_t small = 6, coded = 512;
  std::vector<float> w = gaussian(size_t(small * coded), 9, 0.02f);
  for (int64_t c = 0; c < coded; ++c) w[size_t(2 * coded + c)] = 0.0f;  // axis 1: an all-zero row
  ThreadPool pool(2);
  for (int k : {2, 3, 4})
    for (int axis : {1, 0}) {
      // The coded dim (in for axis 1, out for axis 0) is the one of 512: w is [6, 512] or [512, 6].
      const int64_t o = axis == 1 ? small : coded, i = axis == 1 ? coded : small;
      const TrellisEncoded enc = trellis_encode_linear("w", w.data(), o, i, k, axis, &pool);
      const TrellisGeometry& g = enc.geometry;
      ASSERT_EQ(g.out_features, o);
      ASSERT_EQ(g.in_features, i);
      ASSERT_EQ(enc.words.size(), size_t(g.rows * g.cols * k / 32));
      // Through the tensor checks, as a loader sees the pair.
      Tensor wt(const_cast<uint32_t*>(enc.words.data()), DType::U32, {g.rows, g.words_per_row()});
      Tensor st(const_cast<uint16_t*>(enc.scales.data()), DType::F16, {g.rows});
      const TrellisGeometry lg = trellis_geometry("w", parse_trellis_config(entry(k, axis), "w"), wt, st, o, i);
      const std::vector<float> dec = trellis_decode_linear(lg, wt, st);
      // Re-run the encoder's choice row by row.
      TrellisViterbi vit(TrellisParams{k, 12, 256});
      std::vector<float> x(256);
      std::vector<uint16_t> states(256);
      for (int64_t r = 0; r < g.rows; ++r) {
        const float scale = f16_to_f32(enc.scales[size_t(r)]);
        for (int64_t b = 0; b < g.cols / 256; ++b) {
          for (int t = 0; t < 256; ++t) {
            const int64_t c = b * 256 + t;
            x[size_t(t)] = (axis == 1 ? w[size_t(r * i + c)] : w[size_t(c * i + r)]) * (1.0f / scale);
          }
          vit.encode_block(x.data(), states.data());
          for (int t = 0; t < 256; ++t) {
            const int64_t c = b * 256 + t;
            const float expect = trellis_1mad_value(states[size_t(t)]) * scale;
            ASSERT_EQ(axis == 1 ? dec[size_t(r * i + c)] : dec[size_t(c * i + r)], expect)
                << "k=" << k << " axis=" << axis << " row " << r << " col " << c;
          }
        }
      }
      // Thread count does not change the result.
      const TrellisEncoded one = trellis_encode_linear("w", w.data(), o, i, k, axis, nullptr);
      EXPECT_EQ(one.words, enc.words);
      EXPECT_EQ(one.scales, enc.scales);
    }
}

// The whole-matrix hook (TrellisEncodeOptions::block_viterbi, how the GPU Viterbi plugs in): given a block
// Viterbi that chooses the CPU's paths, the encoded words and scales are the CPU encoder's, on both axes, with
// an all-zero row; it sees each block's targets once, in row-major block order; a path that is not
// tail-biting is refused naming the tensor, and a non-finite weight is refused before it is called.
TEST(TrellisEncode, BlockViterbiHookGivesTheSameWords) {
  const int64_t small = 5, coded = 768;
  std::vector<float> w = gaussian(size_t(small * coded), 12, 0.02f);
  for (int64_t c = 0; c < coded; ++c) w[size_t(1 * coded + c)] = 0.0f;
  ThreadPool pool(2);
  for (int k : {2, 3, 4})
    for (int axis : {1, 0}) {
      const int64_t o = axis == 1 ? small : coded, i = axis == 1 ? coded : small;
      int64_t seen = 0;
      TrellisEncodeOptions opt;
      opt.block_viterbi = [&](int kk, const float* targets, int64_t blocks, uint16_t* states) {
        ASSERT_EQ(kk, k);
        TrellisViterbi vit(TrellisParams{kk, 12, 256});
        for (int64_t b = 0; b < blocks; ++b) vit.encode_block(targets + b * 256, states + b * 256);
        seen += blocks;
      };
      const TrellisEncoded hooked = trellis_encode_linear("w", w.data(), o, i, k, axis, &pool, opt);
      const TrellisEncoded plain = trellis_encode_linear("w", w.data(), o, i, k, axis, &pool);
      EXPECT_EQ(seen, small * coded / 256) << "k=" << k << " axis=" << axis;
      EXPECT_EQ(hooked.words, plain.words) << "k=" << k << " axis=" << axis;
      EXPECT_EQ(hooked.scales, plain.scales) << "k=" << k << " axis=" << axis;
    }
  TrellisEncodeOptions bad;
  bad.block_viterbi = [](int, const float*, int64_t blocks, uint16_t* states) {
    for (int64_t n = 0; n < blocks * 256; ++n) states[n] = uint16_t(n * 37 % 4096);
  };
  std::string m = error_of([&] { trellis_encode_stored("layers.0.mlp.gate_proj", w.data(), 2, 256, 2, 1, nullptr, bad); });
  EXPECT_NE(m.find("layers.0.mlp.gate_proj"), std::string::npos) << m;
  EXPECT_NE(m.find("not tail-biting"), std::string::npos) << m;
  std::vector<float> nan_w(2 * 256, 0.5f);
  nan_w[300] = NAN;
  bool called = false;
  TrellisEncodeOptions spy;
  spy.block_viterbi = [&](int, const float*, int64_t, uint16_t*) { called = true; };
  m = error_of([&] { trellis_encode_stored("q", nan_w.data(), 2, 256, 3, 1, nullptr, spy); });
  EXPECT_NE(m.find("[1, 44]"), std::string::npos) << m;
  EXPECT_FALSE(called);
}

TEST(TrellisEncode, ErrorsNameTheTensor) {
  std::vector<float> w(2 * 256, 0.5f);
  w[300] = NAN;
  std::string m = error_of([&] { trellis_encode_stored("layers.1.mlp.up_proj", w.data(), 2, 256, 3, 1, nullptr); });
  EXPECT_NE(m.find("layers.1.mlp.up_proj"), std::string::npos) << m;
  EXPECT_NE(m.find("[1, 44]"), std::string::npos) << m;
  m = error_of([&] { trellis_encode_stored("q", w.data(), 4, 128, 3, 1, nullptr); });
  EXPECT_NE(m.find("blocks of 256"), std::string::npos) << m;
  m = error_of([&] { trellis_encode_stored("q", w.data(), 2, 256, 5, 1, nullptr); });
  EXPECT_NE(m.find("bits 5"), std::string::npos) << m;
}

// Relative MSE ||W - W^||^2 / ||W||^2 on an i.i.d. Gaussian source, against issue 20's bounds (scalar
// Lloyd-Max gives 0.1175 / 0.0345 / 0.0095; the rate-distortion bound is 0.0625 / 0.0156 / 0.0039).
// With formats.md's RMS-ratio scale (gain 1) k = 4 sits at the bound: 0.00551 over 2M weights
// (docs/benchmarks.md), so the test holds the default gains to the bounds and checks that they beat
// gain 1 where the gain matters (k = 3, 4).
TEST(TrellisEncode, GaussianDistortionWithinBounds) {
  const int64_t rows = 64, cols = 256;
  const std::vector<float> w = gaussian(size_t(rows * cols), 2026, 0.02f);
  ThreadPool pool(2);
  const double bound[5] = {0, 0, 0.080, 0.021, 0.0055};
  auto rel_mse = [&](int k, float gain) {
    TrellisEncodeOptions o;
    o.scale_gain = gain;
    const TrellisEncoded enc = trellis_encode_stored("gauss", w.data(), rows, cols, k, 1, &pool, o);
    const std::vector<float> dec = trellis_decode_linear(enc.geometry, enc.words.data(), enc.scales.data());
    double num = 0, den = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      num += std::pow(double(w[i]) - dec[i], 2);
      den += double(w[i]) * w[i];
    }
    return num / den;
  };
  for (int k : {2, 3, 4}) {
    const double rel = rel_mse(k, 0.0f), rms_ratio = rel_mse(k, 1.0f);
    std::printf("trellis k=%d: relative MSE %.5f (bound %.4f; %.5f with the RMS-ratio scale)\n", k, rel, bound[k],
                rms_ratio);
    EXPECT_LT(rel, bound[k]) << "k=" << k;
    if (k >= 3) {
      EXPECT_LT(rel, rms_ratio) << "k=" << k;
    }
  }
}

}  // namespace
}  // namespace arbor::quant
