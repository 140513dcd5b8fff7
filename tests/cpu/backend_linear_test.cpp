// CpuBackend's linear and embed through the Linear description: load_linear, the kernel pick by
// (format, rows) against linear_reference, and the errors for formats the CPU does not run yet.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear.h"
#include "core/error.h"
#include "../test_util.h"

namespace arbor {
namespace {

using test::random_floats;

TEST(CpuBackendLinear, PickedKernelMatchesReference) {
  CpuBackend be(2, WeightPlacement::Copy);
  for (DType wt : {DType::F32, DType::BF16, DType::F16})
    for (int64_t T : {1, 3, 8, 9, 33})
      for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{7, 5}, {67, 130}}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(wt) << " T " << T << " N " << N << " K " << K);
        std::vector<float> wf = random_floats(size_t(N * K), uint32_t(N * 31 + K + T));
        std::vector<uint16_t> w16(wf.size());
        for (size_t i = 0; i < wf.size(); ++i) w16[i] = wt == DType::BF16 ? f32_to_bf16(wf[i]) : f32_to_f16(wf[i]);
        const Tensor wh = wt == DType::F32 ? Tensor(wf.data(), wt, {N, K}) : Tensor(w16.data(), wt, {N, K});
        std::vector<float> bias = random_floats(size_t(N), 7);
        const Linear l = be.load_linear(Linear::dense(wh, Tensor(bias.data(), DType::F32, {N})));
        EXPECT_EQ(l.rows(), N);
        EXPECT_EQ(l.cols(), K);
        std::vector<float> x = random_floats(size_t(T * K), 11), y(size_t(T * N)), ref(y.size());
        be.linear(Tensor(x.data(), DType::F32, {T, K}), l, Tensor(y.data(), DType::F32, {T, N}));
        cpu::linear_reference(x.data(), T, K, wh.data, wt, N, bias.data(), ref.data());
        float worst = 0, scale = 0;
        for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - ref[i])), scale = std::max(scale, std::fabs(ref[i]));
        EXPECT_LE(worst, 1e-3f * scale);
      }
}

TEST(CpuBackendLinear, EmbedGathersRowsOfTheTable) {
  CpuBackend be(1, WeightPlacement::Mapped);
  const int64_t V = 9, C = 5;
  std::vector<uint16_t> t(size_t(V * C));
  for (size_t i = 0; i < t.size(); ++i) t[i] = f32_to_bf16(float(i) * 0.25f);
  const Linear table = be.load_linear(Linear::dense(Tensor(t.data(), DType::BF16, {V, C})));
  BatchInfo b;
  b.tokens = {4, 0, 8};
  be.begin_batch(b);
  std::vector<float> out(size_t(3 * C));
  be.embed(table, Tensor(out.data(), DType::F32, {3, C}), 2.0f);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[size_t(r * C + c)], float(b.tokens[size_t(r)] * C + c) * 0.25f * 2.0f);
}

TEST(CpuBackendLinear, FormatsWithoutKernelsFailNamingWhatIsSupported) {
  CpuBackend be(1, WeightPlacement::Copy);
  std::vector<uint32_t> codes(64 * 8);
  Linear q;
  // Trellis at 5 bits (the CPU runs 2, 3 and 4).
  q.format = WeightFormat::Trellis, q.n_rows = 64, q.n_cols = 64, q.bits = 5, q.group_size = 256;
  q.data = Tensor(codes.data(), DType::U32, {64, 8});
  for (int64_t rows : {1, 64}) {
    try {
      CpuBackend::pick_linear(q, rows);
      FAIL() << "trellis weights picked a kernel at " << rows << " rows";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("trellis 5-bit axis 1 [64, 64]"), std::string::npos) << m;
      EXPECT_NE(m.find("supported: dense F32/F16/BF16"), std::string::npos) << m;
      EXPECT_NE(m.find("affine 2/3/4/5/6/8-bit"), std::string::npos) << m;
      EXPECT_NE(m.find("trellis 2/3/4-bit"), std::string::npos) << m;
    }
  }
  EXPECT_THROW(be.load_linear(q), Error);
  BatchInfo b;
  b.tokens = {1};
  be.begin_batch(b);
  std::vector<float> out(64);
  EXPECT_THROW(be.embed(q, Tensor(out.data(), DType::F32, {1, 64}), 1.0f), Error);
  // Affine with bits the format does not have.
  q.format = WeightFormat::Affine, q.bits = 7, q.group_size = 64;
  EXPECT_THROW(CpuBackend::pick_linear(q, 1), Error);
}

}  // namespace
}  // namespace arbor
