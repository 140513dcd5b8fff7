// AVX2 + FMA + F16C kernels for MLX affine weights (linear_affine.h): the fused dequantize-and-dot GEMV
// and the dequantizing panel packer of the prefill GEMM.
//
// A row's codes are read in units of 32 codes (4·bits bytes, whole words: a unit never straddles a group).
// Lane i of the 8-lane register gets the 4 codes 4i..4i+3 (4·bits contiguous stream bits) at its bottom:
// one widening load for 2, 4 and 8 bits, a byte shuffle (plus a per-lane shift of 0 or 4 for 3 and 5 bits)
// for 3, 5 and 6. Code k of every lane is then (lane >> k·bits) & mask: vector k holds codes 4i + k, and x
// was permuted to match (linear_affine.cpp), so nothing is shuffled back.
#include "backend/cpu/avx2_common.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/linear_affine.h"
#include "core/error.h"

namespace arbor::cpu::affine_detail {

namespace {

constexpr int kLanes = 8;
constexpr int64_t kPrefetchBytes = 4096;

// Whether the unit loader reads past the unit's 4·B bytes (at most 10 bytes): then the last unit of the
// matrix is copied into a padded buffer first.
constexpr bool overreads(int B) { return B == 3 || B == 5 || B == 6; }

// Lane i: stream bits [4Bi, 4Bi + 4B) of the unit at p, starting at bit 0 (bits above may hold the next
// lane's codes).
template <int B>
ARBOR_AVX2_INLINE __m256i unit_lanes(const uint8_t* p) {
  if constexpr (B == 2) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (B == 4) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (B == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else if constexpr (B == 3) {
    // 12 bits per lane at bit 12i: bytes (0,1) (1,2) (3,4) (4,5) | (6,7) (7,8) (9,10) (10,11), shifts 0/4.
    const __m256i src = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i idx = _mm256_setr_epi8(0, 1, -1, -1, 1, 2, -1, -1, 3, 4, -1, -1, 4, 5, -1, -1,  //
                                         6, 7, -1, -1, 7, 8, -1, -1, 9, 10, -1, -1, 10, 11, -1, -1);
    return _mm256_srlv_epi32(_mm256_shuffle_epi8(src, idx), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
  } else if constexpr (B == 5) {
    // 20 bits per lane at bit 20i: 3-byte windows at 0, 2, 5, 7 of each half (the upper half loaded from
    // byte 10), shifts 0/4.
    const __m256i src = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 10)), 1);
    const __m256i idx = _mm256_setr_epi8(0, 1, 2, -1, 2, 3, 4, -1, 5, 6, 7, -1, 7, 8, 9, -1,  //
                                         0, 1, 2, -1, 2, 3, 4, -1, 5, 6, 7, -1, 7, 8, 9, -1);
    return _mm256_srlv_epi32(_mm256_shuffle_epi8(src, idx), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
  } else {
    static_assert(B == 6);
    // 24 bits per lane at byte 3i (the upper half loaded from byte 12).
    const __m256i src = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 12)), 1);
    const __m256i idx = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,  //
                                         0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    return _mm256_shuffle_epi8(src, idx);
  }
}

// Code k (0..3) of every lane as f32.
template <int B, int k>
ARBOR_AVX2_INLINE __m256 code_ps(__m256i v) {
  // The top code needs no mask where the lane holds exactly 4·B bits (2, 4, 6, 8 bits).
  constexpr bool exact_top = k == 3 && (B == 2 || B == 4 || B == 6 || B == 8);
  __m256i c = k == 0 ? v : _mm256_srli_epi32(v, k * B);
  if constexpr (!exact_top) c = _mm256_and_si256(c, _mm256_set1_epi32((1 << B) - 1));
  return _mm256_cvtepi32_ps(c);
}

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

// ---- GEMV ------------------------------------------------------------------------------------------
// One weight row at a time (one sequential stream per thread, as the dense GEMV), all TT token rows per
// decoded unit. Per group: acc[t] = Σ x·q over the group's units, then total[t] += s·acc[t] (vector) and
// bsum[t] += b·Σx[t, g] (scalar); y = hsum(total) + bsum (+ bias).
template <int B, int TT>
ARBOR_AVX2 void gemv_rows(const Args& a, int64_t n0, int64_t n1) {
  constexpr int AC = TT == 1 ? 4 : TT == 2 ? 2 : 1;  // independent accumulators per token row
  constexpr int64_t kUnitBytes = 4 * B;
  const int64_t K = a.K, G = a.G, groups = K / G, row_bytes = K * B / 8, units = K / 32, upg = G / 32;
  const int64_t group_bytes = G * B / 8;
  alignas(32) uint8_t pad[64] = {};
  const RowParamsPrefetch params_prefetch(a.scales, a.biases, a.sdtype, K, G, B, a.N, kPrefetchBytes);
  for (int64_t n = n0; n < n1; ++n) {
    params_prefetch(n);
    const uint8_t* row = a.codes + n * row_bytes;
    const bool last_row = n == a.N - 1;
    __m256 total[TT];
    float bsum[TT];
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) total[t] = _mm256_setzero_ps(), bsum[t] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* gp = row + g * group_bytes;
      for (int64_t b = 0; b < group_bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(gp) + kPrefetchBytes + b, _MM_HINT_T0);
      __m256 acc[TT][AC];
#pragma GCC unroll 8
      for (int t = 0; t < TT; ++t)
#pragma GCC unroll 4
        for (int c = 0; c < AC; ++c) acc[t][c] = _mm256_setzero_ps();
      for (int64_t uu = 0; uu < upg; ++uu) {
        const int64_t u = g * upg + uu;
        const uint8_t* p = gp + uu * kUnitBytes;
        if constexpr (overreads(B)) {
          if (last_row && u == units - 1) {
            std::memcpy(pad, p, kUnitBytes);
            p = pad;
          }
        }
        const __m256i v = unit_lanes<B>(p);
        const __m256 q[4] = {code_ps<B, 0>(v), code_ps<B, 1>(v), code_ps<B, 2>(v), code_ps<B, 3>(v)};
        const float* xu = a.xp + u * 32;
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k)
#pragma GCC unroll 8
          for (int t = 0; t < TT; ++t)
            acc[t][k % AC] = _mm256_fmadd_ps(q[k], _mm256_loadu_ps(xu + t * K + kLanes * k), acc[t][k % AC]);
      }
      const __m256 s = _mm256_set1_ps(scale_at(a.scales, a.sdtype, n * groups + g));
      const float bg = scale_at(a.biases, a.sdtype, n * groups + g);
#pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) {
        __m256 sum = acc[t][0];
#pragma GCC unroll 4
        for (int c = 1; c < AC; ++c) sum = _mm256_add_ps(sum, acc[t][c]);
        total[t] = _mm256_fmadd_ps(sum, s, total[t]);
        bsum[t] += bg * a.sx[t * groups + g];
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) {
      const float v = hsum(total[t]) + bsum[t];
      a.y[t * a.N + n] = a.bias ? v + a.bias[n] : v;
    }
  }
}

template <int B>
ARBOR_AVX2 void gemv_bits(const Args& a, int64_t n0, int64_t n1) {
  switch (a.T) {
    case 1: return gemv_rows<B, 1>(a, n0, n1);
    case 2: return gemv_rows<B, 2>(a, n0, n1);
    case 3: return gemv_rows<B, 3>(a, n0, n1);
    case 4: return gemv_rows<B, 4>(a, n0, n1);
    case 5: return gemv_rows<B, 5>(a, n0, n1);
    case 6: return gemv_rows<B, 6>(a, n0, n1);
    case 7: return gemv_rows<B, 7>(a, n0, n1);
    case 8: return gemv_rows<B, 8>(a, n0, n1);
  }
}

// ---- GEMM panel ------------------------------------------------------------------------------------
// Rows [nb, nb + nw) (nw <= 32) x permuted columns [kb, kb + kc) dequantized (s·q, then + b, in f32) into
// P[kk][j]; 8 rows at a time: each row's unit decoded into 4 vectors, each vector k of 8 rows transposed into
// P rows u*32 + 8k .. + 8.
template <int B>
ARBOR_AVX2 void pack_bits(const Args& a, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P) {
  const int64_t K = a.K, G = a.G, groups = K / G, row_bytes = K * B / 8, units = K / 32;
  alignas(32) uint8_t pad[64] = {};
  alignas(32) float tmp[4][8][kLanes];  // [code k][row][lane]
  for (int64_t j0 = 0; j0 < 32; j0 += 8) {
    for (int64_t u = kb / 32; u < (kb + kc) / 32; ++u) {
      const int64_t g = u * 32 / G;
      for (int r = 0; r < 8; ++r) {
        const int64_t n = nb + j0 + r;
        if (j0 + r >= nw) {
          for (int k = 0; k < 4; ++k) _mm256_store_ps(tmp[k][r], _mm256_setzero_ps());
          continue;
        }
        const uint8_t* p = a.codes + n * row_bytes + u * 4 * B;
        if constexpr (overreads(B)) {
          if (n == a.N - 1 && u == units - 1) {
            std::memcpy(pad, p, 4 * B);
            p = pad;
          }
        }
        const __m256i v = unit_lanes<B>(p);
        const __m256 s = _mm256_set1_ps(scale_at(a.scales, a.sdtype, n * groups + g));
        const __m256 b = _mm256_set1_ps(scale_at(a.biases, a.sdtype, n * groups + g));
        _mm256_store_ps(tmp[0][r], _mm256_add_ps(_mm256_mul_ps(s, code_ps<B, 0>(v)), b));
        _mm256_store_ps(tmp[1][r], _mm256_add_ps(_mm256_mul_ps(s, code_ps<B, 1>(v)), b));
        _mm256_store_ps(tmp[2][r], _mm256_add_ps(_mm256_mul_ps(s, code_ps<B, 2>(v)), b));
        _mm256_store_ps(tmp[3][r], _mm256_add_ps(_mm256_mul_ps(s, code_ps<B, 3>(v)), b));
      }
      for (int k = 0; k < 4; ++k) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) r[i] = _mm256_load_ps(tmp[k][i]);
        transpose8x8_ps(r);
        float* out = P + (u * 32 - kb + kLanes * k) * linear_detail::kGemmPanelN + j0;
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) _mm256_store_ps(out + i * linear_detail::kGemmPanelN, r[i]);
      }
    }
  }
}

}  // namespace

ARBOR_AVX2 void gemv_avx2(const Args& a, int64_t n0, int64_t n1) {
  ARBOR_CHECK(a.T >= 1 && a.T <= kLinearGemvMaxT, "linear_affine: avx2 gemv called with T={} (1..{})", a.T, kLinearGemvMaxT);
  switch (a.bits) {
    case 2: return gemv_bits<2>(a, n0, n1);
    case 3: return gemv_bits<3>(a, n0, n1);
    case 4: return gemv_bits<4>(a, n0, n1);
    case 5: return gemv_bits<5>(a, n0, n1);
    case 6: return gemv_bits<6>(a, n0, n1);
    case 8: return gemv_bits<8>(a, n0, n1);
    default: fail("linear_affine: avx2 gemv: {} bits not supported", a.bits);
  }
}

ARBOR_AVX2 void pack_panel_avx2(const void* ctx, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P) {
  const Args& a = *static_cast<const Args*>(ctx);
  switch (a.bits) {
    case 2: return pack_bits<2>(a, nb, nw, kb, kc, P);
    case 3: return pack_bits<3>(a, nb, nw, kb, kc, P);
    case 4: return pack_bits<4>(a, nb, nw, kb, kc, P);
    case 5: return pack_bits<5>(a, nb, nw, kb, kc, P);
    case 6: return pack_bits<6>(a, nb, nw, kb, kc, P);
    case 8: return pack_bits<8>(a, nb, nw, kb, kc, P);
    default: fail("linear_affine: avx2 gemm: {} bits not supported", a.bits);
  }
}

}  // namespace arbor::cpu::affine_detail
