// What the AVX2 kernels of the CPU backend share: the target attribute (ARBOR_AVX2: AVX2 + FMA + F16C) and
// an in-register 8x8 transpose of f32 (the GEMM panel packers of linear_avx2 and linear_affine_avx2).
#pragma once

#include <immintrin.h>

#define ARBOR_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ARBOR_AVX2_INLINE ARBOR_AVX2 inline __attribute__((always_inline))

namespace arbor::cpu {

// r[i] lane j <-> r[j] lane i.
ARBOR_AVX2_INLINE void transpose8x8_ps(__m256 r[8]) {
  __m256 t[8], s[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x20);
    r[4 + i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x31);
  }
}

}  // namespace arbor::cpu
