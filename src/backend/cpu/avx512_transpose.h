// In-register transpose of a 16x16 block of 32-bit elements (f32, or bf16 pairs as one word), shared by
// the AVX-512 kernels that pack weight panels (linear_avx512, linear_avx512bf16, gemm_bf16) and by the
// blocked attention. Include after <immintrin.h>. Its target is the AVX-512 subset every caller's target
// contains, so it inlines into each of them.
#pragma once

#include <immintrin.h>

namespace arbor::cpu {

// r[i] lane j <-> r[j] lane i.
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) inline __attribute__((always_inline)) void
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

__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) inline __attribute__((always_inline)) void
transpose16x16_ps(__m512 f[16]) {
  __m512i r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_castps_si512(f[i]);
  transpose16x16_epi32(r);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(r[i]);
}

}  // namespace arbor::cpu
