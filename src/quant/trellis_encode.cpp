// Trellis encoder: the Viterbi step kernels (scalar reference, AVX2, AVX-512, chosen at run time with
// per-function target attributes), tail-biting, packing, row scales and the threaded matrix encode.
//
// State order: a state s = (q << k) | b has the 2^k predecessors q + j*Q (Q = 2^(L-k), j < 2^k), the
// same for all 2^k states sharing q. So one step is: for each q, the minimum of 2^k contiguous slices
// of the previous costs (elementwise across q, which vectorises), its argmin j stored as a byte per q
// (the back-pointer), then each of q's 2^k states adds its own distortion. The distortion of value v
// against target x is (x - v)^2 = x^2 - 2xv + v^2; x^2 is the same for every state of a step, so the
// costs carry fma(-2x, v, v^2) only and the error is recomputed from the final path.
#include "quant/trellis_encode.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "core/error.h"
#include "core/tensor.h"

namespace arbor::quant {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Scalar reference step for any k, L. The SIMD steps below perform the same float operations in the
// same order, so their costs and back-pointers are bit-identical.
void step_scalar(const float* prev, float* cur, uint8_t* bp, const float* v, const float* v2, float x2n, int k, int L) {
  const int Q = 1 << (L - k), fan = 1 << k;
  for (int q = 0; q < Q; ++q) {
    float m = prev[q];
    int arg = 0;
    for (int j = 1; j < fan; ++j) {
      const float c = prev[q + j * Q];
      if (c < m) m = c, arg = j;
    }
    bp[q] = uint8_t(arg);
    for (int b = 0; b < fan; ++b) {
      const int s = (q << k) | b;
      cur[s] = m + std::fma(x2n, v[s], v2[s]);
    }
  }
}

#define ARBOR_TRELLIS_AVX2 __attribute__((target("avx2,fma")))
#define ARBOR_TRELLIS_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl")))

// AVX2: 8 q per iteration; their 8 * 2^K states are 2^K vectors, vector i taking m of q0 + (8i + l) >> K.
template <int K>
ARBOR_TRELLIS_AVX2 void step_avx2(const float* prev, float* cur, uint8_t* bp, const float* v, const float* v2, float x2n,
                                  int L) {
  constexpr int fan = 1 << K;
  const int Q = 1 << (L - K);
  const __m256 xv = _mm256_set1_ps(x2n);
  __m256i spread[fan];
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int i = 0; i < fan; ++i) spread[i] = _mm256_srli_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(8 * i)), K);
  // Low byte of each 32-bit lane to the lane's first 4 bytes (per 128-bit half), then halves together.
  const __m256i byte_pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                                             -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i dword_pick = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
  for (int q0 = 0; q0 < Q; q0 += 8) {
    __m256 m = _mm256_loadu_ps(prev + q0);
    __m256i arg = _mm256_setzero_si256();
    for (int j = 1; j < fan; ++j) {
      const __m256 c = _mm256_loadu_ps(prev + q0 + j * Q);
      const __m256 lt = _mm256_cmp_ps(c, m, _CMP_LT_OQ);
      m = _mm256_blendv_ps(m, c, lt);
      arg = _mm256_blendv_epi8(arg, _mm256_set1_epi32(j), _mm256_castps_si256(lt));
    }
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(arg, byte_pick), dword_pick);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(bp + q0), _mm256_castsi256_si128(bytes));
    const int s0 = q0 << K;
    for (int i = 0; i < fan; ++i) {
      const int s = s0 + 8 * i;
      const __m256 e = _mm256_fmadd_ps(xv, _mm256_loadu_ps(v + s), _mm256_loadu_ps(v2 + s));
      _mm256_storeu_ps(cur + s, _mm256_add_ps(_mm256_permutevar8x32_ps(m, spread[i]), e));
    }
  }
}

// AVX-512: the same with 16 q per iteration.
template <int K>
ARBOR_TRELLIS_AVX512 void step_avx512(const float* prev, float* cur, uint8_t* bp, const float* v, const float* v2,
                                      float x2n, int L) {
  constexpr int fan = 1 << K;
  const int Q = 1 << (L - K);
  const __m512 xv = _mm512_set1_ps(x2n);
  __m512i spread[fan];
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int i = 0; i < fan; ++i) spread[i] = _mm512_srli_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * i)), K);
  for (int q0 = 0; q0 < Q; q0 += 16) {
    __m512 m = _mm512_loadu_ps(prev + q0);
    __m512i arg = _mm512_setzero_si512();
    for (int j = 1; j < fan; ++j) {
      const __m512 c = _mm512_loadu_ps(prev + q0 + j * Q);
      const __mmask16 lt = _mm512_cmp_ps_mask(c, m, _CMP_LT_OQ);
      m = _mm512_mask_mov_ps(m, lt, c);
      arg = _mm512_mask_mov_epi32(arg, lt, _mm512_set1_epi32(j));
    }
    // maskz forms: the unmasked ones start from an undefined register, which GCC 12 warns about.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bp + q0), _mm512_maskz_cvtepi32_epi8(0xFFFF, arg));
    const int s0 = q0 << K;
    for (int i = 0; i < fan; ++i) {
      const int s = s0 + 16 * i;
      const __m512 e = _mm512_fmadd_ps(xv, _mm512_loadu_ps(v + s), _mm512_loadu_ps(v2 + s));
      _mm512_storeu_ps(cur + s, _mm512_add_ps(_mm512_maskz_permutexvar_ps(0xFFFF, spread[i], m), e));
    }
  }
}

using StepFn = void (*)(const float*, float*, uint8_t*, const float*, const float*, float, int);

template <int K>
StepFn simd_step(TrellisIsa isa, int L) {
  if (isa == TrellisIsa::avx512 && L - K >= 4) return step_avx512<K>;
  if (isa != TrellisIsa::scalar && L - K >= 3) return step_avx2<K>;
  return nullptr;
}

StepFn pick_step(TrellisIsa isa, int k, int L) {
  switch (k) {
    case 2: return simd_step<2>(isa, L);
    case 3: return simd_step<3>(isa, L);
    case 4: return simd_step<4>(isa, L);
    default: return nullptr;
  }
}

}  // namespace

bool trellis_isa_supported(TrellisIsa isa) {
  switch (isa) {
    case TrellisIsa::scalar: return true;
    case TrellisIsa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case TrellisIsa::avx512:
      return trellis_isa_supported(TrellisIsa::avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
  return false;
}

TrellisIsa trellis_best_isa() {
  static const TrellisIsa best = trellis_isa_supported(TrellisIsa::avx512) ? TrellisIsa::avx512
                                 : trellis_isa_supported(TrellisIsa::avx2) ? TrellisIsa::avx2
                                                                           : TrellisIsa::scalar;
  return best;
}

const char* trellis_isa_name(TrellisIsa isa) {
  switch (isa) {
    case TrellisIsa::scalar: return "scalar";
    case TrellisIsa::avx2: return "avx2";
    case TrellisIsa::avx512: return "avx512";
  }
  return "?";
}

struct TrellisViterbi::Scratch {
  Buffer cost[2];  // f32 [2^L] each: the previous and current step
  Buffer back;     // u8 [T][2^(L-k)]: the argmin j of each step's q
  StepFn step = nullptr;
};

TrellisViterbi::TrellisViterbi(const TrellisParams& p, TrellisIsa isa) : p_(p), isa_(isa) {
  check_trellis_params(p_, false);
  ARBOR_CHECK(trellis_isa_supported(isa), "trellis: this CPU does not run the {} Viterbi", trellis_isa_name(isa));
  value_ = trellis_code_table(p_.L);
  value_sq_.resize(value_.size());
  for (size_t s = 0; s < value_.size(); ++s) value_sq_[s] = value_[s] * value_[s];
  rotated_.resize(size_t(p_.T));
  rotated_states_.resize(size_t(p_.T));
  scratch_ = std::make_unique<Scratch>();
  for (Buffer& b : scratch_->cost) b = Buffer(sizeof(float) * size_t(p_.states()));
  scratch_->back = Buffer(size_t(p_.T) << (p_.L - p_.k));
  scratch_->step = pick_step(isa, p_.k, p_.L);
}

TrellisViterbi::~TrellisViterbi() = default;

double TrellisViterbi::path(const float* x, int overlap, uint16_t* states) {
  const int k = p_.k, L = p_.L, T = p_.T, S = p_.states(), Q = 1 << (L - k), fan = 1 << k;
  ARBOR_CHECK(overlap < Q, "trellis: overlap {} outside [0, {})", overlap, Q);
  float* prev = scratch_->cost[0].as<float>();
  float* cur = scratch_->cost[1].as<float>();
  uint8_t* back = scratch_->back.as<uint8_t>();
  const float* v = value_.data();
  const float* v2 = value_sq_.data();

  // t = 0: every state may start, or only the 2^k states whose high L-k bits are the overlap.
  const float x0 = -2.0f * x[0];
  for (int s = 0; s < S; ++s) prev[s] = overlap < 0 || (s >> k) == overlap ? std::fma(x0, v[s], v2[s]) : kInf;
  for (int t = 1; t < T; ++t) {
    uint8_t* bp = back + size_t(t) * Q;
    if (scratch_->step)
      scratch_->step(prev, cur, bp, v, v2, -2.0f * x[t], L);
    else
      step_scalar(prev, cur, bp, v, v2, -2.0f * x[t], k, L);
    std::swap(prev, cur);
  }
  // The end: any state, or one whose low L-k bits are the overlap (those are overlap + j*Q).
  int best = -1;
  float best_cost = kInf;
  if (overlap < 0) {
    for (int s = 0; s < S; ++s)
      if (prev[s] < best_cost) best_cost = prev[s], best = s;
  } else {
    for (int j = 0; j < fan; ++j)
      if (prev[overlap + j * Q] < best_cost) best_cost = prev[overlap + j * Q], best = overlap + j * Q;
  }
  ARBOR_CHECK(best >= 0, "trellis: Viterbi found no finite path (non-finite target weight?)");
  uint32_t s = uint32_t(best);
  for (int t = T - 1; t >= 0; --t) {
    states[t] = uint16_t(s);
    if (t > 0) s = (s >> k) + (uint32_t(back[size_t(t) * Q + (s >> k)]) << (L - k));
  }
  double err = 0;
  for (int t = 0; t < T; ++t) {
    const double d = double(x[t]) - double(v[states[t]]);
    err += d * d;
  }
  return err;
}

double TrellisViterbi::encode_block(const float* x, uint16_t* states, TailBiting mode) {
  const int T = p_.T, Q = 1 << (p_.L - p_.k);
  if (mode == TailBiting::exact) {
    double best = std::numeric_limits<double>::infinity();
    for (int c = 0; c < Q; ++c) {
      const double err = path(x, c, rotated_states_.data());
      if (err < best) best = err, std::copy(rotated_states_.begin(), rotated_states_.end(), states);
    }
    return best;
  }
  // Rotated by T/2, the block's wrap sits mid-sequence where the unconstrained path crosses it freely;
  // the state it chooses at the original t = 0 (rotated index T - T/2) fixes the overlap.
  const int half = T / 2;
  for (int t = 0; t < T; ++t) rotated_[size_t(t)] = x[(t + half) % T];
  path(rotated_.data(), -1, rotated_states_.data());
  const int overlap = int(rotated_states_[size_t(T - half)] >> p_.k);
  return path(x, overlap, states);
}

void trellis_pack_block(const uint16_t* states, const TrellisParams& p, uint32_t* block) {
  const int wpb = p.words_per_block();
  std::memset(block, 0, sizeof(uint32_t) * size_t(wpb));
  const uint32_t mask = (1u << p.k) - 1u;
  for (int t = 0; t < p.T; ++t) {
    const uint32_t b = states[t] & mask;
    const int pos = (p.T - 1 - t) * p.k, wi = pos >> 5, off = pos & 31;
    block[wi] |= b << off;
    if (off + p.k > 32) block[wi + 1] |= b >> (32 - off);  // a symbol straddling two words (k = 3)
  }
}

bool trellis_is_tail_biting(const uint16_t* states, const TrellisParams& p) {
  const uint32_t mask = uint32_t(p.states()) - 1u;
  for (int t = 0; t < p.T; ++t) {
    const uint32_t from = states[(t + p.T - 1) % p.T], to = states[t];
    if (to > mask || (((from << p.k) & mask) >> p.k) != (to >> p.k)) return false;
  }
  return true;
}

float trellis_default_scale_gain(int k) {
  switch (k) {
    case 2: return 1.04f;
    case 3: return 1.10f;
    case 4: return 1.14f;
    default: return 1.0f;
  }
}

uint16_t trellis_row_scale(const float* row, int64_t n, double code_rms, float gain) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(row[i]) * double(row[i]);
  if (sum == 0) return f32_to_f16(1.0f);
  const uint16_t h = f32_to_f16(float(double(gain) * std::sqrt(sum / double(n)) / code_rms));
  return h == 0 ? uint16_t(1) : h;  // a row too small for f16 gets the smallest subnormal
}

TrellisEncoded trellis_encode_stored(const std::string& name, const float* stored, int64_t rows, int64_t cols, int k,
                                     int axis, ThreadPool* pool, const TrellisEncodeOptions& opt) {
  const TrellisParams p{k, 12, 256};
  ARBOR_CHECK(k >= 2 && k <= 4, "trellis: '{}': bits {} (supported: 2, 3, 4)", name, k);
  ARBOR_CHECK(axis == 0 || axis == 1, "trellis: '{}': axis {} (supported: 0, 1)", name, axis);
  ARBOR_CHECK(rows >= 1 && cols >= p.T && cols % p.T == 0,
              "trellis: '{}': cannot code a [{}, {}] matrix along its {} columns in blocks of {}", name, rows, cols, cols,
              p.T);
  TrellisEncoded enc;
  TrellisGeometry& g = enc.geometry;
  g.params = p;
  g.axis = axis;
  g.rows = rows;
  g.cols = cols;
  g.in_features = axis == 1 ? cols : rows;
  g.out_features = axis == 1 ? rows : cols;
  const int64_t wpr = g.words_per_row();
  enc.words.resize(size_t(rows * wpr));
  enc.scales.resize(size_t(rows));
  const double code_rms = trellis_code_rms(p.L);
  const float gain = opt.scale_gain > 0 ? opt.scale_gain : trellis_default_scale_gain(k);

  const int64_t bpr = cols / p.T;  // blocks per row
  auto over_rows = [&](const std::function<void(int, int64_t, int64_t)>& fn) {
    if (pool)
      pool->parallel_for(rows, 1, fn);
    else
      fn(0, 0, rows);
  };
  // Every row's scale (into enc.scales) and targets (weights over the scale the file will hold, in code units;
  // a non-finite weight refused naming the tensor and its place), every block's path, then the packing.
  std::vector<float> targets(size_t(rows * cols));
  over_rows([&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = stored + r * cols;
      for (int64_t c = 0; c < cols; ++c)
        ARBOR_CHECK(std::isfinite(row[c]), "trellis: '{}': weight [{}, {}] of the coded matrix is {}", name, r, c, row[c]);
      const uint16_t scale_bits = trellis_row_scale(row, cols, code_rms, gain);
      enc.scales[size_t(r)] = scale_bits;
      const float inv = 1.0f / f16_to_f32(scale_bits);
      for (int64_t c = 0; c < cols; ++c) targets[size_t(r * cols + c)] = row[c] * inv;
    }
  });
  std::vector<uint16_t> states(size_t(rows * cols));
  TrellisBlockPaths(p, pool, opt).run(targets.data(), rows * bpr, states.data());
  over_rows([&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < bpr; ++b) {
        const uint16_t* st = states.data() + (r * bpr + b) * p.T;
        ARBOR_CHECK(trellis_is_tail_biting(st, p), "trellis: '{}': the block Viterbi returned a path that is not tail-biting (row {}, block {})",
                    name, r, b);
        trellis_pack_block(st, p, enc.words.data() + r * wpr + b * p.words_per_block());
      }
  });
  return enc;
}

TrellisBlockPaths::TrellisBlockPaths(const TrellisParams& p, ThreadPool* pool, const TrellisEncodeOptions& opt)
    : p_(p), pool_(pool), opt_(opt), vit_(size_t(pool ? pool->size() : 1)) {}
TrellisBlockPaths::~TrellisBlockPaths() = default;

void TrellisBlockPaths::run(const float* targets, int64_t blocks, uint16_t* states) {
  if (opt_.block_viterbi && opt_.tail_biting == TailBiting::rotate) return opt_.block_viterbi(p_.k, targets, blocks, states);
  auto fn = [&](int t, int64_t b0, int64_t b1) {
    auto& v = vit_[size_t(t)];
    if (!v) v = std::make_unique<TrellisViterbi>(p_, opt_.isa);
    for (int64_t b = b0; b < b1; ++b) v->encode_block(targets + b * p_.T, states + b * p_.T, opt_.tail_biting);
  };
  if (pool_)
    pool_->parallel_for(blocks, 1, fn);
  else
    fn(0, 0, blocks);
}

TrellisEncoded trellis_encode_linear(const std::string& name, const float* w, int64_t out, int64_t in, int k, int axis,
                                     ThreadPool* pool, const TrellisEncodeOptions& opt) {
  if (axis == 1) return trellis_encode_stored(name, w, out, in, k, axis, pool, opt);
  std::vector<float> transposed(size_t(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) transposed[size_t(i * out + o)] = w[o * in + i];
  return trellis_encode_stored(name, transposed.data(), in, out, k, axis, pool, opt);
}

}  // namespace arbor::quant
