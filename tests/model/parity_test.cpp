// Parity with Hugging Face transformers: every architecture fixture (tests/fixtures/models/*, made by
// tools/parity/make_fixtures.py) must reproduce transformers' float32 logits within
// max|Δ| <= 1e-3 * max|ref| and its greedy ids, alone and inside mixed batches. Among them: Phi-3
// longrope past its original context (a prompt longer than it, and a prompt whose decoding crosses it,
// as transformers generates with a KV cache) and head_dims the tuned CUDA kernels do not take.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "core/json.h"
#include "engine/generate.h"
#include "golden_logits.h"
#include "mixed_batches.h"

using namespace arbor;
namespace fs = std::filesystem;

namespace {

using Fixture = test::ModelFixture;

std::vector<std::string> fixture_names() { return test::model_fixture_names(ARBOR_SOURCE_DIR); }

Fixture load_fixture(const std::string& name) { return test::load_model_fixture(ARBOR_SOURCE_DIR, name); }

class Parity : public testing::TestWithParam<std::string> {};

TEST_P(Parity, LogitsAndGreedyIdsMatchTransformers) {
  Fixture f = load_fixture(GetParam());
  CpuBackend be(2, WeightPlacement::Mapped);
  LoadOptions opt;
  opt.model_dir = f.dir;
  opt.ctx_size = 64;
  opt.max_step_tokens = 32;
  Model m(opt, be);
  ASSERT_EQ(m.config().vocab_size, f.vocab);
  const GenerateResult r = test::greedy_with_logits(m, be, f.prompt, int64_t(f.generated.size()));
  EXPECT_EQ(r.tokens, f.generated) << f.name << ": greedy ids differ from transformers";
  ASSERT_EQ(int64_t(r.logits.size()), f.rows * f.vocab);
  int64_t worst_row = 0;
  const double worst = test::worst_logit_row_error(r.logits.data(), f.logits.data(), f.rows, f.vocab, f.max_abs, &worst_row);
  EXPECT_LE(worst, 1e-3) << f.name << ": worst row " << worst_row << " max|Δ|/max|ref| = " << worst;
}

// The same token streams, cut into different chunks and mixed with other sequences in each step,
// must give every row's logits as transformers does for the sequence alone.
TEST_P(Parity, MixedBatchesMatchSingleSequence) {
  Fixture f = load_fixture(GetParam());
  CpuBackend be(2, WeightPlacement::Mapped);
  LoadOptions opt;
  opt.model_dir = f.dir;
  opt.ctx_size = 64;
  opt.max_step_tokens = 64;
  opt.kv_blocks = 32;
  Model m(opt, be);
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  const std::vector<int32_t> stream = f.fed();
  ASSERT_EQ(int64_t(stream.size()), f.rows);
  // Three sequences over prefixes of the stream; each has its own chunking schedule. Each is the
  // fixture's sequence cut short, so each takes the rope regime the fixture's prompt gave it.
  std::vector<std::vector<int32_t>> streams = {stream, {stream.begin(), stream.end() - 5}, {stream.begin(), stream.begin() + 9}};
  const bool long_rope = m.long_rope_for(int64_t(f.prompt.size()));
  double worst = 0;
  int64_t rows = test::run_mixed_batches(
      m, pool, streams, {{5, 9, 1, 1, 3, 100}, {100}, {1, 1, 1, 2, 100}},
      [&](int s, int64_t p, const float* row) {
        const float* ref = f.logits.data() + p * f.vocab;
        worst = std::max(worst, test::logit_row_error(row, ref, f.vocab, f.max_abs));
        EXPECT_EQ(argmax(row, f.vocab), argmax(ref, f.vocab)) << f.name << ": sequence " << s << " position " << p;
      },
      std::vector<bool>(streams.size(), long_rope));
  EXPECT_EQ(rows, int64_t(streams[0].size() + streams[1].size() + streams[2].size()));
  EXPECT_LE(worst, 1e-3) << f.name << ": max|Δ|/max|ref| = " << worst;
  EXPECT_EQ(pool.free_blocks(), pool.n_blocks());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, testing::ValuesIn(fixture_names()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(ParityFixtures, EveryArchitectureHasOne) {
  auto names = fixture_names();
  EXPECT_GE(names.size(), 12u) << "tests/fixtures/models/ should hold a fixture per architecture (tools/parity/make_fixtures.py)";
}

// The fixtures for longrope past the original context and for untuned head_dims must be there (the
// parameterised tests above only run the fixtures they find), and must be what they claim to be.
const char* const kLongRopeFixtures[] = {"phi3_longrope_prompt", "phi3_longrope_cross"};
const char* const kHeadDimFixtures[] = {"llama_hd16", "llama_hd24", "qwen3_hd40", "mistral_hd48", "llama_hd80", "llama_hd112"};

TEST(ParityFixtures, LongRopeAndHeadDimFixturesArePresent) {
  auto names = fixture_names();
  std::vector<std::string> want(std::begin(kLongRopeFixtures), std::end(kLongRopeFixtures));
  want.insert(want.end(), std::begin(kHeadDimFixtures), std::end(kHeadDimFixtures));
  for (const auto& n : want)
    EXPECT_TRUE(std::find(names.begin(), names.end(), n) != names.end())
        << "tests/fixtures/models/" << n << " is missing: python3 tools/parity/make_fixtures.py OUT " << n;
}

TEST(ParityFixtures, LongRopeFixturesCrossTheOriginalContext) {
  for (const char* name : kLongRopeFixtures) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(fs::path(ARBOR_SOURCE_DIR) / "tests/fixtures/models" / name / "golden.json"))
        << "fixture missing: python3 tools/parity/make_fixtures.py OUT " << name;
    Fixture f = load_fixture(name);
    CpuBackend be(1, WeightPlacement::Mapped);
    LoadOptions opt;
    opt.model_dir = f.dir;
    opt.ctx_size = 64;
    opt.show_progress = false;
    Model m(opt, be);
    const RopeConfig& rc = m.config().rope;
    ASSERT_EQ(rc.kind, RopeKind::LongRope);
    const int64_t orig = rc.original_max_position, prompt = int64_t(f.prompt.size()), fed = f.rows;
    if (std::string(name) == "phi3_longrope_prompt") {
      EXPECT_GT(prompt, orig);  // the whole sequence in the long regime
      EXPECT_TRUE(m.long_rope_for(prompt));
    } else {
      EXPECT_LE(prompt, orig);  // short factors for the prompt, long ones from position orig on
      EXPECT_GT(fed, orig);
      EXPECT_FALSE(m.long_rope_for(prompt));
    }
  }
}

TEST(ParityFixtures, HeadDimFixturesHaveTheirHeadDim) {
  for (const char* name : kHeadDimFixtures) {
    SCOPED_TRACE(name);
    const fs::path cfg = fs::path(ARBOR_SOURCE_DIR) / "tests/fixtures/models" / name / "config.json";
    ASSERT_TRUE(fs::exists(cfg)) << "fixture missing: python3 tools/parity/make_fixtures.py OUT " << name;
    const std::string n = name;
    EXPECT_EQ(load_model_config(cfg.string()).head_dim, std::stoll(n.substr(n.find("_hd") + 3)));
  }
}

}  // namespace
