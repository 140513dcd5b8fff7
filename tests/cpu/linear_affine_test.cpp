// The affine kernels (cpu/linear_affine: the reference, and the fused GEMV and dequantizing GEMM at every ISA
// level this CPU runs) and CpuBackend's affine path against dequantize-then-matmul in double, with an
// independent packing of the codes (one little-endian bit stream per row), at odd shapes, every bit width and
// group size, bf16 and f16 scales.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear_affine.h"
#include "core/error.h"
#include "../test_util.h"

namespace arbor {
namespace {

using test::random_floats;

struct AffineCase {
  int64_t N, K;
  int bits, G;
  std::vector<uint32_t> codes;                 // [N, K] unpacked
  std::vector<uint32_t> packed;                // [N, K*bits/32]
  std::vector<float> scales, biases;           // [N, K/G] f32
  std::vector<uint16_t> scales16, biases16;    // the same rounded to bf16 (or f16: dtype16)
  DType dtype16 = DType::BF16;
};

AffineCase make_case(int64_t N, int64_t K, int bits, int G, uint32_t seed, DType dtype16 = DType::BF16) {
  AffineCase c{N, K, bits, G, {}, {}, {}, {}, {}, {}, dtype16};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> code(0, (1u << bits) - 1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  c.codes.resize(size_t(N * K));
  c.packed.assign(size_t(N * K * bits / 32), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j) {
      const uint32_t q = code(rng);
      c.codes[size_t(n * K + j)] = q;
      // Bits j*bits .. j*bits+bits-1 of row n's stream, one bit at a time (independent of the kernel's unpacking).
      for (int b = 0; b < bits; ++b)
        if ((q >> b) & 1u) {
          const int64_t bit = j * bits + b;
          c.packed[size_t(n * (K * bits / 32) + bit / 32)] |= 1u << (bit % 32);
        }
    }
  for (int64_t i = 0; i < N * (K / G); ++i) {
    const bool f16 = dtype16 == DType::F16;
    const float s = 0.05f * (1.0f + 0.5f * u(rng)), b = 0.3f * u(rng);
    c.scales16.push_back(f16 ? f32_to_f16(s) : f32_to_bf16(s));
    c.biases16.push_back(f16 ? f32_to_f16(b) : f32_to_bf16(b));
    c.scales.push_back(f16 ? f16_to_f32(c.scales16.back()) : bf16_to_f32(c.scales16.back()));
    c.biases.push_back(f16 ? f16_to_f32(c.biases16.back()) : bf16_to_f32(c.biases16.back()));
  }
  return c;
}

cpu::AffineMatrix matrix_f32(const AffineCase& c) {
  return {c.packed.data(), c.scales.data(), c.biases.data(), DType::F32, c.bits, c.G, c.N, c.K};
}
cpu::AffineMatrix matrix_16(const AffineCase& c) {
  return {c.packed.data(), c.scales16.data(), c.biases16.data(), c.dtype16, c.bits, c.G, c.N, c.K};
}

// W dequantized in f32 (scale * code, then + bias), then y = x W^T + bias accumulated in double.
std::vector<float> reference(const AffineCase& c, const std::vector<float>& x, int64_t T, const float* bias) {
  std::vector<float> w(size_t(c.N * c.K));
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t j = 0; j < c.K; ++j) {
      const size_t g = size_t(n * (c.K / c.G) + j / c.G);
      const float p = c.scales[g] * float(c.codes[size_t(n * c.K + j)]);
      w[size_t(n * c.K + j)] = p + c.biases[g];
    }
  std::vector<float> y(size_t(T * c.N));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < c.N; ++n) {
      double s = bias ? bias[n] : 0.0;
      for (int64_t j = 0; j < c.K; ++j) s += double(x[size_t(t * c.K + j)]) * w[size_t(n * c.K + j)];
      y[size_t(t * c.N + n)] = float(s);
    }
  return y;
}

void expect_close(const std::vector<float>& y, const std::vector<float>& ref) {
  float worst = 0, scale = 0;
  for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - ref[i])), scale = std::max(scale, std::fabs(ref[i]));
  EXPECT_LE(worst, 2e-5f * scale) << "worst " << worst << " of max " << scale;
}

TEST(CpuLinearAffine, ReferenceMatchesDequantizeThenMatmul) {
  ThreadPool pool(2);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int G : {32, 64, 128})
      for (int64_t T : {1, 3, 9})
        for (int64_t N : {1, 7, 37}) {
          const int64_t K = 3 * G;  // three groups: 3-, 5- and 6-bit codes straddle words
          SCOPED_TRACE(::testing::Message() << bits << "-bit g" << G << " T " << T << " N " << N << " K " << K);
          const AffineCase c = make_case(N, K, bits, G, uint32_t(bits * 1000 + G + N * 7 + T));
          const std::vector<float> x = random_floats(size_t(T * K), uint32_t(T + 5)), bias = random_floats(size_t(N), 3);
          std::vector<float> y(size_t(T * N), -1.0f);
          cpu::linear_affine_reference(pool, x.data(), T, matrix_f32(c), bias.data(), y.data());
          expect_close(y, reference(c, x, T, bias.data()));
          std::vector<float> y16(size_t(T * N), -1.0f);
          cpu::linear_affine_reference(pool, x.data(), T, matrix_16(c), bias.data(), y16.data());
          EXPECT_EQ(y16, y) << "bf16 scales read as their f32 values";
        }
}

TEST(CpuLinearAffine, BackendLoadsPackedWeightsAndPicksTheKernel) {
  for (auto placement : {WeightPlacement::Copy, WeightPlacement::Mapped}) {
    CpuBackend be(2, placement);
    for (int bits : {3, 4, 8})
      for (int64_t T : {1, 9, 33}) {
        const int64_t N = 11, K = 128, G = 32;
        SCOPED_TRACE(::testing::Message() << bits << "-bit T " << T);
        const AffineCase c = make_case(N, K, bits, int(G), uint32_t(bits + T));
        Linear h;
        h.format = WeightFormat::Affine, h.n_rows = N, h.n_cols = K, h.bits = bits, h.group_size = int(G);
        h.data = Tensor(const_cast<uint32_t*>(c.packed.data()), DType::U32, {N, K * bits / 32});
        h.scales = Tensor(const_cast<uint16_t*>(c.scales16.data()), DType::BF16, {N, K / G});
        h.biases = Tensor(const_cast<uint16_t*>(c.biases16.data()), DType::BF16, {N, K / G});
        const Linear l = be.load_linear(h);
        EXPECT_EQ(l.format, WeightFormat::Affine);
        EXPECT_EQ(l.data.dtype, DType::U32);  // still packed
        EXPECT_EQ(l.scales.dtype, DType::BF16);  // read as stored
        const std::vector<float> x = random_floats(size_t(T * K), 9);
        std::vector<float> y(size_t(T * N));
        be.linear(Tensor(const_cast<float*>(x.data()), DType::F32, {T, K}), l, Tensor(y.data(), DType::F32, {T, N}));
        expect_close(y, reference(c, x, T, nullptr));

        // The embedding gather dequantizes rows.
        BatchInfo b;
        b.tokens = {4, 0, 10};
        be.begin_batch(b);
        std::vector<float> out(size_t(3 * K));
        be.embed(l, Tensor(out.data(), DType::F32, {3, K}), 0.5f);
        for (int64_t r = 0; r < 3; ++r)
          for (int64_t j = 0; j < K; ++j) {
            const int64_t id = b.tokens[size_t(r)];
            const size_t g = size_t(id * (K / G) + j / G);
            const float p = c.scales[g] * float(c.codes[size_t(id * K + j)]);
            ASSERT_EQ(out[size_t(r * K + j)], (p + c.biases[g]) * 0.5f) << "row " << r << " col " << j;
          }
      }
  }
}

// y and, per output, Σ|x·w| + |bias|: the magnitude f32 rounding in a dot product scales with.
struct Expected {
  std::vector<float> y;
  std::vector<double> mag;
};
Expected expected(const AffineCase& c, const std::vector<float>& x, int64_t T, const float* bias) {
  Expected e{reference(c, x, T, bias), std::vector<double>(size_t(T * c.N), 0.0)};
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t t = 0; t < T; ++t) {
      double m = bias ? std::fabs(bias[n]) : 0.0;
      for (int64_t j = 0; j < c.K; ++j) {
        const size_t g = size_t(n * (c.K / c.G) + j / c.G);
        const float w = c.scales[g] * float(c.codes[size_t(n * c.K + j)]) + c.biases[g];
        m += std::fabs(double(x[size_t(t * c.K + j)]) * w);
      }
      e.mag[size_t(t * c.N + n)] = m;
    }
  return e;
}

// The fast kernels accumulate in f32 in another order than the reference (per group s·Σ(x·q) + b·Σx, or
// over dequantized panels): each output must be within 1e-5 of Σ|x·w| of the double result. f32 rounding
// of a dot product of K <= 640 terms is at most ~K·6e-8 of Σ|x·w| and in practice ~sqrt(K)·6e-8 (~1.5e-6);
// a wrong code, scale or group anywhere shows as ~1e-2 or more.
constexpr double kAffineTol = 1e-5;

TEST(CpuLinearAffine, EveryIsaMatchesReference) {
  ThreadPool p1(1), p3(3);
  const std::vector<cpu::LinearIsa> isas = cpu::linear_isas_supported();
  ASSERT_FALSE(isas.empty());
  double worst = 0;
  uint32_t seed = 100;
  int cases = 0;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int G : {32, 64, 128})
      for (DType dt : {DType::BF16, DType::F16})
        for (int64_t N : {1, 7, 67, 300})
          for (int64_t groups : {1, 3, 5}) {
            const int64_t K = groups * G;
            const AffineCase c = make_case(N, K, bits, G, seed++, dt);
            for (int64_t T : {1, 2, 5, 8, 9, 33}) {
              const bool with_bias = (cases++ % 2) == 0;
              const std::vector<float> x = random_floats(size_t(T * K), seed++), bias = random_floats(size_t(N), seed++);
              const float* b = with_bias ? bias.data() : nullptr;
              const Expected e = expected(c, x, T, b);
              for (cpu::LinearIsa isa : isas) {
                // One pool thread, then three (the GEMV row split, the GEMM panel and token splits).
                for (ThreadPool* pool : {&p1, &p3}) {
                  SCOPED_TRACE(::testing::Message() << cpu::linear_affine_kernel_name(isa, T) << " " << bits << "-bit g" << G << " "
                                                    << dtype_name(dt) << " T " << T << " N " << N << " K " << K << " bias " << with_bias
                                                    << " threads " << pool->size());
                  std::vector<float> y(size_t(T * N), NAN);
                  cpu::linear_affine_with_isa(isa, *pool, x.data(), T, matrix_16(c), b, y.data());
                  double err = 0;
                  for (size_t i = 0; i < y.size(); ++i) {
                    ASSERT_TRUE(std::isfinite(y[i])) << "output " << i;
                    err = std::max(err, std::fabs(double(y[i]) - e.y[i]) / e.mag[i]);
                  }
                  ASSERT_LE(err, kAffineTol);
                  worst = std::max(worst, err);
                }
              }
            }
          }
  std::printf("worst error / sum|x*w| over %d cases: %.3g (tolerance %.0e)\n", cases, worst, kAffineTol);
}

TEST(CpuLinearAffine, DispatchedKernelMatchesReferenceAtModelShape) {
  // A Llama-3.2-1B o_proj [2048, 2048] at 4 bits g64, bf16 scales: decode and prefill (the GEMM's full
  // 128-column panels and 256-token blocks), through the kernel linear_affine picks.
  ThreadPool pool(2);
  const int64_t N = 2048, K = 2048;
  const AffineCase c = make_case(N, K, 4, 64, 7);
  for (int64_t T : {1, 8, 300}) {
    SCOPED_TRACE(::testing::Message() << cpu::linear_affine_kernel_name(T) << " T " << T);
    const std::vector<float> x = random_floats(size_t(T * K), uint32_t(T));
    std::vector<float> y(size_t(T * N), NAN), ref(y.size());
    cpu::linear_affine(pool, x.data(), T, matrix_16(c), nullptr, y.data());
    cpu::linear_affine_reference(pool, x.data(), T, matrix_16(c), nullptr, ref.data());
    double err = 0, scale = 0;
    for (size_t i = 0; i < y.size(); ++i) err = std::max(err, double(std::fabs(y[i] - ref[i]))), scale = std::max(scale, double(std::fabs(ref[i])));
    EXPECT_LE(err, 1e-5 * scale);
  }
}

// --cpu-gemm bf16 on AVX-512 BF16: panels dequantized in f32 and rounded to bf16, x rounded to bf16, f32
// accumulation. The ground truth rounds the same way (gemm_bf16_reference on the dequantized, rounded W), so
// only the summation order differs: within 1e-5 of Σ|x·w| again.
TEST(CpuLinearAffine, Bf16GemmMatchesRoundedReference) {
  if (!cpu::cpu_features().avx512_bf16)
    GTEST_SKIP() << "no AVX-512 BF16 on this CPU (" << cpu::cpu_features().brand << ": " << cpu::cpu_features().summary()
                 << "); the bf16 affine GEMM is not used here";
  ThreadPool p1(1), p3(3);
  uint32_t seed = 900;
  double worst = 0;
  int cases = 0;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int G : {32, 64, 128})
      for (int64_t N : {1, 7, 67, 300})
        for (int64_t groups : {1, 3, 5}) {
          const int64_t K = groups * G;
          const AffineCase c = make_case(N, K, bits, G, seed++, (cases % 2) ? DType::F16 : DType::BF16);
          std::vector<uint16_t> wb(size_t(N * K));
          std::vector<float> row(static_cast<size_t>(K));
          for (int64_t n = 0; n < N; ++n) {
            cpu::affine_dequantize_row(matrix_16(c), n, row.data());
            for (int64_t j = 0; j < K; ++j) wb[size_t(n * K + j)] = f32_to_bf16(row[size_t(j)]);
          }
          for (int64_t T : {9, 33, 300}) {
            const bool with_bias = (cases++ % 3) == 0;
            const std::vector<float> x = random_floats(size_t(T * K), seed++), bias = random_floats(size_t(N), seed++);
            const float* b = with_bias ? bias.data() : nullptr;
            std::vector<float> ref(size_t(T * N));
            cpu::gemm_bf16_reference(x.data(), T, K, wb.data(), N, b, ref.data());
            for (ThreadPool* pool : {&p1, &p3}) {
              SCOPED_TRACE(::testing::Message() << bits << "-bit g" << G << " T " << T << " N " << N << " K " << K << " bias " << with_bias
                                                << " threads " << pool->size());
              std::vector<float> y(ref.size(), NAN);
              cpu::linear_affine_with_isa(cpu::LinearIsa::Avx512Bf16, *pool, x.data(), T, matrix_16(c), b, y.data(), cpu::GemmMode::Bf16);
              for (int64_t t = 0; t < T; ++t)
                for (int64_t n = 0; n < N; ++n) {
                  double mag = b ? std::fabs(b[n]) : 0.0;
                  for (int64_t j = 0; j < K; ++j)
                    mag += std::fabs(double(bf16_to_f32(f32_to_bf16(x[size_t(t * K + j)]))) * bf16_to_f32(wb[size_t(n * K + j)]));
                  const size_t i = size_t(t * N + n);
                  ASSERT_TRUE(std::isfinite(y[i]));
                  const double err = std::fabs(double(y[i]) - ref[i]) / mag;
                  ASSERT_LE(err, kAffineTol) << "t " << t << " n " << n;
                  worst = std::max(worst, err);
                }
            }
          }
        }
  std::printf("bf16 GEMM: worst error / sum|x*w| over %d cases: %.3g (tolerance %.0e)\n", cases, worst, kAffineTol);

  // CpuBackend in --cpu-gemm bf16 mode sends affine prompt chunks here (and 4-bit decode rows to the q8 GEMV).
  ThreadPool pool1(1);
  CpuBackend be(2, WeightPlacement::Copy);
  be.set_gemm_mode(cpu::GemmMode::Bf16);
  const int64_t N = 70, K = 256, G = 64;
  const AffineCase c = make_case(N, K, 4, int(G), 5);
  Linear h;
  h.format = WeightFormat::Affine, h.n_rows = N, h.n_cols = K, h.bits = 4, h.group_size = int(G);
  h.data = Tensor(const_cast<uint32_t*>(c.packed.data()), DType::U32, {N, K / 8});
  h.scales = Tensor(const_cast<uint16_t*>(c.scales16.data()), DType::BF16, {N, K / G});
  h.biases = Tensor(const_cast<uint16_t*>(c.biases16.data()), DType::BF16, {N, K / G});
  const Linear l = be.load_linear(h);
  std::vector<uint16_t> wb(size_t(N * K));
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    cpu::affine_dequantize_row(matrix_16(c), n, row.data());
    for (int64_t j = 0; j < K; ++j) wb[size_t(n * K + j)] = f32_to_bf16(row[size_t(j)]);
  }
  for (int64_t T : {4, 40}) {
    const std::vector<float> x = random_floats(size_t(T * K), 77);
    std::vector<float> y(size_t(T * N)), ref(y.size());
    be.linear(Tensor(const_cast<float*>(x.data()), DType::F32, {T, K}), l, Tensor(y.data(), DType::F32, {T, N}));
    if (T > cpu::kLinearGemvMaxT)
      cpu::gemm_bf16_reference(x.data(), T, K, wb.data(), N, nullptr, ref.data());
    else
      cpu::linear_affine_q8_reference(pool1, x.data(), T, matrix_16(c), nullptr, ref.data());  // the q8 GEMV
    double err = 0, scale = 0;
    for (size_t i = 0; i < y.size(); ++i) err = std::max(err, double(std::fabs(y[i] - ref[i]))), scale = std::max(scale, double(std::fabs(ref[i])));
    EXPECT_LE(err, 1e-5 * scale) << "backend, T " << T;
  }
  EXPECT_EQ(cpu::linear_affine_kernel_name(cpu::LinearIsa::Avx512Bf16, 9, cpu::GemmMode::Bf16), "avx512bf16-affine-gemm-bf16");
  EXPECT_EQ(cpu::linear_affine_kernel_name(cpu::LinearIsa::Avx512Bf16, 9, cpu::GemmMode::Exact), "avx512-affine-gemm");
  EXPECT_EQ(cpu::linear_affine_kernel_name(cpu::LinearIsa::Avx512Bf16, 8, cpu::GemmMode::Bf16), "avx512-affine-gemv");
  EXPECT_EQ(cpu::linear_affine_kernel_name(cpu::LinearIsa::Avx512Bf16, 8, cpu::GemmMode::Bf16, 4),
            cpu::cpu_features().avx512_vnni ? "avx512vnni-affine-gemv-q8" : "avx2-affine-gemv-q8");
}

// ---- The int8-activation GEMV of the fast mode (GemmMode::Bf16, T <= 8, 2/4/8 bits) -------------------

// x with what real activations have: a few large outliers per row, and an all-zero 32-column block (d = 0).
std::vector<float> activations(int64_t T, int64_t K, uint32_t seed) {
  std::vector<float> x = random_floats(size_t(T * K), seed);
  std::mt19937 rng(seed + 1);
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < 3; ++i) x[size_t(t * K) + rng() % size_t(K)] *= 30.0f;
    if (K >= 64)
      for (int64_t j = 32; j < 64; ++j) x[size_t(t * K + j)] = 0.0f;
  }
  return x;
}

// Per output, for the q8 GEMV: the magnitude its f32 rounding scales with (Σ_j |s·code_j|·(|x_j| + d_j) +
// |b|·|x_j|, + |bias|), and the bound of x's int8 rounding: Σ_j |s·code_j|·d_j/2 (|x_j - d·q_j| <= d/2; the
// bias term uses the exact Σx). d_j = max|x| / 127 over x's 32-column block of j, computed here on its own.
struct Q8Bounds {
  std::vector<double> mag, rounding;
};
Q8Bounds q8_bounds(const AffineCase& c, const std::vector<float>& x, int64_t T, const float* bias) {
  Q8Bounds e{std::vector<double>(size_t(T * c.N)), std::vector<double>(size_t(T * c.N))};
  std::vector<double> d(size_t(T * c.K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < c.K; b += 32) {
      double m = 0;
      for (int64_t j = b; j < b + 32; ++j) m = std::max(m, std::fabs(double(x[size_t(t * c.K + j)])));
      for (int64_t j = b; j < b + 32; ++j) d[size_t(t * c.K + j)] = m / 127.0;
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < c.N; ++n) {
      double mag = bias ? std::fabs(bias[n]) : 0.0, r = 0;
      for (int64_t j = 0; j < c.K; ++j) {
        const size_t g = size_t(n * (c.K / c.G) + j / c.G);
        const double sq = std::fabs(double(c.scales[g]) * c.codes[size_t(n * c.K + j)]), xj = std::fabs(double(x[size_t(t * c.K + j)]));
        mag += sq * (xj + d[size_t(t * c.K + j)]) + std::fabs(double(c.biases[g])) * xj;
        r += sq * d[size_t(t * c.K + j)] / 2;
      }
      e.mag[size_t(t * c.N + n)] = mag, e.rounding[size_t(t * c.N + n)] = r;
    }
  return e;
}

// The q8 GEMV against linear_affine_q8_reference (the same int8 x, integer dots and scaling, in double): only
// f32 rounding and summation order differ, within kAffineTol of the magnitude. Both against the exact product
// (dequantize-then-matmul in double): within x's int8 rounding bound, plus kAffineTol of the magnitude.
// Every bits × group × scale dtype the kernel takes, odd N, K of 1, 3 and 5 groups, a long K and one of 1025
// groups (the kernel's per-row scale buffer then leaves the stack), T 1..8 (1, 3, 8 for the long rows; rows in
// pairs up to T 4 (AVX2; VNNI: one row at a time), one at a time above; the last span of a row short of
// the kernel's span: K of 1, 3, 5 groups), with and without bias, one pool thread and three; every ISA
// level (on an AVX512_VNNI CPU the AVX-512 levels run the VNNI kernel, AVX2 the AVX2 one); 3, 5 and 6 bits on
// the levels that take them (the VBMI form: AVX-512 with VNNI and VBMI; their last span short at K of odd 32s).
TEST(CpuLinearAffine, Q8GemvMatchesItsReferenceAndTheExactProductWithinInt8Rounding) {
  std::vector<cpu::LinearIsa> isas;
  for (cpu::LinearIsa isa : cpu::linear_isas_supported())
    if (isa != cpu::LinearIsa::Scalar) isas.push_back(isa);
  if (isas.empty()) GTEST_SKIP() << "no AVX2 on this CPU: the fast mode runs the exact kernels";
  ThreadPool p1(1), p3(3);
  uint32_t seed = 5000;
  int cases = 0;
  double worst_ref = 0, worst_exact = 0;  // kernel vs reference / mag; kernel vs exact / (rounding bound + tol)
  for (int bits : {2, 4, 8, 3, 5, 6})
    for (int G : {32, 64, 128})
      for (DType dt : {DType::F32, DType::BF16, DType::F16})
        for (int64_t N : {1, 7, 67, 300})
          for (int64_t groups : {1, 3, 5, -1, 1025}) {
            const int64_t K = groups > 0 ? groups * G : 8192;  // -1: a long row (down_proj's K)
            if ((groups < 0 && N > 67) || (groups > 5 && N != 7)) continue;
            const AffineCase c = make_case(N, K, bits, G, seed++, dt == DType::F16 ? DType::F16 : DType::BF16);
            const cpu::AffineMatrix w = dt == DType::F32 ? matrix_f32(c) : matrix_16(c);
            for (int64_t T = 1; T <= 8; ++T) {
              if ((groups < 0 || groups > 5) && T != 1 && T != 3 && T != 8) continue;  // long rows: fewer T
              const bool with_bias = (cases++ % 2) == 0;
              const std::vector<float> x = activations(T, K, seed++), bias = random_floats(size_t(N), seed++);
              const float* b = with_bias ? bias.data() : nullptr;
              std::vector<float> ref(size_t(T * N), NAN);
              cpu::linear_affine_q8_reference(p1, x.data(), T, w, b, ref.data());
              const std::vector<float> exact = reference(c, x, T, b);
              const Q8Bounds e = q8_bounds(c, x, T, b);
              for (size_t i = 0; i < ref.size(); ++i)
                ASSERT_LE(std::fabs(double(ref[i]) - exact[i]), e.rounding[i] + kAffineTol * e.mag[i]) << "reference, output " << i;
              for (cpu::LinearIsa isa : isas)
                for (ThreadPool* pool : {&p1, &p3}) {
                  if (!cpu::linear_affine_q8_applies(isa, bits)) continue;  // 3/5/6 bits: VBMI levels only
                  SCOPED_TRACE(::testing::Message() << cpu::linear_affine_kernel_name(isa, T, cpu::GemmMode::Bf16, bits) << " " << bits
                                                    << "-bit g" << G << " " << dtype_name(dt) << " T " << T << " N " << N << " K " << K
                                                    << " bias " << with_bias << " threads " << pool->size());
                  const bool vnni = isa != cpu::LinearIsa::Avx2 && cpu::cpu_features().avx512_vnni;
                  ASSERT_EQ(cpu::linear_affine_kernel_name(isa, T, cpu::GemmMode::Bf16, bits),
                            bits == 3 || bits == 5 || bits == 6 ? "avx512vbmi-affine-gemv-q8"
                            : vnni                             ? "avx512vnni-affine-gemv-q8"
                                                               : "avx2-affine-gemv-q8");
                  std::vector<float> y(size_t(T * N), NAN);
                  cpu::linear_affine_with_isa(isa, *pool, x.data(), T, w, b, y.data(), cpu::GemmMode::Bf16);
                  for (size_t i = 0; i < y.size(); ++i) {
                    ASSERT_TRUE(std::isfinite(y[i])) << "output " << i;
                    const double er = std::fabs(double(y[i]) - ref[i]) / e.mag[i];
                    ASSERT_LE(er, kAffineTol) << "against the q8 reference, output " << i << ": " << y[i] << " vs " << ref[i];
                    const double ee = std::fabs(double(y[i]) - exact[i]) / (e.rounding[i] + kAffineTol * e.mag[i]);
                    ASSERT_LE(ee, 1.0) << "against the exact product, output " << i << ": " << y[i] << " vs " << exact[i];
                    worst_ref = std::max(worst_ref, er), worst_exact = std::max(worst_exact, ee);
                  }
                }
            }
          }
  std::printf("q8 gemv over %d cases: worst |Δ| vs its reference / magnitude %.3g (tolerance %.0e); worst |Δ| vs exact / "
              "(int8 bound + tolerance) %.3g\n",
              cases, worst_ref, kAffineTol, worst_exact);
}

// 3, 5 and 6 bits in the fast mode run the q8 GEMV where VBMI is there (AVX-512 with VNNI and VBMI: within x's int8
// rounding of the exact product) and the exact GEMV elsewhere (to the exact tolerance); the CpuBackend in bf16 mode
// sends q8 decode rows to the q8 GEMV and prompt chunks elsewhere.
TEST(CpuLinearAffine, FastModeDecodeDispatch) {
  ThreadPool pool(2);
  const bool vbmi = cpu::cpu_features().avx512 && cpu::cpu_features().avx512_vnni && cpu::cpu_features().avx512_vbmi;
  for (int bits : {3, 5, 6}) {
    SCOPED_TRACE(bits);
    EXPECT_EQ(cpu::linear_affine_q8_applies(bits), vbmi);
    const AffineCase c = make_case(37, 192, bits, 64, uint32_t(bits));
    const std::vector<float> x = activations(3, 192, 4);
    std::vector<float> y(3 * 37);
    cpu::linear_affine(pool, x.data(), 3, matrix_16(c), nullptr, y.data(), cpu::GemmMode::Bf16);
    const Expected e = expected(c, x, 3, nullptr);
    const Q8Bounds b = q8_bounds(c, x, 3, nullptr);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_LE(std::fabs(double(y[i]) - e.y[i]), (vbmi ? b.rounding[i] : 0.0) + kAffineTol * e.mag[i]) << i;
    if (vbmi) EXPECT_EQ(cpu::linear_affine_kernel_name(3, cpu::GemmMode::Bf16, bits), "avx512vbmi-affine-gemv-q8");
    else EXPECT_EQ(cpu::linear_affine_kernel_name(3, cpu::GemmMode::Bf16, bits), cpu::linear_affine_kernel_name(3, cpu::GemmMode::Exact, bits));
  }
  if (!cpu::cpu_features().avx2) GTEST_SKIP() << "no AVX2: the fast mode runs the exact kernels";
  for (int bits : {2, 4, 8}) EXPECT_TRUE(cpu::linear_affine_q8_applies(bits));
  const std::string q8 = cpu::cpu_features().avx512_vnni ? "avx512vnni-affine-gemv-q8" : "avx2-affine-gemv-q8";
  EXPECT_EQ(cpu::linear_affine_kernel_name(8, cpu::GemmMode::Bf16, 4), q8);
  EXPECT_NE(cpu::linear_affine_kernel_name(9, cpu::GemmMode::Bf16, 4), q8);
  EXPECT_NE(cpu::linear_affine_kernel_name(1, cpu::GemmMode::Exact, 4), q8);

  CpuBackend be(2, WeightPlacement::Copy);
  be.set_gemm_mode(cpu::GemmMode::Bf16);
  const int64_t N = 45, K = 320, G = 32;
  for (int bits : {2, 4, 8, 6})
    for (int64_t T : {1, 8, 9}) {
      SCOPED_TRACE(::testing::Message() << bits << "-bit T " << T);
      const AffineCase c = make_case(N, K, bits, int(G), uint32_t(bits * 10 + T));
      Linear h;
      h.format = WeightFormat::Affine, h.n_rows = N, h.n_cols = K, h.bits = bits, h.group_size = int(G);
      h.data = Tensor(const_cast<uint32_t*>(c.packed.data()), DType::U32, {N, K * bits / 32});
      h.scales = Tensor(const_cast<uint16_t*>(c.scales16.data()), DType::BF16, {N, K / G});
      h.biases = Tensor(const_cast<uint16_t*>(c.biases16.data()), DType::BF16, {N, K / G});
      const Linear l = be.load_linear(h);
      const std::vector<float> x = activations(T, K, 31);
      std::vector<float> y(size_t(T * N)), ref(y.size());
      be.linear(Tensor(const_cast<float*>(x.data()), DType::F32, {T, K}), l, Tensor(y.data(), DType::F32, {T, N}));
      const bool q8 = T <= cpu::kLinearGemvMaxT && cpu::linear_affine_q8_applies(bits);
      if (q8)
        cpu::linear_affine_q8_reference(pool, x.data(), T, matrix_16(c), nullptr, ref.data());
      else if (T > cpu::kLinearGemvMaxT && cpu::cpu_features().avx512_bf16)
        continue;  // the bf16 GEMM: Bf16GemmMatchesRoundedReference
      else
        ref = reference(c, x, T, nullptr);
      const Q8Bounds e = q8_bounds(c, x, T, nullptr);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_LE(std::fabs(double(y[i]) - ref[i]), kAffineTol * e.mag[i]) << "q8 " << q8 << " output " << i;
    }
}

// linear_affine_multi (q/k/v, gate/up in one pass): where it fuses (the q8 GEMV, one K, bits and group) the
// same bits as one linear_affine per matrix (the same prepared x and kernel, rows only regrouped over the
// pool); where it does not (mixed bits, exact mode, T > 8) one call each. Also through CpuBackend::linear_multi.
TEST(CpuLinearAffine, MultiMatchesOneCallEach) {
  ThreadPool p1(1), p3(3);
  const int64_t K = 320;
  for (int bits : {2, 4, 8})
    for (int G : {32, 64})
      for (int64_t T : {1, 2, 5, 8, 9})
        for (cpu::GemmMode mode : {cpu::GemmMode::Bf16, cpu::GemmMode::Exact})
          for (bool mixed : {false, true}) {
            SCOPED_TRACE(::testing::Message() << bits << "-bit g" << G << " T " << T << " bf16 mode " << (mode == cpu::GemmMode::Bf16)
                                              << " mixed " << mixed);
            const int64_t Ns[3] = {67, 13, 13};
            std::vector<AffineCase> cs;
            for (int i = 0; i < 3; ++i) cs.push_back(make_case(Ns[i], K, mixed && i == 2 ? 6 : bits, G, uint32_t(900 + 10 * bits + i)));
            const std::vector<float> x = activations(T, K, uint32_t(T)), bias = random_floats(size_t(Ns[0]), 3);
            std::vector<std::vector<float>> y(3), ref(3);
            cpu::AffineOut outs[3];
            cpu::AffineMatrix ws[3];
            for (int i = 0; i < 3; ++i) {
              y[size_t(i)].assign(size_t(T * Ns[i]), NAN), ref[size_t(i)].assign(size_t(T * Ns[i]), NAN);
              ws[i] = matrix_16(cs[size_t(i)]);
              outs[i] = {ws[i], i == 0 ? bias.data() : nullptr, y[size_t(i)].data()};
            }
            const bool fuses = mode == cpu::GemmMode::Bf16 && T <= cpu::kLinearGemvMaxT && !mixed && cpu::linear_affine_q8_applies(bits);
            EXPECT_EQ(cpu::linear_affine_multi_fuses(ws, 3, T, mode), fuses);
            for (ThreadPool* pool : {&p1, &p3}) {
              cpu::linear_affine_multi(*pool, x.data(), T, outs, 3, mode);
              for (int i = 0; i < 3; ++i) {
                cpu::linear_affine(*pool, x.data(), T, ws[i], outs[i].bias, ref[size_t(i)].data(), mode);
                for (size_t j = 0; j < ref[size_t(i)].size(); ++j)
                  ASSERT_EQ(y[size_t(i)][j], ref[size_t(i)][j]) << "matrix " << i << " output " << j << " threads " << pool->size();
              }
            }
          }

  // The backend: q/k/v-shaped affine linears through linear_multi in bf16 mode, against linear() each.
  CpuBackend be(2, WeightPlacement::Copy);
  be.set_gemm_mode(cpu::GemmMode::Bf16);
  const int64_t Ns[3] = {96, 32, 32};
  std::vector<AffineCase> cs;
  std::vector<Linear> ls;
  for (int i = 0; i < 3; ++i) {
    cs.push_back(make_case(Ns[i], K, 4, 64, uint32_t(70 + i)));
    Linear h;
    h.format = WeightFormat::Affine, h.n_rows = Ns[i], h.n_cols = K, h.bits = 4, h.group_size = 64;
    h.data = Tensor(const_cast<uint32_t*>(cs.back().packed.data()), DType::U32, {Ns[i], K / 8});
    h.scales = Tensor(const_cast<uint16_t*>(cs.back().scales16.data()), DType::BF16, {Ns[i], K / 64});
    h.biases = Tensor(const_cast<uint16_t*>(cs.back().biases16.data()), DType::BF16, {Ns[i], K / 64});
    ls.push_back(be.load_linear(h));
  }
  for (int64_t T : {1, 8}) {
    const std::vector<float> x = activations(T, K, 12);
    const Tensor xt(const_cast<float*>(x.data()), DType::F32, {T, K});
    std::vector<std::vector<float>> y(3), ref(3);
    Backend::LinearOut outs[3];
    for (int i = 0; i < 3; ++i) {
      y[size_t(i)].assign(size_t(T * Ns[i]), NAN), ref[size_t(i)].assign(size_t(T * Ns[i]), NAN);
      outs[i] = {&ls[size_t(i)], Tensor(y[size_t(i)].data(), DType::F32, {T, Ns[i]})};
    }
    be.linear_multi(xt, outs, 3);
    for (int i = 0; i < 3; ++i) {
      be.linear(xt, ls[size_t(i)], Tensor(ref[size_t(i)].data(), DType::F32, {T, Ns[i]}));
      for (size_t j = 0; j < ref[size_t(i)].size(); ++j) ASSERT_EQ(y[size_t(i)][j], ref[size_t(i)][j]) << "backend, T " << T << " matrix " << i;
    }
  }
}

TEST(CpuLinearAffine, KernelsRejectBadArguments) {
  ThreadPool pool(1);
  const AffineCase c = make_case(4, 64, 4, 32, 1);
  const std::vector<float> x = random_floats(64, 1);
  std::vector<float> y(4);
  cpu::AffineMatrix w = matrix_16(c);
  EXPECT_NO_THROW(cpu::linear_affine(pool, x.data(), 1, w, nullptr, y.data()));
  cpu::AffineMatrix bad = w;
  bad.bits = 7;
  EXPECT_NE(test::error_of([&] { cpu::linear_affine(pool, x.data(), 1, bad, nullptr, y.data()); }).find("7 bits not supported"),
            std::string::npos);
  bad = w, bad.group_size = 48;
  EXPECT_NE(test::error_of([&] { cpu::linear_affine(pool, x.data(), 1, bad, nullptr, y.data()); }).find("group size 48"), std::string::npos);
  bad = w, bad.K = 80;  // not a multiple of the group
  EXPECT_NE(test::error_of([&] { cpu::linear_affine(pool, x.data(), 1, bad, nullptr, y.data()); }).find("bad shape"), std::string::npos);
  bad = w, bad.sdtype = DType::U32;
  EXPECT_NE(test::error_of([&] { cpu::linear_affine(pool, x.data(), 1, bad, nullptr, y.data()); }).find("scales/biases dtype"),
            std::string::npos);
  bad = w, bad.scales = nullptr;
  EXPECT_NE(test::error_of([&] { cpu::linear_affine(pool, x.data(), 1, bad, nullptr, y.data()); }).find("null pointer"), std::string::npos);
}

TEST(CpuLinearAffine, LoadRejectsBadGeometry) {
  CpuBackend be(1, WeightPlacement::Copy);
  const AffineCase c = make_case(4, 64, 4, 32, 1);
  Linear h;
  h.format = WeightFormat::Affine, h.n_rows = 4, h.n_cols = 64, h.bits = 4, h.group_size = 32;
  h.data = Tensor(const_cast<uint32_t*>(c.packed.data()), DType::U32, {4, 8});
  h.scales = Tensor(const_cast<uint16_t*>(c.scales16.data()), DType::BF16, {4, 2});
  h.biases = Tensor(const_cast<uint16_t*>(c.biases16.data()), DType::BF16, {4, 2});
  EXPECT_NO_THROW(be.load_linear(h));
  Linear bad = h;
  bad.biases = Tensor{};
  EXPECT_THROW(be.load_linear(bad), Error);
  bad = h, bad.bits = 7;
  EXPECT_THROW(be.load_linear(bad), Error);
  bad = h, bad.data = Tensor(const_cast<uint32_t*>(c.packed.data()), DType::U32, {4, 4});
  EXPECT_THROW(be.load_linear(bad), Error);
}

}  // namespace
}  // namespace arbor
