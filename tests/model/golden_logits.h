// What the transformers-parity tests (parity_test.cpp, cpu_gemm_bf16_test.cpp, affine_fixture_test.cpp,
// tests/cuda/affine_fixture_test.cpp) share: the architecture fixtures' goldens, greedy generation that keeps every
// fed row's logits, and the error of logits against golden ones; also two models' generations compared bit for bit
// (affine_model_test.cpp, trellis_model_test.cpp).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/json.h"
#include "engine/generate.h"
#include "model/model.h"

namespace arbor::test {

// An architecture fixture (tests/fixtures/models/<name>/, tools/parity/make_fixtures.py): the prompt and
// transformers' greedy ids (golden.json) and its float32 logits of every row fed (logits.bin).
struct ModelFixture {
  std::string name, dir;
  std::vector<int32_t> prompt, generated;
  int64_t rows = 0, vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  float max_abs = 0;
  // The rows the logits belong to: the prompt, then the generated ids but the last (teacher-forced).
  std::vector<int32_t> fed() const {
    std::vector<int32_t> t = prompt;
    if (!generated.empty()) t.insert(t.end(), generated.begin(), generated.end() - 1);
    return t;
  }
};

// The fixture directories under root that hold a golden.json, sorted (none if root is absent).
inline std::vector<std::string> golden_fixture_names(const std::string& root) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "golden.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// f.dir's golden.json (prompt and greedy ids, rows, vocab) and logits.bin into f; returns golden.json for the fields a
// kind of fixture adds (the affine fixtures' bf16 error).
inline json read_golden(ModelFixture& f) {
  json g = read_json_file(f.dir + "/golden.json");
  f.prompt = g.at("prompt_ids").get<std::vector<int32_t>>();
  f.generated = g.at("generated_ids").get<std::vector<int32_t>>();
  f.rows = g.at("rows").get<int64_t>();
  f.vocab = g.at("vocab").get<int64_t>();
  f.logits.resize(size_t(f.rows * f.vocab));
  std::ifstream in(f.dir + "/logits.bin", std::ios::binary);
  in.read(reinterpret_cast<char*>(f.logits.data()), std::streamsize(f.logits.size() * sizeof(float)));
  EXPECT_TRUE(in.good()) << f.dir << "/logits.bin is shorter than " << f.rows << " x " << f.vocab << " floats";
  for (float v : f.logits) f.max_abs = std::max(f.max_abs, std::fabs(v));
  return g;
}

inline std::vector<std::string> model_fixture_names(const std::string& source_dir) {
  return golden_fixture_names((std::filesystem::path(source_dir) / "tests/fixtures/models").string());
}

inline ModelFixture load_model_fixture(const std::string& source_dir, const std::string& name) {
  ModelFixture f;
  f.name = name;
  f.dir = (std::filesystem::path(source_dir) / "tests/fixtures/models" / name).string();
  read_golden(f);
  return f;
}

// max |a - ref| over a row of n logits, relative to the golden logits' max |ref|.
inline double logit_row_error(const float* a, const float* ref, int64_t n, float max_abs) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) e = std::max(e, double(std::fabs(a[i] - ref[i])));
  return e / double(max_abs);
}

// The worst logit_row_error over `rows` rows of `vocab` logits, and which row (*worst_row).
inline double worst_logit_row_error(const float* got, const float* ref, int64_t rows, int64_t vocab, float max_abs, int64_t* worst_row) {
  double worst = 0;
  *worst_row = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double e = logit_row_error(got + r * vocab, ref + r * vocab, vocab, max_abs);
    if (e > worst) worst = e, *worst_row = r;
  }
  return worst;
}

// Greedy generation of n tokens after `prompt`, keeping the logits of every row fed (the prompt's, then each
// generated token's but the last), as transformers' golden files hold them.
inline GenerateResult greedy_with_logits(Model& m, Backend& be, const std::vector<int32_t>& prompt, int64_t n) {
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = n;
  req.keep_logits = true;
  return generate(m, pool, req);
}

// Greedy generation on two models that must compute the same thing (a checkpoint and the dummy weights that
// reproduce it): an 11-token prompt (the prefill paths), 4 tokens; the same ids and bit-identical finite logits.
inline void expect_identical_generation(Model& a, Backend& ba, Model& b, Backend& bb) {
  const std::vector<int32_t> prompt = {1, 5, 9, 77, 3, 96, 0, 41, 12, 8, 60};
  const GenerateResult ra = greedy_with_logits(a, ba, prompt, 4), rb = greedy_with_logits(b, bb, prompt, 4);
  EXPECT_EQ(ra.tokens, rb.tokens);
  ASSERT_EQ(ra.logits.size(), rb.logits.size());
  ASSERT_FALSE(rb.logits.empty());
  EXPECT_EQ(std::memcmp(ra.logits.data(), rb.logits.data(), ra.logits.size() * sizeof(float)), 0);
  for (float v : rb.logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace arbor::test
