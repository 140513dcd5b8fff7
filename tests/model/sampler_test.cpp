// Sampler against a plain reference (sort everything, filter in transformers' order, walk the sorted
// list) on random logits: with the same seed, the filtered paths must pick the same tokens; plain
// temperature must follow softmax(l / T).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/sampler.h"

using namespace arbor;

namespace {

int32_t reference_sample(const std::vector<float>& logits, const SamplingParams& p, std::mt19937_64& rng) {
  std::vector<std::pair<double, int32_t>> c;
  float mx = *std::max_element(logits.begin(), logits.end());
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({std::exp(double((logits[i] - mx) / p.temperature)), int32_t(i)});
  std::stable_sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first; });
  size_t n = c.size();
  if (p.top_k > 0) n = std::min<size_t>(n, size_t(p.top_k));
  double mass = 0;
  for (size_t i = 0; i < n; ++i) mass += c[i].first;
  if (p.top_p < 1) {
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += c[keep++].first;
      if (cum >= p.top_p * mass) break;
    }
    n = keep;
  }
  if (p.min_p > 0) {
    size_t keep = 1;
    while (keep < n && c[keep].first >= p.min_p * c[0].first) ++keep;
    n = keep;
  }
  double kept = 0;
  for (size_t i = 0; i < n; ++i) kept += c[i].first;
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * kept;
  for (size_t i = 0; i < n; ++i)
    if ((u -= c[i].first) < 0) return c[i].second;
  return c[n - 1].second;
}

TEST(Sampler, FilteredPathsMatchTheReference) {
  std::mt19937 gen(5);
  std::normal_distribution<float> d(0, 2);
  int compared = 0, differ = 0;
  for (int64_t vocab : {7, 300, 5000}) {
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (auto& l : logits) l = d(gen);
    logits[3] = logits[4];  // a tie
    for (SamplingParams p : {SamplingParams{0.7f, 5, 1.0f, 0.0f, 1}, SamplingParams{1.0f, 0, 0.9f, 0.0f, 2},
                             SamplingParams{1.3f, 0, 1.0f, 0.05f, 3}, SamplingParams{0.9f, 40, 0.95f, 0.02f, 4},
                             SamplingParams{1.0f, 0, 0.3f, 0.0f, 5}, SamplingParams{2.0f, 1000, 0.999f, 0.0f, 6}}) {
      Sampler s(p);
      std::mt19937_64 ref_rng(p.seed);
      for (int i = 0; i < 100; ++i) {
        int32_t a = s.sample(logits.data(), vocab), b = reference_sample(logits, p, ref_rng);
        ++compared;
        differ += a != b;  // float vs double weights may move a draw that lands on a boundary
      }
    }
  }
  EXPECT_LE(differ, compared / 500) << differ << " of " << compared;
}

TEST(Sampler, PlainTemperatureFollowsSoftmax) {
  std::vector<float> logits = {1.0f, 0.0f, -1.0f, 2.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 11;
  Sampler s(p);
  std::vector<int> hits(5);
  const int n = 50000;
  for (int i = 0; i < n; ++i) hits[size_t(s.sample(logits.data(), 5))]++;
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.8);
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(hits[i] / double(n), std::exp(logits[i] / 0.8) / z, 0.01) << i;
}

}  // namespace
