// Pieces both prefill attention files share (attention_prefill.cu: mma.sync kernels,
// attention_prefill_wgmma.cu: the wgmma kernels): what a block works on, base-2 exponentials, bf16
// packing (mma_sync.h: ldmatrix and mma.sync). Device code: include from .cu files only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cp_async.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_sync.h"

namespace arbor::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// 2^x in one MUFU op (2^-inf = 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// What a prefill block works on: the tile (block order: kv heads fastest, tiles last to first) and
// the key range it may need; load_q copies its Q rows (padding rows zero-filled) into shared memory
// as the first cp.async group. Shared by every prefill kernel.
template <int D>
struct PrefillBlock {
  int g, G;
  int32_t tok0, ntok, kv_lo, kv_hi;
  int64_t qrow, kvrow;
  const int32_t* table;
  __device__ __forceinline__ PrefillBlock(const AttnArgs& a, const int32_t* tiles) {
    const unsigned lin = blockIdx.y * gridDim.x + blockIdx.x;
    g = int(lin % gridDim.y);
    const int32_t* tile = tiles + int64_t(gridDim.x - 1 - lin / gridDim.y) * 8;
    tok0 = tile[0], ntok = tile[1];
    const int32_t seq = tile[2], min_pos = tile[3], max_pos = tile[4];
    G = a.n_heads / a.n_kv_heads;
    qrow = int64_t(a.n_heads) * D, kvrow = int64_t(a.n_kv_heads) * D;
    table = a.block_tables + int64_t(seq) * a.max_blocks;
    kv_lo = a.window > 0 ? max(0, min_pos - a.window + 1) : 0, kv_hi = max_pos + 1;
  }
  // Q row r's 16-byte chunk c goes to shared address dst(r, c).
  template <int THREADS, class Dst>
  __device__ __forceinline__ void load_q(const AttnArgs& a, Dst dst) const {
#pragma unroll
    for (int i = 0; i < kPrefillRows * (D / 8) / THREADS; ++i) {
      const int idx = threadIdx.x + i * THREADS, r = idx / (D / 8), c = idx % (D / 8), ti = r / G, hi = r % G;
      const bool ok = ti < ntok;
      const uint16_t* src = ok ? a.q + int64_t(tok0 + ti) * qrow + int64_t(g * G + hi) * D + c * 8 : a.q;
      cp_async16_zfill(dst(r, c), src, ok);
    }
    cp_async_commit();
  }
};

}  // namespace arbor::cuda
