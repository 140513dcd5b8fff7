// The fast-mode (GemmMode::Bf16) decode GEMV for MLX affine weights of 2, 4 and 8 bits on int8 activations
// (linear_affine.h): x quantized per 32 columns, integer dot products (vpmaddubsw / vpmaddwd), one f32 scale
// per 32 columns of x and per group of W. AVX2 + FMA + F16C; AVX-512 CPUs run this code too.
//
// A span is 32 bytes of one weight row's codes: S = 128 codes at 2 bits, 64 at 4, 32 at 8. It is decoded
// into 8/B-per-byte registers of 32 unsigned bytes (2 and 4 bits: register k, byte p holds code c·p + k, c =
// 8/B codes per byte; 8 bits: codes widened to s16 in column order), multiplied with x quantized and
// permuted into the same order (q8_prepare), and the s16 pair sums of all registers added before one
// vpmaddwd with ones: s32 lane l holds the partial dot of span columns [l·S/8, (l+1)·S/8), all in one
// 32-column block of x and one group of W. Per lane then f32: total += float(isum)·(d_x·s_w), where the
// per-lane d_x of each span is precomputed (xd) and s_w is the lane's group scale. Overflow: a 4-bit s16
// lane adds 4 products ≤ 15·127, a 2-bit lane 8 products ≤ 3·127 (both < 32767); 8-bit codes (≤ 255)
// would saturate vpmaddubsw, so they take the s16 path (vpmovzxbw, vpmaddwd against s16 x).
// The bias term Σ_g b_g·Σx_g uses the exact f32 Σx of each group.
#include "backend/cpu/avx2_common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/linear_affine.h"
#include "core/error.h"

namespace arbor::cpu::affine_detail {

namespace {

constexpr int64_t kPrefetchBytes = 4096;

ARBOR_AVX2_INLINE float scale_at(const void* p, DType t, int64_t i) {
  if (t == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  if (t == DType::F16) return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

ARBOR_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- x: quantization ---------------------------------------------------------------------------------
// One 32-column block: d = max|x| / 127 and q = round-to-nearest-even(x · (127 / max|x|)) (0 and d = 0 for an
// all-zero block), the same f32 operations as linear_affine_q8_reference.
ARBOR_AVX2_INLINE float quantize_block(const float* x, int32_t* q) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], m = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 8 * i), m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float amax = _mm_cvtss_f32(h);
  const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 8 * i), _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)));
  return amax / 127.0f;
}

template <int B>
constexpr int span_codes() { return B == 2 ? 128 : B == 4 ? 64 : 32; }

// Columns [c0, c1) of one row of x (c0 a multiple of kPrepCols, c1 = min(K, c0 + kPrepCols)): xq (int8 for
// 2 and 4 bits, int16 for 8, in the decode order above; the last span zero-padded past K), xd (per span, the
// 8 lanes' d), and Σx per group (8 partial f32 sums, as the exact path).
template <int B>
ARBOR_AVX2 void prepare_bits(const float* xr, int64_t K, int64_t G, int64_t c0, int64_t c1, void* xqv, float* xd, float* sx) {
  constexpr int S = span_codes<B>(), c = 8 / B;
  // Zero the row's last span where K does not fill it (its padding is read as x = 0, d = 0).
  if (c1 == K && K % S != 0) {
    const int64_t s = K / S;
    if constexpr (B == 8)
      std::memset(static_cast<int16_t*>(xqv) + s * S, 0, S * sizeof(int16_t));
    else
      std::memset(static_cast<int8_t*>(xqv) + s * S, 0, S);
    std::memset(xd + s * 8, 0, 8 * sizeof(float));
  }
  alignas(32) int32_t q[32];
  for (int64_t b0 = c0; b0 < c1; b0 += 32) {
    const float d = quantize_block(xr + b0, q);
    const int64_t s = b0 / S, r0 = b0 % S;  // span, first column within it
    // The lanes of this block: l·S/8 in [r0, r0 + 32).
    for (int l = 0; l < 8; ++l)
      if (l * S / 8 >= r0 && l * S / 8 < r0 + 32) xd[s * 8 + l] = d;
    if constexpr (B == 8) {
      int16_t* o = static_cast<int16_t*>(xqv) + b0;
      for (int j = 0; j < 32; ++j) o[j] = int16_t(q[j]);
    } else {
      int8_t* o = static_cast<int8_t*>(xqv) + s * S;
      for (int j = 0; j < 32; ++j) {
        const int64_t r = r0 + j;
        o[32 * (r % c) + r / c] = int8_t(q[j]);
      }
    }
  }
  for (int64_t g0 = c0; g0 < c1; g0 += G) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = g0; j < g0 + G; j += 8)
      for (int l = 0; l < 8; ++l) acc[l] += xr[j + l];
    sx[g0 / G] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
}

// ---- GEMV --------------------------------------------------------------------------------------------
// Per token row t, the s32 lane sums of one decoded span against x row t's quantized span.
template <int B>
struct Span {
  __m256i r[B == 8 ? 2 : 8 / B];  // 2 and 4 bits: u8 code registers; 8 bits: s16 codes, columns 0..15, 16..31
  ARBOR_AVX2_INLINE void load(const uint8_t* p) {
    if constexpr (B == 8) {
      r[0] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      r[1] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    } else {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      const __m256i mask = _mm256_set1_epi8(char((1 << B) - 1));
      r[0] = _mm256_and_si256(v, mask);
#pragma GCC unroll 4
      for (int k = 1; k < 8 / B; ++k) r[k] = _mm256_and_si256(_mm256_srli_epi16(v, k * B), mask);
    }
  }
  // xv: this span of one row's xq (int8 [S] or int16 [S]) in registers.
  ARBOR_AVX2_INLINE __m256i dot(const __m256i* xv) const {
    if constexpr (B == 8) {
      return _mm256_add_epi32(_mm256_madd_epi16(r[0], xv[0]), _mm256_madd_epi16(r[1], xv[1]));
    } else {
      __m256i p = _mm256_maddubs_epi16(r[0], xv[0]);
#pragma GCC unroll 4
      for (int k = 1; k < 8 / B; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(r[k], xv[k]));
      return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    }
  }
};

// n scales or biases from `sdtype` to f32 (8 at a time, then one by one).
ARBOR_AVX2_INLINE void to_f32(const void* p, DType t, int64_t n, float* out) {
  int64_t i = 0;
  if (t == DType::BF16) {
    const auto* h = static_cast<const uint16_t*>(p);
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                    _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))), 16)));
  } else if (t == DType::F16) {
    const auto* h = static_cast<const uint16_t*>(p);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  } else {
    std::memcpy(out, p, size_t(n) * sizeof(float));
    return;
  }
  for (; i < n; ++i) out[i] = scale_at(p, t, i);
}

// Σ_g b_g·sx_g over n groups, b in `t` (bf16, f16 or f32), 8 at a time then one by one.
ARBOR_AVX2_INLINE float bias_dot(const void* p, DType t, const float* sx, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  if (t == DType::BF16) {
    const auto* h = static_cast<const uint16_t*>(p);
    for (; i + 8 <= n; i += 8)
      acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))), 16)),
                            _mm256_loadu_ps(sx + i), acc);
  } else if (t == DType::F16) {
    const auto* h = static_cast<const uint16_t*>(p);
    for (; i + 8 <= n; i += 8)
      acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))), _mm256_loadu_ps(sx + i), acc);
  } else {
    const auto* f = static_cast<const float*>(p);
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(f + i), _mm256_loadu_ps(sx + i), acc);
  }
  float s = hsum(acc);
  for (; i < n; ++i) s += scale_at(p, t, i) * sx[i];
  return s;
}

// What span_step reads besides the codes.
struct SpanCtx {
  const uint8_t* xq;  // Q8Args::xq
  const float* xd;
  int gshift;  // WIDE: log2(G/S), the span's group is sp >> gshift; else log2(G)
  int64_t Kp, spans;
  __m256i lane_group;
};

// One span (index sp) of R weight rows (codes at p[r], f32 scales sb[r]) against every token row:
// total[r][t][c] += float(isum)·(s·d). x's registers and d are loaded once for the R rows.
template <int B, int TT, int R, int AC, bool WIDE>
ARBOR_AVX2_INLINE void span_step(const SpanCtx& x, int64_t sp, const uint8_t* const (&p)[R], const float* const (&sb)[R],
                                 __m256 (&total)[R][TT][AC], int c) {
  constexpr int64_t S = span_codes<B>(), XB = B == 8 ? 2 : 1;
  constexpr int NX = B == 8 ? 2 : 8 / B;  // x registers per span
  __m256 s[R];
  Span<B> u[R];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
    if constexpr (WIDE)
      s[r] = _mm256_broadcast_ss(sb[r] + (sp >> x.gshift));
    else
      s[r] = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sb[r] + ((sp * S) >> x.gshift))), x.lane_group);
    u[r].load(p[r]);
  }
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t) {
    const auto* xv = reinterpret_cast<const __m256i*>(x.xq + (t * x.Kp + sp * S) * XB);
    __m256i xr[NX];
#pragma GCC unroll 4
    for (int k = 0; k < NX; ++k) xr[k] = _mm256_load_si256(xv + k);
    const __m256 d = _mm256_load_ps(x.xd + (t * x.spans + sp) * 8);
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      const __m256 v = _mm256_cvtepi32_ps(u[r].dot(xr));
      total[r][t][c] = _mm256_fmadd_ps(v, _mm256_mul_ps(s[r], d), total[r][t][c]);
    }
  }
}

// R weight rows at a time (R sequential streams per thread), all TT token rows per decoded span. Each row's
// scales are first converted to f32 (sb); per span and token row, total += float(isum)·(s_lane·d_lane), in AC
// independent accumulators per row and token row when TT is small (the FMA's latency would otherwise bound one
// span); y = Σ total + Σ_g b_g·Σx_g (+ bias). Rows pair up so that x's registers, loaded once per span, serve
// two rows (the loads, not the multiplies, bound one row on 2-load-port cores).
template <int B, int TT, int R, bool WIDE>
ARBOR_AVX2 void q8_row_block(const Q8Args& a, int64_t n, float* const (&sb)[R]) {
  constexpr int64_t S = span_codes<B>();
  constexpr int64_t kSpanBytes = 32;
  constexpr int AC = TT == 1 ? (R == 1 ? 4 : 2) : (TT == 2 && R == 1) ? 2 : 1;
  const int64_t K = a.K, G = a.G, groups = K / G, row_bytes = K * B / 8, spans = (K + S - 1) / S;
  const int64_t Kp = spans * S;  // xq row stride (elements)
  const __m256i lane_group = G * 4 == S ? _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3) : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  // The last span of each row is read from a padded copy where the row's codes do not fill it: read in place
  // it would run into the next row, and past the matrix for the last rows (K of a few groups).
  const bool tail_short = row_bytes % kSpanBytes != 0;
  const int64_t full = tail_short ? spans - 1 : spans;  // spans read in place
  const size_t ssize = dtype_size(a.sdtype);
  const uint8_t* row[R];
  const float* sbc[R];
  const RowParamsPrefetch params_prefetch(a.scales, a.biases, a.sdtype, K, G, B, a.N, kPrefetchBytes);
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
    params_prefetch(n + r);
    row[r] = a.codes + (n + r) * row_bytes;
    to_f32(static_cast<const uint8_t*>(a.scales) + (n + r) * groups * ssize, a.sdtype, groups, sb[r]);
    sbc[r] = sb[r];
  }
  __m256 total[R][TT][AC];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t)
#pragma GCC unroll 4
      for (int c = 0; c < AC; ++c) total[r][t][c] = _mm256_setzero_ps();
  const SpanCtx ctx{static_cast<const uint8_t*>(a.xq), a.xd, WIDE ? __builtin_ctzll(uint64_t(G / S)) : __builtin_ctzll(uint64_t(G)), Kp,
                    spans, lane_group};
  int64_t sp = 0;
  for (; sp + AC <= full; sp += AC) {
#pragma GCC unroll 4
    for (int c = 0; c < AC; ++c) {
      const uint8_t* p[R];
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) {
        p[r] = row[r] + (sp + c) * kSpanBytes;
        if ((sp + c) % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(p[r]) + kPrefetchBytes, _MM_HINT_T0);
      }
      span_step<B, TT, R, AC, WIDE>(ctx, sp + c, p, sbc, total, c);
    }
  }
  for (; sp < full; ++sp) {
    const uint8_t* p[R];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) p[r] = row[r] + sp * kSpanBytes;
    span_step<B, TT, R, AC, WIDE>(ctx, sp, p, sbc, total, 0);
  }
  if (full < spans) {
    alignas(32) uint8_t pad[R][kSpanBytes] = {};
    const uint8_t* p[R];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      std::memcpy(pad[r], row[r] + full * kSpanBytes, size_t(row_bytes - full * kSpanBytes));
      p[r] = pad[r];
    }
    span_step<B, TT, R, AC, WIDE>(ctx, full, p, sbc, total, 0);
  }
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
    const void* biases = static_cast<const uint8_t*>(a.biases) + (n + r) * groups * ssize;
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) {
      __m256 sum = total[r][t][0];
#pragma GCC unroll 4
      for (int c = 1; c < AC; ++c) sum = _mm256_add_ps(sum, total[r][t][c]);
      const float v = hsum(sum) + bias_dot(biases, a.sdtype, a.sx + t * groups, groups);
      a.y[t * a.N + n + r] = a.bias ? v + a.bias[n + r] : v;
    }
  }
}

// Rows [n0, n1): pairs of rows, then an odd row one at a time.
template <int B, int TT, bool WIDE>
ARBOR_AVX2 void q8_rows(const Q8Args& a, int64_t n0, int64_t n1) {
  const int64_t groups = a.K / a.G;
  // Scales of a row in f32: K/32 groups at most, plus 4 zeros read by the last span's lane vector (a span past
  // the row's last group).
  constexpr int64_t kMaxGroupsOnStack = 1024;
  alignas(32) float sb_stack[2][kMaxGroupsOnStack + 8];
  std::vector<float> sb_heap;
  float* sb[2] = {sb_stack[0], sb_stack[1]};
  if (groups > kMaxGroupsOnStack) {
    sb_heap.resize(size_t(2 * (groups + 8)));
    sb[0] = sb_heap.data(), sb[1] = sb_heap.data() + groups + 8;
  }
  std::memset(sb[0] + groups, 0, 4 * sizeof(float));
  std::memset(sb[1] + groups, 0, 4 * sizeof(float));
  constexpr bool kPairs = TT <= 4;  // register pressure: 2·TT accumulators and 2 decoded spans
  int64_t n = n0;
  if constexpr (kPairs) {
    for (; n + 2 <= n1; n += 2) q8_row_block<B, TT, 2, WIDE>(a, n, {sb[0], sb[1]});
  }
  for (; n < n1; ++n) q8_row_block<B, TT, 1, WIDE>(a, n, {sb[0]});
}

template <int B, bool WIDE>
ARBOR_AVX2 void q8_bits_groups(const Q8Args& a, int64_t n0, int64_t n1) {
  switch (a.T) {
    case 1: return q8_rows<B, 1, WIDE>(a, n0, n1);
    case 2: return q8_rows<B, 2, WIDE>(a, n0, n1);
    case 3: return q8_rows<B, 3, WIDE>(a, n0, n1);
    case 4: return q8_rows<B, 4, WIDE>(a, n0, n1);
    case 5: return q8_rows<B, 5, WIDE>(a, n0, n1);
    case 6: return q8_rows<B, 6, WIDE>(a, n0, n1);
    case 7: return q8_rows<B, 7, WIDE>(a, n0, n1);
    case 8: return q8_rows<B, 8, WIDE>(a, n0, n1);
  }
}

// WIDE: a group covers whole spans (G >= S), one scale per span; else a span holds S/G groups (lane runs of 8G/S).
template <int B>
ARBOR_AVX2 void q8_bits(const Q8Args& a, int64_t n0, int64_t n1) {
  if (a.G >= span_codes<B>()) return q8_bits_groups<B, true>(a, n0, n1);
  if constexpr (B != 8) return q8_bits_groups<B, false>(a, n0, n1);
}

}  // namespace

int64_t q8_span_codes(int bits) { return bits == 2 ? 128 : bits == 4 ? 64 : 32; }

ARBOR_AVX2 void q8_prepare_avx2(const float* xr, int64_t K, int64_t G, int bits, int64_t c0, int64_t c1, void* xq, float* xd, float* sx) {
  switch (bits) {
    case 2: return prepare_bits<2>(xr, K, G, c0, c1, xq, xd, sx);
    case 4: return prepare_bits<4>(xr, K, G, c0, c1, xq, xd, sx);
    case 8: return prepare_bits<8>(xr, K, G, c0, c1, xq, xd, sx);
    default: fail("linear_affine: q8 gemv: {} bits not supported (2, 4, 8)", bits);
  }
}

ARBOR_AVX2 void q8_gemv_avx2(const Q8Args& a, int64_t n0, int64_t n1) {
  ARBOR_CHECK(a.T >= 1 && a.T <= kLinearGemvMaxT, "linear_affine: q8 gemv called with T={} (1..{})", a.T, kLinearGemvMaxT);
  switch (a.bits) {
    case 2: return q8_bits<2>(a, n0, n1);
    case 4: return q8_bits<4>(a, n0, n1);
    case 8: return q8_bits<8>(a, n0, n1);
    default: fail("linear_affine: q8 gemv: {} bits not supported (2, 4, 8)", a.bits);
  }
}

}  // namespace arbor::cpu::affine_detail
