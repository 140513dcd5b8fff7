// The affine reference kernel (cpu/linear_affine) and CpuBackend's affine path against dequantize-then-matmul,
// with an independent packing of the codes (one little-endian bit stream per row), at odd shapes, every bit
// width and group size.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
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
  std::vector<uint16_t> scales16, biases16;    // the same rounded to bf16
};

AffineCase make_case(int64_t N, int64_t K, int bits, int G, uint32_t seed) {
  AffineCase c{N, K, bits, G, {}, {}, {}, {}, {}, {}};
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
    c.scales16.push_back(f32_to_bf16(0.05f * (1.0f + 0.5f * u(rng))));
    c.biases16.push_back(f32_to_bf16(0.3f * u(rng)));
    c.scales.push_back(bf16_to_f32(c.scales16.back()));
    c.biases.push_back(bf16_to_f32(c.biases16.back()));
  }
  return c;
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

TEST(CpuLinearAffine, KernelMatchesDequantizeThenMatmul) {
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
          cpu::linear_affine(pool, x.data(), T, K, c.packed.data(), c.scales.data(), c.biases.data(), bits, G, N, bias.data(), y.data());
          expect_close(y, reference(c, x, T, bias.data()));
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
        EXPECT_EQ(l.scales.dtype, DType::F32);
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
