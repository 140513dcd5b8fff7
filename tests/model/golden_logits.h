// What the transformers-parity tests (parity_test.cpp, affine_fixture_test.cpp, tests/cuda/affine_fixture_test.cpp)
// share: greedy generation that keeps every fed row's logits, and the error of logits against golden ones.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/generate.h"
#include "model/model.h"

namespace arbor::test {

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

}  // namespace arbor::test
