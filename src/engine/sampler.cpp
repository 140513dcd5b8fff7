// Token sampling. Sorting 150k-entry vocabularies every token costs more than a small model's forward
// (measured by the server: 210 tok/s greedy vs 40 tok/s sampled with a 151k vocabulary), so the
// sampler sorts only what a filter needs: nothing for plain temperature, the top k for top-k, and a
// growing sorted prefix for top-p and min-p.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace arbor {

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (p_.temperature <= 0.0f) return argmax(logits, vocab);
  // Unnormalised probabilities exp((l - max) / T): the best token has weight 1.
  const float inv_t = 1.0f / p_.temperature;
  const float mx = logits[argmax(logits, vocab)];
  cand_.resize(size_t(vocab));
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    float w = std::exp((logits[i] - mx) * inv_t);
    cand_[size_t(i)] = {w, int32_t(i)};
    total += w;
  }
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const bool filtered = p_.top_k > 0 || p_.top_p < 1.0f || p_.min_p > 0.0f;
  if (!filtered) {  // plain temperature: walk in id order, no sort
    double u = uniform(rng_) * total;
    for (const auto& [w, id] : cand_) {
      u -= w;
      if (u < 0) return id;
    }
    return cand_.back().second;
  }
  // Highest weight first; ties by lower id (as a stable sort of the logits would order them).
  auto by_weight = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  auto begin = cand_.begin();
  size_t n = cand_.size(), sorted = 0;
  double mass = total;
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    std::partial_sort(begin, begin + p_.top_k, cand_.end(), by_weight);
    n = sorted = size_t(p_.top_k);
    mass = 0;
    for (size_t i = 0; i < n; ++i) mass += cand_[i].first;
  }
  // Sorts a prefix of at least `want` entries (growing geometrically), within the first n.
  auto sort_prefix = [&](size_t want) {
    if (want <= sorted) return;
    size_t k = std::min(n, std::max(want, sorted * 4));
    std::partial_sort(begin + int64_t(sorted), begin + int64_t(k), begin + int64_t(n), by_weight);
    sorted = k;
  };
  if (p_.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p of the kept mass (at least one)
    const double target = double(p_.top_p) * mass;
    double cum = 0;
    size_t keep = 0;
    sort_prefix(std::min<size_t>(n, 64));
    while (keep < n) {
      if (keep == sorted) sort_prefix(sorted + 1);
      cum += cand_[keep++].first;
      if (cum >= target) break;
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {  // drop tokens below min_p times the best (whose weight is 1)
    size_t count = 0;
    for (size_t i = 0; i < n; ++i) count += cand_[i].first >= p_.min_p;
    sort_prefix(std::max<size_t>(count, 1));
    n = std::max<size_t>(count, 1);
  }
  sort_prefix(n);
  double kept = 0;
  for (size_t i = 0; i < n; ++i) kept += cand_[i].first;
  double u = uniform(rng_) * kept;
  for (size_t i = 0; i < n; ++i) {
    u -= cand_[i].first;
    if (u < 0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace arbor
