// Blocked causal attention on AVX-512 (attention_blocked.h). Per call: rows = nt tokens x G query heads
// of kv head g. For each block of 16 key positions: the 16 keys transposed into Kt[hd][16] (one 16x16
// transpose per 16 dims), scores for every row as hd broadcast-FMAs into one zmm (16 keys at once),
// online softmax (running max M and sum L per row, exp in vector form), and O_row += p · V_block with
// the row's hd/16 accumulators in registers. Finally out = O / L.
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include "backend/cpu/attention_blocked.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "backend/cpu/cpu_features.h"
#include "core/error.h"

namespace arbor::cpu {

namespace {

constexpr int64_t kMaxHd = 256, kMaxGroup = 8, kRun = 16;

alignas(64) const float kZeroRow[kMaxHd] = {};

// ARBOR_CPU_ATTN_DECODE=0 sends decode tokens through block_kernel too (A/B runs; tests set it with
// set_attention_block_decode).
int g_decode_kernel = -1;
bool decode_kernel_on() {
  if (g_decode_kernel < 0) {
    const char* e = std::getenv("ARBOR_CPU_ATTN_DECODE");
    g_decode_kernel = e && e[0] == '0' ? 0 : 1;
  }
  return g_decode_kernel == 1;
}

// Both kernels' scratch: O [rows][hd], then M and L [rows], then Kt [hd][16] (64-byte aligned: offsets are multiples
// of 16 floats); the first `rows` rows of O, M and L start empty.
struct BlockScratch {
  float *O, *M, *L, *Kt;
  BlockScratch(float* scratch, int64_t hd, int64_t rows)
      : O(scratch), M(O + kRun * kMaxGroup * hd), L(M + kRun * kMaxGroup), Kt(L + kRun * kMaxGroup) {
    std::fill(O, O + rows * hd, 0.0f);
    std::fill(M, M + rows, -INFINITY);
    std::fill(L, L + rows, 0.0f);
  }
};

// The first float of kv head g's row at position kp.
inline int64_t kv_offset(const AttnBlockArgs& a, const int32_t* table, int64_t g, int64_t kp) {
  return (int64_t(table[kp / a.bs]) * a.bs + kp % a.bs) * a.n_kv_heads * a.hd + g * a.hd;
}

// The key and value rows of the block at j0 (positions outside [lo, last] read the zero row), and its keys
// transposed into Kt [hd][16].
template <int NC>
ARBOR_AVX512_INLINE void gather_block(const AttnBlockArgs& a, const int32_t* table, int64_t g, int64_t j0, int64_t lo, int64_t last,
                                      const float* (&kr)[16], const float* (&vr)[16], float* Kt) {
  for (int c = 0; c < 16; ++c) {
    const int64_t kp = j0 + c;
    if (kp > last || kp < lo) {
      kr[c] = vr[c] = kZeroRow;
      continue;
    }
    const int64_t off = kv_offset(a, table, g, kp);
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
}

// Keys j0 + c with lo <= j0 + c <= pos.
ARBOR_AVX512_INLINE __mmask16 visible_keys(int64_t j0, int64_t lo, int64_t pos) {
  const __m512i kpos = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(int(j0)));
  return _mm512_cmple_epi32_mask(kpos, _mm512_set1_epi32(int(pos))) & _mm512_cmpge_epi32_mask(kpos, _mm512_set1_epi32(int(lo)));
}

// One row's online-softmax step over a block: scores s (scaled), masked by vis, update the row's running max m and
// sum l; the block's weights go to pc, and the factor the row's earlier output must be scaled by is returned (0 on
// the row's first visible block).
ARBOR_AVX512_INLINE float softmax_step(__m512 s, __mmask16 vis, float& m, float& l, float* pc) {
  s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis, s);
  const float m_new = std::max(m, _mm512_reduce_max_ps(s));
  const __m512 p = _mm512_maskz_mov_ps(vis, exp_nonpos(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
  const float corr = std::exp(m - m_new);
  l = l * corr + _mm512_reduce_add_ps(p);
  m = m_new;
  _mm512_store_ps(pc, p);
  return corr;
}

// NC = hd / 16 vectors per row.
template <int NC>
ARBOR_AVX512 void block_kernel(const AttnBlockArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table,
                               int64_t g, float* scratch) {
  constexpr int64_t hd = NC * 16;
  const int64_t G = a.n_heads / a.n_kv_heads, R = nt * G, qrow = a.n_heads * hd;
  BlockScratch sc(scratch, hd, R);
  const int64_t last = pos0 + nt - 1;
  const int64_t lo_all = a.window > 0 ? std::max<int64_t>(0, pos0 - a.window + 1) : 0;
  const __m512 scale = _mm512_set1_ps(a.scale);
  alignas(64) float pc[16];
  for (int64_t j0 = lo_all / 16 * 16; j0 <= last; j0 += 16) {
    const float* kr[16];
    const float* vr[16];
    gather_block<NC>(a, table, g, j0, lo_all, last, kr, vr, sc.Kt);
    for (int64_t row = 0; row < R; ++row) {
      const int64_t i = row / G, h = g * G + row % G;
      const int64_t pos = pos0 + i;
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
      if (j0 > pos || j0 + 15 < lo) continue;  // every key of this block is masked for this row
      const float* qr = a.q + (t0 + i) * qrow + h * hd;
      __m512 s4[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 16
      for (int64_t d = 0; d < hd; ++d) s4[d & 3] = _mm512_fmadd_ps(_mm512_set1_ps(qr[d]), _mm512_load_ps(sc.Kt + d * 16), s4[d & 3]);
      const __mmask16 vis = visible_keys(j0, lo, pos);
      const float corr = softmax_step(_mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(s4[0], s4[1]), _mm512_add_ps(s4[2], s4[3])), scale), vis,
                                      sc.M[row], sc.L[row], pc);
      float* orow = sc.O + row * hd;
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
  attention_block_store(a, t0, R, g, sc.O, sc.L);
}

// One decode token (nt = 1): the G query rows of kv head g share every key and value, so they go through a
// block together, four at a time: the transposed keys are loaded once for the four rows' scores (two FMA chains a
// row), and each value row once for the four rows' outputs (in slices of 4 vectors of hd, 16 accumulators). The
// per-row kernel above reloads both for every row and runs each row's chain (scores, reductions, exp, P·V) alone.
// Measured (docs/benchmarks.md, session 23): 43-44 -> 24-27 µs a Llama-3.2-1B layer at ctx 160 on 2 threads, 1.19x
// at ctx 4096. Rows past G (a group of 4 not filled) compute on row 0's query into scratch rows that are never
// stored. The next block's key and value rows are prefetched.
template <int NC>
ARBOR_AVX512 void decode_kernel(const AttnBlockArgs& a, int64_t t0, int64_t pos, const int32_t* table, int64_t g, float* scratch) {
  constexpr int64_t hd = NC * 16;
  const int64_t G = a.n_heads / a.n_kv_heads, qrow = a.n_heads * hd;
  BlockScratch sc(scratch, hd, (G + 3) / 4 * 4);  // with the padding of the last group of 4
  const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  const __m512 scale = _mm512_set1_ps(a.scale);
  alignas(64) float pc[4][16];
  for (int64_t j0 = lo / 16 * 16; j0 <= pos; j0 += 16) {
    const float* kr[16];
    const float* vr[16];
    gather_block<NC>(a, table, g, j0, lo, pos, kr, vr, sc.Kt);
    for (int64_t kp = j0 + 16; kp < std::min(j0 + 32, pos + 1); ++kp) {  // the next block's rows
      const int64_t off = kv_offset(a, table, g, kp);
      for (int64_t b = 0; b < hd * 4; b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(a.K + off) + b, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(a.V + off) + b, _MM_HINT_T0);
      }
    }
    const __mmask16 vis = visible_keys(j0, lo, pos);  // the same for every row of a decode token
    for (int64_t rb = 0; rb < G; rb += 4) {
      const float* qr[4];
      for (int r = 0; r < 4; ++r) qr[r] = a.q + t0 * qrow + (g * G + (rb + r < G ? rb + r : 0)) * hd;
      __m512 s0[4], s1[4];
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int64_t d = 0; d < hd; d += 2) {
        const __m512 k0 = _mm512_load_ps(sc.Kt + d * 16), k1 = _mm512_load_ps(sc.Kt + (d + 1) * 16);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          s0[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[r][d]), k0, s0[r]);
          s1[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[r][d + 1]), k1, s1[r]);
        }
      }
      float corr[4];
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r)
        corr[r] = softmax_step(_mm512_mul_ps(_mm512_add_ps(s0[r], s1[r]), scale), vis, sc.M[rb + r], sc.L[rb + r], pc[r]);
#pragma GCC unroll 4
      for (int kc = 0; kc < NC; kc += 4) {
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m512 vc = _mm512_set1_ps(corr[r]);
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k)
            if (kc + k < NC) acc[r][k] = _mm512_mul_ps(_mm512_loadu_ps(sc.O + (rb + r) * hd + 16 * (kc + k)), vc);
        }
        for (int c = 0; c < 16; ++c) {
          if (!((vis >> c) & 1)) continue;
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            if (kc + k >= NC) continue;
            const __m512 v = _mm512_loadu_ps(vr[c] + 16 * (kc + k));
#pragma GCC unroll 4
            for (int r = 0; r < 4; ++r) acc[r][k] = _mm512_fmadd_ps(_mm512_set1_ps(pc[r][c]), v, acc[r][k]);
          }
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k)
            if (kc + k < NC) _mm512_storeu_ps(sc.O + (rb + r) * hd + 16 * (kc + k), acc[r][k]);
      }
    }
  }
  attention_block_store(a, t0, G, g, sc.O, sc.L);
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
  if (nt == 1 && decode_kernel_on())
    attention_block_by_width(a.hd, [&]<int NC>() { decode_kernel<NC>(a, t0, pos0, table, g, scratch); });
  else
    attention_block_by_width(a.hd, [&]<int NC>() { block_kernel<NC>(a, t0, nt, pos0, table, g, scratch); });
}

void set_attention_block_decode(int on) { g_decode_kernel = on == 0 || on == 1 ? on : -1; }

}  // namespace arbor::cpu
