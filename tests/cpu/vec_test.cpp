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
