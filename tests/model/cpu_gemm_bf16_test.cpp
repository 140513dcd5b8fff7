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
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear.h"
#include "core/json.h"
#include "engine/generate.h"

using namespace arbor;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> out;
  fs::path root = fs::path(ARBOR_SOURCE_DIR) / "tests/fixtures/models";
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "golden.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

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

TEST(CpuGemmBf16Model, FixturesMatchTransformersWithinBf16Tolerance) {
  const auto dirs = fixture_dirs();
  ASSERT_GE(dirs.size(), 12u) << "tests/fixtures/models/ should hold the parity fixtures";
  const bool bf16_runs = cpu::gemm_bf16_applies(DType::BF16);
  if (!bf16_runs)
    std::printf("note: no AVX-512 BF16 here (%s); bf16 mode runs the exact kernels\n", cpu::cpu_features().summary().c_str());
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    json g = read_json_file(dir + "/golden.json");
    std::vector<int32_t> tokens = g["prompt_ids"].get<std::vector<int32_t>>();
    const int64_t prompt = int64_t(tokens.size());
    ASSERT_GT(prompt, cpu::kLinearGemvMaxT) << "the prompt must take the GEMM path";
    const auto gen = g["generated_ids"].get<std::vector<int32_t>>();
    tokens.insert(tokens.end(), gen.begin(), gen.end() - 1);
    const int64_t rows = g["rows"].get<int64_t>(), V = g["vocab"].get<int64_t>();
    ASSERT_EQ(int64_t(tokens.size()), rows);
    std::vector<float> ref(size_t(rows * V));
    std::ifstream in(dir + "/logits.bin", std::ios::binary);
    in.read(reinterpret_cast<char*>(ref.data()), std::streamsize(ref.size() * sizeof(float)));
    ASSERT_TRUE(in.good()) << "logits.bin shorter than " << rows << " x " << V;
    float ref_max = 0;
    for (float v : ref) ref_max = std::max(ref_max, std::fabs(v));
    for (cpu::GemmMode mode : {cpu::GemmMode::Bf16, cpu::GemmMode::Exact}) {
      CpuBackend be(2, WeightPlacement::Mapped);
      be.set_gemm_mode(mode);
      LoadOptions opt;
      opt.model_dir = dir;
      opt.ctx_size = 128, opt.max_step_tokens = 64, opt.show_progress = false;
      Model m(opt, be);
      const std::vector<float> got = teacher_forced(m, be, tokens, prompt);
      ASSERT_EQ(got.size(), ref.size());
      float diff = 0;
      int64_t decisive = 0, agree = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const float* a = got.data() + r * V;
        const float* e = ref.data() + r * V;
        for (int64_t i = 0; i < V; ++i) diff = std::max(diff, std::fabs(a[i] - e[i]));
        const int64_t ie = std::max_element(e, e + V) - e;
        float second = -INFINITY;
        for (int64_t i = 0; i < V; ++i)
          if (i != ie) second = std::max(second, e[i]);
        if (e[ie] - second > 2e-2f * ref_max) {
          ++decisive;
          agree += (std::max_element(a, a + V) - a) == ie;
        }
      }
      const double tol = mode == cpu::GemmMode::Exact ? 1e-3 : 2e-2;
      EXPECT_LE(diff, tol * ref_max) << cpu::gemm_mode_name(mode) << ": max|ref| " << ref_max;
      EXPECT_EQ(agree, decisive) << cpu::gemm_mode_name(mode) << ": greedy ids on the decisive rows";
      std::printf("[ %s %s ] max|Δ| %.3g of max|ref| %.3g (%.3f%%), greedy on decisive rows %lld/%lld\n",
                  fs::path(dir).filename().string().c_str(), std::string(cpu::gemm_mode_name(mode)).c_str(), double(diff),
                  double(ref_max), 100.0 * double(diff) / double(ref_max), (long long)agree, (long long)decisive);
    }
  }
}

// In bf16 mode a prompt row runs the bf16 GEMM and a decode row the exact GEMV whatever else shares the
// step (BatchInfo::decode_rows), so a token's logits are the same alone and beside others: here a decode
// row of one sequence beside an 8-token prompt of another (9 rows: by row count alone, both would have
// taken the GEMM), against each run on its own. Bitwise: the kernels' per-row arithmetic does not
// depend on how many rows they are given.
TEST(CpuGemmBf16Model, ATokensLogitsDoNotDependOnWhatSharesItsStep) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  CpuBackend be(2, WeightPlacement::Mapped);
  be.set_gemm_mode(cpu::GemmMode::Bf16);
  LoadOptions opt;
  opt.model_dir = dirs.front();
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
