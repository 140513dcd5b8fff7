// bf16 prefill attention on AVX-512 BF16 (attention_bf16.h). Per call: rows = nt tokens x G query heads
// of kv head g, each row's q rounded to bf16 pairs once (Qp). For each block of 32 key positions
// (aligned to multiples of 32, so a row's blocks do not depend on its run): the keys rounded to bf16
// pairs and transposed into Kp[dim pair][32 keys] (one 16x16 transpose of 32-bit words per 16 keys x
// 32 dims), the values into Vp[key pair][hd] as (v[2i][d], v[2i+1][d]) words; then, kRT rows at a
// time, the scores as one vdpbf16ps per (row, 16 keys, dim pair) with the row's pair broadcast, the
// online softmax in f32 (running max M, per-lane sum Lv, exp in vector form), p rounded to bf16 pairs,
// and O_row = O_row * corr + p · V_block as one vdpbf16ps per (row, 16 dims, key pair). Finally out =
// O / sum(Lv).
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include "backend/cpu/attention_bf16.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_features.h"
#include "core/error.h"

namespace arbor::cpu {

namespace {

constexpr int64_t kMaxHd = 256, kMaxGroup = 8, kKeys = 32;
constexpr int kRT = 8;  // rows per score tile: 2 x 8 independent vdpbf16ps chains

alignas(64) const float kZeroRow[kMaxHd] = {};

// 32 dims from x (fewer where `left` < 32, zero past it) as 16 bf16 pairs in order.
ARBOR_BF16_INLINE __m512i round_pairs(const float* x, int64_t left) {
  const __mmask16 m0 = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
  const __mmask16 m1 = left >= 32 ? __mmask16(0xffff) : left > 16 ? __mmask16((1u << (left - 16)) - 1) : __mmask16(0);
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, x + 16), _mm512_maskz_loadu_ps(m0, x));
}

// PV rows per sub-tile: at most 16 accumulators (NC per row).
constexpr int pv_rows(int nc) { return nc <= 2 ? 8 : nc <= 4 ? 4 : nc <= 8 ? 2 : 1; }

// NC = hd / 16 vectors per row, HP = hd / 2 dim pairs.
template <int NC>
ARBOR_BF16 void bf16_kernel(const AttnBlockArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table,
                            int64_t g, float* scratch) {
  constexpr int64_t hd = NC * 16, HP = NC * 8;
  constexpr int RP = pv_rows(NC);
  const int64_t G = a.n_heads / a.n_kv_heads, R = nt * G, kv_row = a.n_kv_heads * hd, qrow = a.n_heads * hd;
  const int64_t Rmax = kAttnBf16MaxRun * kMaxGroup;
  // Every region a multiple of 16 words, so each stays 64-byte aligned.
  uint32_t* Qp = reinterpret_cast<uint32_t*>(scratch);  // [R][HP]
  float* O = scratch + Rmax * HP;                        // [R][hd]
  float* Lv = O + Rmax * hd;                             // [R][16]
  float* M = Lv + Rmax * 16;                             // [R]
  float* Od = M + Rmax;                                  // [kRT][hd]: rows past R of the last tile
  uint32_t* Kp = reinterpret_cast<uint32_t*>(Od + kRT * hd);  // [HP][32 keys]
  uint32_t* Vp = Kp + HP * kKeys;                        // [16 key pairs][hd]
  uint32_t* P = Vp + (kKeys / 2) * hd;                   // [kRT][16]
  for (int64_t r = 0; r < R; ++r) {
    const int64_t i = r / G, h = g * G + r % G;
    const float* qr = a.q + (t0 + i) * qrow + h * hd;
#pragma GCC unroll 8
    for (int64_t d = 0; d < hd; d += 32) {
      const __m512i v = round_pairs(qr + d, hd - d);
      if (hd - d >= 32)
        _mm512_storeu_si512(Qp + r * HP + d / 2, v);
      else
        _mm512_mask_storeu_epi32(Qp + r * HP + d / 2, __mmask16(0xff), v);
    }
    std::fill(O + r * hd, O + (r + 1) * hd, 0.0f);
    std::fill(Lv + r * 16, Lv + (r + 1) * 16, 0.0f);
    M[r] = -INFINITY;
  }
  const int64_t last = pos0 + nt - 1;
  const int64_t lo_all = a.window > 0 ? std::max<int64_t>(0, pos0 - a.window + 1) : 0;
  const __m512 scale = _mm512_set1_ps(a.scale);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Words a0 b0 a1 b1 ... from a0..a15 b0..b15.
  const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                       20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t j0 = lo_all / kKeys * kKeys; j0 <= last; j0 += kKeys) {
    const float* kr[kKeys];
    const float* vr[kKeys];
    for (int c = 0; c < kKeys; ++c) {
      const int64_t kp = j0 + c;
      if (kp > last || kp < lo_all) {
        kr[c] = vr[c] = kZeroRow;
        continue;
      }
      const int64_t off = (int64_t(table[kp / a.bs]) * a.bs + kp % a.bs) * kv_row + g * hd;
      kr[c] = a.K + off, vr[c] = a.V + off;
    }
    // Kp[p][16 * half + c] = the pair (k[2p], k[2p + 1]) of key j0 + 16 * half + c.
    for (int half = 0; half < 2; ++half) {
#pragma GCC unroll 8
      for (int64_t d = 0; d < hd; d += 32) {
        __m512i r[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; ++c) r[c] = round_pairs(kr[16 * half + c] + d, hd - d);
        transpose16x16_epi32(r);
        const int np = hd - d >= 32 ? 16 : 8;
#pragma GCC unroll 16
        for (int p = 0; p < np; ++p) _mm512_store_si512(Kp + (d / 2 + p) * kKeys + 16 * half, r[p]);
      }
    }
    // Vp[i][d] = the pair (v[2i][d], v[2i + 1][d]) of keys j0 + 2i, j0 + 2i + 1.
    for (int i = 0; i < kKeys / 2; ++i) {
#pragma GCC unroll 16
      for (int k = 0; k < NC; ++k) {
        const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(vr[2 * i + 1] + 16 * k), _mm512_loadu_ps(vr[2 * i] + 16 * k));
        _mm512_store_si512(Vp + i * hd + 16 * k, _mm512_permutexvar_epi16(zip, w));
      }
    }
    for (int64_t r0 = 0; r0 < R; r0 += kRT) {
      const int nr = int(std::min<int64_t>(kRT, R - r0));
      // Skip the tile when every key of the block is masked for all its rows (rows are in position order).
      const int64_t pos_first = pos0 + r0 / G, pos_last = pos0 + (r0 + nr - 1) / G;
      const int64_t lo_first = a.window > 0 ? std::max<int64_t>(0, pos_first - a.window + 1) : 0;
      if (j0 > pos_last || j0 + kKeys - 1 < lo_first) continue;
      const uint32_t* qp[kRT];
#pragma GCC unroll 16
      for (int rr = 0; rr < kRT; ++rr) qp[rr] = Qp + std::min<int64_t>(r0 + rr, R - 1) * HP;
      __m512 s[kRT][2];
#pragma GCC unroll 16
      for (int rr = 0; rr < kRT; ++rr) s[rr][0] = s[rr][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
      for (int64_t p = 0; p < HP; ++p) {
        const __m512bh k0 = (__m512bh)_mm512_load_si512(Kp + p * kKeys);
        const __m512bh k1 = (__m512bh)_mm512_load_si512(Kp + p * kKeys + 16);
#pragma GCC unroll 16
        for (int rr = 0; rr < kRT; ++rr) {
          const __m512bh qv = (__m512bh)_mm512_set1_epi32(int(qp[rr][p]));
          s[rr][0] = _mm512_dpbf16_ps(s[rr][0], qv, k0);
          s[rr][1] = _mm512_dpbf16_ps(s[rr][1], qv, k1);
        }
      }
      float corr[kRT];
      float* orow[kRT];
#pragma GCC unroll 16
      for (int rr = 0; rr < kRT; ++rr) {
        corr[rr] = 1.0f;
        orow[rr] = rr < nr ? O + (r0 + rr) * hd : Od + rr * hd;
        __m512i pw = _mm512_setzero_si512();
        const int64_t row = r0 + rr, pos = pos0 + row / G;
        const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
        if (rr < nr && j0 <= pos && j0 + kKeys - 1 >= lo) {
          // Key j0 + c is visible iff lo <= j0 + c <= pos.
          const __m512i kp0 = _mm512_add_epi32(lane, _mm512_set1_epi32(int(j0)));
          const __m512i kp1 = _mm512_add_epi32(kp0, _mm512_set1_epi32(16));
          const __m512i vpos = _mm512_set1_epi32(int(pos)), vlo = _mm512_set1_epi32(int(lo));
          const __mmask16 vis0 = _mm512_cmple_epi32_mask(kp0, vpos) & _mm512_cmpge_epi32_mask(kp0, vlo);
          const __mmask16 vis1 = _mm512_cmple_epi32_mask(kp1, vpos) & _mm512_cmpge_epi32_mask(kp1, vlo);
          const __m512 x0 = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis0, _mm512_mul_ps(s[rr][0], scale));
          const __m512 x1 = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis1, _mm512_mul_ps(s[rr][1], scale));
          const float m_new = std::max(M[row], _mm512_reduce_max_ps(_mm512_max_ps(x0, x1)));
          const __m512 mv = _mm512_set1_ps(m_new);
          const __m512 p0 = _mm512_maskz_mov_ps(vis0, exp_nonpos(_mm512_sub_ps(x0, mv)));
          const __m512 p1 = _mm512_maskz_mov_ps(vis1, exp_nonpos(_mm512_sub_ps(x1, mv)));
          // In vector form (a call to expf would spill the score tile); e^-87 rather than 0 on the row's
          // first visible block, where O and Lv are still 0.
          corr[rr] = _mm512_cvtss_f32(exp_nonpos(_mm512_set1_ps(M[row] - m_new)));
          M[row] = m_new;
          _mm512_store_ps(Lv + row * 16, _mm512_add_ps(_mm512_fmadd_ps(_mm512_load_ps(Lv + row * 16), _mm512_set1_ps(corr[rr]), p0), p1));
          pw = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);  // keys 0..15 in the low half: word i = keys 2i, 2i + 1
        }
        _mm512_store_si512(P + rr * 16, pw);
      }
      for (int rb = 0; rb < kRT; rb += RP) {
        if (rb >= nr) break;
        __m512 acc[RP][NC];
#pragma GCC unroll 16
        for (int rr = 0; rr < RP; ++rr) {
          const __m512 vc = _mm512_set1_ps(corr[rb + rr]);
#pragma GCC unroll 16
          for (int k = 0; k < NC; ++k) acc[rr][k] = _mm512_mul_ps(_mm512_load_ps(orow[rb + rr] + 16 * k), vc);
        }
#pragma GCC unroll 2
        for (int i = 0; i < kKeys / 2; ++i) {
#pragma GCC unroll 16
          for (int rr = 0; rr < RP; ++rr) {
            const __m512bh pv = (__m512bh)_mm512_set1_epi32(int(P[(rb + rr) * 16 + i]));
#pragma GCC unroll 16
            for (int k = 0; k < NC; ++k) acc[rr][k] = _mm512_dpbf16_ps(acc[rr][k], pv, (__m512bh)_mm512_load_si512(Vp + i * hd + 16 * k));
          }
        }
#pragma GCC unroll 16
        for (int rr = 0; rr < RP; ++rr)
#pragma GCC unroll 16
          for (int k = 0; k < NC; ++k) _mm512_store_ps(orow[rb + rr] + 16 * k, acc[rr][k]);
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) M[r] = _mm512_reduce_add_ps(_mm512_load_ps(Lv + r * 16));  // M: the row sums now
  attention_block_store(a, t0, R, g, O, M);
}

}  // namespace

bool attention_bf16_applies(int64_t hd, int64_t group, float softcap) {
  static_assert(kMaxHd == 256 && kMaxGroup == 8, "the shapes attention_block_shape_ok admits");
  return cpu_features().avx512_bf16 && attention_block_shape_ok(hd, group, softcap);
}

int64_t attention_bf16_scratch_floats(int64_t hd, int64_t group) {
  (void)group;
  const int64_t Rmax = kAttnBf16MaxRun * kMaxGroup;
  return Rmax * (hd / 2 + hd + 16 + 1) + kRT * hd + (hd / 2) * kKeys + (kKeys / 2) * hd + kRT * 16;
}

void attention_bf16(const AttnBlockArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table, int64_t g,
                    float* scratch) {
  const int64_t G = a.n_kv_heads > 0 ? a.n_heads / a.n_kv_heads : 0;
  check_attention_block_call("attention_bf16", attention_bf16_applies(a.hd, G, 0.0f), a, nt, kAttnBf16MaxRun, g, pos0);
  attention_block_by_width(a.hd, [&]<int NC>() { bf16_kernel<NC>(a, t0, nt, pos0, table, g, scratch); });
}

}  // namespace arbor::cpu
