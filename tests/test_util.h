// Helpers shared by the test binaries (include as "../test_util.h").
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace arbor::test {

// Runs f, expecting an arbor::Error; returns its message, or "<no error thrown>" (which no assertion matches).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error thrown>";
}

// n floats uniform in [-1, 1), reproducible from seed.
inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace arbor::test
