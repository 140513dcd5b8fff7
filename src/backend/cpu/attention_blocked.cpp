// Blocked causal attention on AVX-512 (attention_blocked.h). Per call: rows = nt tokens x G query heads
// of kv head g. For each block of 16 key positions: the 16 keys transposed into Kt[hd][16] (one 16x16
// transpose per 16 dims), scores for every row as hd broadcast-FMAs into one zmm (16 keys at once),
// online softmax (running max M and sum L per row, exp in vector form), and O_row += p · V_block with
// the row's hd/16 accumulators in registers. Finally out = O / L.
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include "backend/cpu/attention_blocked.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_features.h"
#include "core/error.h"

namespace arbor::cpu {

namespace {

constexpr int64_t kMaxHd = 256, kMaxGroup = 8, kRun = 16;

alignas(64) const float kZeroRow[kMaxHd] = {};

// NC = hd / 16 vectors per row.
template <int NC>
ARBOR_AVX512 void block_kernel(const AttnBlockArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table,
                               int64_t g, float* scratch) {
  constexpr int64_t hd = NC * 16;
  const int64_t G = a.n_heads / a.n_kv_heads, R = nt * G, kv_row = a.n_kv_heads * hd, qrow = a.n_heads * hd;
  float* O = scratch;             // [R][hd]
  float* M = O + kRun * kMaxGroup * hd;  // [R]
  float* L = M + kRun * kMaxGroup;       // [R]
  float* Kt = L + kRun * kMaxGroup;      // [hd][16], 64-byte aligned (offsets are multiples of 16 floats)
  for (int64_t r = 0; r < R; ++r) {
    std::fill(O + r * hd, O + (r + 1) * hd, 0.0f);
    M[r] = -INFINITY, L[r] = 0.0f;
  }
  const int64_t last = pos0 + nt - 1;
  const int64_t lo_all = a.window > 0 ? std::max<int64_t>(0, pos0 - a.window + 1) : 0;
  const __m512 scale = _mm512_set1_ps(a.scale);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  alignas(64) float pc[16];
  for (int64_t j0 = lo_all / 16 * 16; j0 <= last; j0 += 16) {
    const float* kr[16];
    const float* vr[16];
    for (int c = 0; c < 16; ++c) {
      const int64_t kp = j0 + c;
      if (kp > last || kp < lo_all) {
        kr[c] = vr[c] = kZeroRow;
        continue;
      }
      const int64_t off = (int64_t(table[kp / a.bs]) * a.bs + kp % a.bs) * kv_row + g * hd;
      kr[c] = a.K + off, vr[c] = a.V + off;
    }
#pragma GCC unroll 16
    for (int d0 = 0; d0 < NC; ++d0) {
      __m512 r[16];
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) r[c] = _mm512_loadu_ps(kr[c] + 16 * d0);
      transpose16x16_ps(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_store_ps(Kt + (16 * d0 + i) * 16, r[i]);
    }
    for (int64_t row = 0; row < R; ++row) {
      const int64_t i = row / G, h = g * G + row % G;
      const int64_t pos = pos0 + i;
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
      if (j0 > pos || j0 + 15 < lo) continue;  // every key of this block is masked for this row
      const float* qr = a.q + (t0 + i) * qrow + h * hd;
      __m512 s4[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 16
      for (int64_t d = 0; d < hd; ++d) s4[d & 3] = _mm512_fmadd_ps(_mm512_set1_ps(qr[d]), _mm512_load_ps(Kt + d * 16), s4[d & 3]);
      __m512 s = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(s4[0], s4[1]), _mm512_add_ps(s4[2], s4[3])), scale);
      // Key j0 + c is visible iff lo <= j0 + c <= pos.
      const __m512i kpos = _mm512_add_epi32(lane, _mm512_set1_epi32(int(j0)));
      const __mmask16 vis = _mm512_cmple_epi32_mask(kpos, _mm512_set1_epi32(int(pos))) &
                            _mm512_cmpge_epi32_mask(kpos, _mm512_set1_epi32(int(lo)));
      s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis, s);
      const float m_new = std::max(M[row], _mm512_reduce_max_ps(s));
      const __m512 p = _mm512_maskz_mov_ps(vis, exp_nonpos(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
      const float corr = std::exp(M[row] - m_new);  // 0 on the row's first visible block
      L[row] = L[row] * corr + _mm512_reduce_add_ps(p);
      M[row] = m_new;
      _mm512_store_ps(pc, p);
      float* orow = O + row * hd;
      __m512 acc[NC];
      const __m512 vc = _mm512_set1_ps(corr);
#pragma GCC unroll 16
      for (int k = 0; k < NC; ++k) acc[k] = _mm512_mul_ps(_mm512_loadu_ps(orow + 16 * k), vc);
      for (int c = 0; c < 16; ++c) {
        if (!((vis >> c) & 1)) continue;
        const __m512 pb = _mm512_set1_ps(pc[c]);
#pragma GCC unroll 16
        for (int k = 0; k < NC; ++k) acc[k] = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vr[c] + 16 * k), acc[k]);
      }
#pragma GCC unroll 16
      for (int k = 0; k < NC; ++k) _mm512_storeu_ps(orow + 16 * k, acc[k]);
    }
  }
  attention_block_store(a, t0, R, g, O, L);
}

}  // namespace

bool attention_block_shape_ok(int64_t hd, int64_t group, float softcap) {
  return softcap == 0.0f && hd % 16 == 0 && hd >= 16 && hd <= kMaxHd && group >= 1 && group <= kMaxGroup;
}

bool attention_block_applies(int64_t hd, int64_t group, float softcap) {
  return cpu_features().avx512 && attention_block_shape_ok(hd, group, softcap);
}

void check_attention_block_call(const char* who, bool applies, const AttnBlockArgs& a, int64_t nt, int64_t max_run, int64_t g,
                                int64_t pos0) {
  const int64_t G = a.n_kv_heads > 0 ? a.n_heads / a.n_kv_heads : 0;
  ARBOR_CHECK(applies && a.n_heads == G * a.n_kv_heads && nt >= 1 && nt <= max_run && g >= 0 && g < a.n_kv_heads && pos0 >= 0,
              "{}: unsupported call (hd {}, heads {}/{}, rows {}, kv head {}, pos {})", who, a.hd, a.n_heads, a.n_kv_heads, nt, g,
              pos0);
}

ARBOR_AVX512 void attention_block_store(const AttnBlockArgs& a, int64_t t0, int64_t R, int64_t g, const float* O, const float* L) {
  const int64_t hd = a.hd, G = a.n_heads / a.n_kv_heads, qrow = a.n_heads * hd;
  for (int64_t r = 0; r < R; ++r) {
    float* o = a.out + (t0 + r / G) * qrow + (g * G + r % G) * hd;
    const __m512 inv = _mm512_set1_ps(1.0f / L[r]);
    for (int64_t d = 0; d < hd; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(O + r * hd + d), inv));
  }
}

int64_t attention_block_scratch_floats(int64_t hd, int64_t group) {
  (void)group;
  return kRun * kMaxGroup * (hd + 2) + hd * 16;
}

void attention_block(const AttnBlockArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table, int64_t g,
                     float* scratch) {
  const int64_t G = a.n_kv_heads > 0 ? a.n_heads / a.n_kv_heads : 0;
  check_attention_block_call("attention_block", attention_block_applies(a.hd, G, 0.0f), a, nt, kRun, g, pos0);
  attention_block_by_width(a.hd, [&]<int NC>() { block_kernel<NC>(a, t0, nt, pos0, table, g, scratch); });
}

}  // namespace arbor::cpu
