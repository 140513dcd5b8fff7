// RopeTable: rotary-embedding frequencies for one rope config (default, linear, dynamic NTK, llama3,
// yarn, longrope), computed once at load as transformers computes them, and a cos/sin cache per
// position grown on demand. Rotation is HF's rotate_half over the first rotary_dim dims.
// Longrope has a second cache, the long regime: the long factors at every position, for a sequence
// whose prompt is longer than original_max_position_embeddings (docs/architecture.md, "Rope").
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
  // cos/sin [rot_dim/2] (scaled by attention_factor) at pos. The default regime is what a sequence
  // whose prompt fits original_max_position_embeddings sees, token by token; long_regime (longrope
  // only) is the long factors at every position.
  const float* cos(int64_t pos, bool long_regime = false) const { return table(cos_, cos_long_, pos, long_regime); }
  const float* sin(int64_t pos, bool long_regime = false) const { return table(sin_, sin_long_, pos, long_regime); }
  int64_t cached() const { return cached_; }
  // Whether this rope has a long regime (longrope), and whether a sequence whose prompt (its first
  // forward, in transformers' terms) has prompt_tokens tokens takes it.
  bool has_long_regime() const { return cfg_.kind == RopeKind::LongRope; }
  bool long_regime_for(int64_t prompt_tokens) const { return has_long_regime() && prompt_tokens > cfg_.original_max_position; }

 private:
  std::vector<float> freqs_for(int64_t pos) const;  // inv_freq of the default regime at this position
  const float* table(const std::vector<float>& def, const std::vector<float>& lng, int64_t pos, bool long_regime) const;

  RopeConfig cfg_;
  int64_t rot_dim_ = 0, max_position_ = 0, cached_ = 0;
  float attention_factor_ = 1.0f;
  std::vector<float> inv_freq_, inv_freq_long_;
  std::vector<float> cos_, sin_, cos_long_, sin_long_;
};

}  // namespace arbor
