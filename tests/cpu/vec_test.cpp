// The attention vector primitives against their scalar reference, at odd lengths (masked tails).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/vec.h"

using namespace arbor::cpu;

TEST(VecOps, DotAndAxpyMatchScalar) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0, 1);
  const VecOps& fast = vec_ops();
  const VecOps& ref = vec_ops_scalar();
  for (int64_t n : {1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 96, 128, 129, 256}) {
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (auto& v : a) v = d(rng);
    for (auto& v : b) v = d(rng);
    double exact = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) exact += double(a[size_t(i)]) * b[size_t(i)], mag += std::fabs(double(a[size_t(i)]) * b[size_t(i)]);
    EXPECT_NEAR(fast.dot(a.data(), b.data(), n), exact, 1e-5 * mag + 1e-6) << fast.name << " n=" << n;
    EXPECT_NEAR(ref.dot(a.data(), b.data(), n), exact, 1e-5 * mag + 1e-6) << "n=" << n;
    std::vector<float> y1 = b, y2 = b;
    fast.axpy(y1.data(), 0.37f, a.data(), n);
    ref.axpy(y2.data(), 0.37f, a.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y1[size_t(i)], y2[size_t(i)], 1e-6f) << fast.name << " n=" << n << " i=" << i;
  }
}

// silu_mul against double math at odd lengths (masked tails), with and without u, at 0 and -0, and past the
// exp's clamp (|g| = 88, 100: there silu is below 1e-36 and the floor of 1e-30 absolute takes it).
TEST(VecOps, SiluMulMatchesDouble) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> d(-12.0f, 12.0f);
  const VecOps& fast = vec_ops();
  const VecOps& ref = vec_ops_scalar();
  for (int64_t n : {1, 7, 16, 17, 33, 1000}) {
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n)), o1(g.size()), o2(g.size()), o3(g.size());
    for (auto& v : g) v = d(rng);
    for (auto& v : u) v = d(rng);
    if (n >= 16) g[0] = 0.0f, g[1] = -0.0f, g[2] = 100.0f, g[3] = -100.0f, g[4] = 88.0f, g[5] = -88.0f;
    fast.silu_mul(g.data(), u.data(), o1.data(), n);
    ref.silu_mul(g.data(), u.data(), o2.data(), n);
    fast.silu_mul(g.data(), nullptr, o3.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[size_t(i)], s = x / (1.0 + std::exp(-x));
      const double tol = 4 * std::ldexp(1.0, -23) * std::fabs(s) + 1e-30;
      EXPECT_NEAR(o3[size_t(i)], s, tol) << fast.name << " g=" << x;
      EXPECT_NEAR(o1[size_t(i)], s * u[size_t(i)], tol * std::fabs(u[size_t(i)]) * 2 + 1e-30) << fast.name << " g=" << x;
      EXPECT_NEAR(o2[size_t(i)], s * u[size_t(i)], tol * std::fabs(u[size_t(i)]) * 2 + 1e-30) << "scalar g=" << x;
    }
  }
}
