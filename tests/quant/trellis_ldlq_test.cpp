// LDLQ for the trellis encoder (quant/trellis_ldlq.h): the input Hessian against a direct double sum at
// odd sizes; a diagonal Hessian gives the plain encoder's codes bit for bit on both axes, in any coding
// order (no error to feed forward); on correlated inputs the coded weights' output error (the proxy loss) falls well below
// the plain encoder's on both axes, with the CPU Viterbi or a block Viterbi passed in; bad Hessians fail
// naming the tensor.
#include "quant/trellis_ldlq.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/trellis.h"
#include "../test_util.h"

namespace arbor::quant {
namespace {

using test::error_of;

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Rows x [N, n] with strong correlations across all inputs: rank-r factors plus a little noise and a
// per-input gain (some inputs far larger than others, as real activations have).
std::vector<float> correlated_inputs(int64_t N, int64_t n, int rank, uint32_t seed) {
  const std::vector<float> z = gaussian(size_t(N * rank), seed), b = gaussian(size_t(rank * n), seed + 1),
                           e = gaussian(size_t(N * n), seed + 2), g = gaussian(size_t(n), seed + 3);
  std::vector<float> x(size_t(N * n));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t i = 0; i < n; ++i) {
      float s = 0.2f * e[size_t(t * n + i)];
      for (int r = 0; r < rank; ++r) s += z[size_t(t * rank + r)] * b[size_t(r * n + i)];
      x[size_t(t * n + i)] = s * (1.0f + 2.0f * std::fabs(g[size_t(i)]));
    }
  return x;
}

std::vector<double> hessian_of(const std::vector<float>& x, int64_t n, ThreadPool* pool) {
  InputHessian h(n);
  h.add(x.data(), int64_t(x.size()) / n, pool);
  return h.mean();
}

std::vector<float> decoded(const TrellisEncoded& e) { return trellis_decode_linear(e.geometry, e.words.data(), e.scales.data()); }

// Runs body once with each LDLQ kernel set this CPU has (AVX-512, AVX2, the plain reference loops), then restores
// the default choice.
template <class Body>
void for_each_ldlq_isa(Body&& body) {
  for (const char* isa : {"avx512", "avx2", "plain"}) {
    if (!set_ldlq_isa(isa)) continue;
    SCOPED_TRACE(isa);
    body();
  }
  set_ldlq_isa("");
}

// Each tile kernel this CPU runs, odd sizes and row counts (the tiles' and the 16-row padding's edges), with and
// without the pool.
TEST(TrellisLdlq, InputHessianMatchesADirectSum) {
  ThreadPool pool(2);
  for_each_ldlq_isa([&] {
  for (int64_t n : {1, 7, 33, 70}) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      SCOPED_TRACE(n);
      const std::vector<float> x = gaussian(size_t(23 * n), uint32_t(n));
      InputHessian h(n);
      h.add(x.data(), 5, p);  // three calls of 5, 1 and 17 rows
      h.add(x.data() + 5 * n, 1, p);
      h.add(x.data() + 6 * n, 17, p);
      EXPECT_EQ(h.rows(), 23u);
      const std::vector<double> m = h.mean();
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t t = 0; t < 23; ++t) s += double(x[size_t(t * n + i)]) * double(x[size_t(t * n + j)]);
          EXPECT_NEAR(m[size_t(i * n + j)], s / 23, 1e-5 * (1 + std::fabs(s / 23))) << i << "," << j;
        }
      EXPECT_EQ(h.take_mean(), m);  // in place of the sum, moved out
      EXPECT_EQ(h.n(), 0);
    }
  }
  });
  EXPECT_NE(error_of([] { InputHessian(4).mean(); }).find("no rows"), std::string::npos);
}

// The factor against its definition, with each dot-product kernel this CPU runs: R upper with a positive diagonal and
// Rᵀ R H = I, on random positive definite H of odd sizes (the kernels' 8- and 16-lane edges), with and without the
// pool; a matrix that is not positive definite is refused.
TEST(TrellisLdlq, InverseFactorMatchesItsDefinition) {
  ThreadPool pool(2);
  for_each_ldlq_isa([&] {
    for (int64_t n : {1, 5, 37, 130}) {
      SCOPED_TRACE(n);
      std::vector<double> h = hessian_of(correlated_inputs(2 * n + 9, n, 3, uint32_t(n)), n, &pool);
      for (int64_t i = 0; i < n; ++i) h[size_t(i * n + i)] += 0.05;
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<double> r;
        ASSERT_TRUE(ldlq_inverse_factor(h, n, r, p));
        double worst = 0;
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_GT(r[size_t(i * n + i)], 0.0);
          for (int64_t j = 0; j < i; ++j) EXPECT_EQ(r[size_t(i * n + j)], 0.0);
        }
        // (Rᵀ R H)[i][j] = Σ_a R[a][i] (R H)[a][j]
        std::vector<double> rh(size_t(n * n), 0.0);
        for (int64_t a = 0; a < n; ++a)
          for (int64_t b = 0; b < n; ++b)
            for (int64_t j = 0; j < n; ++j) rh[size_t(a * n + j)] += r[size_t(a * n + b)] * h[size_t(b * n + j)];
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double v = 0;
            for (int64_t a = 0; a < n; ++a) v += r[size_t(a * n + i)] * rh[size_t(a * n + j)];
            worst = std::max(worst, std::fabs(v - (i == j ? 1.0 : 0.0)));
          }
        EXPECT_LT(worst, 1e-8);
      }
    }
    std::vector<double> bad = {1, 2, 2, 1}, r;  // eigenvalues 3 and -1
    EXPECT_FALSE(ldlq_inverse_factor(bad, 2, r, &pool));
  });
}

TEST(TrellisLdlq, DiagonalHessianGivesThePlainCodes) {
  ThreadPool pool(2);
  struct Case {
    int64_t out, in;
    int k, axis;
  };
  for (const Case c : {Case{5, 512, 2, 1}, Case{3, 256, 3, 1}, Case{256, 9, 2, 0}, Case{512, 3, 4, 0}}) {
    SCOPED_TRACE(testing::Message() << c.out << "x" << c.in << " k" << c.k << " axis " << c.axis);
    const std::vector<float> w = gaussian(size_t(c.out * c.in), uint32_t(c.out + c.in));
    std::vector<double> h(size_t(c.in * c.in), 0.0);
    for (int64_t i = 0; i < c.in; ++i) h[size_t(i * c.in + i)] = 1.0 + double((i * 7) % 5);  // diagonal: act order moves inputs
    const TrellisEncoded plain = trellis_encode_linear("w", w.data(), c.out, c.in, c.k, c.axis, &pool);
    const TrellisEncoded ldlq = trellis_encode_linear_ldlq("w", w.data(), c.out, c.in, c.k, c.axis, h, &pool);
    EXPECT_EQ(ldlq.geometry.axis, c.axis);
    EXPECT_EQ(ldlq.geometry.in_features, c.in);
    EXPECT_EQ(ldlq.geometry.out_features, c.out);
    EXPECT_EQ(ldlq.words, plain.words);
    EXPECT_EQ(ldlq.scales, plain.scales);
  }
}

TEST(TrellisLdlq, CorrelatedInputsLowerTheOutputError) {
  ThreadPool pool(2);
  struct Case {
    int64_t out, in;
    int k, axis;
    double most;  // LDLQ's proxy loss at most this fraction of the plain encoder's
  };
  // Axis 0 feeds every input's error forward; axis 1 only across its 256-input blocks (three here).
  for (const Case c : {Case{256, 48, 2, 0, 0.3}, Case{256, 37, 3, 0, 0.3}, Case{24, 768, 2, 1, 0.5}, Case{7, 512, 4, 1, 0.8}}) {
    SCOPED_TRACE(testing::Message() << c.out << "x" << c.in << " k" << c.k << " axis " << c.axis);
    const std::vector<double> h = hessian_of(correlated_inputs(4 * c.in + 64, c.in, 6, uint32_t(c.in)), c.in, &pool);
    const std::vector<float> w = gaussian(size_t(c.out * c.in), uint32_t(7 * c.in + c.k));
    const double plain = hessian_proxy_loss(w.data(), decoded(trellis_encode_linear("w", w.data(), c.out, c.in, c.k, c.axis, &pool)).data(),
                                            c.out, c.in, h);
    const TrellisEncoded e = trellis_encode_linear_ldlq("w", w.data(), c.out, c.in, c.k, c.axis, h, &pool);
    const double ldlq = hessian_proxy_loss(w.data(), decoded(e).data(), c.out, c.in, h);
    std::printf("    [%lld x %lld] k %d axis %d: proxy loss plain %.4g, LDLQ %.4g (%.3f)\n", (long long)c.out, (long long)c.in, c.k, c.axis,
                plain, ldlq, ldlq / plain);
    EXPECT_LT(ldlq, c.most * plain);
    if (c.axis == 0) {  // in the stored order too (act order off)
      LdlqOptions lo;
      lo.act_order = false;
      const double in_order =
          hessian_proxy_loss(w.data(), decoded(trellis_encode_linear_ldlq("w", w.data(), c.out, c.in, c.k, 0, h, &pool, {}, lo)).data(),
                             c.out, c.in, h);
      std::printf("    the same in the stored order: %.4g (%.3f)\n", in_order, in_order / plain);
      EXPECT_LT(in_order, c.most * plain);
    }

    // The same codes through a block Viterbi passed in (how the GPU's is used), and it is called.
    TrellisEncodeOptions opt;
    int calls = 0;
    opt.block_viterbi = [&](int k, const float* targets, int64_t blocks, uint16_t* states) {
      ++calls;
      TrellisViterbi v(TrellisParams{k, 12, 256});
      for (int64_t b = 0; b < blocks; ++b) v.encode_block(targets + b * 256, states + b * 256);
    };
    const TrellisEncoded eb = trellis_encode_linear_ldlq("w", w.data(), c.out, c.in, c.k, c.axis, h, &pool, opt);
    EXPECT_GT(calls, 0);
    EXPECT_EQ(eb.words, e.words);
    EXPECT_EQ(eb.scales, e.scales);
  }
}

TEST(TrellisLdlq, ErrorsNameTheTensor) {
  const std::vector<float> w = gaussian(256 * 2, 1);
  std::vector<double> h = {1, 0, 0, 1};
  EXPECT_NE(error_of([&] { trellis_encode_linear_ldlq("layers.0.down", w.data(), 256, 2, 2, 0, std::vector<double>(3), nullptr); })
                .find("'layers.0.down': an input Hessian of 3 values for 2 inputs"),
            std::string::npos);
  // Not positive definite (eigenvalues -1 and 3) even with the damping.
  const std::vector<double> indefinite = {1, 2, 2, 1};
  EXPECT_NE(error_of([&] { trellis_encode_linear_ldlq("layers.0.down", w.data(), 256, 2, 2, 0, indefinite, nullptr); })
                .find("'layers.0.down': the input Hessian is not positive definite"),
            std::string::npos);
  const std::vector<double> negative = {-1, 0, 0, -1};
  EXPECT_NE(error_of([&] { trellis_encode_linear_ldlq("layers.0.down", w.data(), 256, 2, 2, 0, negative, nullptr); })
                .find("'layers.0.down': the input Hessian"),
            std::string::npos);
  std::vector<float> bad = w;
  bad[3] = NAN;
  EXPECT_NE(error_of([&] { trellis_encode_linear_ldlq("layers.0.down", bad.data(), 256, 2, 2, 0, h, nullptr); })
                .find("'layers.0.down': weight [1, 1] is nan"),
            std::string::npos);
  EXPECT_NE(error_of([&] { trellis_encode_linear_ldlq("q", w.data(), 2, 256, 2, 0, std::vector<double>(256 * 256), nullptr); })
                .find("'q': cannot code [2, 256] along its outputs"),
            std::string::npos);
  // A Hessian of zeros (the linear never saw a nonzero input): the plain codes.
  const TrellisEncoded z = trellis_encode_linear_ldlq("z", w.data(), 256, 2, 2, 0, std::vector<double>(4, 0.0), nullptr);
  EXPECT_EQ(z.words, trellis_encode_linear("z", w.data(), 256, 2, 2, 0, nullptr).words);
}

}  // namespace
}  // namespace arbor::quant
