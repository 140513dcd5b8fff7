// Blocked attention over a coded KV cache on AVX-512 (attention_coded.h). Per call: rows = nt tokens x G
// query heads of kv head g. For each block of 16 key positions (the next block's rows prefetched):
//   K: 16 codes of each key row at a time unpacked to int32 lanes (8-bit: one widening load; 4-bit: a
//      byte unpack and per-lane shifts; other widths: two 64-bit words shifted per lane), the 16 rows
//      transposed 16x16 as integers, then to float with the group's scales and biases as vectors over
//      the 16 keys: Kt[hd][16], dequantized once per block for every query row;
//   V: the codes to floats (affine) or Lloyd-Max centroids (vpermps; TurboQuant, rotated domain) into
//      Vc[16][hd], undequantized: the scale is folded into the probabilities (p_c * s_c per group) and
//      the bias into one sum per group (Σ_c p_c b_c);
//   scores for every row as hd broadcast-FMAs into one zmm (16 keys at once), scale, softcap (scalar
//   tanh, rare), the causal/window mask, online softmax (running max M and sum L per row, vector exp),
//   then O = O * corr + bias + Σ_c p'_c Vc[c] for two rows at a time over 64 dims (8 independent
//   accumulators, each Vc vector loaded once for both rows).
// Finally out = O / L, and for TurboQuant values the inverse rotation of each output row.
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include "backend/cpu/attention_coded.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_features.h"
#include "core/error.h"

namespace arbor::cpu {

namespace {

constexpr int64_t kMaxHd = 512, kMaxGroup = 8, kRun = 16;

// A masked key's rows point here: all codes 0 and scales 0 decode to 0 (finite, times p = 0). Big enough
// for the largest row (512 8-bit codes + 16 scales + 16 zeros) and the unpacking's read past the codes.
alignas(64) const uint8_t kZeroRow[kMaxHd + 4 * (kMaxHd / 32) + 64] = {};

ARBOR_AVX512_INLINE float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The 16 codes of elements 16*d0 .. 16*d0 + 15 of a row of B-bit codes (a little-endian bit stream; 16
// codes are 2B whole bytes), as int32 lanes; SIGNED: 8-bit codes are int8 (TurboQuant keys).
template <int B, bool SIGNED>
ARBOR_AVX512_INLINE __m512i codes16(const uint8_t* row, int64_t d0) {
  const uint8_t* p = row + d0 * 2 * B;
  if constexpr (B == 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return SIGNED ? _mm512_cvtepi8_epi32(x) : _mm512_cvtepu8_epi32(x);
  } else if constexpr (B == 4) {
    __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    x = _mm_unpacklo_epi8(x, x);  // each byte twice: lane 2i takes the low nibble, 2i+1 the high
    const __m512i v = _mm512_cvtepu8_epi32(x);
    const __m512i sh = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    return _mm512_and_si512(_mm512_srlv_epi32(v, sh), _mm512_set1_epi32(15));
  } else {
    // Codes 0..7 in the first B bytes, 8..15 in the next B: each half from one 64-bit word (reads up to
    // 8 - B bytes past the chunk; the row's scales follow, the pools are padded past the last row).
    uint64_t w0, w1;
    std::memcpy(&w0, p, 8);
    std::memcpy(&w1, p + B, 8);
    const __m512i sh = _mm512_setr_epi64(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
    const __m256i lo = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(_mm512_set1_epi64(int64_t(w0)), sh));
    const __m256i hi = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(_mm512_set1_epi64(int64_t(w1)), sh));
    return _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi32((1 << B) - 1));
  }
}

// Per-key f16 fields of the 16 rows (at byte offset `off` of each row) as 16 float lanes.
ARBOR_AVX512_INLINE __m512 gather_f16(const uint8_t* const* rows, int64_t off) {
  alignas(32) uint16_t h[16];
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) std::memcpy(&h[c], rows[c] + off, 2);
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h)));
}

// Key tile: the 16 rows kr[] dequantized and transposed, Kt[d][c] = key c, element d. The codes are
// transposed as int32 lanes, then each Kt row is one group's codes of the 16 keys, so the group's scales
// and biases (zero points) are two vectors over the keys: code * scale + bias (affine), (code + zero) *
// scale (TurboQuant keys, exactly as the reference decodes them).
template <int B, KVCodecKind KIND>
ARBOR_AVX512 void key_tile(const uint8_t* const* kr, int64_t hd, int64_t group, float* Kt, float*, float*) {
  const int64_t G = hd / group, code_bytes = hd * B / 8;
  __m512 S = _mm512_setzero_ps(), Z = _mm512_setzero_ps();
  for (int64_t d0 = 0; d0 < hd / 16; ++d0) {
    if ((d0 * 16) % group == 0) {
      const int64_t gi = d0 * 16 / group;
      S = gather_f16(kr, code_bytes + 2 * gi), Z = gather_f16(kr, code_bytes + 2 * G + 2 * gi);
    }
    __m512i r[16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; ++c) r[c] = codes16<B, KIND == KVCodecKind::TurboKey && B == 8>(kr[c], d0);
    transpose16x16_epi32(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      const __m512 x = _mm512_cvtepi32_ps(r[i]);
      _mm512_store_ps(Kt + (16 * d0 + i) * 16, KIND == KVCodecKind::Affine ? _mm512_fmadd_ps(x, S, Z) : _mm512_mul_ps(_mm512_add_ps(x, Z), S));
    }
  }
}

// Value tile, undequantized: Vc[c][d] = value row c's code d as a float (affine) or its Lloyd-Max
// centroid (TurboQuant, rotated domain); Sv[g][c] / Bv[g][c] = row c's scale / bias of group g. The
// kernel folds the scale into the probabilities (p_c * s_cg) and the bias into one sum per group
// (Σ_c p_c b_cg), so a value element costs one FMA per query row and nothing to dequantize.
template <int B, KVCodecKind KIND>
ARBOR_AVX512 void value_tile(const uint8_t* const* vr, int64_t hd, int64_t group, float* Vc, float* Sv, float* Bv) {
  const int64_t G = hd / group, code_bytes = hd * B / 8;
  __m512 cent = _mm512_setzero_ps();
  if constexpr (KIND == KVCodecKind::TurboValue) {
    alignas(64) float t[16] = {};
    std::memcpy(t, lloyd_max_centroids(B), sizeof(float) << B);
    cent = _mm512_load_ps(t);
  }
  for (int c = 0; c < 16; ++c) {
    const uint8_t* row = vr[c];
    float* dst = Vc + c * hd;
    for (int64_t d0 = 0; d0 < hd / 16; ++d0) {
      const __m512i q = codes16<B, false>(row, d0);
      _mm512_store_ps(dst + 16 * d0, KIND == KVCodecKind::TurboValue ? _mm512_permutexvar_ps(q, cent) : _mm512_cvtepi32_ps(q));
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    _mm512_store_ps(Sv + 16 * g, gather_f16(vr, code_bytes + 2 * g));
    if constexpr (KIND == KVCodecKind::Affine) _mm512_store_ps(Bv + 16 * g, gather_f16(vr, code_bytes + 2 * G + 2 * g));
  }
}

using TileFn = void (*)(const uint8_t* const*, int64_t, int64_t, float*, float*, float*);

template <KVCodecKind KIND, bool KEY, int B>
TileFn tile_at() {
  if constexpr (KEY) return key_tile<B, KIND>;
  else if constexpr (KIND == KVCodecKind::TurboValue && B > 4) return nullptr;  // no centroid table
  else return value_tile<B, KIND>;
}

template <KVCodecKind KIND, bool KEY>
TileFn tile_for_bits(int bits) {
  switch (bits) {
    case 2: return tile_at<KIND, KEY, 2>();
    case 3: return tile_at<KIND, KEY, 3>();
    case 4: return tile_at<KIND, KEY, 4>();
    case 5: return tile_at<KIND, KEY, 5>();
    case 6: return tile_at<KIND, KEY, 6>();
    case 7: return tile_at<KIND, KEY, 7>();
    case 8: return tile_at<KIND, KEY, 8>();
    default: return nullptr;
  }
}

TileFn key_tile_fn(const KVCodec& c) {
  if (c.kind == KVCodecKind::Affine) return tile_for_bits<KVCodecKind::Affine, true>(c.bits);
  if (c.kind == KVCodecKind::TurboKey) return tile_for_bits<KVCodecKind::TurboKey, true>(c.bits);
  return nullptr;
}
TileFn value_tile_fn(const KVCodec& c) {
  if (c.kind == KVCodecKind::Affine) return tile_for_bits<KVCodecKind::Affine, false>(c.bits);
  if (c.kind == KVCodecKind::TurboValue) return tile_for_bits<KVCodecKind::TurboValue, false>(c.bits);
  return nullptr;
}

// O[row][64 dims at d] = O * corr[row] + Σ_c P[row][c] Vc[c][d..] + bias, for ROWS (1 or 2) rows at
// once (8 independent accumulators; each Vc vector loaded once for both rows). pa / pb: the row's
// scaled probabilities of the groups holding dims d..d+31 and d+32..d+63; ba / bb their bias sums.
template <int ROWS>
ARBOR_AVX512_INLINE void pv_slab(float* const* orow, const float* const* pa, const float* const* pb, const float* ba, const float* bb,
                                 const float* corr, const float* Vc, int64_t hd, int64_t d) {
  __m512 acc[ROWS][4];
#pragma GCC unroll 2
  for (int r = 0; r < ROWS; ++r) {
    const __m512 vc = _mm512_set1_ps(corr[r]), va = _mm512_set1_ps(ba[r]), vb = _mm512_set1_ps(bb[r]);
    acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(orow[r] + d), vc, va);
    acc[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(orow[r] + d + 16), vc, va);
    acc[r][2] = _mm512_fmadd_ps(_mm512_loadu_ps(orow[r] + d + 32), vc, vb);
    acc[r][3] = _mm512_fmadd_ps(_mm512_loadu_ps(orow[r] + d + 48), vc, vb);
  }
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) {
    const float* v = Vc + c * hd + d;
    const __m512 v0 = _mm512_load_ps(v), v1 = _mm512_load_ps(v + 16), v2 = _mm512_load_ps(v + 32), v3 = _mm512_load_ps(v + 48);
#pragma GCC unroll 2
    for (int r = 0; r < ROWS; ++r) {
      const __m512 a = _mm512_set1_ps(pa[r][c]), b = _mm512_set1_ps(pb[r][c]);
      acc[r][0] = _mm512_fmadd_ps(a, v0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, v1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(b, v2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(b, v3, acc[r][3]);
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(orow[r] + d + 16 * k, acc[r][k]);
}

// Scratch, in floats (every offset a multiple of 16): O [R][hd], M, L, C [R], P [R][Gv][16] (the
// block's probabilities times each value group's scales), Bs [R][Gv] (bias sums, padded to 16), Kt
// [hd][16], Vc [16][hd], Sv and Bv [Gv][16]; R = 16 tokens x 8 heads, Gv up to hd / 16.
struct Scratch {
  float *O, *M, *L, *C, *P, *Bs, *Kt, *Vc, *Sv, *Bv;
};
constexpr int64_t kRows = kRun * kMaxGroup;
int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

Scratch carve(float* s, int64_t hd) {
  const int64_t gmax = hd / 16;
  Scratch x;
  x.O = s;
  x.M = x.O + kRows * hd;
  x.L = x.M + kRows;
  x.C = x.L + kRows;
  x.P = x.C + kRows;
  x.Bs = x.P + kRows * gmax * 16;
  x.Kt = x.Bs + pad16(kRows * gmax);
  x.Vc = x.Kt + hd * 16;
  x.Sv = x.Vc + 16 * hd;
  x.Bv = x.Sv + gmax * 16;
  return x;
}
int64_t scratch_floats(int64_t hd) {
  const int64_t gmax = hd / 16;
  return kRows * hd + 3 * kRows + kRows * gmax * 16 + pad16(kRows * gmax) + 2 * hd * 16 + 2 * gmax * 16;
}

// kv heads g0 .. g1 - 1 of one run, each block of 16 key positions visited once for all of them: a
// slot holds the n_kv_heads rows of a position side by side, so the heads of one call read one
// contiguous span per position (a call per head would read each cache line that two heads' rows share
// twice, and the spans n_kv_heads rows apart defeat the hardware prefetch).
ARBOR_AVX512 void coded_kernel(const AttnCodedArgs& a, TileFn ktile, TileFn vtile, int64_t t0, int64_t nt, int64_t pos0,
                               const int32_t* table, int64_t g0, int64_t g1, float* scratch) {
  const int64_t hd = a.hd, G = a.n_heads / a.n_kv_heads, R = nt * G, qrow = a.n_heads * hd, H = a.n_kv_heads, NH = g1 - g0;
  const int64_t vgroup = a.vc.group, Gv = hd / vgroup;
  const bool vbias = a.vc.kind == KVCodecKind::Affine;
  const Scratch sc = carve(scratch, hd);
  // State row x = head (g - g0) * R + row, row = token i * G + query head of the group.
  for (int64_t x = 0; x < NH * R; ++x) {
    std::fill(sc.O + x * hd, sc.O + (x + 1) * hd, 0.0f);
    sc.M[x] = -INFINITY, sc.L[x] = 0.0f;
  }
  const int64_t last = pos0 + nt - 1;
  const int64_t lo_all = a.window > 0 ? std::max<int64_t>(0, pos0 - a.window + 1) : 0;
  const __m512 scale = _mm512_set1_ps(a.scale);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Slot of each position of the block at j0 (-1: masked for every row, reads the zero row).
  auto slots_at = [&](int64_t j0, int64_t* slot) {
    for (int c = 0; c < 16; ++c) {
      const int64_t kp = j0 + c;
      slot[c] = kp > last || kp < lo_all ? -1 : int64_t(table[kp / a.bs]) * a.bs + kp % a.bs;
    }
  };
  int64_t slot[16], next[16];
  int64_t j0 = lo_all / 16 * 16;
  if (j0 <= last) slots_at(j0, slot);
  for (; j0 <= last; j0 += 16) {
    // The next block's spans, prefetched while this one is computed.
    if (j0 + 16 <= last) {
      slots_at(j0 + 16, next);
      for (int c = 0; c < 16; ++c) {
        if (next[c] < 0) continue;
        const char* k0 = reinterpret_cast<const char*>(a.K + (next[c] * H + g0) * a.kb);
        const char* v0 = reinterpret_cast<const char*>(a.V + (next[c] * H + g0) * a.vb);
        for (int64_t o = 0; o < NH * a.kb + 63; o += 64) _mm_prefetch(k0 + std::min(o, NH * a.kb - 1), _MM_HINT_T0);
        for (int64_t o = 0; o < NH * a.vb + 63; o += 64) _mm_prefetch(v0 + std::min(o, NH * a.vb - 1), _MM_HINT_T0);
      }
    }
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t *kr[16], *vr[16];
      for (int c = 0; c < 16; ++c) {
        kr[c] = slot[c] < 0 ? kZeroRow : a.K + (slot[c] * H + g) * a.kb;
        vr[c] = slot[c] < 0 ? kZeroRow : a.V + (slot[c] * H + g) * a.vb;
      }
      ktile(kr, hd, a.kc.group, sc.Kt, nullptr, nullptr);
      vtile(vr, hd, vgroup, sc.Vc, sc.Sv, sc.Bv);
      const int64_t x0 = (g - g0) * R;  // this head's first state row
      for (int64_t row = 0; row < R; ++row) {
        const int64_t x = x0 + row, i = row / G, h = g * G + row % G;
        const int64_t pos = pos0 + i;
        const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
        float* prow = sc.P + x * Gv * 16;
        if (j0 > pos || j0 + 15 < lo) {  // every key of this block is masked for this row: O unchanged
          for (int64_t gv = 0; gv < Gv; ++gv) _mm512_store_ps(prow + gv * 16, _mm512_setzero_ps()), sc.Bs[x * Gv + gv] = 0.0f;
          sc.C[x] = 1.0f;
          continue;
        }
        const float* qr = a.q + (t0 + i) * qrow + h * hd;
        __m512 s4[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t d = 0; d < hd; d += 4) {
          s4[0] = _mm512_fmadd_ps(_mm512_set1_ps(qr[d]), _mm512_load_ps(sc.Kt + d * 16), s4[0]);
          s4[1] = _mm512_fmadd_ps(_mm512_set1_ps(qr[d + 1]), _mm512_load_ps(sc.Kt + (d + 1) * 16), s4[1]);
          s4[2] = _mm512_fmadd_ps(_mm512_set1_ps(qr[d + 2]), _mm512_load_ps(sc.Kt + (d + 2) * 16), s4[2]);
          s4[3] = _mm512_fmadd_ps(_mm512_set1_ps(qr[d + 3]), _mm512_load_ps(sc.Kt + (d + 3) * 16), s4[3]);
        }
        __m512 s = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(s4[0], s4[1]), _mm512_add_ps(s4[2], s4[3])), scale);
        if (a.softcap > 0) {
          alignas(64) float t[16];
          _mm512_store_ps(t, s);
          for (float& v : t) v = a.softcap * std::tanh(v / a.softcap);
          s = _mm512_load_ps(t);
        }
        // Key j0 + c is visible iff lo <= j0 + c <= pos.
        const __m512i kpos = _mm512_add_epi32(lane, _mm512_set1_epi32(int(j0)));
        const __mmask16 vis = _mm512_cmple_epi32_mask(kpos, _mm512_set1_epi32(int(pos))) &
                              _mm512_cmpge_epi32_mask(kpos, _mm512_set1_epi32(int(lo)));
        s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis, s);
        const float m_new = std::max(sc.M[x], _mm512_reduce_max_ps(s));
        const __m512 p = _mm512_maskz_mov_ps(vis, exp_nonpos(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
        // 0 on the row's first visible block; 1 (no libm call) while the running max holds.
        const float corr = m_new == sc.M[x] ? 1.0f : std::exp(sc.M[x] - m_new);
        sc.L[x] = sc.L[x] * corr + _mm512_reduce_add_ps(p);
        sc.M[x] = m_new;
        sc.C[x] = corr;
        for (int64_t gv = 0; gv < Gv; ++gv) {
          _mm512_store_ps(prow + gv * 16, _mm512_mul_ps(p, _mm512_load_ps(sc.Sv + gv * 16)));
          sc.Bs[x * Gv + gv] = vbias ? _mm512_reduce_add_ps(_mm512_mul_ps(p, _mm512_load_ps(sc.Bv + gv * 16))) : 0.0f;
        }
      }
      for (int64_t d = 0; d < hd; d += 64) {
        const int64_t ga = d / vgroup, gb = (d + 32) / vgroup;
        int64_t x = x0;
        for (; x + 1 < x0 + R; x += 2) {
          float* const o[2] = {sc.O + x * hd, sc.O + (x + 1) * hd};
          const float* const pa[2] = {sc.P + (x * Gv + ga) * 16, sc.P + ((x + 1) * Gv + ga) * 16};
          const float* const pb[2] = {sc.P + (x * Gv + gb) * 16, sc.P + ((x + 1) * Gv + gb) * 16};
          const float ba[2] = {sc.Bs[x * Gv + ga], sc.Bs[(x + 1) * Gv + ga]};
          const float bb[2] = {sc.Bs[x * Gv + gb], sc.Bs[(x + 1) * Gv + gb]};
          pv_slab<2>(o, pa, pb, ba, bb, sc.C + x, sc.Vc, hd, d);
        }
        if (x < x0 + R) {
          float* const o[1] = {sc.O + x * hd};
          const float* const pa[1] = {sc.P + (x * Gv + ga) * 16};
          const float* const pb[1] = {sc.P + (x * Gv + gb) * 16};
          const float ba[1] = {sc.Bs[x * Gv + ga]}, bb[1] = {sc.Bs[x * Gv + gb]};
          pv_slab<1>(o, pa, pb, ba, bb, sc.C + x, sc.Vc, hd, d);
        }
      }
    }
    if (j0 + 16 <= last) std::copy(next, next + 16, slot);
  }
  const bool rotated = a.vc.kind == KVCodecKind::TurboValue;
  for (int64_t x = 0; x < NH * R; ++x) {
    const int64_t g = g0 + x / R, row = x % R, i = row / G, h = g * G + row % G;
    float* o = a.out + (t0 + i) * qrow + h * hd;
    const __m512 inv = _mm512_set1_ps(1.0f / sc.L[x]);
    for (int64_t d = 0; d < hd; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(sc.O + x * hd + d), inv));
    if (rotated) turbo_unrotate(o, hd, o);  // Σ p_j R⁻¹y_j = R⁻¹ Σ p_j y_j: once per output row
  }
}

}  // namespace

bool attention_coded_applies(const KVCodecPair& c, int64_t hd, int64_t group) {
  return cpu_features().avx512 && !c.k.plain() && !c.v.plain() && key_tile_fn(c.k) && value_tile_fn(c.v) && hd % 64 == 0 &&
         hd >= 64 && hd <= kMaxHd && hd % c.k.group == 0 && hd % c.v.group == 0 && c.k.group % 16 == 0 && c.v.group % 32 == 0 &&
         group >= 1 && group <= kMaxGroup;
}

int64_t attention_coded_scratch_floats(int64_t hd, int64_t group) {
  (void)group;
  return scratch_floats(hd);
}

int64_t attention_coded_max_heads(int64_t nt, int64_t group) { return std::max<int64_t>(1, kRows / std::max<int64_t>(1, nt * group)); }

void attention_coded(const AttnCodedArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table, int64_t g0, int64_t g1,
                     float* scratch) {
  const int64_t G = a.n_kv_heads > 0 ? a.n_heads / a.n_kv_heads : 0;
  ARBOR_CHECK(attention_coded_applies({a.kc, a.vc}, a.hd, G) && a.n_heads == G * a.n_kv_heads && nt >= 1 && nt <= kRun && g0 >= 0 &&
                  g0 < g1 && g1 <= a.n_kv_heads && (g1 - g0) * nt * G <= kRows && pos0 >= 0 && a.kb == a.kc.row_bytes(a.hd, 4) &&
                  a.vb == a.vc.row_bytes(a.hd, 4),
              "attention_coded: unsupported call (codec {}, hd {}, heads {}/{}, rows {}, kv heads {}..{}, pos {})",
              KVCodecPair{a.kc, a.vc}.name(), a.hd, a.n_heads, a.n_kv_heads, nt, g0, g1 - 1, pos0);
  coded_kernel(a, key_tile_fn(a.kc), value_tile_fn(a.vc), t0, nt, pos0, table, g0, g1, scratch);
}

}  // namespace arbor::cpu
