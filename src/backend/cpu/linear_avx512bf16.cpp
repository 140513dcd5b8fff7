// AVX-512 BF16 prefill GEMM for bf16 weights: vdpbf16ps on packed 32-column weight panels (pairs of k)
// against x split into two bf16 halves (x ≈ x_hi + x_lo, ~16 mantissa bits), f32 accumulation. The
// weights are exact; x keeps enough precision to match an f32 reference to ~1e-5 relative.
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/linear.h"
#include "core/error.h"

namespace arbor::cpu::linear_detail {

namespace {

constexpr int kMR = 12;    // token rows per register tile: 12 x 2 accumulators + 2 weight vectors
constexpr int kKCP = 128;  // k pairs per packed panel: 128 x 32 x 4 B = 16 KiB, L1-resident

// P[p][j] (p < kcp rounded up to 16, j < 32) = the bf16 pair W[nb+j][kb+2p], W[nb+j][kb+2p+1] as one
// 32-bit word; zero past row nb+nw or past K (so an odd K gets a zero partner).
ARBOR_BF16 void pack_panel(const Args& a, int64_t nb, int64_t nw, int64_t kb, int64_t kcp, uint32_t* P) {
  const uint16_t* W = static_cast<const uint16_t*>(a.W);
  for (int h = 0; h < 2; ++h) {
    for (int64_t g = 0; g < kcp; g += 16) {
      const int64_t left = a.K - (kb + 2 * g);  // elements of the row left from this group on
      const __mmask32 m = left >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << left) - 1);
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t j = 16 * h + i;
        r[i] = j < nw ? _mm512_maskz_loadu_epi16(m, W + (nb + j) * a.K + kb + 2 * g) : _mm512_setzero_si512();
      }
      transpose16x16_epi32(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_store_si512(P + (g + i) * 32 + 16 * h, r[i]);
    }
  }
}

// y[0..MR, 0..32 masked] (+)= x[0..MR, pairs 0..kcp] · P; on the first k block y is overwritten (+ bias).
// xs rows hold (hi pair, lo pair) words; both halves accumulate into the same f32 sums.
template <int MR>
ARBOR_BF16 void gemm_tile(const uint32_t* xs, int64_t ldx, const uint32_t* P, int64_t kcp, float* y,
                                int64_t ldy, __mmask16 m0, __mmask16 m1, const float* bias, bool first) {
  __m512 acc[MR][2];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kcp; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_load_si512(P + p * 32);
    const __m512bh w1 = (__m512bh)_mm512_load_si512(P + p * 32 + 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh hi = (__m512bh)_mm512_set1_epi32(int(xs[i * ldx + 2 * p]));
      const __m512bh lo = (__m512bh)_mm512_set1_epi32(int(xs[i * ldx + 2 * p + 1]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], w0, hi);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], w1, hi);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], w0, lo);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], w1, lo);
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
ARBOR_BF16 void gemm_tile_any(int mr, const uint32_t* xs, int64_t ldx, const uint32_t* P, int64_t kcp,
                                    float* y, int64_t ldy, __mmask16 m0, __mmask16 m1, const float* bias,
                                    bool first) {
  if constexpr (MR > 1) {
    if (mr < MR) return gemm_tile_any<MR - 1>(mr, xs, ldx, P, kcp, y, ldy, m0, m1, bias, first);
  }
  gemm_tile<MR>(xs, ldx, P, kcp, y, ldy, m0, m1, bias, first);
}

}  // namespace

ARBOR_BF16 void split_bf16_avx512bf16(const float* x, int64_t K, int64_t Kp, int64_t t0, int64_t t1,
                                            uint32_t* x_split) {
  // Word order within 16 outputs: hi pair 0, lo pair 0, hi pair 1, ... (hi words 0..7, lo words 8..15).
  const __m512i interleave = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xr = x + t * K;
    uint32_t* out = x_split + t * Kp;
    for (int64_t k = 0; k < Kp; k += 16) {
      const int64_t left = K - k;
      const __mmask16 m = left >= 16 ? __mmask16(0xffff) : left > 0 ? __mmask16((1u << left) - 1) : __mmask16(0);
      const __m512 v = _mm512_maskz_loadu_ps(m, xr + k);
      const __m256i hi = (__m256i)_mm512_cvtneps_pbh(v);
      const __m512 hi_f32 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
      const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, hi_f32));
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(hi), lo, 1);
      // Kp - k words are left in this row: 16, or fewer at the end.
      const int64_t words = std::min<int64_t>(16, Kp - k);
      _mm512_mask_storeu_epi32(out + k, __mmask16((1u << words) - 1), _mm512_permutexvar_epi32(interleave, both));
    }
  }
}

ARBOR_BF16 void gemm_avx512bf16(const Args& a, int64_t n0, int64_t n1, float* scratch) {
  ARBOR_CHECK(a.wtype == DType::BF16 && a.x_split && a.Kp == (a.K + 1) / 2 * 2,
              "linear: avx512bf16 gemm needs bf16 weights and split x (got {}, Kp={} for K={})",
              dtype_name(a.wtype), a.Kp, a.K);
  uint32_t* P = reinterpret_cast<uint32_t*>(scratch);
  const int64_t pairs = a.Kp / 2;
  for (int64_t tb = 0; tb < a.T; tb += kGemmBlockT) {
    const int64_t te = std::min(a.T, tb + kGemmBlockT);
    for (int64_t ng = n0; ng < n1; ng += kGemmGroupN) {
      const int64_t ne = std::min(n1, ng + kGemmGroupN);
      for (int64_t pb = 0; pb < pairs; pb += kKCP) {
        const int64_t kcp = std::min<int64_t>(kKCP, pairs - pb);
        for (int64_t nb = ng; nb < ne; nb += 32) {
          const int64_t nw = std::min<int64_t>(32, ne - nb);
          const uint32_t cols = nw >= 32 ? 0xffffffffu : (1u << nw) - 1;
          const __mmask16 m0 = __mmask16(cols), m1 = __mmask16(cols >> 16);
          pack_panel(a, nb, nw, 2 * pb, kcp, P);
          for (int64_t t = tb; t < te; t += kMR) {
            const int mr = int(std::min<int64_t>(kMR, te - t));
            gemm_tile_any<kMR>(mr, a.x_split + t * a.Kp + 2 * pb, a.Kp, P, kcp, a.y + t * a.N + nb, a.N, m0, m1,
                               a.bias ? a.bias + nb : nullptr, pb == 0);
          }
        }
      }
    }
  }
}

}  // namespace arbor::cpu::linear_detail
