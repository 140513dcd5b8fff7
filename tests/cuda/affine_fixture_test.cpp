// MLX affine checkpoints on CUDA against Hugging Face transformers: every fixture under tests/fixtures/affine/
// (tools/quant/affine_fixtures.py: arbor's quantized checkpoints, transformers' float32 logits on their
// dequantized weights, and transformers' own error when it runs the same weights in bf16 on the GPU) must give
// the float32 logits no worse than transformers in bf16 does, fed
// teacher-forced through the prompt as one chunk (the 9-64 row kernels), a 3-token chunk (the multi-row GEMV)
// and single tokens (the decode GEMV, graph replay); and greedy generation must give transformers' ids except at
// a near-tie (a reference top-2 gap within twice that error). "No worse": the mean over rows of max|Δ| / max|ref|
// at most transformers' own mean, and the worst row at most 1.25x transformers' worst (one row's bf16 error is
// one draw of rounding noise: on qwen3_q5_g32 an H200 gave 9.164e-3 against transformers' 9.136e-3 at the same
// row, while the means were lower). Both never below the CPU's tolerance, 2e-3. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "../model/affine_fixtures.h"
#include "../model/golden_logits.h"
#include "cuda_test_util.h"
#include "engine/generate.h"

using namespace arbor;

namespace {

std::vector<std::string> names() { return test::affine_fixture_names(cuda_test::source_dir()); }

// Every row's logits for `tokens`, fed in chunks of the given sizes (the last repeated to the end).
std::vector<float> teacher_forced(Model& m, Backend& be, const std::vector<int32_t>& tokens, const std::vector<int64_t>& chunks) {
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  SequenceKV seq;
  seq.long_rope = m.long_rope_for(chunks[0]);
  EXPECT_TRUE(seq.reserve(pool, int64_t(tokens.size())));
  const int64_t V = m.config().vocab_size;
  std::vector<float> out, l;
  size_t ci = 0;
  for (int64_t p0 = 0; p0 < int64_t(tokens.size());) {
    const int64_t n = std::min(chunks[std::min(ci++, chunks.size() - 1)], int64_t(tokens.size()) - p0);
    std::vector<int32_t> chunk(tokens.begin() + p0, tokens.begin() + p0 + n);
    BatchInfo b = make_batch({chunk}, {p0}, {&seq}, true);
    l.resize(size_t(n * V));
    m.forward(b, l.data());
    out.insert(out.end(), l.begin(), l.end());
    seq.length = p0 + n;
    p0 += n;
  }
  seq.release(pool);
  return out;
}

class AffineFixtureCuda : public testing::TestWithParam<std::string> {};

TEST_P(AffineFixtureCuda, NoWorseThanTransformersInBf16) {
  ARBOR_REQUIRE_GPU();
  const test::AffineFixture f = test::load_affine_fixture(cuda_test::source_dir(), GetParam());
  ASSERT_GT(f.bf16_error, 0) << f.dir << "/golden.json has no bf16 measurement (make it on a GPU machine)";
  ASSERT_EQ(int64_t(f.bf16_row_errors.size()), f.rows) << f.dir << "/golden.json: bf16 row_rel_errors";
  double tf_mean = 0;
  for (double e : f.bf16_row_errors) tf_mean += e / double(f.rows);
  const double bound = std::max(f.bf16_error, 2e-3), mean_bound = std::max(tf_mean, 2e-3);
  CudaBackend gpu(0);
  LoadOptions opt;
  opt.model_dir = f.dir;
  opt.ctx_size = 64, opt.max_step_tokens = 32, opt.show_progress = false;
  Model m(opt, gpu);
  ASSERT_EQ(m.config().vocab_size, f.vocab);

  std::vector<int32_t> stream = f.prompt;
  stream.insert(stream.end(), f.generated.begin(), f.generated.end() - 1);  // the rows fed
  const std::vector<float> logits = teacher_forced(m, gpu, stream, {int64_t(f.prompt.size()), 3, 1});
  ASSERT_EQ(int64_t(logits.size()), f.rows * f.vocab);
  int64_t worst_row = 0;
  const double worst = test::worst_logit_row_error(logits.data(), f.logits.data(), f.rows, f.vocab, f.max_abs, &worst_row);
  double mean = 0;
  for (int64_t r = 0; r < f.rows; ++r)
    mean += test::logit_row_error(logits.data() + r * f.vocab, f.logits.data() + r * f.vocab, f.vocab, f.max_abs) / double(f.rows);
  EXPECT_LE(mean, mean_bound) << f.name << ": mean row max|Δ|/max|ref| = " << mean << "; transformers bf16: " << tf_mean;
  EXPECT_LE(worst, 1.25 * bound) << f.name << ": worst row " << worst_row << " max|Δ|/max|ref| = " << worst
                                 << "; transformers bf16: " << f.bf16_error;

  BlockPool pool(gpu.kv_layout().n_blocks, gpu.kv_layout().block_size);
  GenerateRequest req;
  req.prompt = f.prompt;
  req.max_tokens = int64_t(f.generated.size());
  const GenerateResult r = generate(m, pool, req);
  ASSERT_EQ(r.tokens.size(), f.generated.size());
  for (size_t k = 0; k < f.generated.size(); ++k) {
    if (r.tokens[k] == f.generated[k]) continue;
    // The first difference: allowed only where the reference's top two are within the noise.
    const int64_t row = int64_t(f.prompt.size() + k) - 1;
    const float margin = test::top2_margin(f.logits.data() + row * f.vocab, f.vocab);
    EXPECT_LE(double(margin), 2 * bound * double(f.max_abs))
        << f.name << ": greedy id " << k << " is " << r.tokens[k] << ", transformers " << f.generated[k] << " (top-2 gap "
        << margin / f.max_abs << " of max|ref|)";
    break;  // later ids follow a different sequence
  }
  std::printf("%-24s CUDA max|Δ|/max|ref| worst row %.3e, mean %.3e (transformers bf16: %.3e, %.3e)\n", f.name.c_str(), worst, mean,
              f.bf16_error, tf_mean);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(AffineFixtureCuda);  // no fixtures: the presence test below fails
INSTANTIATE_TEST_SUITE_P(Fixtures, AffineFixtureCuda, testing::ValuesIn(names()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(AffineFixturesCuda, ArePresent) {
  EXPECT_GE(names().size(), 6u) << test::affine_fixture_root(cuda_test::source_dir())
                                << " should hold the fixtures (ARBOR_SOURCE_DIR names the source tree)";
}

}  // namespace
