// Rope variants. Formulas follow transformers' modeling_rope_utils (float32 frequencies); where
// transformers recomputes with the running sequence length (dynamic NTK, longrope), the length used
// for a token is its own position + 1, which is what incremental decoding with a KV cache sees.
// Longrope's long regime is the one exception: transformers picks the factors once per forward from
// max(position) + 1, so a prompt longer than original_max_position_embeddings is rotated with the
// long factors at every position (cos(pos, true)); the caller decides which regime a sequence takes.
#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace arbor {

namespace {

std::vector<float> base_inv_freq(double base, int64_t dim) {
  std::vector<float> f(size_t(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    float expo = float(2 * i) / float(dim);
    f[size_t(i)] = 1.0f / std::pow(float(base), expo);
  }
  return f;
}

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double yarn_correction_dim(double rotations, int64_t dim, double base, double max_pos) {
  return (double(dim) * std::log(max_pos / (rotations * 2 * M_PI))) / (2 * std::log(base));
}

}  // namespace

RopeTable::RopeTable(const RopeConfig& cfg, int64_t rotary_dim, int64_t max_position)
    : cfg_(cfg), rot_dim_(rotary_dim), max_position_(max_position) {
  ARBOR_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rope: rotary dim {} must be positive and even", rotary_dim);
  const int64_t half = rotary_dim / 2;
  inv_freq_ = base_inv_freq(cfg.theta, rotary_dim);
  switch (cfg.kind) {
    case RopeKind::None:
    case RopeKind::Default:
    case RopeKind::Dynamic:
      break;
    case RopeKind::Linear:
      for (auto& f : inv_freq_) f = float(f / cfg.factor);
      break;
    case RopeKind::Llama3: {
      double orig = double(cfg.original_max_position > 0 ? cfg.original_max_position : 8192);
      double low_wavelen = orig / cfg.low_freq_factor, high_wavelen = orig / cfg.high_freq_factor;
      for (auto& f : inv_freq_) {
        double wavelen = 2 * M_PI / double(f);
        float scaled = wavelen > low_wavelen ? float(f / cfg.factor) : f;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
          double smooth = (orig / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor);
          scaled = float((1 - smooth) * double(scaled) / cfg.factor + smooth * double(scaled));
        }
        f = scaled;
      }
      break;
    }
    case RopeKind::Yarn: {
      double factor = cfg.factor;
      double orig = double(max_position);
      if (cfg.original_max_position > 0) {  // as transformers: the ratio, not `factor`, when both exist
        orig = double(cfg.original_max_position);
        factor = double(max_position) / orig;
      }
      attention_factor_ = float(cfg.attention_factor >= 0 ? cfg.attention_factor
                                 : (cfg.mscale != 0 && cfg.mscale_all_dim != 0)
                                     ? yarn_mscale(factor, cfg.mscale) / yarn_mscale(factor, cfg.mscale_all_dim)
                                     : yarn_mscale(factor, 1.0));
      double low = yarn_correction_dim(cfg.beta_fast, rotary_dim, cfg.theta, orig);
      double high = yarn_correction_dim(cfg.beta_slow, rotary_dim, cfg.theta, orig);
      if (cfg.truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0), high = std::min(high, double(rotary_dim - 1));
      if (low == high) high += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        float extrap = inv_freq_[size_t(i)];
        float interp = float(double(extrap) / factor);
        float ramp = std::clamp(float((double(i) - low) / (high - low)), 0.0f, 1.0f);
        float extrap_weight = 1.0f - ramp;
        inv_freq_[size_t(i)] = interp * (1 - extrap_weight) + extrap * extrap_weight;
      }
      break;
    }
    case RopeKind::LongRope: {
      ARBOR_CHECK(int64_t(cfg.short_factor.size()) == half && int64_t(cfg.long_factor.size()) == half,
                  "rope: longrope factors have {} and {} entries, rotary dim {} needs {}", cfg.short_factor.size(),
                  cfg.long_factor.size(), rotary_dim, half);
      double orig = double(cfg.original_max_position);
      double factor = double(max_position) / orig;
      attention_factor_ = float(cfg.attention_factor >= 0 ? cfg.attention_factor
                                 : factor <= 1 ? 1.0
                                               : std::sqrt(1 + std::log(factor) / std::log(orig)));
      inv_freq_long_.resize(size_t(half));
      for (int64_t i = 0; i < half; ++i) {
        float shape = float(2 * i) / float(rotary_dim);
        float p = std::pow(float(cfg.theta), shape);
        inv_freq_long_[size_t(i)] = 1.0f / (float(cfg.long_factor[size_t(i)]) * p);
        inv_freq_[size_t(i)] = 1.0f / (float(cfg.short_factor[size_t(i)]) * p);
      }
      break;
    }
  }
}

std::vector<float> RopeTable::freqs_for(int64_t pos) const {
  if (cfg_.kind == RopeKind::LongRope && pos >= cfg_.original_max_position) return inv_freq_long_;
  if (cfg_.kind == RopeKind::Dynamic) {
    int64_t orig = cfg_.original_max_position > 0 ? cfg_.original_max_position : max_position_;
    int64_t seq_len = pos + 1;
    if (seq_len > orig) {
      double base = cfg_.theta * std::pow(cfg_.factor * double(seq_len) / double(orig) - (cfg_.factor - 1),
                                          double(rot_dim_) / double(rot_dim_ - 2));
      return base_inv_freq(base, rot_dim_);
    }
  }
  return inv_freq_;
}

const float* RopeTable::table(const std::vector<float>& def, const std::vector<float>& lng, int64_t pos, bool long_regime) const {
  ARBOR_CHECK(pos >= 0 && pos < cached_, "rope: position {} outside the cached {}", pos, cached_);
  ARBOR_CHECK(!long_regime || has_long_regime(), "rope: the long regime of a {} rope", rope_kind_name(cfg_.kind));
  return (long_regime ? lng : def).data() + pos * (rot_dim_ / 2);
}

void RopeTable::ensure(int64_t n) {
  if (n <= cached_) return;
  int64_t want = std::max(n, std::min<int64_t>(std::max<int64_t>(cached_ * 2, 256), std::max(n, max_position_)));
  const int64_t half = rot_dim_ / 2;
  auto fill = [&](std::vector<float>& cs, std::vector<float>& sn, int64_t p, const std::vector<float>& f) {
    for (int64_t i = 0; i < half; ++i) {
      float angle = float(p) * f[size_t(i)];  // float32 product, as torch computes it
      cs[size_t(p * half + i)] = float(std::cos(double(angle))) * attention_factor_;
      sn[size_t(p * half + i)] = float(std::sin(double(angle))) * attention_factor_;
    }
  };
  cos_.resize(size_t(want * half));
  sin_.resize(size_t(want * half));
  if (has_long_regime()) cos_long_.resize(size_t(want * half)), sin_long_.resize(size_t(want * half));
  for (int64_t p = cached_; p < want; ++p) {
    fill(cos_, sin_, p, freqs_for(p));
    if (has_long_regime()) fill(cos_long_, sin_long_, p, inv_freq_long_);
  }
  cached_ = want;
}

}  // namespace arbor
