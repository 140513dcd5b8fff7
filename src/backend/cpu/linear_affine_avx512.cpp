// AVX-512 (F/BW/VL/DQ) kernels for MLX affine weights (linear_affine.h): the fused dequantize-and-dot GEMV
// and the dequantizing panel packers of the prefill GEMMs (f32, and bf16 pairs for gemm_bf16 on AVX-512 BF16).
//
// A row's codes are read in units of 32 codes (4·bits bytes, whole words: a unit never straddles a group).
// Lane i of the 16-lane register gets the 2 codes 2i, 2i+1 (2·bits contiguous stream bits) at its bottom:
// one widening load for 4 and 8 bits; for 2, 3, 5 and 6 bits a byte shuffle into 16-bit windows (widened to
// 32 bits) and a per-lane shift. Code k of every lane is (lane >> k·bits) & mask: vector k holds codes
// 2i + k, and x was permuted to match (linear_affine.cpp), so nothing is shuffled back.
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/linear_affine.h"
#include "core/error.h"

namespace arbor::cpu::affine_detail {

namespace {

constexpr int kLanes = 16;
constexpr int64_t kPrefetchBytes = 4096;

// Whether the unit loader reads past the unit's 4·B bytes (at most 10 bytes): then the last unit of the
// matrix is copied into a padded buffer first.
constexpr bool overreads(int B) { return B == 3 || B == 5 || B == 6; }

// 16-bit windows: word lane i = bytes (idx[i], idx[i] + 1) of its 128-bit half of src.
ARBOR_AVX512_INLINE __m512i windows16(__m256i src, __m256i idx, __m512i shifts) {
  return _mm512_srlv_epi32(_mm512_cvtepu16_epi32(_mm256_shuffle_epi8(src, idx)), shifts);
}

ARBOR_AVX512_INLINE __m256i load_halves(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}

// Lane i: stream bits [2Bi, 2Bi + 2B) of the unit at p, starting at bit 0 (bits above may hold the next
// lane's codes).
template <int B>
ARBOR_AVX512_INLINE __m512i unit_lanes(const uint8_t* p) {
  if constexpr (B == 4) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (B == 8) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else if constexpr (B == 2) {
    // Nibble i: byte i/2, shifted by 0 or 4.
    const __m128i idx = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i w = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), idx));
    return _mm512_srlv_epi32(w, _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4));
  } else if constexpr (B == 3) {
    // 6 bits at bit 6i: bytes 0 0 1 2 3 3 4 5 | 6 6 7 8 9 9 10 11, shifts 0 6 4 2 repeating.
    const __m256i src = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i idx = _mm256_setr_epi8(0, 1, 0, 1, 1, 2, 2, 3, 3, 4, 3, 4, 4, 5, 5, 6,  //
                                         6, 7, 6, 7, 7, 8, 8, 9, 9, 10, 9, 10, 10, 11, 11, 12);
    return windows16(src, idx, _mm512_setr_epi32(0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2));
  } else if constexpr (B == 5) {
    // 10 bits at bit 10i: bytes 0 1 2 3 5 6 7 8 of each half (the upper half loaded from byte 10), shifts
    // 0 2 4 6 repeating.
    const __m256i idx = _mm256_setr_epi8(0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 6, 7, 7, 8, 8, 9,  //
                                         0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 6, 7, 7, 8, 8, 9);
    return windows16(load_halves(p, p + 10), idx, _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6));
  } else {
    static_assert(B == 6);
    // 12 bits at bit 12i: bytes 0 1 3 4 6 7 9 10 of each half (the upper half loaded from byte 12), shifts 0 4.
    const __m256i idx = _mm256_setr_epi8(0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 7, 8, 9, 10, 10, 11,  //
                                         0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 7, 8, 9, 10, 10, 11);
    return windows16(load_halves(p, p + 12), idx, _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4));
  }
}

// Code k (0, 1) of every lane as f32. Up to 4 bits, one vpermps from a 16-entry table of code values
// (it reads only the low 4 bits of each index, so the mask and the int -> float conversion both go).
template <int B, int k>
ARBOR_AVX512_INLINE __m512 code_ps(__m512i v) {
  if constexpr (B <= 4) {
    constexpr int m = (1 << B) - 1;
    const __m512 table = _mm512_setr_ps(0 & m, 1 & m, 2 & m, 3 & m, 4 & m, 5 & m, 6 & m, 7 & m, 8 & m, 9 & m, 10 & m, 11 & m, 12 & m,
                                        13 & m, 14 & m, 15 & m);
    return _mm512_permutexvar_ps(k == 0 ? v : _mm512_srli_epi32(v, k * B), table);
  }
  constexpr bool exact_top = k == 1 && (B == 4 || B == 8);  // the lane holds exactly 2·B bits
  __m512i c = k == 0 ? v : _mm512_srli_epi32(v, k * B);
  if constexpr (!exact_top) c = _mm512_and_si512(c, _mm512_set1_epi32((1 << B) - 1));
  return _mm512_cvtepi32_ps(c);
}

ARBOR_AVX512_INLINE float scale_at(const void* p, DType t, int64_t i) {
  if (t == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  if (t == DType::F16) return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

ARBOR_AVX512_INLINE float hsum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xb1));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4e));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));
  return _mm512_cvtss_f32(v);
}

// ---- GEMV ------------------------------------------------------------------------------------------
// As linear_affine_avx2.cpp: one weight row at a time, all TT token rows per decoded unit; per group
// acc[t] = Σ x·q, total[t] += s·acc[t], bsum[t] += b·Σx[t, g]; y = hsum(total) + bsum (+ bias).
template <int B, int TT>
ARBOR_AVX512 void gemv_rows(const Args& a, int64_t n0, int64_t n1) {
  constexpr int AC = TT == 1 ? 2 : 1;  // independent accumulators per token row
  constexpr int64_t kUnitBytes = 4 * B;
  const int64_t K = a.K, G = a.G, groups = K / G, row_bytes = K * B / 8, units = K / 32, upg = G / 32;
  const int64_t group_bytes = G * B / 8;
  alignas(64) uint8_t pad[64] = {};
  const RowParamsPrefetch params_prefetch(a.scales, a.biases, a.sdtype, K, G, B, a.N, kPrefetchBytes);
  for (int64_t n = n0; n < n1; ++n) {
    params_prefetch(n);
    const uint8_t* row = a.codes + n * row_bytes;
    const bool last_row = n == a.N - 1;
    __m512 total[TT];
    float bsum[TT];
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) total[t] = _mm512_setzero_ps(), bsum[t] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* gp = row + g * group_bytes;
      for (int64_t b = 0; b < group_bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(gp) + kPrefetchBytes + b, _MM_HINT_T0);
      __m512 acc[TT][AC];
#pragma GCC unroll 8
      for (int t = 0; t < TT; ++t)
#pragma GCC unroll 2
        for (int c = 0; c < AC; ++c) acc[t][c] = _mm512_setzero_ps();
      for (int64_t uu = 0; uu < upg; ++uu) {
        const int64_t u = g * upg + uu;
        const uint8_t* p = gp + uu * kUnitBytes;
        if constexpr (overreads(B)) {
          if (last_row && u == units - 1) {
            std::memcpy(pad, p, kUnitBytes);
            p = pad;
          }
        }
        const __m512i v = unit_lanes<B>(p);
        const __m512 q[2] = {code_ps<B, 0>(v), code_ps<B, 1>(v)};
        const float* xu = a.xp + u * 32;
#pragma GCC unroll 2
        for (int k = 0; k < 2; ++k)
#pragma GCC unroll 8
          for (int t = 0; t < TT; ++t)
            acc[t][k % AC] = _mm512_fmadd_ps(q[k], _mm512_loadu_ps(xu + t * K + kLanes * k), acc[t][k % AC]);
      }
      const __m512 s = _mm512_set1_ps(scale_at(a.scales, a.sdtype, n * groups + g));
      const float bg = scale_at(a.biases, a.sdtype, n * groups + g);
#pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) {
        __m512 sum = acc[t][0];
#pragma GCC unroll 2
        for (int c = 1; c < AC; ++c) sum = _mm512_add_ps(sum, acc[t][c]);
        total[t] = _mm512_fmadd_ps(sum, s, total[t]);
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
ARBOR_AVX512 void gemv_bits(const Args& a, int64_t n0, int64_t n1) {
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
// P[kk][j]; 16 rows at a time: each row's unit decoded into 2 vectors, each vector k of 16 rows transposed
// into P rows u*32 + 16k .. + 16.
template <int B>
ARBOR_AVX512 void pack_bits(const Args& a, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P) {
  const int64_t K = a.K, G = a.G, groups = K / G, row_bytes = K * B / 8, units = K / 32;
  alignas(64) uint8_t pad[64] = {};
  for (int64_t j0 = 0; j0 < 32; j0 += 16) {
    for (int64_t u = kb / 32; u < (kb + kc) / 32; ++u) {
      const int64_t g = u * 32 / G;
      __m512 r0[16], r1[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        const int64_t n = nb + j0 + r;
        if (j0 + r >= nw) {
          r0[r] = r1[r] = _mm512_setzero_ps();
          continue;
        }
        const uint8_t* p = a.codes + n * row_bytes + u * 4 * B;
        if constexpr (overreads(B)) {
          if (n == a.N - 1 && u == units - 1) {
            std::memcpy(pad, p, 4 * B);
            p = pad;
          }
        }
        const __m512i v = unit_lanes<B>(p);
        const __m512 s = _mm512_set1_ps(scale_at(a.scales, a.sdtype, n * groups + g));
        const __m512 b = _mm512_set1_ps(scale_at(a.biases, a.sdtype, n * groups + g));
        r0[r] = _mm512_add_ps(_mm512_mul_ps(s, code_ps<B, 0>(v)), b);
        r1[r] = _mm512_add_ps(_mm512_mul_ps(s, code_ps<B, 1>(v)), b);
      }
      transpose16x16_ps(r0);
      transpose16x16_ps(r1);
      float* out = P + (u * 32 - kb) * linear_detail::kGemmPanelN + j0;
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        _mm512_store_ps(out + i * linear_detail::kGemmPanelN, r0[i]);
        _mm512_store_ps(out + (kLanes + i) * linear_detail::kGemmPanelN, r1[i]);
      }
    }
  }
}

// The bf16 GEMM's panel (gemm_bf16_panels): rows [nb, nb + nw) x column pairs [pb, pb + kcp), dequantized in
// f32 (s·q, then + b) and rounded to bf16 (nearest even). A unit's two code vectors hold codes 2i and 2i+1 in
// lane i, so interleaving their bf16 halves gives the natural column pairs: x needs no permutation here.
template <int B>
ARBOR_BF16 void pack_bf16_bits(const Args& a, int64_t nb, int64_t nw, int64_t pb, int64_t kcp, uint32_t* P) {
  const int64_t K = a.K, G = a.G, groups = K / G, row_bytes = K * B / 8, units = K / 32;
  alignas(64) uint8_t pad[64] = {};
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i inter = _mm512_load_si512(kInterleave);
  for (int64_t j0 = 0; j0 < 32; j0 += 16) {
    for (int64_t u = pb / 16; u < (pb + kcp) / 16; ++u) {
      const int64_t g = u * 32 / G;
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t n = nb + j0 + i;
        if (j0 + i >= nw) {
          r[i] = _mm512_setzero_si512();
          continue;
        }
        const uint8_t* p = a.codes + n * row_bytes + u * 4 * B;
        if constexpr (overreads(B)) {
          if (n == a.N - 1 && u == units - 1) {
            std::memcpy(pad, p, 4 * B);
            p = pad;
          }
        }
        const __m512i v = unit_lanes<B>(p);
        const __m512 s = _mm512_set1_ps(scale_at(a.scales, a.sdtype, n * groups + g));
        const __m512 b = _mm512_set1_ps(scale_at(a.biases, a.sdtype, n * groups + g));
        const __m512 w0 = _mm512_add_ps(_mm512_mul_ps(s, code_ps<B, 0>(v)), b);
        const __m512 w1 = _mm512_add_ps(_mm512_mul_ps(s, code_ps<B, 1>(v)), b);
        r[i] = _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
      }
      transpose16x16_epi32(r);
      uint32_t* out = P + (u * 16 - pb) * linear_detail::kGemmPanelN + j0;
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_store_si512(out + i * linear_detail::kGemmPanelN, r[i]);
    }
  }
}

}  // namespace

ARBOR_BF16 void pack_panel_bf16_avx512bf16(const void* ctx, int64_t nb, int64_t nw, int64_t pb, int64_t kcp, uint32_t* P) {
  const Args& a = *static_cast<const Args*>(ctx);
  switch (a.bits) {
    case 2: return pack_bf16_bits<2>(a, nb, nw, pb, kcp, P);
    case 3: return pack_bf16_bits<3>(a, nb, nw, pb, kcp, P);
    case 4: return pack_bf16_bits<4>(a, nb, nw, pb, kcp, P);
    case 5: return pack_bf16_bits<5>(a, nb, nw, pb, kcp, P);
    case 6: return pack_bf16_bits<6>(a, nb, nw, pb, kcp, P);
    case 8: return pack_bf16_bits<8>(a, nb, nw, pb, kcp, P);
    default: fail("linear_affine: bf16 gemm: {} bits not supported", a.bits);
  }
}

ARBOR_AVX512 void gemv_avx512(const Args& a, int64_t n0, int64_t n1) {
  ARBOR_CHECK(a.T >= 1 && a.T <= kLinearGemvMaxT, "linear_affine: avx512 gemv called with T={} (1..{})", a.T, kLinearGemvMaxT);
  switch (a.bits) {
    case 2: return gemv_bits<2>(a, n0, n1);
    case 3: return gemv_bits<3>(a, n0, n1);
    case 4: return gemv_bits<4>(a, n0, n1);
    case 5: return gemv_bits<5>(a, n0, n1);
    case 6: return gemv_bits<6>(a, n0, n1);
    case 8: return gemv_bits<8>(a, n0, n1);
    default: fail("linear_affine: avx512 gemv: {} bits not supported", a.bits);
  }
}

ARBOR_AVX512 void pack_panel_avx512(const void* ctx, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P) {
  const Args& a = *static_cast<const Args*>(ctx);
  switch (a.bits) {
    case 2: return pack_bits<2>(a, nb, nw, kb, kc, P);
    case 3: return pack_bits<3>(a, nb, nw, kb, kc, P);
    case 4: return pack_bits<4>(a, nb, nw, kb, kc, P);
    case 5: return pack_bits<5>(a, nb, nw, kb, kc, P);
    case 6: return pack_bits<6>(a, nb, nw, kb, kc, P);
    case 8: return pack_bits<8>(a, nb, nw, kb, kc, P);
    default: fail("linear_affine: avx512 gemm: {} bits not supported", a.bits);
  }
}

}  // namespace arbor::cpu::affine_detail
