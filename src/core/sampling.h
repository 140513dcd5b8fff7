// What a token draw is, shared by the engine's host sampler (engine/sampler.h) and the backends that
// pick ids where the logits are (Backend::argmax_rows_start / sample_rows_start): the sampling
// parameters, and greedy argmax with its tie rule.
#pragma once
#include <cstdint>

namespace arbor {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
};

// The first largest of logits[0..n) (ties to the lowest id, as torch.argmax).
inline int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

}  // namespace arbor
