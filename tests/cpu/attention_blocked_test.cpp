// attention_block (attention_blocked.h) against a double-precision reference: paged K/V with a
// shuffled block table, head_dims 16..256, GQA groups 1..8, runs of 1..16 tokens at positions that
// start mid-block, sliding windows; decode tokens through both kernels. Skips where the CPU has no AVX-512.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/attention_blocked.h"
#include "backend/cpu/cpu_features.h"
#include "core/error.h"

namespace arbor::cpu {
namespace {

struct Case {
  int64_t hd, n_heads, n_kv, nt, pos0, window;
};

TEST(CpuAttentionBlocked, MatchesReference) {
  if (!attention_block_applies(64, 4, 0.0f)) GTEST_SKIP() << "no AVX-512 here: " << cpu_features().summary();
  const std::vector<Case> cases = {{64, 32, 8, 16, 0, 0},  {64, 4, 1, 1, 0, 0},    {64, 4, 2, 7, 37, 0},   {128, 16, 8, 16, 100, 0},
                                   {16, 8, 1, 3, 5, 0},    {256, 2, 2, 16, 47, 0},  {80, 10, 5, 11, 200, 0}, {48, 16, 2, 16, 63, 24},
                                   {64, 8, 8, 1, 300, 0},  {112, 8, 4, 5, 18, 5},   {32, 12, 4, 16, 16, 1},
                                   // decode tokens (nt = 1): groups of 1..8 rows (not multiples of 4 too), hd past 4 vectors
                                   // and not a multiple of 4 vectors, windows, a first block that starts mid-block
                                   {64, 32, 8, 1, 159, 0}, {128, 32, 8, 1, 70, 0},  {80, 6, 1, 1, 45, 0},   {48, 21, 3, 1, 33, 9},
                                   {256, 16, 2, 1, 17, 0}, {64, 5, 1, 1, 0, 0},     {16, 8, 4, 1, 100, 40}};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1, 1);
  const int64_t bs = 16;
  for (int decode_kernel : {1, 0})
  for (const Case& c : cases) {
    if (decode_kernel == 0 && c.nt != 1) continue;  // the per-row kernel on decode tokens too
    set_attention_block_decode(decode_kernel);
    const int64_t G = c.n_heads / c.n_kv, ctx = c.pos0 + c.nt, n_blocks = (ctx + bs - 1) / bs + 3;
    const int64_t kv_row = c.n_kv * c.hd, qrow = c.n_heads * c.hd;
    std::vector<int32_t> table(static_cast<size_t>(n_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<float> K(size_t(n_blocks * bs * kv_row)), V(K.size()), q(size_t(c.nt * qrow)), out(q.size(), NAN);
    for (float& v : K) v = d(rng);
    for (float& v : V) v = d(rng);
    for (float& v : q) v = 2 * d(rng);
    AttnBlockArgs a{q.data(), out.data(), K.data(), V.data(), c.n_heads, c.n_kv, c.hd, bs, 1.0f / std::sqrt(float(c.hd)), c.window};
    std::vector<float> scratch(size_t(attention_block_scratch_floats(c.hd, G)) + 16);
    float* s = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
    for (int64_t g = 0; g < c.n_kv; ++g) attention_block(a, 0, c.nt, c.pos0, table.data(), g, s);
    double worst = 0;
    for (int64_t i = 0; i < c.nt; ++i) {
      const int64_t pos = c.pos0 + i, lo = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const int64_t g = h / G;
        const float* qh = q.data() + i * qrow + h * c.hd;
        std::vector<double> sc;
        double mx = -INFINITY;
        for (int64_t kp = lo; kp <= pos; ++kp) {
          const float* kh = K.data() + (int64_t(table[size_t(kp / bs)]) * bs + kp % bs) * kv_row + g * c.hd;
          double dot = 0;
          for (int64_t e = 0; e < c.hd; ++e) dot += double(qh[e]) * kh[e];
          sc.push_back(dot * a.scale);
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double& v : sc) sum += (v = std::exp(v - mx));
        for (int64_t e = 0; e < c.hd; ++e) {
          double o = 0;
          for (int64_t kp = lo; kp <= pos; ++kp)
            o += sc[size_t(kp - lo)] / sum * V[size_t((int64_t(table[size_t(kp / bs)]) * bs + kp % bs) * kv_row + g * c.hd + e)];
          worst = std::max(worst, std::fabs(o - double(out[size_t(i * qrow + h * c.hd + e)])));
        }
      }
    }
    EXPECT_LE(worst, 2e-6) << "hd " << c.hd << " heads " << c.n_heads << "/" << c.n_kv << " rows " << c.nt << " pos0 " << c.pos0
                           << " window " << c.window << " decode kernel " << decode_kernel;
  }
  set_attention_block_decode(-1);
}

TEST(CpuAttentionBlocked, Applies) {
  EXPECT_FALSE(attention_block_applies(64, 4, 30.0f));  // softcap: the scalar path
  EXPECT_FALSE(attention_block_applies(72, 4, 0.0f));
  EXPECT_FALSE(attention_block_applies(64, 16, 0.0f));
  EXPECT_EQ(attention_block_applies(64, 4, 0.0f), cpu_features().avx512);
}

}  // namespace
}  // namespace arbor::cpu
