// Tests of the bf16-activation prefill GEMM (gemm_bf16.h) against gemm_bf16_reference (x rounded to
// bf16 once, double accumulation) at odd shapes and thread counts, of its precision against the exact
// f32 product, and of the mode names and the dot-product peak probe. The GEMM itself runs only on an
// AVX-512 BF16 CPU; elsewhere those tests skip and say so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/linear.h"
#include "core/error.h"

namespace arbor::cpu {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) {
    do x = d(rng); while (x == 0.0f);
  }
  return v;
}

std::vector<uint16_t> random_bf16(int64_t N, int64_t K, uint32_t seed) {
  std::vector<float> v = random_floats(size_t(N * K), seed, 1.0f / std::sqrt(float(K)) + 0.05f);
  std::vector<uint16_t> w(v.size());
  for (size_t i = 0; i < v.size(); ++i) w[i] = f32_to_bf16(v[i]);
  return w;
}

double rel_err(const std::vector<float>& y, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) return INFINITY;
    md = std::max(md, double(std::fabs(y[i] - ref[i])));
    mr = std::max(mr, double(std::fabs(ref[i])));
  }
  return md / std::max(mr, 1e-30);
}

#define REQUIRE_BF16_GEMM()                                                                                   \
  if (!gemm_bf16_applies(DType::BF16))                                                                       \
  GTEST_SKIP() << "no AVX-512 BF16 on this CPU (" << cpu_features().brand << ": " << cpu_features().summary() \
               << "); gemm_bf16 is not used here"

// With x rounded the same way, only the f32 summation order differs from the reference.
constexpr double kTol = 1e-5;

TEST(CpuGemmBf16, MatchesReferenceAtOddShapes) {
  REQUIRE_BF16_GEMM();
  ThreadPool p1(1), p2(2), p3(3);
  struct Shape {
    int64_t T, K, N;
  };
  // T: 1 row, a ragged register tile (17 = 12 + 5), exactly one tile, more than one 256-token block;
  // K: 1, odd (a zero partner in the last pair), one k pair short of / past a packed k block (2 x 256
  // pairs), several blocks; N: 1, 5, below and above one 32-column panel, past one 256-column group,
  // and few panels for many threads (the token split).
  const std::vector<Shape> shapes = {{1, 64, 48},   {17, 33, 67},   {12, 1, 5},    {17, 511, 33},  {9, 513, 257},
                                     {25, 1027, 300}, {300, 130, 33}, {13, 4097, 31}, {40, 2, 1},    {261, 96, 520},
                                     {2, 7, 3},     {64, 2048, 64}};
  uint32_t seed = 1;
  int i = 0;
  for (const Shape& s : shapes) {
    std::vector<float> x = random_floats(size_t(s.T * s.K), seed++, 1.0f);
    std::vector<float> bias = random_floats(size_t(s.N), seed++, 0.5f);
    std::vector<uint16_t> w = random_bf16(s.N, s.K, seed++);
    for (bool with_bias : {false, true}) {
      std::vector<float> ref(size_t(s.T * s.N));
      gemm_bf16_reference(x.data(), s.T, s.K, w.data(), s.N, with_bias ? bias.data() : nullptr, ref.data());
      ThreadPool& pool = (i % 3 == 0) ? p1 : (i % 3 == 1) ? p2 : p3;
      ++i;
      std::vector<float> y(ref.size(), NAN);
      gemm_bf16(pool, x.data(), s.T, s.K, w.data(), DType::BF16, s.N, with_bias ? bias.data() : nullptr, y.data());
      EXPECT_LE(rel_err(y, ref), kTol) << "T=" << s.T << " K=" << s.K << " N=" << s.N << " bias=" << with_bias
                                       << " threads=" << pool.size();
    }
  }
}

// f16 weights: each rounded to bf16 (nearest even) as its panel is packed, so the result is the bf16 GEMM's
// on those rounded weights; values spanning f16's range (subnormals, the largest finite) and odd shapes.
TEST(CpuGemmBf16, F16WeightsAreRoundedToBf16) {
  REQUIRE_BF16_GEMM();
  ThreadPool p1(1), p2(2);
  struct Shape {
    int64_t T, K, N;
  };
  const std::vector<Shape> shapes = {{17, 33, 67}, {9, 513, 257}, {25, 1027, 31}, {300, 130, 33}, {2, 7, 3}};
  uint32_t seed = 101;
  int i = 0;
  for (const Shape& s : shapes) {
    std::vector<float> x = random_floats(size_t(s.T * s.K), seed++, 1.0f);
    std::vector<float> wf = random_floats(size_t(s.N * s.K), seed++, 1.0f);
    std::vector<uint16_t> w16(wf.size()), wb(wf.size());
    for (size_t e = 0; e < wf.size(); ++e) {
      float v = wf[e];
      if (e % 7 == 3) v *= 1e-5f;   // f16 subnormals
      if (e % 11 == 5) v *= 6e4f;   // near f16's largest finite (65504)
      w16[e] = f32_to_f16(v);
      wb[e] = f32_to_bf16(f16_to_f32(w16[e]));
    }
    std::vector<float> ref(size_t(s.T * s.N)), y(ref.size(), NAN);
    gemm_bf16_reference(x.data(), s.T, s.K, wb.data(), s.N, nullptr, ref.data());
    ThreadPool& pool = i++ % 2 ? p2 : p1;
    gemm_bf16(pool, x.data(), s.T, s.K, w16.data(), DType::F16, s.N, nullptr, y.data());
    EXPECT_LE(rel_err(y, ref), kTol) << "T=" << s.T << " K=" << s.K << " N=" << s.N << " threads=" << pool.size();
  }
}

// One bf16 rounding of x: the error against the exact product is that of transformers in bf16
// (~2^-9 per element, averaging down over K), far above the split GEMM's 1e-5 and far below 1e-2.
TEST(CpuGemmBf16, ErrorIsOneBf16RoundingOfX) {
  REQUIRE_BF16_GEMM();
  ThreadPool pool(2);
  const int64_t T = 48, K = 2048, N = 64;
  std::vector<float> x = random_floats(size_t(T * K), 11, 1.0f), y(size_t(T * N)), exact(y.size());
  std::vector<uint16_t> w = random_bf16(N, K, 12);
  linear_reference(x.data(), T, K, w.data(), DType::BF16, N, nullptr, exact.data());
  gemm_bf16(pool, x.data(), T, K, w.data(), DType::BF16, N, nullptr, y.data());
  const double e = rel_err(y, exact);
  EXPECT_GT(e, 1e-4);
  EXPECT_LT(e, 1e-2);
}

TEST(CpuGemmBf16, RejectsWhatItCannotRun) {
  ThreadPool pool(1);
  std::vector<float> x(16, 1.0f), y(16);
  std::vector<uint16_t> w(16, 0x3f80);
  EXPECT_THROW(gemm_bf16(pool, x.data(), 2, 4, w.data(), DType::F32, 2, nullptr, y.data()), Error);
  EXPECT_FALSE(gemm_bf16_applies(DType::F32));
  EXPECT_EQ(gemm_bf16_applies(DType::F16), cpu_features().avx512_bf16);
  EXPECT_EQ(gemm_bf16_applies(DType::BF16), cpu_features().avx512_bf16);
  if (!gemm_bf16_applies(DType::BF16)) {
    EXPECT_THROW(gemm_bf16(pool, x.data(), 2, 4, w.data(), DType::BF16, 4, nullptr, y.data()), Error);
    return;
  }
  EXPECT_THROW(gemm_bf16(pool, x.data(), 2, 0, w.data(), DType::BF16, 4, nullptr, y.data()), Error);
  EXPECT_THROW(gemm_bf16(pool, nullptr, 2, 4, w.data(), DType::BF16, 4, nullptr, y.data()), Error);
  y.assign(16, 3.0f);
  gemm_bf16(pool, x.data(), 0, 4, w.data(), DType::BF16, 4, nullptr, y.data());
  EXPECT_EQ(y[0], 3.0f);
}

TEST(CpuGemmBf16, ModeNames) {
  EXPECT_EQ(parse_gemm_mode("exact", "--cpu-gemm"), GemmMode::Exact);
  EXPECT_EQ(parse_gemm_mode("bf16", "--cpu-gemm"), GemmMode::Bf16);
  EXPECT_EQ(gemm_mode_name(GemmMode::Bf16), "bf16");
  EXPECT_EQ(gemm_mode_name(GemmMode::Exact), "exact");
  try {
    parse_gemm_mode("fp8", "--cpu-gemm");
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cpu-gemm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos) << e.what();
  }
}

TEST(CpuDotPeak, MeasuresAPlausibleRate) {
  ThreadPool pool(2);
  DotPeak p = measure_dot_peak(pool, 0.05);
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(p.threads, 2);
  if (!f.avx2) return;
  EXPECT_EQ(p.what, f.avx512_bf16 ? "vdpbf16ps zmm" : f.avx512 ? "vfmadd231ps zmm" : "vfmadd231ps ymm");
  // Two threads do ~30 GFLOP/s (AVX2) to ~500 (AVX-512 BF16) when they have their cores, but on a
  // build machine shared by a dozen compilers a thread may get a fraction of one: the bounds only
  // catch a broken count (0, inf, a unit slip); no CPU core does 1 TFLOP/s on these.
  EXPECT_GT(p.flops, 1e8);
  EXPECT_LT(p.flops, 2e12);
}

}  // namespace
}  // namespace arbor::cpu
