// Device helpers for bf16 rows held 8 dims (16 bytes) per lane, a row of head_dim D over D/8 lanes
// side by side: unpack/pack, and the per-head q/k norm + rope of the q/k prep on such a row. Used by
// the q/k prep kernel (elementwise.cu) and the decode-attention kernel that does the prep inside
// (attention_decode.cu). Device code: include from .cu files only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace arbor::cuda {

__device__ __forceinline__ void unpack8(const uint4& q, float* f) {
  const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

// The constants a lane's 8 dims of a q or k head row need for the prep: the norm weight (already
// (1 + w) for Gemma; has_norm false: no norm) and the rope cos/sin at the row's position (rot false:
// this lane's dims are not rotated, or no rope). They depend on nothing a previous kernel writes, so
// the decode-attention kernel loads them before waiting on it.
struct PrepRow {
  bool has_norm = false, rot = false;
  float w[8], c[8], s[8];
};

// Loads the weights of norm nw (null: none) and the cos/sin of table row `row` (the token's position,
// or its rope_rows entry) for lane sub-index sl.
template <int LPK>
__device__ __forceinline__ void load_prep_row(const QKPrepArgs& pa, const float* nw, int32_t row, int sl, PrepRow& r) {
  r.has_norm = nw != nullptr;
  if (nw)
#pragma unroll
    for (int e = 0; e < 8; ++e) r.w[e] = pa.plus_one ? 1.0f + nw[sl * 8 + e] : nw[sl * 8 + e];
  const int hl = pa.half / 8;
  r.rot = pa.cos && sl < 2 * hl;
  if (r.rot) {
    const int64_t c0 = int64_t(row) * pa.half + (sl < hl ? sl : sl - hl) * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) r.c[e] = pa.cos[c0 + e], r.s[e] = pa.sin[c0 + e];
  }
}

// f: the 8 dims [8 sl, 8 sl + 8) of one q or k head row held by this lane, the row's other dims by the
// LPK - 1 lanes beside it (LPK a power of two). Applies the per-head norm and rope of r (pa.half % 8
// == 0) in place, rounding to bf16 after each as the separate head_norm and rope ops store. Every
// lane of the warp must call it (shuffles).
template <int LPK>
__device__ __forceinline__ void prep_row(const QKPrepArgs& pa, const PrepRow& r, int lane, int sl, float* f) {
  constexpr int D = LPK * 8;
  if (r.has_norm) {
    float ss = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += f[e] * f[e];
#pragma unroll
    for (int o = LPK / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / float(D) + pa.eps);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = round_bf16(f[e] * inv * r.w[e]);
  }
  if (pa.cos) {
    // Rotated dims [0, 2 half): dim j pairs with j +- half, which is 8 dims per lane away by half / 8
    // lanes (the launcher requires half % 8 == 0).
    const int hl = pa.half / 8;
    const bool first = sl < hl;
    const int partner = lane - sl + (!r.rot ? sl : first ? sl + hl : sl - hl);
    float other[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) other[e] = __shfl_sync(0xffffffffu, f[e], partner);
    if (r.rot)
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = first ? f[e] * r.c[e] - other[e] * r.s[e] : f[e] * r.c[e] + other[e] * r.s[e];
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = round_bf16(f[e]);
}

__device__ __forceinline__ uint4 pack8(const float* f) {
  uint32_t u[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) u[i] = uint32_t(__bfloat16_as_ushort(__float2bfloat16(f[2 * i]))) |
                                     uint32_t(__bfloat16_as_ushort(__float2bfloat16(f[2 * i + 1]))) << 16;
  return make_uint4(u[0], u[1], u[2], u[3]);
}

}  // namespace arbor::cuda
