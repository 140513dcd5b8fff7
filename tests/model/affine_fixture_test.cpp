// MLX affine checkpoints against Hugging Face transformers: every fixture under tests/fixtures/affine/ (arbor's
// quantized checkpoints, with transformers' float32 logits on their dequantized weights; made by
// tools/quant/affine_fixtures.py) must give those logits on the CPU backend (its default, reference-accuracy
// GEMM) within 2e-3 * max|ref| with the same greedy ids. And the fixtures together must cover the format: every
// bit width and group size, per-module overrides (false included), quantized and tied embeddings, a quantized
// LM head, three architectures.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>

#include "affine_fixtures.h"
#include "backend/cpu/cpu_backend.h"
#include "golden_logits.h"
#include "io/checkpoint.h"
#include "model/archs.h"
#include "model/config.h"
#include "quant/affine.h"

using namespace arbor;

namespace {

std::vector<std::string> names() { return test::affine_fixture_names(ARBOR_SOURCE_DIR); }

class AffineFixtureCpu : public testing::TestWithParam<std::string> {};

TEST_P(AffineFixtureCpu, LogitsAndGreedyIdsMatchTransformers) {
  const test::AffineFixture f = test::load_affine_fixture(ARBOR_SOURCE_DIR, GetParam());
  CpuBackend be(2, WeightPlacement::Mapped);
  ASSERT_EQ(be.gemm_mode(), cpu::GemmMode::Exact) << "the fixtures check the reference-accuracy GEMM";
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
  EXPECT_LE(worst, 2e-3) << f.name << ": worst row " << worst_row << " max|Δ|/max|ref| = " << worst;
  std::printf("%-24s CPU max|Δ|/max|ref| %.3e (transformers bf16 on the GPU: %.3e)\n", f.name.c_str(), worst, f.bf16_error);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(AffineFixtureCpu);  // no fixtures: the presence test below fails
INSTANTIATE_TEST_SUITE_P(Fixtures, AffineFixtureCpu, testing::ValuesIn(names()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// What the fixtures exercise, read from their files (config.json's quantization block and which modules store
// .scales), not from the generator's word.
TEST(AffineFixtures, CoverTheFormat) {
  const std::vector<std::string> fixtures = names();
  ASSERT_GE(fixtures.size(), 6u) << "tests/fixtures/affine/ should hold the fixtures of tools/quant/affine_fixtures.py "
                                    "(make here, golden on the GPU machine)";
  std::set<int> bits, groups;
  std::set<std::string> types;
  int dict_overrides = 0, false_overrides = 0, tied_quantized_embed = 0, untied_quantized_head = 0, dense_modules = 0;
  for (const std::string& n : fixtures) {
    SCOPED_TRACE(n);
    const std::string dir = test::affine_fixture_root(ARBOR_SOURCE_DIR) + "/" + n;
    const json cj = read_json_file(dir + "/config.json");
    ModelConfig c = parse_model_config(cj, dir);
    const ArchDescriptor& a = find_arch(c);
    types.insert(a.model_type);
    const std::optional<quant::AffineQuantConfig> qc = quant::parse_affine_quant_config(cj, dir);
    ASSERT_TRUE(qc.has_value());
    const Checkpoint ck = Checkpoint::open(dir);
    for (const TensorInfo* t : ck.tensors()) {
      const std::string& name = t->name;
      if (name.size() < 8 || name.compare(name.size() - 7, 7, ".weight") != 0 || t->shape.size() != 2) continue;
      const std::string module = name.substr(0, name.size() - 7);
      if (ck.find(module + ".scales")) {
        const std::optional<quant::AffineParams> p = qc->for_module(module);
        ASSERT_TRUE(p.has_value()) << module;
        bits.insert(p->bits), groups.insert(p->group_size);
      } else {
        ++dense_modules;
      }
    }
    for (const auto& [module, p] : qc->modules) {
      if (p) {
        ++dict_overrides;
      } else {
        EXPECT_TRUE(ck.find(module + ".weight") && !ck.find(module + ".scales")) << module << ": false, yet not stored dense";
        ++false_overrides;
      }
    }
    const std::string embed = a.names.embed.substr(0, a.names.embed.size() - 7), head = a.names.lm_head.substr(0, a.names.lm_head.size() - 7);
    if (c.tie_word_embeddings && ck.find(embed + ".scales")) ++tied_quantized_embed;
    if (!c.tie_word_embeddings && ck.find(head + ".scales")) ++untied_quantized_head;
  }
  EXPECT_EQ(bits, (std::set<int>{2, 3, 4, 5, 6, 8}));
  EXPECT_EQ(groups, (std::set<int>{32, 64, 128}));
  EXPECT_GE(types.size(), 3u);
  EXPECT_GE(dict_overrides, 2);
  EXPECT_GE(false_overrides, 2);
  EXPECT_GE(dense_modules, 2);
  EXPECT_GE(tied_quantized_embed, 2);
  EXPECT_GE(untied_quantized_head, 2);
}

}  // namespace
