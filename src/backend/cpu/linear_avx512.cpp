// AVX-512 (F/BW/VL/DQ) linear kernels: the decode GEMV (weights streamed once, all T <= 8 token rows
// per weight load) and the prefill GEMM (packed 32-column weight panels, 12x32 register tile) for f32,
// f16 and bf16 weights, f32 math. Compiled with per-function target attributes, chosen at run time.
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/linear.h"
#include "core/error.h"

namespace arbor::cpu::linear_detail {

namespace {

enum class WT { F32, F16, BF16 };

// 16 consecutive weights starting at element i of W, as f32 (bf16 -> f32 is a 16-bit shift; f16 via F16C).
template <WT wt>
ARBOR_AVX512_INLINE __m512 wload(const void* W, int64_t i) {
  if constexpr (wt == WT::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(W) + i);
  } else {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(W) + i));
    if constexpr (wt == WT::F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// The same with lanes outside `m` read as zero (and not touched in memory).
template <WT wt>
ARBOR_AVX512_INLINE __m512 wload_masked(const void* W, int64_t i, __mmask16 m) {
  if constexpr (wt == WT::F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(W) + i);
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(W) + i);
    if constexpr (wt == WT::F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Horizontal sum of the 16 lanes.
ARBOR_AVX512_INLINE float hsum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));  // + the other 256-bit half
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xb1));  // + the neighbouring 128-bit lane
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4e));        // + the other 64-bit half of the lane
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));        // + the neighbouring element
  return _mm512_cvtss_f32(v);
}

// ---- GEMV ------------------------------------------------------------------------------------------
// A tile is R weight rows x TT token rows, read front to back in steps of U vectors of 16: each weight
// vector is loaded once and used TT times, each x vector loaded once and used R times, with TT*R*U
// independent accumulators. Two limits set the shape, both measured here: about one zmm load per
// cycle from L1 (at TT > 1 the x loads dominate unless R > 1), and DRAM reads fastest as one
// sequential stream per thread (8 interleaved streams got half the bandwidth of 1), so R is 1 unless
// compute is the limit (see gemv_typed).
constexpr int64_t kPrefetchBytes = 4096;

template <WT wt, int TT, int R, int U>
ARBOR_AVX512 void gemv_tile(const Args& a, int64_t n) {
  const int64_t K = a.K;
  constexpr int64_t esize = wt == WT::F32 ? 4 : 2;
  const char* wbytes = static_cast<const char*>(a.W);
  __m512 acc[TT][R][U];
#pragma GCC unroll 32
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 32
      for (int u = 0; u < U; ++u) acc[t][r][u] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 * U <= K; k += 16 * U) {
    __m512 w[R][U];
    // Software prefetch kPrefetchBytes ahead in each row's stream; past a row's end, into the row the
    // next tile reads in its place (R rows on). A prefetch never faults, so running past the matrix is
    // harmless. Measured up to 1.4x faster than the hardware prefetcher alone.
    const int64_t pf_skip = k + kPrefetchBytes / esize < K ? 0 : (R - 1) * K;
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const int64_t at = (n + r) * K + k;
#pragma GCC unroll 8
      for (int64_t b = 0; b < 16 * U * esize; b += 64)
        _mm_prefetch(wbytes + (at + pf_skip) * esize + kPrefetchBytes + b, _MM_HINT_T0);
#pragma GCC unroll 32
      for (int u = 0; u < U; ++u) w[r][u] = wload<wt>(a.W, at + 16 * u);
    }
#pragma GCC unroll 32
    for (int t = 0; t < TT; ++t)
#pragma GCC unroll 32
      for (int u = 0; u < U; ++u) {
        __m512 xv = _mm512_loadu_ps(a.x + t * K + k + 16 * u);
        // Keep xv in a register: otherwise GCC folds the load into each of the R FMAs as a memory
        // operand, loading x R times and losing the point of R > 1 (L1 loads are the bottleneck).
        if constexpr (R > 1) __asm__("" : "+v"(xv));
#pragma GCC unroll 32
        for (int r = 0; r < R; ++r) acc[t][r][u] = _mm512_fmadd_ps(xv, w[r][u], acc[t][r][u]);
      }
  }
  for (; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (K - k)) - 1);
    __m512 w[R];
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) w[r] = wload_masked<wt>(a.W, (n + r) * K + k, m);
#pragma GCC unroll 32
    for (int t = 0; t < TT; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, a.x + t * K + k);
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r) acc[t][r][0] = _mm512_fmadd_ps(xv, w[r], acc[t][r][0]);
    }
  }
#pragma GCC unroll 32
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 32
      for (int u = 1; u < U; ++u) acc[t][r][0] = _mm512_add_ps(acc[t][r][0], acc[t][r][u]);
      const float s = hsum(acc[t][r][0]);
      a.y[t * a.N + n + r] = a.bias ? s + a.bias[n + r] : s;
    }
}

template <WT wt, int TT, int R, int U>
ARBOR_AVX512 void gemv_rows(const Args& a, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + R <= n1; n += R) gemv_tile<wt, TT, R, U>(a, n);
  for (; n < n1; ++n) gemv_tile<wt, TT, 1, U>(a, n);
}

template <WT wt>
ARBOR_AVX512 void gemv_typed(const Args& a, int64_t n0, int64_t n1) {
  // <TT, R, U>, measured with thread CPU time on bf16 weights streamed from DRAM (2048 x 2048, 64
  // copies, 1 thread): T = 1..8 reach 36, 34, 29, 27, 27, 24, 20, 19 GB/s. R = 1 keeps one
  // sequential stream, best while compute keeps up (TT <= 3); above, x loads (1 zmm/cycle from L1)
  // limit R = 1 to 22 GB/s at TT = 4 and 7 GB/s at TT = 8, so more rows share each x load.
  switch (a.T) {
    case 1: return gemv_rows<wt, 1, 1, 8>(a, n0, n1);
    case 2: return gemv_rows<wt, 2, 1, 4>(a, n0, n1);
    case 3: return gemv_rows<wt, 3, 1, 4>(a, n0, n1);
    case 4: return gemv_rows<wt, 4, 2, 2>(a, n0, n1);
    case 5: return gemv_rows<wt, 5, 2, 2>(a, n0, n1);
    case 6: return gemv_rows<wt, 6, 2, 2>(a, n0, n1);
    case 7: return gemv_rows<wt, 7, 4, 1>(a, n0, n1);
    case 8: return gemv_rows<wt, 8, 4, 1>(a, n0, n1);
  }
}

// ---- GEMM ------------------------------------------------------------------------------------------
constexpr int kMR = 12;   // token rows per register tile: 12 x 2 accumulators + 2 weight vectors
constexpr int kKC = int(kGemmPanelK);  // k per packed panel: 128 x 32 f32 = 16 KiB, stays in L1 across all token tiles

// P[kk][j] (kk < kc rounded up to 16, j < 32) = W[nb + j][kb + kk] as f32; zero past row nb+nw or past K.
template <WT wt>
ARBOR_AVX512 void pack_panel(const Args& a, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P) {
  for (int h = 0; h < 2; ++h) {
    for (int64_t g = 0; g < kc; g += 16) {
      const int64_t left = kc - g;
      const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
      __m512 r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t j = 16 * h + i;
        r[i] = j < nw ? wload_masked<wt>(a.W, (nb + j) * a.K + kb + g, m) : _mm512_setzero_ps();
      }
      transpose16x16_ps(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_store_ps(P + (g + i) * 32 + 16 * h, r[i]);
    }
  }
}

// y[0..MR, 0..32 masked] (+)= x[0..MR, 0..kc] · P; on the first k block y is overwritten (+ bias).
template <int MR>
ARBOR_AVX512 void gemm_tile(const float* x, int64_t ldx, const float* P, int64_t kc, float* y, int64_t ldy,
                            __mmask16 m0, __mmask16 m1, const float* bias, bool first) {
  __m512 acc[MR][2];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m512 w0 = _mm512_load_ps(P + kk * 32), w1 = _mm512_load_ps(P + kk * 32 + 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * ldx + kk]);
      acc[i][0] = _mm512_fmadd_ps(xb, w0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xb, w1, acc[i][1]);
    }
  }
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (first && bias) b0 = _mm512_maskz_loadu_ps(m0, bias), b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* yr = y + i * ldy;
    __m512 v0 = first ? b0 : _mm512_maskz_loadu_ps(m0, yr);
    __m512 v1 = first ? b1 : _mm512_maskz_loadu_ps(m1, yr + 16);
    _mm512_mask_storeu_ps(yr, m0, _mm512_add_ps(v0, acc[i][0]));
    _mm512_mask_storeu_ps(yr + 16, m1, _mm512_add_ps(v1, acc[i][1]));
  }
}

template <int MR>
ARBOR_AVX512 void gemm_tile_any(int mr, const float* x, int64_t ldx, const float* P, int64_t kc, float* y,
                                int64_t ldy, __mmask16 m0, __mmask16 m1, const float* bias, bool first) {
  if constexpr (MR > 1) {
    if (mr < MR) return gemm_tile_any<MR - 1>(mr, x, ldx, P, kc, y, ldy, m0, m1, bias, first);
  }
  gemm_tile<MR>(x, ldx, P, kc, y, ldy, m0, m1, bias, first);
}

// The cache-blocked loop nest around the register tiles; `pack` supplies each weight panel.
ARBOR_AVX512 void gemm_blocked(const Args& a, int64_t n0, int64_t n1, float* P, PanelPacker pack, const void* ctx) {
  for (int64_t tb = 0; tb < a.T; tb += kGemmBlockT) {
    const int64_t te = std::min(a.T, tb + kGemmBlockT);
    for (int64_t ng = n0; ng < n1; ng += kGemmGroupN) {
      const int64_t ne = std::min(n1, ng + kGemmGroupN);
      for (int64_t kb = 0; kb < a.K; kb += kKC) {
        const int64_t kc = std::min<int64_t>(kKC, a.K - kb);
        for (int64_t nb = ng; nb < ne; nb += 32) {
          const int64_t nw = std::min<int64_t>(32, ne - nb);
          const uint32_t cols = nw >= 32 ? 0xffffffffu : (1u << nw) - 1;
          const __mmask16 m0 = __mmask16(cols), m1 = __mmask16(cols >> 16);
          pack(ctx, nb, nw, kb, kc, P);
          for (int64_t t = tb; t < te; t += kMR) {
            const int mr = int(std::min<int64_t>(kMR, te - t));
            gemm_tile_any<kMR>(mr, a.x + t * a.K + kb, a.K, P, kc, a.y + t * a.N + nb, a.N, m0, m1,
                               a.bias ? a.bias + nb : nullptr, kb == 0);
          }
        }
      }
    }
  }
}

template <WT wt>
ARBOR_AVX512 void pack_dense(const void* ctx, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P) {
  pack_panel<wt>(*static_cast<const Args*>(ctx), nb, nw, kb, kc, P);
}

template <WT wt>
ARBOR_AVX512 void gemm_typed(const Args& a, int64_t n0, int64_t n1, float* P) {
  gemm_blocked(a, n0, n1, P, pack_dense<wt>, &a);
}

}  // namespace

ARBOR_AVX512 void gemv_avx512(const Args& a, int64_t n0, int64_t n1) {
  ARBOR_CHECK(a.T >= 1 && a.T <= kLinearGemvMaxT, "linear: avx512 gemv called with T={} (1..{})", a.T,
              kLinearGemvMaxT);
  switch (a.wtype) {
    case DType::F32: return gemv_typed<WT::F32>(a, n0, n1);
    case DType::F16: return gemv_typed<WT::F16>(a, n0, n1);
    case DType::BF16: return gemv_typed<WT::BF16>(a, n0, n1);
    default: fail("linear: avx512 gemv: weight dtype {} not supported", dtype_name(a.wtype));
  }
}

ARBOR_AVX512 void gemm_avx512(const Args& a, int64_t n0, int64_t n1, float* scratch) {
  switch (a.wtype) {
    case DType::F32: return gemm_typed<WT::F32>(a, n0, n1, scratch);
    case DType::F16: return gemm_typed<WT::F16>(a, n0, n1, scratch);
    case DType::BF16: return gemm_typed<WT::BF16>(a, n0, n1, scratch);
    default: fail("linear: avx512 gemm: weight dtype {} not supported", dtype_name(a.wtype));
  }
}

ARBOR_AVX512 void gemm_avx512_panels(const Args& a, int64_t n0, int64_t n1, float* scratch, PanelPacker pack, const void* ctx) {
  gemm_blocked(a, n0, n1, scratch, pack, ctx);
}

}  // namespace arbor::cpu::linear_detail
