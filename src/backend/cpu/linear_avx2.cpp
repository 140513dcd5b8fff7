// AVX2 + FMA + F16C linear kernels, the baseline for x86-64 CPUs without AVX-512: the decode GEMV and
// the prefill GEMM (packed 32-column weight panels, 6x16 register tile) for f32, f16 and bf16 weights.
#include "backend/cpu/avx2_common.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/linear.h"
#include "core/error.h"

namespace arbor::cpu::linear_detail {

namespace {

enum class WT { F32, F16, BF16 };

// 8 consecutive weights starting at element i of W, as f32.
template <WT wt>
ARBOR_AVX2_INLINE __m256 wload(const void* W, int64_t i) {
  if constexpr (wt == WT::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(W) + i);
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(W) + i));
    if constexpr (wt == WT::F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// The first n (< 8) weights from element i, zero-padded (no read past the end of W).
template <WT wt>
ARBOR_AVX2_INLINE __m256 wload_partial(const void* W, int64_t i, int64_t n) {
  alignas(32) uint8_t buf[32] = {};
  constexpr size_t esize = wt == WT::F32 ? 4 : 2;
  std::memcpy(buf, static_cast<const uint8_t*>(W) + i * esize, size_t(n) * esize);
  return wload<wt>(buf, 0);
}

ARBOR_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- GEMV ------------------------------------------------------------------------------------------
// One weight row n against all TT token rows, read front to back in steps of U vectors (TT*U
// accumulators within the 16 ymm registers). Rows are streamed one after another, not interleaved:
// one sequential stream per thread reads DRAM fastest (see linear_avx512.cpp).
constexpr int64_t kPrefetchBytes = 4096;

template <WT wt, int TT, int U>
ARBOR_AVX2 void gemv_row(const Args& a, int64_t n) {
  const int64_t K = a.K;
  const int64_t row = n * K;
  __m256 acc[TT][U];
#pragma GCC unroll 16
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) acc[t][u] = _mm256_setzero_ps();
  constexpr int64_t esize = wt == WT::F32 ? 4 : 2;
  const char* wbytes = static_cast<const char*>(a.W);
  int64_t k = 0;
  for (; k + 8 * U <= K; k += 8 * U) {
    // Software prefetch ahead of the stream, as in linear_avx512.cpp (never faults past the end).
#pragma GCC unroll 8
    for (int64_t b = 0; b < 8 * U * esize; b += 64)
      _mm_prefetch(wbytes + (row + k) * esize + kPrefetchBytes + b, _MM_HINT_T0);
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u) {
      const __m256 w = wload<wt>(a.W, row + k + 8 * u);
#pragma GCC unroll 16
      for (int t = 0; t < TT; ++t) acc[t][u] = _mm256_fmadd_ps(_mm256_loadu_ps(a.x + t * K + k + 8 * u), w, acc[t][u]);
    }
  }
  for (; k + 8 <= K; k += 8) {
    const __m256 w = wload<wt>(a.W, row + k);
#pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) acc[t][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.x + t * K + k), w, acc[t][0]);
  }
  if (k < K) {
    const __m256 w = wload_partial<wt>(a.W, row + k, K - k);
#pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      alignas(32) float xb[8] = {};
      std::memcpy(xb, a.x + t * K + k, size_t(K - k) * 4);
      acc[t][0] = _mm256_fmadd_ps(_mm256_load_ps(xb), w, acc[t][0]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < TT; ++t) {
#pragma GCC unroll 16
    for (int u = 1; u < U; ++u) acc[t][0] = _mm256_add_ps(acc[t][0], acc[t][u]);
    const float s = hsum(acc[t][0]);
    a.y[t * a.N + n] = a.bias ? s + a.bias[n] : s;
  }
}

template <WT wt, int TT, int U>
ARBOR_AVX2 void gemv_rows(const Args& a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) gemv_row<wt, TT, U>(a, n);
}

template <WT wt>
ARBOR_AVX2 void gemv_typed(const Args& a, int64_t n0, int64_t n1) {
  switch (a.T) {
    case 1: return gemv_rows<wt, 1, 8>(a, n0, n1);
    case 2: return gemv_rows<wt, 2, 4>(a, n0, n1);
    case 3: return gemv_rows<wt, 3, 4>(a, n0, n1);
    case 4: return gemv_rows<wt, 4, 3>(a, n0, n1);
    case 5: return gemv_rows<wt, 5, 2>(a, n0, n1);
    case 6: return gemv_rows<wt, 6, 2>(a, n0, n1);
    case 7: return gemv_rows<wt, 7, 1>(a, n0, n1);
    case 8: return gemv_rows<wt, 8, 1>(a, n0, n1);
  }
}

// ---- GEMM ------------------------------------------------------------------------------------------
constexpr int kMR = 6;    // token rows per register tile: 6 x 2 accumulators + 2 weights + 1 broadcast
constexpr int kKC = int(kGemmPanelK);  // k per packed panel: 128 x 32 f32 = 16 KiB

// P[kk][j] (kk < kc rounded up to 8, j < 32) = W[nb + j][kb + kk] as f32; zero past row nb+nw or K.
template <WT wt>
ARBOR_AVX2 void pack_panel(const Args& a, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P) {
  for (int q = 0; q < 4; ++q) {
    for (int64_t g = 0; g < kc; g += 8) {
      const int64_t left = kc - g;
      __m256 r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const int64_t j = 8 * q + i;
        const int64_t at = (nb + j) * a.K + kb + g;
        r[i] = j >= nw ? _mm256_setzero_ps() : left >= 8 ? wload<wt>(a.W, at) : wload_partial<wt>(a.W, at, left);
      }
      transpose8x8_ps(r);
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) _mm256_store_ps(P + (g + i) * 32 + 8 * q, r[i]);
    }
  }
}

// y[0..MR, 0..nc] (+)= x[0..MR, 0..kc] · P[:, 0..16] with P's row stride 32; nc <= 16 valid columns.
template <int MR>
ARBOR_AVX2 void gemm_tile(const float* x, int64_t ldx, const float* P, int64_t kc, float* y, int64_t ldy, int64_t nc,
                          const float* bias, bool first) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 w0 = _mm256_load_ps(P + kk * 32), w1 = _mm256_load_ps(P + kk * 32 + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xb = _mm256_broadcast_ss(x + i * ldx + kk);
      acc[i][0] = _mm256_fmadd_ps(xb, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xb, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    alignas(32) float out[16];
    _mm256_store_ps(out, acc[i][0]);
    _mm256_store_ps(out + 8, acc[i][1]);
    float* yr = y + i * ldy;
    for (int64_t j = 0; j < nc; ++j) yr[j] = out[j] + (first ? (bias ? bias[j] : 0.0f) : yr[j]);
  }
}

template <int MR>
ARBOR_AVX2 void gemm_tile_any(int mr, const float* x, int64_t ldx, const float* P, int64_t kc, float* y, int64_t ldy,
                              int64_t nc, const float* bias, bool first) {
  if constexpr (MR > 1) {
    if (mr < MR) return gemm_tile_any<MR - 1>(mr, x, ldx, P, kc, y, ldy, nc, bias, first);
  }
  gemm_tile<MR>(x, ldx, P, kc, y, ldy, nc, bias, first);
}

// The cache-blocked loop nest around the register tiles; `pack` supplies each weight panel.
ARBOR_AVX2 void gemm_blocked(const Args& a, int64_t n0, int64_t n1, float* P, PanelPacker pack, const void* ctx) {
  for (int64_t tb = 0; tb < a.T; tb += kGemmBlockT) {
    const int64_t te = std::min(a.T, tb + kGemmBlockT);
    for (int64_t ng = n0; ng < n1; ng += kGemmGroupN) {
      const int64_t ne = std::min(n1, ng + kGemmGroupN);
      for (int64_t kb = 0; kb < a.K; kb += kKC) {
        const int64_t kc = std::min<int64_t>(kKC, a.K - kb);
        for (int64_t nb = ng; nb < ne; nb += 32) {
          const int64_t nw = std::min<int64_t>(32, ne - nb);
          pack(ctx, nb, nw, kb, kc, P);
          for (int h = 0; h < 2 && 16 * h < nw; ++h) {
            const int64_t nc = std::min<int64_t>(16, nw - 16 * h);
            for (int64_t t = tb; t < te; t += kMR) {
              const int mr = int(std::min<int64_t>(kMR, te - t));
              gemm_tile_any<kMR>(mr, a.x + t * a.K + kb, a.K, P + 16 * h, kc, a.y + t * a.N + nb + 16 * h, a.N, nc,
                                 a.bias ? a.bias + nb + 16 * h : nullptr, kb == 0);
            }
          }
        }
      }
    }
  }
}

template <WT wt>
ARBOR_AVX2 void pack_dense(const void* ctx, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P) {
  pack_panel<wt>(*static_cast<const Args*>(ctx), nb, nw, kb, kc, P);
}

template <WT wt>
ARBOR_AVX2 void gemm_typed(const Args& a, int64_t n0, int64_t n1, float* P) {
  gemm_blocked(a, n0, n1, P, pack_dense<wt>, &a);
}

}  // namespace

ARBOR_AVX2 void gemv_avx2(const Args& a, int64_t n0, int64_t n1) {
  ARBOR_CHECK(a.T >= 1 && a.T <= kLinearGemvMaxT, "linear: avx2 gemv called with T={} (1..{})", a.T,
              kLinearGemvMaxT);
  switch (a.wtype) {
    case DType::F32: return gemv_typed<WT::F32>(a, n0, n1);
    case DType::F16: return gemv_typed<WT::F16>(a, n0, n1);
    case DType::BF16: return gemv_typed<WT::BF16>(a, n0, n1);
    default: fail("linear: avx2 gemv: weight dtype {} not supported", dtype_name(a.wtype));
  }
}

ARBOR_AVX2 void gemm_avx2(const Args& a, int64_t n0, int64_t n1, float* scratch) {
  switch (a.wtype) {
    case DType::F32: return gemm_typed<WT::F32>(a, n0, n1, scratch);
    case DType::F16: return gemm_typed<WT::F16>(a, n0, n1, scratch);
    case DType::BF16: return gemm_typed<WT::BF16>(a, n0, n1, scratch);
    default: fail("linear: avx2 gemm: weight dtype {} not supported", dtype_name(a.wtype));
  }
}

ARBOR_AVX2 void gemm_avx2_panels(const Args& a, int64_t n0, int64_t n1, float* scratch, PanelPacker pack, const void* ctx) {
  gemm_blocked(a, n0, n1, scratch, pack, ctx);
}

}  // namespace arbor::cpu::linear_detail
