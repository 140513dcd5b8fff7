// Sampler: greedy, and seeded temperature / top-k / top-p / min-p sampling over one row of logits.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace arbor {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
};

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

int32_t argmax(const float* logits, int64_t n);

}  // namespace arbor
