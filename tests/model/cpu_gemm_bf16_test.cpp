// The CPU backend with --cpu-gemm bf16 (prefill linears on bf16-rounded activations, cpu/gemm_bf16.h)
// against transformers' float32 logits on every parity fixture, held to the CUDA backend's bf16
// criterion (tests/cuda/model_test.cpp): max|Δ| <= 2e-2 max|ref|, and the greedy id on every row whose
// reference top-2 gap exceeds that tolerance. The prompt runs in one forward (the GEMM; prompts are
// longer than kLinearGemvMaxT rows), then one token per step (the exact GEMV), teacher-forced, as the
// goldens were made. Exact mode on the same schedule keeps the parity tests' 1e-3. On a CPU without
// AVX-512 BF16 the bf16 mode runs the exact kernels (gemm_bf16_applies) and the test says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear.h"
#include "engine/generate.h"
#include "golden_logits.h"
#include "io/safetensors.h"

using namespace arbor;
namespace fs = std::filesystem;

namespace {

std::vector<float> teacher_forced(Model& m, Backend& be, const std::vector<int32_t>& tokens, int64_t prefill) {
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  SequenceKV seq;
  seq.long_rope = m.long_rope_for(prefill);
  EXPECT_TRUE(seq.reserve(pool, int64_t(tokens.size())));
  const int64_t V = m.config().vocab_size;
  std::vector<float> all, l;
  for (int64_t p0 = 0; p0 < int64_t(tokens.size());) {
    const int64_t n = p0 == 0 ? prefill : 1;
    std::vector<int32_t> chunk(tokens.begin() + p0, tokens.begin() + p0 + n);
    BatchInfo b = make_batch({chunk}, {p0}, {&seq}, true);
    l.resize(size_t(n * V));
    m.forward(b, l.data());
    all.insert(all.end(), l.begin(), l.end());
    seq.length = p0 + n;
    p0 += n;
  }
  seq.release(pool);
  return all;
}

// max|got - ref| and the greedy id on every row whose reference top-2 gap exceeds 2e-2 max|ref|.
struct Agreement {
  float diff = 0;
  int64_t decisive = 0, agree = 0;
};
Agreement compare_logits(const std::vector<float>& got, const std::vector<float>& ref, int64_t rows, int64_t V, float ref_max) {
  Agreement a;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got.data() + r * V;
    const float* e = ref.data() + r * V;
    for (int64_t i = 0; i < V; ++i) a.diff = std::max(a.diff, std::fabs(g[i] - e[i]));
    const int64_t ie = std::max_element(e, e + V) - e;
    float second = -INFINITY;
    for (int64_t i = 0; i < V; ++i)
      if (i != ie) second = std::max(second, e[i]);
    if (e[ie] - second > 2e-2f * ref_max) {
      ++a.decisive;
      a.agree += (std::max_element(g, g + V) - g) == ie;
    }
  }
  return a;
}

// The fixture's fed rows teacher-forced through `model_dir` (the fixture itself or a copy) in `mode`.
std::vector<float> run_fixture(const std::string& model_dir, cpu::GemmMode mode, const test::ModelFixture& g) {
  CpuBackend be(2, WeightPlacement::Mapped);
  be.set_gemm_mode(mode);
  LoadOptions opt;
  opt.model_dir = model_dir;
  opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
  Model m(opt, be);
  return teacher_forced(m, be, g.fed(), int64_t(g.prompt.size()));
}

// A copy of fixture `dir` with every bf16 tensor stored as f16 (exact for bf16 values in f16's normal range).
std::string f16_copy(const std::string& dir) {
  const fs::path out = fs::path(testing::TempDir()) / ("arbor_cpu_gemm_f16_" + fs::path(dir).filename().string());
  fs::create_directories(out);
  fs::copy_file(fs::path(dir) / "config.json", out / "config.json", fs::copy_options::overwrite_existing);
  SafetensorsFile f((fs::path(dir) / "model.safetensors").string());
  std::vector<std::vector<uint16_t>> bufs;
  std::vector<TensorToWrite> tw;
  bufs.reserve(f.tensors().size());
  for (const TensorInfo& t : f.tensors()) {
    TensorToWrite w{t.name, t.dtype, t.shape, t.data, t.nbytes};
    if (t.dtype == DType::BF16) {
      std::vector<uint16_t>& b = bufs.emplace_back(size_t(t.numel()));
      std::memcpy(b.data(), t.data, t.nbytes);
      for (uint16_t& v : b) v = f32_to_f16(bf16_to_f32(v));
      w.dtype = DType::F16, w.data = b.data();
    }
    tw.push_back(w);
  }
  write_safetensors((out / "model.safetensors").string(), tw);
  return out.string();
}

// An f16 checkpoint in bf16 mode runs the bf16 GEMM with its weights rounded to bf16 (gemm_bf16.h): on an f16
// copy of two fixtures, transformers' criterion as below, and within 1e-3 max|ref| of the bf16 checkpoint's
// own bf16-mode logits (the same weights but for f16's subnormals).
TEST(CpuGemmBf16Model, F16CheckpointsRunTheBf16Gemm) {
  if (!cpu::gemm_bf16_applies(DType::F16)) GTEST_SKIP() << "no AVX-512 BF16 here: f16 prompts run the exact kernels";
  for (const char* name : {"llama3", "qwen3"}) {
    SCOPED_TRACE(name);
    const test::ModelFixture g = test::load_model_fixture(ARBOR_SOURCE_DIR, name);
    const std::vector<float> bf16 = run_fixture(g.dir, cpu::GemmMode::Bf16, g);
    const std::vector<float> f16 = run_fixture(f16_copy(g.dir), cpu::GemmMode::Bf16, g);
    ASSERT_EQ(f16.size(), g.logits.size());
    const Agreement vs_ref = compare_logits(f16, g.logits, g.rows, g.vocab, g.max_abs);
    EXPECT_LE(vs_ref.diff, 2e-2 * g.max_abs);
    EXPECT_EQ(vs_ref.agree, vs_ref.decisive);
    const Agreement vs_bf16 = compare_logits(f16, bf16, g.rows, g.vocab, g.max_abs);
    EXPECT_LE(vs_bf16.diff, 1e-3 * g.max_abs);
    std::printf("[ %s f16 ] max|Δ| vs transformers %.3g, vs the bf16 checkpoint %.3g, of max|ref| %.3g\n", name,
                double(vs_ref.diff), double(vs_bf16.diff), double(g.max_abs));
  }
}

TEST(CpuGemmBf16Model, FixturesMatchTransformersWithinBf16Tolerance) {
  const auto names = test::model_fixture_names(ARBOR_SOURCE_DIR);
  ASSERT_GE(names.size(), 12u) << "tests/fixtures/models/ should hold the parity fixtures";
  const bool bf16_runs = cpu::gemm_bf16_applies(DType::BF16);
  if (!bf16_runs)
    std::printf("note: no AVX-512 BF16 here (%s); bf16 mode runs the exact kernels\n", cpu::cpu_features().summary().c_str());
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const test::ModelFixture g = test::load_model_fixture(ARBOR_SOURCE_DIR, name);
    ASSERT_GT(int64_t(g.prompt.size()), cpu::kLinearGemvMaxT) << "the prompt must take the GEMM path";
    ASSERT_EQ(int64_t(g.fed().size()), g.rows);
    for (cpu::GemmMode mode : {cpu::GemmMode::Bf16, cpu::GemmMode::Exact}) {
      const std::vector<float> got = run_fixture(g.dir, mode, g);
      ASSERT_EQ(got.size(), g.logits.size());
      const Agreement a = compare_logits(got, g.logits, g.rows, g.vocab, g.max_abs);
      const double tol = mode == cpu::GemmMode::Exact ? 1e-3 : 2e-2;
      EXPECT_LE(a.diff, tol * g.max_abs) << cpu::gemm_mode_name(mode) << ": max|ref| " << g.max_abs;
      EXPECT_EQ(a.agree, a.decisive) << cpu::gemm_mode_name(mode) << ": greedy ids on the decisive rows";
      std::printf("[ %s %s ] max|Δ| %.3g of max|ref| %.3g (%.3f%%), greedy on decisive rows %lld/%lld\n",
                  name.c_str(), std::string(cpu::gemm_mode_name(mode)).c_str(), double(a.diff),
                  double(g.max_abs), 100.0 * double(a.diff) / double(g.max_abs), (long long)a.agree, (long long)a.decisive);
    }
  }
}

// In bf16 mode a prompt row runs the bf16 GEMM and a decode row the exact GEMV whatever else shares the
// step (BatchInfo::decode_rows), so a token's logits are the same alone and beside others: here a decode
// row of one sequence beside an 8-token prompt of another (9 rows: by row count alone, both would have
// taken the GEMM), against each run on its own. Bitwise: the kernels' per-row arithmetic does not
// depend on how many rows they are given.
TEST(CpuGemmBf16Model, ATokensLogitsDoNotDependOnWhatSharesItsStep) {
  const auto names = test::model_fixture_names(ARBOR_SOURCE_DIR);
  ASSERT_FALSE(names.empty());
  CpuBackend be(2, WeightPlacement::Mapped);
  be.set_gemm_mode(cpu::GemmMode::Bf16);
  LoadOptions opt;
  opt.model_dir = (fs::path(ARBOR_SOURCE_DIR) / "tests/fixtures/models" / names.front()).string();
  opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
  Model m(opt, be);
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> a(20), bp(size_t(cpu::kLinearGemvMaxT));
  for (size_t i = 0; i < a.size(); ++i) a[i] = int32_t((i * 37 + 5) % size_t(V));
  for (size_t i = 0; i < bp.size(); ++i) bp[i] = int32_t((i * 53 + 11) % size_t(V));
  const int32_t next = 7;
  auto forward = [&](BatchInfo b, std::vector<uint8_t> kinds) {
    b.decode_rows = std::move(kinds);
    std::vector<float> l(b.logit_rows.size() * size_t(V));
    m.forward(b, l.data());
    return l;
  };
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  // Alone: A's prompt, then A's decode step; B's prompt on its own.
  std::vector<float> a_decode, b_last;
  {
    SequenceKV sa, sb;
    ASSERT_TRUE(sa.reserve(pool, 32) && sb.reserve(pool, 32));
    forward(make_batch({a}, {0}, {&sa}, false), std::vector<uint8_t>(a.size(), 0));
    sa.length = int64_t(a.size());
    a_decode = forward(make_batch({{next}}, {sa.length}, {&sa}, false), {1});
    b_last = forward(make_batch({bp}, {0}, {&sb}, false), std::vector<uint8_t>(bp.size(), 0));
    sa.release(pool), sb.release(pool);
  }
  // Together: A's decode step and B's whole prompt in one step.
  SequenceKV sa, sb;
  ASSERT_TRUE(sa.reserve(pool, 32) && sb.reserve(pool, 32));
  forward(make_batch({a}, {0}, {&sa}, false), std::vector<uint8_t>(a.size(), 0));
  sa.length = int64_t(a.size());
  std::vector<uint8_t> kinds(1 + bp.size(), 0);
  kinds[0] = 1;
  const std::vector<float> both = forward(make_batch({{next}, bp}, {sa.length, 0}, {&sa, &sb}, false), kinds);
  ASSERT_EQ(both.size(), size_t(2 * V));
  EXPECT_TRUE(std::equal(a_decode.begin(), a_decode.end(), both.begin())) << "the decode row's logits changed beside a prompt";
  EXPECT_TRUE(std::equal(b_last.begin(), b_last.end(), both.begin() + V)) << "the prompt's logits changed beside a decode row";
  sa.release(pool), sb.release(pool);
}

}  // namespace
