// Token sampling.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace arbor {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (p_.temperature <= 0.0f) return argmax(logits, vocab);
  cand_.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i] / p_.temperature, int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = size_t(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax over the survivors (sorted, highest first).
  const float mx = cand_[0].first;
  double total = 0;
  std::vector<double> prob(n);
  for (size_t i = 0; i < n; ++i) total += (prob[i] = std::exp(double(cand_[i].first - mx)));
  for (auto& q : prob) q /= total;
  if (p_.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p (always at least one token)
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += prob[keep++];
      if (cum >= double(p_.top_p)) break;
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {  // drop tokens below min_p times the top probability
    size_t keep = 1;
    while (keep < n && prob[keep] >= double(p_.min_p) * prob[0]) ++keep;
    n = keep;
  }
  double mass = 0;
  for (size_t i = 0; i < n; ++i) mass += prob[i];
  double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (size_t i = 0; i < n; ++i) {
    u -= prob[i];
    if (u < 0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace arbor
