// The fast-mode (GemmMode::Bf16) decode GEMV for MLX affine weights of 2, 4 and 8 bits on int8 activations,
// AVX-512 VNNI form (linear_affine.h): the same product as linear_affine_q8_avx2.cpp (x quantized per 32
// columns to int8 with d = max|x|/127, integer dots, one f32 scale per 32 columns of x and per group of W,
// the bias term on the exact Σx), with vpdpbusd (u8 codes × s8 x, four products summed into an s32 lane,
// never saturating) on 512-bit registers. AVX-512 F/BW/VL/DQ + VNNI.
//
// A span is 64 bytes of one weight row's codes (one cache line of an aligned row): S = 256 codes at 2 bits,
// 128 at 4, 64 at 8. 2 and 4 bits are decoded by mask and shift into c = 8/B registers of 64 unsigned bytes
// (register k, byte p holds code c·p + k); 8-bit codes are already the u8 operand. x is quantized and permuted
// into the same order (q8_prepare_avx512), so vpdpbusd of register k against x register k, summed over k,
// leaves in s32 lane l the partial dot of span columns [l·S/16, (l+1)·S/16) — S/16 ≤ 16 columns, all in one
// 32-column block of x and one group of W. Per lane then f32: total += float(isum)·(d_x·s_w), the lane's d_x
// precomputed per span (xd, 16 lanes) and s_w its group's scale. Overflow: a lane sums at most 16 products of
// |code·q| ≤ 255·127, far inside s32.
// The last span of a row that its codes do not fill is read with a masked load (nothing past the row is
// touched); x is zero-padded there and its d is 0.
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/linear_affine.h"
#include "core/error.h"

#define ARBOR_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define ARBOR_VNNI_INLINE ARBOR_VNNI inline __attribute__((always_inline))

namespace arbor::cpu::affine_detail {

namespace {

constexpr int64_t kSpanBytes = 64;
constexpr int64_t kPrefetchBytes = 4096;

template <int B>
constexpr int64_t span_codes() { return 512 / B; }

// ---- x: quantization ---------------------------------------------------------------------------------
// One 32-column block: d = max|x| / 127 and q = round-to-nearest-even(x · (127 / max|x|)) (0 and d = 0 for an
// all-zero block), the same f32 operations as linear_affine_q8_reference.
ARBOR_VNNI_INLINE float quantize_block(const float* x, __m256i* q) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  *q = _mm256_set_m128i(_mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv))),
                        _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv))));
  return amax / 127.0f;
}

// Σx per group of columns [c0, c1): eight partial sums (lane l sums columns ≡ l mod 8), combined in the reference's order.
ARBOR_VNNI_INLINE void group_sums(const float* xr, int64_t G, int64_t c0, int64_t c1, float* sx) {
  for (int64_t g0 = c0; g0 < c1; g0 += G) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = g0; j < g0 + G; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(xr + j));
    alignas(32) float a[8];
    _mm256_store_ps(a, acc);
    sx[g0 / G] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  }
}

// Columns [c0, c1) of one row of x (c0 a multiple of kPrepCols, a multiple of every S; c1 = min(K, c0 +
// kPrepCols)): xq (int8 in the decode order above; the last span zero-padded past K), xd (per span, the 16
// lanes' d), and Σx per group (8 partial f32 sums, as the exact path).
template <int B>
ARBOR_VNNI void prepare_bits(const float* xr, int64_t K, int64_t G, int64_t c0, int64_t c1, int8_t* xq, float* xd, float* sx) {
  constexpr int64_t S = span_codes<B>(), L = S / 16;  // L: columns per s32 lane
  if (c1 == K && K % S != 0) {
    const int64_t s = K / S;
    std::memset(xq + s * S, 0, S);
    std::memset(xd + s * 16, 0, 16 * sizeof(float));
  }
  __m256i v;  // the block's 32 int8 values in column order
  for (int64_t b0 = c0; b0 < c1; b0 += 32) {
    const float d = quantize_block(xr + b0, &v);
    const int64_t s = b0 / S, r0 = b0 % S;  // span, first column within it
    for (int64_t l = r0 / L; l < (r0 + 32) / L && l < 16; ++l) xd[s * 16 + l] = d;
    int8_t* o = xq + s * S;
    // Column r of the span goes to o[64·(r % c) + r / c]; r0 is a multiple of 32, so the block's columns of
    // each k are contiguous: 16 bytes at o + 64k + r0/2 (4 bits), 8 at o + 64k + r0/4 (2 bits).
    if constexpr (B == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + r0), v);
    } else if constexpr (B == 4) {  // each 16-byte lane to [evens, odds], then the qwords to [evens, odds]
      const __m256i eo = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8,
                                                                 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
      const __m256i w = _mm256_permute4x64_epi64(eo, 0xD8);  // qwords 0, 2, 1, 3
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + r0 / 2), _mm256_castsi256_si128(w));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 64 + r0 / 2), _mm256_extracti128_si256(w, 1));
    } else {  // B == 2: each lane to [k0, k1, k2, k3] (4 bytes each), then the dwords to k-major qwords
      const __m256i k4 = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1,
                                                                 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
      const __m256i w = _mm256_permutevar8x32_epi32(k4, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      alignas(32) int64_t part[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(part), w);
      for (int k = 0; k < 4; ++k) std::memcpy(o + 64 * k + r0 / 4, &part[k], 8);
    }
  }
  group_sums(xr, G, c0, c1, sx);
}

// ---- GEMV --------------------------------------------------------------------------------------------
// n scales from `t` to f32: 16 at a time, the rest loaded under a mask. Stored with plain stores (the zeros past
// n included: the caller's buffer has 16 spare), since a masked store does not forward to the span loop's loads
// that read `out` right after.
ARBOR_VNNI_INLINE __m512 scales16(const void* p, DType t, int64_t i, __mmask16 m) {
  if (t == DType::BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i)), 16));
  if (t == DType::F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
}
ARBOR_VNNI_INLINE void to_f32(const void* p, DType t, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, scales16(p, t, i, __mmask16(0xFFFF)));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_storeu_ps(out + i, scales16(p, t, i, m));  // zeros past n: sb has room (rows() keeps 16 spare)
  }
}

// Σ_g b_g·sx_g over n groups, b in `t`: 16 at a time, the rest under a mask; left in 16 lanes (added to the
// row's total before its one horizontal sum).
ARBOR_VNNI_INLINE __m512 bias_dot(const void* p, DType t, const float* sx, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    __m512 b;
    if (t == DType::BF16)
      b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i)), 16));
    else if (t == DType::F16)
      b = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
    else
      b = _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
    acc = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m, sx + i), acc);
  }
  return acc;
}

// The s32 lane sums of one decoded span (codes as loaded, raw) against x registers xr.
template <int B>
ARBOR_VNNI_INLINE __m512i span_dot(__m512i raw, const __m512i* xr) {
  if constexpr (B == 8) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), raw, xr[0]);
  } else {
    const __m512i mask = _mm512_set1_epi8(char((1 << B) - 1));
    __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(raw, mask), xr[0]);
    // srli_epi16 shifts the next byte's low bits into each byte's top: every field is masked.
#pragma GCC unroll 4
    for (int k = 1; k < 8 / B; ++k) acc = _mm512_dpbusd_epi32(acc, _mm512_and_si512(_mm512_srli_epi16(raw, k * B), mask), xr[k]);
    return acc;
  }
}

// What span_step reads besides the codes.
struct SpanCtx {
  const int8_t* xq;  // Q8Args::xq
  const float* xd;   // [T, spans, 16]
  int gshift;        // WIDE: log2(G/S), the span's group is sp >> gshift; else log2(S/G) groups per span
  int64_t Kp, spans;
  __m512i lane_group;  // !WIDE: lane l's group within its span
};

// One span (index sp, raw codes v[r]) of R weight rows (f32 scales sb[r]) against every token row:
// total[r][t][c] += float(isum)·(s·d). x's registers and d are loaded once for the R rows.
template <int B, int TT, int R, int AC, bool WIDE>
ARBOR_VNNI_INLINE void span_step(const SpanCtx& x, int64_t sp, const __m512i (&v)[R], const float* const (&sb)[R],
                                 __m512 (&total)[R][TT][AC], int c) {
  constexpr int64_t S = span_codes<B>();
  constexpr int NX = B == 8 ? 1 : 8 / B;  // x registers per span
  __m512 s[R];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
    if constexpr (WIDE)
      s[r] = _mm512_set1_ps(sb[r][sp >> x.gshift]);
    else
      s[r] = _mm512_permutexvar_ps(x.lane_group, _mm512_castps256_ps512(_mm256_loadu_ps(sb[r] + (sp << x.gshift))));
  }
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t) {
    const auto* xv = reinterpret_cast<const __m512i*>(x.xq + t * x.Kp + sp * S);
    __m512i xr[NX];
#pragma GCC unroll 4
    for (int k = 0; k < NX; ++k) xr[k] = _mm512_load_si512(xv + k);
    const __m512 d = _mm512_load_ps(x.xd + (t * x.spans + sp) * 16);
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      const __m512 isum = _mm512_cvtepi32_ps(span_dot<B>(v[r], xr));
      total[r][t][c] = _mm512_fmadd_ps(isum, _mm512_mul_ps(s[r], d), total[r][t][c]);
    }
  }
}

// A row's scales in f32 for the span loops (to_f32 writes them): on the stack up to kMaxGroupsOnStack groups, else
// on the heap, with 16 spare zeros past the last group (a span's lane vector may read past it).
class RowScales {
 public:
  explicit RowScales(int64_t groups) : p_(stack_) {
    if (groups > kMaxGroupsOnStack) heap_.resize(size_t(groups + 16)), p_ = heap_.data();
    std::memset(p_ + groups, 0, 16 * sizeof(float));
  }
  float* get() { return p_; }

 private:
  static constexpr int64_t kMaxGroupsOnStack = 1024;
  alignas(64) float stack_[kMaxGroupsOnStack + 16];
  std::vector<float> heap_;
  float* p_;
};

// Row n's outputs for every token row: the span sums (AC accumulators) plus Σ_g b_g·Σx_g, plus the layer's bias.
template <int TT, int AC>
ARBOR_VNNI_INLINE void finish_row(const Q8Args& a, int64_t n, size_t ssize, const __m512 (&total)[TT][AC]) {
  const int64_t groups = a.K / a.G;
  const void* biases = static_cast<const uint8_t*>(a.biases) + n * groups * int64_t(ssize);
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t) {
    __m512 sum = bias_dot(biases, a.sdtype, a.sx + t * groups, groups);
#pragma GCC unroll 2
    for (int c = 0; c < AC; ++c) sum = _mm512_add_ps(sum, total[t][c]);
    const float v = _mm512_reduce_add_ps(sum);
    a.y[t * a.N + n] = a.bias ? v + a.bias[n] : v;
  }
}

// f.template operator()<TT>() for TT = a.T (1..kLinearGemvMaxT): the row loops are compiled per token-row count.
template <typename F>
inline void with_token_rows(int64_t T, F&& f) {
  static_assert(kLinearGemvMaxT == 8, "one case per token-row count");
  switch (T) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    case 4: return f.template operator()<4>();
    case 5: return f.template operator()<5>();
    case 6: return f.template operator()<6>();
    case 7: return f.template operator()<7>();
    case 8: return f.template operator()<8>();
  }
}

// R weight rows at a time (R sequential streams per thread), all TT token rows per decoded span. Each row's
// scales are first converted to f32 (sb); per span and token row, total += float(isum)·(s_lane·d_lane), in AC
// independent accumulators per row and token row when TT is small (the FMA's latency would otherwise bound
// one span); y = Σ total + Σ_g b_g·Σx_g (+ bias).
// A row's sizes, the same for every row of a call: worked out once per call (they were an idiv and a call
// to dtype_size per row; no change in speed was measurable on the Zen 5 VM).
struct RowGeom {
  int64_t groups, row_bytes, full, rem;  // full spans of kSpanBytes and the bytes past them
  size_t ssize;                          // bytes of one scale or bias
  RowParamsPrefetch params_prefetch;
  RowGeom(const Q8Args& a, int B)
      : groups(a.K / a.G), row_bytes(a.K * B / 8), full(row_bytes / kSpanBytes), rem(row_bytes % kSpanBytes),
        ssize(dtype_size(a.sdtype)), params_prefetch(a.scales, a.biases, a.sdtype, a.K, a.G, B, a.N, kPrefetchBytes) {}
};

template <int B, int TT, int R, bool WIDE>
ARBOR_VNNI_INLINE void row_block(const Q8Args& a, const SpanCtx& ctx, const RowGeom& g, int64_t n, float* const (&sb)[R]) {
  constexpr int AC = TT == 1 ? 2 : 1;
  const int64_t groups = g.groups, row_bytes = g.row_bytes, full = g.full, rem = g.rem;
  const size_t ssize = g.ssize;
  const uint8_t* row[R];
  const float* sbc[R];
  g.params_prefetch(n);
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
    row[r] = a.codes + (n + r) * row_bytes;
    to_f32(static_cast<const uint8_t*>(a.scales) + (n + r) * groups * ssize, a.sdtype, groups, sb[r]);
    sbc[r] = sb[r];
  }
  __m512 total[R][TT][AC];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t)
#pragma GCC unroll 2
      for (int c = 0; c < AC; ++c) total[r][t][c] = _mm512_setzero_ps();
  int64_t sp = 0;
  for (; sp + AC <= full; sp += AC) {
#pragma GCC unroll 2
    for (int c = 0; c < AC; ++c) {
      __m512i v[R];
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = row[r] + (sp + c) * kSpanBytes;
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
        v[r] = _mm512_loadu_si512(p);
      }
      span_step<B, TT, R, AC, WIDE>(ctx, sp + c, v, sbc, total, c);
    }
  }
  for (; sp < full; ++sp) {
    __m512i v[R];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) v[r] = _mm512_loadu_si512(row[r] + sp * kSpanBytes);
    span_step<B, TT, R, AC, WIDE>(ctx, sp, v, sbc, total, 0);
  }
  if (rem) {
    const __mmask64 m = (uint64_t(1) << rem) - 1;
    __m512i v[R];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) v[r] = _mm512_maskz_loadu_epi8(m, row[r] + full * kSpanBytes);
    span_step<B, TT, R, AC, WIDE>(ctx, full, v, sbc, total, 0);
  }
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) finish_row<TT, AC>(a, n + r, ssize, total[r]);
}

// Rows [n0, n1), one at a time (row_block takes R rows; R = 1 is what runs, see below).
template <int B, int TT, bool WIDE>
ARBOR_VNNI void rows(const Q8Args& a, int64_t n0, int64_t n1) {
  RowScales sb(a.K / a.G);
  constexpr int64_t S = span_codes<B>();
  const int64_t spans = (a.K + S - 1) / S;
  alignas(64) int lane_group[16] = {};
  if constexpr (!WIDE)
    for (int l = 0; l < 16; ++l) lane_group[l] = int(l * S / 16 / a.G);
  const SpanCtx ctx{static_cast<const int8_t*>(a.xq), a.xd,
                    WIDE ? __builtin_ctzll(uint64_t(a.G / S)) : __builtin_ctzll(uint64_t(S / a.G)), spans * S, spans,
                    _mm512_load_si512(lane_group)};
  // One row at a time (one sequential stream per thread): row pairs (R = 2, x's registers shared by two rows)
  // measured slower here when streaming from memory (2048 x 8192, T=1, 2 threads: 26-28 GB/s against 35-40
  // for single rows; the two streams a row apart put one row's prefetch on the other row's lines).
  const RowGeom geom(a, B);
  for (int64_t n = n0; n < n1; ++n) row_block<B, TT, 1, WIDE>(a, ctx, geom, n, {sb.get()});
}

// WIDE: a group covers whole spans (G >= S), one scale per span; else a span holds S/G groups.
template <int B>
ARBOR_VNNI void bits(const Q8Args& a, int64_t n0, int64_t n1) {
  const bool wide = a.G >= span_codes<B>();
  with_token_rows(a.T, [&]<int TT>() { wide ? rows<B, TT, true>(a, n0, n1) : rows<B, TT, false>(a, n0, n1); });
}

// ---- 3, 5 and 6 bits (AVX-512 VBMI) ------------------------------------------------------------------
// A span is 64 codes (8·B bytes: 24, 40 or 48), read with a masked load. vpermb puts the B bytes of codes 8i..8i+7
// at the bottom of qword i, vpmultishiftqb takes the 8 bit fields at offsets 0, B, ..., 7B of each qword into its 8
// bytes, and an AND leaves the 64 codes as u8 in column order. x is int8 in column order too, so vpdpbusd's lane l
// sums columns 4l..4l+3 of the span: lanes 0-7 lie in the span's first 32-column block of x, 8-15 in its second
// (xd holds their d), and each lane in one group of W (4l / G of the span's first group).
#define ARBOR_VBMI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi")))

template <int B>
ARBOR_VBMI void prepare_wide(const float* xr, int64_t K, int64_t G, int64_t c0, int64_t c1, int8_t* xq, float* xd, float* sx) {
  if (c1 == K && K % 64 != 0) {  // the last span's second half: zeros, d 0
    std::memset(xq + K, 0, 32);
    std::memset(xd + (K / 64) * 16 + 8, 0, 8 * sizeof(float));
  }
  __m256i v;
  for (int64_t b0 = c0; b0 < c1; b0 += 32) {
    const float d = quantize_block(xr + b0, &v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + b0), v);
    _mm256_storeu_ps(xd + (b0 / 64) * 16 + ((b0 / 32) % 2) * 8, _mm256_set1_ps(d));
  }
  group_sums(xr, G, c0, c1, sx);
}

// The 64 codes of one span (its 8·B bytes at p, `m` masking a short last span) as u8 in column order.
template <int B>
ARBOR_VBMI inline __attribute__((always_inline)) __m512i wide_codes(__m512i raw, __m512i perm, __m512i shifts) {
  return _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, _mm512_permutexvar_epi8(perm, raw)), _mm512_set1_epi8(char((1 << B) - 1)));
}

template <int B, int TT, bool G64>
ARBOR_VBMI void wide_rows(const Q8Args& a, int64_t n0, int64_t n1) {
  constexpr int64_t kBytes = 8 * B;  // a span's codes
  constexpr int AC = TT == 1 ? 2 : 1;
  const int64_t K = a.K, G = a.G, groups = K / G, row_bytes = K * B / 8, spans = (K + 63) / 64, full = K / 64;
  const int gshift = __builtin_ctzll(uint64_t(G));
  alignas(64) uint8_t perm_b[64], shift_b[64];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) perm_b[8 * i + j] = uint8_t(j < B ? B * i + j : 0), shift_b[8 * i + j] = uint8_t(B * j);
  alignas(64) int lane_group[16];
  for (int l = 0; l < 16; ++l) lane_group[l] = int((4 * l) >> gshift);
  const __m512i perm = _mm512_load_si512(perm_b), shifts = _mm512_load_si512(shift_b), lg = _mm512_load_si512(lane_group);
  const __mmask64 all = (uint64_t(1) << kBytes) - 1, tail = (uint64_t(1) << (row_bytes - full * kBytes)) - 1;
  const int64_t safe = row_bytes >= 64 ? (row_bytes - 64) / kBytes + 1 : 0;  // spans whose 64-byte load stays in the row
  const int8_t* xq = static_cast<const int8_t*>(a.xq);
  const int64_t Kp = spans * 64;
  RowScales scales(groups);
  float* sb = scales.get();
  const size_t ssize = dtype_size(a.sdtype);
  const RowParamsPrefetch params_prefetch(a.scales, a.biases, a.sdtype, K, G, B, a.N, kPrefetchBytes);
  for (int64_t n = n0; n < n1; ++n) {
    params_prefetch(n);
    const uint8_t* row = a.codes + n * row_bytes;
    to_f32(static_cast<const uint8_t*>(a.scales) + n * groups * ssize, a.sdtype, groups, sb);
    __m512 total[TT][AC];
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t)
#pragma GCC unroll 2
      for (int c = 0; c < AC; ++c) total[t][c] = _mm512_setzero_ps();
    for (int64_t sp = 0; sp < spans; ++sp) {
      const uint8_t* p = row + sp * kBytes;
      _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
      // A plain 64-byte load while it stays inside the row; the row's last spans under a mask.
      const __m512i raw = sp < safe ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(sp < full ? all : tail, p);
      const __m512i q = wide_codes<B>(raw, perm, shifts);
      // G >= 64: the span lies in one group (a broadcast); G = 32: two, by lane.
      const __m512 s = G64 ? _mm512_set1_ps(sb[(sp * 64) >> gshift])
                           : _mm512_permutexvar_ps(lg, _mm512_castps256_ps512(_mm256_loadu_ps(sb + ((sp * 64) >> gshift))));
#pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) {
        const __m512i xv = _mm512_loadu_si512(xq + t * Kp + sp * 64);
        const __m512 isum = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xv));
        const __m512 d = _mm512_loadu_ps(a.xd + (t * spans + sp) * 16);
        total[t][sp % AC] = _mm512_fmadd_ps(isum, _mm512_mul_ps(s, d), total[t][sp % AC]);
      }
    }
    finish_row<TT, AC>(a, n, ssize, total);
  }
}

template <int B>
ARBOR_VBMI void wide_bits(const Q8Args& a, int64_t n0, int64_t n1) {
  const bool g64 = a.G >= 64;
  with_token_rows(a.T, [&]<int TT>() { g64 ? wide_rows<B, TT, true>(a, n0, n1) : wide_rows<B, TT, false>(a, n0, n1); });
}

}  // namespace

int64_t q8_span_codes_avx512(int bits) { return bits == 2 || bits == 4 || bits == 8 ? 512 / bits : 64; }

ARBOR_VNNI void q8_prepare_avx512(const float* xr, int64_t K, int64_t G, int bits, int64_t c0, int64_t c1, void* xq, float* xd, float* sx) {
  auto* q = static_cast<int8_t*>(xq);
  switch (bits) {
    case 2: return prepare_bits<2>(xr, K, G, c0, c1, q, xd, sx);
    case 4: return prepare_bits<4>(xr, K, G, c0, c1, q, xd, sx);
    case 8: return prepare_bits<8>(xr, K, G, c0, c1, q, xd, sx);
    case 3: return prepare_wide<3>(xr, K, G, c0, c1, q, xd, sx);
    case 5: return prepare_wide<5>(xr, K, G, c0, c1, q, xd, sx);
    case 6: return prepare_wide<6>(xr, K, G, c0, c1, q, xd, sx);
    default: fail("linear_affine: q8 gemv (avx512 vnni): {} bits not supported (2, 3, 4, 5, 6, 8)", bits);
  }
}

ARBOR_VNNI void q8_gemv_avx512vnni(const Q8Args& a, int64_t n0, int64_t n1) {
  ARBOR_CHECK(a.T >= 1 && a.T <= kLinearGemvMaxT, "linear_affine: q8 gemv called with T={} (1..{})", a.T, kLinearGemvMaxT);
  switch (a.bits) {
    case 2: return bits<2>(a, n0, n1);
    case 4: return bits<4>(a, n0, n1);
    case 8: return bits<8>(a, n0, n1);
    case 3: return wide_bits<3>(a, n0, n1);  // the callers check VBMI (linear_affine_q8_applies)
    case 5: return wide_bits<5>(a, n0, n1);
    case 6: return wide_bits<6>(a, n0, n1);
    default: fail("linear_affine: q8 gemv (avx512 vnni): {} bits not supported (2, 3, 4, 5, 6, 8)", a.bits);
  }
}

}  // namespace arbor::cpu::affine_detail
