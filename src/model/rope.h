// RopeTable: rotary-embedding frequencies for one rope config (default, linear, dynamic NTK, llama3,
// yarn, longrope), computed once at load as transformers computes them, and a cos/sin cache per
// position grown on demand. Rotation is HF's rotate_half over the first rotary_dim dims.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace arbor {

class RopeTable {
 public:
  RopeTable() = default;
  // rotary_dim: dims rotated per head; max_position: config.max_position_embeddings.
  RopeTable(const RopeConfig& cfg, int64_t rotary_dim, int64_t max_position);

  int64_t rotary_dim() const { return rot_dim_; }
  float attention_factor() const { return attention_factor_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  // Makes cos/sin available for positions [0, n). Not thread-safe: call before a forward.
  void ensure(int64_t n);
  const float* cos(int64_t pos) const { return cos_.data() + pos * (rot_dim_ / 2); }  // [rot_dim/2], scaled
  const float* sin(int64_t pos) const { return sin_.data() + pos * (rot_dim_ / 2); }
  int64_t cached() const { return cached_; }

 private:
  std::vector<float> freqs_for(int64_t pos) const;  // inv_freq to use at this position

  RopeConfig cfg_;
  int64_t rot_dim_ = 0, max_position_ = 0, cached_ = 0;
  float attention_factor_ = 1.0f;
  std::vector<float> inv_freq_, inv_freq_long_;
  std::vector<float> cos_, sin_;
};

}  // namespace arbor
