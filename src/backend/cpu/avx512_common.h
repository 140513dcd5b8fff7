// What the AVX-512 kernels of the CPU backend share: the GCC 12 warning workaround, the target
// attributes (ARBOR_AVX512 for the AVX-512 F/BW/VL/DQ subset, ARBOR_BF16 adding AVX-512 BF16), an
// in-register 16x16 transpose of 32-bit elements (weight panels and key blocks), and the vector exp of
// the attention kernels' online softmax. Include it before any other header that could include
// <immintrin.h>: GCC 12's AVX-512 intrinsics trip -Wuninitialized when inlined (GCC bug 105593), and
// the pragmas must precede the intrinsics header, where the warning is located.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#define ARBOR_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define ARBOR_AVX512_INLINE ARBOR_AVX512 inline __attribute__((always_inline))
#define ARBOR_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define ARBOR_BF16_INLINE ARBOR_BF16 inline __attribute__((always_inline))

namespace arbor::cpu {

// r[i] lane j <-> r[j] lane i.
ARBOR_AVX512_INLINE void
transpose16x16_epi32(__m512i r[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // r[4i+j], 128-bit lane L, now holds column 4L+j of rows 4i..4i+3.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // Gather lane L of r[j], r[4+j], r[8+j], r[12+j] into column 4L+j.
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    __m512i e0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88), o0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
    __m512i e1 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88), o1 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
    t[j] = _mm512_shuffle_i32x4(e0, e1, 0x88);
    t[8 + j] = _mm512_shuffle_i32x4(e0, e1, 0xdd);
    t[4 + j] = _mm512_shuffle_i32x4(o0, o1, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(o0, o1, 0xdd);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

ARBOR_AVX512_INLINE void
transpose16x16_ps(__m512 f[16]) {
  __m512i r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_castps_si512(f[i]);
  transpose16x16_epi32(r);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(r[i]);
}

// e^x for x <= 0 (a score minus the running max): n = round(x log2 e), r = x - n ln 2 in
// [-ln2/2, ln2/2], e^r by its degree-7 Taylor polynomial (truncation < 1e-8 relative), times 2^n.
ARBOR_AVX512_INLINE __m512 exp_nonpos(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace arbor::cpu
