// attention_bf16 (attention_bf16.h) against a double-precision reference on the same bf16-rounded q, k
// and v: paged K/V with a shuffled block table, head_dims 16..256 (odd multiples of 16 included), GQA
// groups 1..8, runs of 1..32 tokens at positions that start mid-block (a chunk after a cached prefix),
// sliding windows, flat and peaked softmaxes. Also: a row's result does not depend on the run it is
// computed in. Skips where the CPU has no AVX-512 BF16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/attention_bf16.h"
#include "backend/cpu/cpu_features.h"
#include "core/error.h"

namespace arbor::cpu {
namespace {

// Round to nearest even, as vcvtne2ps2bf16 (finite inputs).
float bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

struct Case {
  int64_t hd, n_heads, n_kv, nt, pos0, window;
  float scale_mul;  // times 1/sqrt(hd): > 1 peaks the softmax
};

struct Problem {
  Case c;
  int64_t bs = 16, n_blocks = 0;
  std::vector<int32_t> table;
  std::vector<float> K, V, q;
};

Problem make(const Case& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1, 1);
  Problem s;
  s.c = c;
  const int64_t ctx = c.pos0 + c.nt;
  s.n_blocks = (ctx + s.bs - 1) / s.bs + 3;
  s.table.resize(size_t(s.n_blocks));
  std::iota(s.table.begin(), s.table.end(), 0);
  std::shuffle(s.table.begin(), s.table.end(), rng);
  s.K.resize(size_t(s.n_blocks * s.bs * c.n_kv * c.hd)), s.V.resize(s.K.size()), s.q.resize(size_t(c.nt * c.n_heads * c.hd));
  for (float& v : s.K) v = d(rng);
  for (float& v : s.V) v = d(rng);
  for (float& v : s.q) v = 2 * d(rng);
  return s;
}

std::vector<float> run(const Problem& s, const std::vector<std::pair<int64_t, int64_t>>& runs) {
  const Case& c = s.c;
  std::vector<float> out(s.q.size(), NAN);
  AttnBlockArgs a{s.q.data(), out.data(), s.K.data(), s.V.data(), c.n_heads, c.n_kv, c.hd, s.bs,
                  c.scale_mul / std::sqrt(float(c.hd)), c.window};
  std::vector<float> scratch(size_t(attention_bf16_scratch_floats(c.hd, c.n_heads / c.n_kv)) + 16);
  float* sp = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
  for (auto [t0, n] : runs)
    for (int64_t g = 0; g < c.n_kv; ++g) attention_bf16(a, t0, n, c.pos0 + t0, s.table.data(), g, sp);
  return out;
}

TEST(CpuAttentionBf16, MatchesReference) {
  if (!attention_bf16_applies(64, 4, 0.0f)) GTEST_SKIP() << "no AVX-512 BF16 here: " << cpu_features().summary();
  const std::vector<Case> cases = {
      {64, 32, 8, 32, 0, 0, 1},     {64, 32, 8, 32, 480, 0, 4},  {128, 8, 8, 27, 100, 0, 1}, {128, 32, 8, 32, 997, 0, 1},
      {64, 16, 2, 19, 37, 0, 1},    {80, 10, 5, 11, 200, 0, 1},  {256, 4, 1, 32, 47, 0, 2},  {16, 8, 1, 3, 5, 0, 1},
      {48, 16, 2, 32, 63, 24, 1},   {112, 8, 4, 5, 18, 5, 3},    {64, 4, 1, 1, 300, 0, 1},   {96, 12, 4, 30, 500, 100, 1},
      {64, 8, 8, 16, 0, 1, 1},      {192, 6, 2, 21, 70, 0, 8}};
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    const Problem s = make(c, rng);
    const std::vector<float> out = run(s, {{0, c.nt}});
    const int64_t G = c.n_heads / c.n_kv, kv_row = c.n_kv * c.hd, qrow = c.n_heads * c.hd, bs = s.bs;
    const double scale = double(c.scale_mul / std::sqrt(float(c.hd)));
    // Reference: exact softmax in double over the bf16-rounded q, k, v. The kernel also rounds each p to
    // bf16 (relative error |δ_j| <= 2^-8, about uniform) for P·V while its sum is taken unrounded, so
    // out - ref = Σ_j δ_j p_j v_j / Σ_j p_j: mean 0, standard deviation at most
    // σ = 2^-8 / sqrt(3) · sqrt(Σ_j p_j² v_j²) / Σ_j p_j. Allowed: 6σ plus 2e-5 for f32 arithmetic
    // (scores, exp, accumulation). Dropping or adding a key, or a wrong pairing, costs far more.
    double worst = 0, worst_sigmas = 0;
    for (int64_t i = 0; i < c.nt; ++i) {
      const int64_t pos = c.pos0 + i, lo = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const int64_t g = h / G;
        const float* qh = s.q.data() + i * qrow + h * c.hd;
        auto slot = [&](int64_t kp) { return (int64_t(s.table[size_t(kp / bs)]) * bs + kp % bs) * kv_row + g * c.hd; };
        std::vector<double> sc;
        double mx = -INFINITY;
        for (int64_t kp = lo; kp <= pos; ++kp) {
          const float* kh = s.K.data() + slot(kp);
          double dot = 0;
          for (int64_t e = 0; e < c.hd; ++e) dot += double(bf16_round(qh[e])) * double(bf16_round(kh[e]));
          sc.push_back(dot * scale);
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double& v : sc) sum += (v = std::exp(v - mx));
        for (int64_t e = 0; e < c.hd; ++e) {
          double o = 0, var = 0;
          for (int64_t kp = lo; kp <= pos; ++kp) {
            const double pv = sc[size_t(kp - lo)] * double(bf16_round(s.V[size_t(slot(kp) + e)]));
            o += pv, var += pv * pv;
          }
          o /= sum;
          const double sigma = std::ldexp(1.0, -8) / std::sqrt(3.0) * std::sqrt(var) / sum;
          const double err = std::fabs(o - double(out[size_t(i * qrow + h * c.hd + e)]));
          worst = std::max(worst, err);
          worst_sigmas = std::max(worst_sigmas, (err - 2e-5) / sigma);
          ASSERT_LE(err, 6 * sigma + 2e-5) << "hd " << c.hd << " heads " << c.n_heads << "/" << c.n_kv << " rows " << c.nt
                                           << " pos0 " << c.pos0 << " window " << c.window << ": token " << i << " head " << h
                                           << " dim " << e << " got " << out[size_t(i * qrow + h * c.hd + e)] << " want " << o;
        }
      }
    }
    std::printf("[ hd %3lld heads %2lld/%lld rows %2lld pos0 %3lld window %3lld scale x%g ] max|Δ| %.2e, worst %.2f σ\n",
                (long long)c.hd, (long long)c.n_heads, (long long)c.n_kv, (long long)c.nt, (long long)c.pos0,
                (long long)c.window, double(c.scale_mul), worst, std::max(0.0, worst_sigmas));
  }
}

// Bitwise: a token's rows come out the same whether its run holds 32 tokens or it is split 1 + 7 + 24
// (key blocks are aligned to absolute positions; a row's arithmetic is its own).
TEST(CpuAttentionBf16, RowsDoNotDependOnTheirRun) {
  if (!attention_bf16_applies(64, 4, 0.0f)) GTEST_SKIP() << "no AVX-512 BF16 here: " << cpu_features().summary();
  std::mt19937 rng(11);
  for (const Case& c : {Case{64, 32, 8, 32, 45, 0, 1}, Case{128, 16, 2, 32, 100, 40, 1}}) {
    const Problem s = make(c, rng);
    const std::vector<float> whole = run(s, {{0, 32}}), split = run(s, {{0, 1}, {1, 7}, {8, 24}});
    EXPECT_EQ(0, std::memcmp(whole.data(), split.data(), whole.size() * sizeof(float))) << "hd " << c.hd;
  }
}

TEST(CpuAttentionBf16, Applies) {
  EXPECT_FALSE(attention_bf16_applies(64, 4, 30.0f));  // softcap: not taken
  EXPECT_FALSE(attention_bf16_applies(72, 4, 0.0f));
  EXPECT_FALSE(attention_bf16_applies(64, 16, 0.0f));
  EXPECT_FALSE(attention_bf16_applies(512, 1, 0.0f));
  EXPECT_EQ(attention_bf16_applies(64, 4, 0.0f), cpu_features().avx512_bf16);
}

}  // namespace
}  // namespace arbor::cpu
