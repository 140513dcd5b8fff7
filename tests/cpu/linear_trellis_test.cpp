// The trellis kernels (cpu/linear_trellis): the reference against the dense product of
// quant::trellis_decode_linear's weights, and every GEMV and tiled kernel this CPU runs against the
// reference, at odd shapes (rows/outputs 1, 7, 67, 300; coded length 256, 768, 1280), T = 1, 3, 8, 9, 33, k = 2/3/4,
// both axes, with a bias. CpuBackend's trellis path (load_linear: f16 scales, the interleaved k = 3
// axis-0 layout; linear at decode and prefill rows) against a dense layer of the decoded weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/linear_trellis.h"
#include "core/dtype.h"
#include "quant/trellis.h"
#include "../test_util.h"

namespace arbor {
namespace {

using test::random_floats;

struct TrellisCase {
  int k, axis;
  int64_t N, K;                  // W [N out, K in]
  std::vector<uint32_t> words;   // plain layout
  std::vector<uint16_t> scales16;
  std::vector<float> scales;     // the f16 values in f32
  std::vector<float> dense;      // decoded W [N, K]
  quant::TrellisGeometry g;
};

TrellisCase make_case(int k, int axis, int64_t N, int64_t K, uint32_t seed) {
  TrellisCase c{k, axis, N, K, {}, {}, {}, {}, {}};
  const int64_t rows = axis == 1 ? N : K, cols = axis == 1 ? K : N;
  std::mt19937 rng(seed);
  c.words.resize(size_t(rows * cols * k / 32));
  for (auto& w : c.words) w = rng();  // every word is a valid code (formats.md §3)
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (int64_t r = 0; r < rows; ++r) {
    c.scales16.push_back(f32_to_f16(0.02f * u(rng)));
    c.scales.push_back(f16_to_f32(c.scales16.back()));
  }
  c.g.params = {k, 12, 256};
  c.g.axis = axis, c.g.rows = rows, c.g.cols = cols, c.g.in_features = K, c.g.out_features = N;
  c.dense = quant::trellis_decode_linear(c.g, c.words.data(), c.scales16.data());
  return c;
}

cpu::TrellisWeights weights_of(const TrellisCase& c) { return {c.words.data(), c.scales.data(), c.k, c.axis, c.N, c.K}; }

// |W| |x|ᵀ per output: the scale of the rounding error a sum in f32 may make.
std::vector<double> abs_dot(const TrellisCase& c, const std::vector<float>& x, int64_t T) {
  std::vector<double> out(size_t(T * c.N), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < c.N; ++n) {
      double s = 0;
      for (int64_t j = 0; j < c.K; ++j) s += std::fabs(double(c.dense[size_t(n * c.K + j)]) * x[size_t(t * c.K + j)]);
      out[size_t(t * c.N + n)] = s;
    }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& scale, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double tol = rel * scale[i] + 1e-6;
    if (!(std::fabs(double(got[i]) - double(want[i])) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i] << " (tolerance " << tol << ")";
      ++bad;
    }
  }
}

struct Shape {
  int64_t rows, coded;  // coded rows (outputs on axis 1, inputs on axis 0) and coded length
};
// {300, 256}: on axis 0, 300 coded rows over one output block: the GEMV splits the rows into slices.
// {67, 1280}: on axis 0, 5 output blocks: at T = 8 two groups of blocks (4 + 1), each over its own rows.
const Shape kShapes[] = {{1, 256}, {7, 768}, {67, 256}, {67, 768}, {300, 256}, {67, 1280}};
const int64_t kTs[] = {1, 3, 8, 9, 33};

TEST(LinearTrellis, ReferenceIsTheDenseProductOfTheDecodedWeights) {
  ThreadPool pool(2);
  uint32_t seed = 1;
  for (int k : {2, 3, 4})
    for (int axis : {0, 1})
      for (const Shape& s : kShapes) {
        const int64_t N = axis == 1 ? s.rows : s.coded, K = axis == 1 ? s.coded : s.rows;
        const TrellisCase c = make_case(k, axis, N, K, seed++);
        for (int64_t T : {int64_t(1), int64_t(9)}) {
          const auto x = random_floats(size_t(T * K), seed++);
          const auto bias = random_floats(size_t(N), seed++);
          std::vector<float> got(size_t(T * N)), want(size_t(T * N));
          cpu::linear_trellis(pool, x.data(), T, weights_of(c), bias.data(), got.data(), cpu::TrellisKernel::Reference);
          cpu::linear_reference(x.data(), T, K, c.dense.data(), DType::F32, N, bias.data(), want.data());
          expect_close(got, want, abs_dot(c, x, T), 1e-7,
                       "reference k=" + std::to_string(k) + " axis=" + std::to_string(axis) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K) + " T=" + std::to_string(T));
        }
      }
}

void check_kernel(cpu::TrellisKernel kernel) {
  if (!cpu::trellis_kernel_supported(kernel)) GTEST_SKIP() << "this CPU cannot run the " << cpu::trellis_kernel_name(kernel) << " kernel";
  ThreadPool pool(3);
  uint32_t seed = 100;
  for (int k : {2, 3, 4})
    for (int axis : {0, 1})
      for (const Shape& s : kShapes) {
        const int64_t N = axis == 1 ? s.rows : s.coded, K = axis == 1 ? s.coded : s.rows;
        const TrellisCase c = make_case(k, axis, N, K, seed++);
        for (int64_t T : kTs) {
          const auto x = random_floats(size_t(T * K), seed++);
          const auto bias = random_floats(size_t(N), seed++);
          const auto scale = abs_dot(c, x, T);
          for (const bool with_bias : {true, false}) {
            std::vector<float> want(size_t(T * N));
            const float* b = with_bias ? bias.data() : nullptr;
            cpu::linear_trellis(pool, x.data(), T, weights_of(c), b, want.data(), cpu::TrellisKernel::Reference);
            for (const bool tiled : {false, true}) {
              if (!tiled && T > cpu::kLinearGemvMaxT) continue;
              std::vector<float> got(size_t(T * N), NAN);
              cpu::linear_trellis(pool, x.data(), T, weights_of(c), b, got.data(), kernel, tiled);
              expect_close(got, want, scale, 2e-6,
                           std::string(cpu::trellis_kernel_name(kernel)) + (tiled ? " tiled" : " gemv") + " k=" + std::to_string(k) +
                               " axis=" + std::to_string(axis) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                               " T=" + std::to_string(T) + (with_bias ? " bias" : ""));
            }
          }
        }
      }
}

// Every weight the GEMV decodes is the format's value, bit for bit: with one-hot activation rows (row t has a
// 1 at input j + t) each output is a single product, which every GEMV computes as float(y)·(scale·(1/147.8))
// with y = quant::trellis_1mad_y of the weight's state (quant::trellis_state) and no other rounding.
void check_gemv_decodes_exactly(cpu::TrellisKernel kernel) {
  if (!cpu::trellis_kernel_supported(kernel)) GTEST_SKIP() << "this CPU cannot run the " << cpu::trellis_kernel_name(kernel) << " kernel";
  ThreadPool pool(2);
  const float inv = 1.0f / quant::kTrellis1madStd;
  uint32_t seed = 900;
  for (int k : {2, 3, 4})
    for (int axis : {0, 1}) {
      const int64_t N = axis == 1 ? 37 : 1280, K = axis == 1 ? 768 : 37;
      const TrellisCase c = make_case(k, axis, N, K, seed++);
      const int64_t wpr = c.g.cols / 256 * c.g.params.words_per_block();
      int bad = 0;
      for (int64_t T = 1; T <= cpu::kLinearGemvMaxT; ++T)
        for (int64_t j = 0; j + T <= K; j += T) {
          std::vector<float> x(size_t(T * K), 0.0f), y(size_t(T * N), NAN);
          for (int64_t t = 0; t < T; ++t) x[size_t(t * K + j + t)] = 1.0f;
          cpu::linear_trellis(pool, x.data(), T, weights_of(c), nullptr, y.data(), kernel);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n) {
              const int64_t row = axis == 1 ? n : j + t, col = axis == 1 ? j + t : n;
              const uint32_t* block = c.words.data() + row * wpr + col / 256 * c.g.params.words_per_block();
              const float want = float(quant::trellis_1mad_y(quant::trellis_state(block, c.g.params, int(col % 256)))) * (c.scales[size_t(row)] * inv);
              if (y[size_t(t * N + n)] != want && bad++ < 5)
                ADD_FAILURE() << cpu::trellis_kernel_name(kernel) << " k=" << k << " axis=" << axis << " T=" << T << " weight (" << n << ", "
                              << j + t << "): got " << y[size_t(t * N + n)] << " want " << want;
            }
        }
    }
}

TEST(LinearTrellis, Avx2GemvDecodesExactly) { check_gemv_decodes_exactly(cpu::TrellisKernel::Avx2); }
TEST(LinearTrellis, Avx512GemvDecodesExactly) { check_gemv_decodes_exactly(cpu::TrellisKernel::Avx512); }
TEST(LinearTrellis, Avx512VbmiGemvDecodesExactly) { check_gemv_decodes_exactly(cpu::TrellisKernel::Avx512Vbmi); }

TEST(LinearTrellis, Avx2MatchesReference) { check_kernel(cpu::TrellisKernel::Avx2); }
TEST(LinearTrellis, Avx512MatchesReference) { check_kernel(cpu::TrellisKernel::Avx512); }
TEST(LinearTrellis, Avx512VbmiMatchesReference) { check_kernel(cpu::TrellisKernel::Avx512Vbmi); }

TEST(LinearTrellis, BadShapesFail) {
  ThreadPool pool(1);
  const TrellisCase c = make_case(2, 1, 4, 256, 7);
  std::vector<float> x(256), y(4);
  cpu::TrellisWeights w = weights_of(c);
  w.K = 200;
  EXPECT_NE(test::error_of([&] { cpu::linear_trellis(pool, x.data(), 1, w, nullptr, y.data()); }).find("not a multiple of 256"),
            std::string::npos);
  w = weights_of(c);
  w.k = 5;
  EXPECT_NE(test::error_of([&] { cpu::linear_trellis(pool, x.data(), 1, w, nullptr, y.data()); }).find("k = 5"), std::string::npos);
}

// CpuBackend: a host trellis Linear (f16 scales; k = 3 axis 0 also interleaved) loaded and run equals a dense
// F32 layer of the decoded weights, at decode and prefill rows.
TEST(LinearTrellis, BackendLoadsAndRunsTrellisLinears) {
  for (const WeightPlacement place : {WeightPlacement::Mapped, WeightPlacement::Copy}) {
    CpuBackend be(2, place);
    uint32_t seed = 500;
    for (int k : {2, 3, 4})
      for (int axis : {0, 1})
        for (bool interleave : {false, true}) {
          if (interleave && !(k == 3 && axis == 0)) continue;
          const int64_t N = axis == 1 ? 67 : 512, K = axis == 1 ? 512 : 67;
          TrellisCase c = make_case(k, axis, N, K, seed++);
          std::vector<uint32_t> stored = c.words;
          Linear host;
          host.format = WeightFormat::Trellis, host.bits = k, host.group_size = 256, host.axis = axis;
          host.n_rows = N, host.n_cols = K;
          if (interleave) {
            stored = quant::trellis_interleave_k3(c.words.data(), K, N);
            host.data = Tensor(stored.data(), DType::U32, {N / 512, K, 48});
          } else {
            host.data = Tensor(stored.data(), DType::U32, {c.g.rows, int64_t(c.words.size()) / c.g.rows});
          }
          host.scales = Tensor(c.scales16.data(), DType::F16, {c.g.rows});
          auto bias = random_floats(size_t(N), seed++);
          host.bias = Tensor(bias.data(), DType::F32, {N});
          const Linear l = be.load_linear(host);
          const Linear d = be.load_linear(Linear::dense(Tensor(c.dense.data(), DType::F32, {N, K}), host.bias));
          EXPECT_EQ(l.describe(), "trellis " + std::to_string(k) + "-bit axis " + std::to_string(axis) + " [" + std::to_string(N) + ", " +
                                      std::to_string(K) + "]");
          for (int64_t T : {int64_t(1), int64_t(5), int64_t(33)}) {
            auto x = random_floats(size_t(T * K), seed++);
            Tensor xt(x.data(), DType::F32, {T, K});
            std::vector<float> got(size_t(T * N)), want(size_t(T * N));
            be.linear(xt, l, Tensor(got.data(), DType::F32, {T, N}));
            be.linear(xt, d, Tensor(want.data(), DType::F32, {T, N}));
            expect_close(got, want, abs_dot(c, x, T), 2e-6,
                         "backend k=" + std::to_string(k) + " axis=" + std::to_string(axis) + (interleave ? " interleaved" : "") +
                             " T=" + std::to_string(T));
          }
        }
  }
}

}  // namespace
}  // namespace arbor
