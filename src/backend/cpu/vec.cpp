// f32 dot / axpy / silu_mul per ISA level.
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include "backend/cpu/vec.h"

#include <cmath>

#include "backend/cpu/cpu_features.h"

namespace arbor::cpu {

namespace {

float dot_scalar(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
void axpy_scalar(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void silu_mul_scalar(const float* g, const float* u, float* o, int64_t n) {
  if (u)
    for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  else
    for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i]));
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  s0 = _mm256_add_ps(s0, s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float s = _mm_cvtss_f32(h);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
__attribute__((target("avx2,fma"))) void axpy_avx2(float* y, float a, const float* x, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

__attribute__((target("avx512f"))) float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  if (i < n) {  // masked tail
    __mmask16 m = __mmask16((1u << (n - i)) - 1);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}
__attribute__((target("avx512f"))) void axpy_avx512(float* y, float a, const float* x, int64_t n) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// silu(g) = g * sigmoid(g), sigmoid from e = e^-|g| (in (0, 1], so exp_nonpos's range): 1 / (1 + e) for
// g >= 0, e / (1 + e) below.
ARBOR_AVX512_INLINE __m512 silu16(__m512 g) {
  const __m512 e = exp_nonpos(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 num = _mm512_mask_mov_ps(one, neg, e);
  return _mm512_mul_ps(g, _mm512_div_ps(num, _mm512_add_ps(one, e)));
}
ARBOR_AVX512 void silu_mul_avx512(const float* g, const float* u, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 s = silu16(_mm512_loadu_ps(g + i));
    _mm512_storeu_ps(o + i, u ? _mm512_mul_ps(s, _mm512_loadu_ps(u + i)) : s);
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m512 s = silu16(_mm512_maskz_loadu_ps(m, g + i));
    _mm512_mask_storeu_ps(o + i, m, u ? _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)) : s);
  }
}

const VecOps kScalar{dot_scalar, axpy_scalar, silu_mul_scalar, "scalar"};
const VecOps kAvx2{dot_avx2, axpy_avx2, silu_mul_scalar, "avx2"};
const VecOps kAvx512{dot_avx512, axpy_avx512, silu_mul_avx512, "avx512"};

}  // namespace

const VecOps& vec_ops_scalar() { return kScalar; }

const VecOps& vec_ops() {
  static const VecOps& best = cpu_features().avx512 ? kAvx512 : cpu_features().avx2 ? kAvx2 : kScalar;
  return best;
}

}  // namespace arbor::cpu
