// The MLX affine parity fixtures (tests/fixtures/affine/<name>/, made by tools/quant/affine_fixtures.py): arbor's
// quantized checkpoints with transformers' float32 logits on their dequantized weights (golden.json,
// logits.bin) and transformers' own bf16 error on the GPU. Shared by the CPU and the CUDA fixture tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/json.h"
#include "golden_logits.h"

namespace arbor::test {

struct AffineFixture : ModelFixture {
  double bf16_error = -1;  // transformers in bf16 on the GPU: max|bf16 - f32| / max|ref| (-1: not measured)
  std::vector<double> bf16_row_errors;
};

inline std::string affine_fixture_root(const std::string& source_dir) {
  return (std::filesystem::path(source_dir) / "tests/fixtures/affine").string();
}

inline std::vector<std::string> affine_fixture_names(const std::string& source_dir) {
  return golden_fixture_names(affine_fixture_root(source_dir));
}

inline AffineFixture load_affine_fixture(const std::string& source_dir, const std::string& name) {
  AffineFixture f;
  f.name = name;
  f.dir = affine_fixture_root(source_dir) + "/" + name;
  const json g = read_golden(f);
  EXPECT_EQ(f.rows, int64_t(f.prompt.size() + f.generated.size()) - 1) << f.dir << "/golden.json";
  if (auto b = g.find("bf16"); b != g.end() && b->is_object()) {
    f.bf16_error = b->at("max_rel_error").get<double>();
    f.bf16_row_errors = b->at("row_rel_errors").get<std::vector<double>>();
  }
  return f;
}

// The gap between a row's largest and second largest logit.
inline float top2_margin(const float* row, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] > a) b = a, a = row[i];
    else if (row[i] > b) b = row[i];
  }
  return a - b;
}

}  // namespace arbor::test
