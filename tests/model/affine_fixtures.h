// The MLX affine parity fixtures (tests/fixtures/affine/<name>/, made by tools/quant/affine_fixtures.py): arbor's
// quantized checkpoints with transformers' float32 logits on their dequantized weights (golden.json,
// logits.bin) and transformers' own bf16 error on the GPU. Shared by the CPU and the CUDA fixture tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/json.h"

namespace arbor::test {

struct AffineFixture {
  std::string name, dir;
  std::vector<int32_t> prompt, generated;
  int64_t rows = 0, vocab = 0;
  std::vector<float> logits;  // [rows, vocab]: row i predicts token i + 1 of prompt + generated
  float max_abs = 0;
  double bf16_error = -1;     // transformers in bf16 on the GPU: max|bf16 - f32| / max|ref| (-1: not measured)
  std::vector<double> bf16_row_errors;
};

inline std::string affine_fixture_root(const std::string& source_dir) {
  return (std::filesystem::path(source_dir) / "tests/fixtures/affine").string();
}

inline std::vector<std::string> affine_fixture_names(const std::string& source_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  const fs::path root = affine_fixture_root(source_dir);
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "golden.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

inline AffineFixture load_affine_fixture(const std::string& source_dir, const std::string& name) {
  AffineFixture f;
  f.name = name;
  f.dir = affine_fixture_root(source_dir) + "/" + name;
  const json g = read_json_file(f.dir + "/golden.json");
  f.prompt = g.at("prompt_ids").get<std::vector<int32_t>>();
  f.generated = g.at("generated_ids").get<std::vector<int32_t>>();
  f.rows = g.at("rows").get<int64_t>();
  f.vocab = g.at("vocab").get<int64_t>();
  EXPECT_EQ(f.rows, int64_t(f.prompt.size() + f.generated.size()) - 1) << f.dir << "/golden.json";
  f.logits.resize(size_t(f.rows * f.vocab));
  std::ifstream in(f.dir + "/logits.bin", std::ios::binary);
  in.read(reinterpret_cast<char*>(f.logits.data()), std::streamsize(f.logits.size() * sizeof(float)));
  EXPECT_TRUE(in.good()) << f.dir << "/logits.bin is shorter than " << f.rows << " x " << f.vocab << " floats";
  for (float v : f.logits) f.max_abs = std::max(f.max_abs, std::fabs(v));
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
