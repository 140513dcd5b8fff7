// Device helpers for coded KV rows (quant/kv_codec.h's layout: codes as a little-endian bit stream,
// then G f16 scales, then G f16 biases / zero points), with a head row held 8 dims per lane over
// LPK = head_dim / 8 lanes as in qk_rows.h: a lane's 8 codes are b whole bytes at byte 8 sl * b / 8
// = sl * b of the row. The encoder reproduces kv_encode_row's float arithmetic operation by operation
// (IEEE division and square root, round-to-nearest-even f16, the same FWHT butterflies in the same
// order, the same double sum of squares), so the codes and scales are bit-identical to the reference's
// on the same (bf16) inputs; tests/cuda/kv_codec_cuda_test.cpp checks it. Device code: include from
// .cu files only.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace arbor::cuda {

// Lloyd-Max centroids of a unit Gaussian (2, 3, 4 bits), ascending: the same numbers as
// kv_codec.cpp's tables (the encode test fails if they differ).
__device__ __constant__ const float kLloydMax[3][16] = {
    {-1.510418f, -0.452780f, 0.452780f, 1.510418f},
    {-2.151946f, -1.343909f, -0.756005f, -0.245094f, 0.245094f, 0.756005f, 1.343909f, 2.151946f},
    {-2.732590f, -2.069017f, -1.618046f, -1.256231f, -0.942340f, -0.656759f, -0.388048f, -0.128395f, 0.128395f, 0.388048f,
     0.656759f, 0.942340f, 1.256231f, 1.618046f, 2.069017f, 2.732590f}};

// TurboQuant's fixed sign of dim i (kv_codec.cpp's turbo_signs: the top bit of output i of
// splitmix64 from seed "turbquat"; splitmix64's output i mixes seed + (i + 1) * golden).
__device__ __forceinline__ float turbo_sign(int i) {
  uint64_t z = 0x7475726271756174ull + uint64_t(i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (z >> 63) ? -1.0f : 1.0f;
}

__device__ __forceinline__ uint16_t f16_bits(float f) {  // kv_codec.cpp's to_f16: clamp to +-65504, round to nearest even
  return __half_as_ushort(__float2half_rn(fminf(fmaxf(f, -65504.0f), 65504.0f)));
}
__device__ __forceinline__ float f16_value(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Writes bytes [0, n) of w (little-endian) to p (any alignment).
__device__ __forceinline__ void store_bytes(uint8_t* p, uint64_t w, int n) {
  for (int i = 0; i < n; ++i) p[i] = uint8_t(w >> (8 * i));
}

// A lane's share of a coded row: its 8 codes (code e at bit e * b) and its group's f16 scale and bias /
// zero point (0 for TurboQuant values), as the decode kernel loads them.
struct CodedRow8 {
  uint64_t codes;
  uint16_t s, z;
};

// Encodes one head row of D = 8 LPK values held 8 per lane (lane sub-index sl; the row's lanes are
// LPK consecutive lanes of the warp, LPK >= 4) into `row` (row_bytes of c; zero bytes need not be
// zeroed first: every byte is written), and returns the lane's share. Every lane of the warp must call
// it (shuffles); lanes with write false take part without storing.
template <int LPK>
__device__ CodedRow8 encode_row8(const KVCodecDev& c, const float* x, int sl, uint8_t* row, bool write) {
  constexpr int D = LPK * 8;
  const int bits = c.bits, code_bytes = D * bits / 8, G = D / c.group;
  const int lpg = c.group / 8;  // lanes per group: 8 (affine, 64) or 4 (TurboQuant, 32)
  const int grp = sl / lpg;
  uint8_t* scales = row + code_bytes;
  uint8_t* zeros = scales + 2 * G;
  const int maxq = (1 << bits) - 1;
  uint64_t codes = 0;
  if (c.kind == int(KVCodecKind::TurboValue)) {
    // y = FWHT(x * s) / sqrt(D): butterflies h = 1, 2, 4 inside the lane, then h = 8, 16, ... across lanes
    // (partner lane sl ^ (h / 8)), in the reference's order; the same a + b / a - b for every element.
    float y[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = x[e] * turbo_sign(sl * 8 + e);
#pragma unroll
    for (int h = 1; h < 8; h *= 2)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (!(e & h)) {
          const float a = y[e], b = y[e + h];
          y[e] = a + b, y[e + h] = a - b;
        }
#pragma unroll
    for (int m = 1; m < LPK; m *= 2) {
      const bool upper = sl & m;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float o = __shfl_xor_sync(0xffffffffu, y[e], m);
        y[e] = upper ? o - y[e] : y[e] + o;  // lower: a + b; upper: a - b with a the lower lane's
      }
    }
    const float inv = 1.0f / sqrtf(float(D));
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] *= inv;
    // sqrt(mean(y^2)) over the group of 32 (4 lanes), the double sum in element order as the reference:
    // lane k of the group adds its 8 squares to the running sum of lanes 0..k-1.
    double ss = 0;
    const int lane = threadIdx.x % 32, g0 = lane - sl % 4;
    for (int k = 0; k < 4; ++k) {
      double mine = ss;
#pragma unroll
      for (int e = 0; e < 8; ++e) mine += double(y[e]) * y[e];
      ss = __shfl_sync(0xffffffffu, mine, g0 + k);
    }
    const uint16_t sh = f16_bits(float(sqrt(ss / 32.0)));
    const float inv_s = 1.0f / (f16_value(sh) + 1e-8f);
    const float* cent = kLloydMax[bits - 2];
    const int n = 1 << bits;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float u = y[e] * inv_s;
      int q = 0;
      for (int k = 0; k + 1 < n; ++k) q += u >= 0.5f * (cent[k] + cent[k + 1]);
      codes |= uint64_t(q) << (e * bits);
    }
    if (write && sl % 4 == 0) store_bytes(scales + 2 * grp, sh, 2);
    if (write) store_bytes(row + sl * bits, codes, bits);
    return {codes, sh, 0};
  } else {
    // The group's min and max as the reference's std::min / std::max loop finds them: on equal values
    // (only -0 against +0 can differ) the first in element order stays, so ties go to the lower lane.
    float mn = x[0], mx = x[0];
#pragma unroll
    for (int e = 1; e < 8; ++e) mn = x[e] < mn ? x[e] : mn, mx = mx < x[e] ? x[e] : mx;
    int mn_at = sl, mx_at = sl;
    for (int m = 1; m < lpg; m *= 2) {
      const float on = __shfl_xor_sync(0xffffffffu, mn, m), ox = __shfl_xor_sync(0xffffffffu, mx, m);
      const int on_at = __shfl_xor_sync(0xffffffffu, mn_at, m), ox_at = __shfl_xor_sync(0xffffffffu, mx_at, m);
      if (on < mn || (on == mn && on_at < mn_at)) mn = on, mn_at = on_at;
      if (mx < ox || (ox == mx && ox_at < mx_at)) mx = ox, mx_at = ox_at;
    }
    uint16_t sh = 0, zh = 0;
    if (c.kind == int(KVCodecKind::Affine)) {
      const bool neg_edge = fabsf(mn) > fabsf(mx);
      float scale = fmaxf(__fdiv_rn(mx - mn, float(maxq)), 1e-7f);
      if (!neg_edge) scale = -scale;
      const float edge = neg_edge ? mn : mx;
      const float q0 = rintf(__fdiv_rn(edge, scale));
      if (q0 != 0) scale = __fdiv_rn(edge, q0);
      sh = f16_bits(scale), zh = f16_bits(q0 == 0 ? 0.0f : edge);
      const float s = f16_value(sh), b = f16_value(zh);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float q = s == 0 ? 0.0f : fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(x[e], b), s)), 0.0f), float(maxq));
        codes |= uint64_t(uint32_t(q)) << (e * bits);
      }
    } else {  // TurboKey
      const bool sign8 = bits == 8;
      const float centre = sign8 ? __fmul_rn(0.5f, __fadd_rn(mx, mn)) : mn;
      sh = f16_bits(fmaxf(__fdiv_rn(mx - mn, sign8 ? 254.0f : float(maxq)), __fdiv_rn(fabsf(centre), 1024.0f)));
      const float s = f16_value(sh);
      const float zero = s == 0 ? 0.0f : rintf(__fdiv_rn(centre, s));
      zh = f16_bits(zero);
      const float lo = sign8 ? -127.0f : 0.0f, hi = sign8 ? 127.0f : float(maxq);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float q = s == 0 ? 0.0f : fminf(fmaxf(rintf(__fsub_rn(__fdiv_rn(x[e], s), zero)), lo), hi);
        const uint32_t u = sign8 ? uint32_t(uint8_t(int8_t(q))) : uint32_t(q);
        codes |= uint64_t(u) << (e * bits);
      }
    }
    if (write && sl % lpg == 0) store_bytes(scales + 2 * grp, sh, 2), store_bytes(zeros + 2 * grp, zh, 2);
    if (write) store_bytes(row + sl * bits, codes, bits);
    return {codes, sh, zh};
  }
}

// The 8 codes of lane sl (b bits each, the b bytes at byte sl * b of the row) as one 64-bit word,
// code e at bit e * b. Rows are 4-byte aligned (their sizes are multiples of 4); a 3-bit lane's
// bytes may straddle words (pools carry 16 bytes of padding past the last row).
template <int BITS>
__device__ __forceinline__ uint64_t load_codes(const uint8_t* row, int sl, int bits) {
  if (BITS == 8) {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(row + sl * 8);
    return uint64_t(p[0]) | uint64_t(p[1]) << 32;
  }
  if (BITS == 4) return *reinterpret_cast<const uint32_t*>(row + sl * 4);
  if (BITS == 2) return *reinterpret_cast<const uint16_t*>(row + sl * 2);
  const int b = BITS > 0 ? BITS : bits;
  const int start = sl * b, sh = (start & 3) * 8;
  const uint32_t* p = reinterpret_cast<const uint32_t*>(row + (start & ~3));
  const uint32_t w0 = p[0], w1 = p[1];
  const uint32_t w2 = (start & 3) + b > 8 ? p[2] : 0u;
  return uint64_t(__funnelshift_r(w0, w1, sh)) | uint64_t(__funnelshift_r(w1, w2, sh)) << 32;
}

__device__ __forceinline__ uint32_t code_at(uint64_t w, int e, int bits) { return uint32_t(w >> (e * bits)) & ((1u << bits) - 1u); }

}  // namespace arbor::cuda
