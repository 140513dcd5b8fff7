// Sampler: greedy, and seeded temperature / top-k / top-p / min-p sampling over one row of logits.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "core/sampling.h"  // SamplingParams, argmax

namespace arbor {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Picks a token from logits [vocab]. Filters apply in transformers' order: temperature, top-k,
  // top-p, min-p; ties in greedy go to the lowest id (as torch.argmax).
  int32_t sample(const float* logits, int64_t vocab);
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // reused across calls
};

}  // namespace arbor
