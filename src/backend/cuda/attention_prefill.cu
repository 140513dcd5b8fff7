// Flash attention for prefill over the paged bf16 KV cache, on tensor cores (mma.sync m16n8k16,
// bf16 in, f32 accumulators), with online softmax in base 2 (exp2, the scale folded with log2 e).
// A block owns kPrefillRows (128) query rows = (tokens of one sequence) x (the query heads of one GQA
// group), so the group shares every K/V tile it loads. Two kernels here (Hopper's wgmma kernel, the
// default where it runs, is in attention_prefill_wgmma.cu; set_prefill_kernel and
// ARBOR_CUDA_ATTN_PREFILL pick): the 16-row kernel, 8 warps of 16 rows, Q fragments loaded once
// (into registers up to head_dim 128; head_dim 256 reads them from shared memory each tile), K/V
// tiles of 64 keys (32 at head_dim 256) double-buffered; and the 32-row kernel (head_dim 32-128; 256
// takes the 16-row kernel either way), 4 warps of 32 rows (two m16 tiles, so each K and V fragment
// feeds two mma's: half the shared-memory reads per FLOP), 2-4 blocks per SM, K/V tiles of 32 keys
// in three buffers, Q fragments in registers for one or both row tiles (the rest read from shared
// memory each tile). K and V fragments come through ldmatrix. K/V tiles are gathered block by block
// through the block table with cp.async, the next tiles' copies overlapping this tile's math. A warp
// skips tiles none of its rows can see and masks per element only on tiles some row sees in part
// (the causal diagonal, the window's edge). Blocks take the tiles last to first (the longest key
// ranges first under a causal mask), so the short ones fill the tail of the grid.
#include <cuda_bf16.h>

#include <climits>
#include <string>

#include "backend/cuda/attention_prefill.h"
#include "backend/cuda/cuda_check.h"

namespace arbor::cuda {

namespace {

constexpr int kRows = kPrefillRows;  // 128
constexpr int kWarps = kRows / 16;   // 16 rows per warp (one m16 tile)
constexpr int kThreads = kWarps * 32;
static_assert(kRows % 16 == 0, "prefill rows per tile come in m16 tiles, one per warp");

// D: head_dim; KT: keys per tile. Shared rows are padded by 8 elements (16 bytes) so the 8 rows an
// ldmatrix reads fall in distinct banks. K/V tiles are double-buffered and fetched with cp.async, the
// next tile's copy in flight while the tensor cores work on this one.
template <int D, int KT>
__global__ void __launch_bounds__(kThreads, (D <= 32 ? 2 : 1)) attn_prefill_kernel(AttnArgs a, const int32_t* tiles) {
  constexpr int LD = D + 8;
  constexpr bool kQRegs = D <= 128;  // Q fragments in registers (D/4 of them); 256 would spill
  constexpr int kChunks = KT * (D / 8) / kThreads;  // 16-byte K (and V) copies per thread per tile
  static_assert(D % 32 == 0 && KT % 16 == 0 && (KT * (D / 8)) % kThreads == 0 && (kRows * (D / 8)) % kThreads == 0,
                "prefill attention tile shape");
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* Qs = smem;                  // [kRows][LD]
  uint16_t* Ks = Qs + kRows * LD;       // [2][KT][LD]
  uint16_t* Vs = Ks + 2 * KT * LD;      // [2][KT][LD]

  const PrefillBlock<D> blk(a, tiles);
  const int g = blk.g, G = blk.G;
  const int32_t tok0 = blk.tok0, ntok = blk.ntok, kv_lo = blk.kv_lo, kv_hi = blk.kv_hi;
  const int64_t qrow = blk.qrow, kvrow = blk.kvrow;
  const int32_t* table = blk.table;
  blk.template load_q<kThreads>(a, [&](int r, int c) { return smem_addr(Qs + r * LD + c * 8); });

  // Copies K/V tile [kt, kt + KT) into buffer buf with cp.async (keys past kv_hi are zero-filled: V
  // rows of masked keys must be finite, P = 0 times them must stay 0). The slots are looked up first,
  // so the block-table reads overlap.
  auto fetch = [&](int buf, int32_t kt) {
    int64_t off[kChunks];
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int idx = threadIdx.x + i * kThreads, j = idx / (D / 8), c = idx % (D / 8);
      const int32_t kp = kt + j;
      off[i] = kp < kv_hi ? kv_slot(a, table, kp) * kvrow + int64_t(g) * D + c * 8 : -1;
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int idx = threadIdx.x + i * kThreads, j = idx / (D / 8), c = idx % (D / 8);
      const bool ok = off[i] >= 0;
      const int64_t o = ok ? off[i] : 0;
      cp_async16_zfill(smem_addr(Ks + (buf * KT + j) * LD + c * 8), a.k_pool + o, ok);
      cp_async16_zfill(smem_addr(Vs + (buf * KT + j) * LD + c * 8), a.v_pool + o, ok);
    }
  };
  if (kv_lo < kv_hi) fetch(0, kv_lo);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
  const int rA = warp * 16 + gq, rB = rA + 8;
  const bool validA = rA / G < ntok, validB = rB / G < ntok;
  const int32_t posA = validA ? a.pos[tok0 + rA / G] : -1, posB = validB ? a.pos[tok0 + rB / G] : -1;
  const int32_t loA = a.window > 0 ? posA - a.window + 1 : 0, loB = a.window > 0 ? posB - a.window + 1 : 0;
  // The warp's position range over its valid rows (none valid: wmax = -1, every tile skipped).
  const int32_t wmin = __reduce_min_sync(0xffffffffu, min(validA ? posA : INT_MAX, validB ? posB : INT_MAX));
  const int32_t wmax = __reduce_max_sync(0xffffffffu, max(posA, posB));
  // The lowest and the highest first visible key over those rows (0 without a window).
  const int32_t wlo_min = a.window > 0 ? wmin - (a.window - 1) : 0, wlo_max = a.window > 0 ? wmax - (a.window - 1) : 0;

  // Scores go to the exponent in base 2: without softcap the raw q.k is kept and scaled by
  // scale * log2 e inside the exp2 (one FFMA); with softcap the capped score s = cap tanh(scale q.k / cap)
  // is stored times log2 e and the exp2 factor is 1.
  const bool capped = a.softcap > 0;
  const float mul = capped ? 1.0f : a.scale * kLog2e;
  const float cap_l2 = a.softcap * kLog2e, inv_cap = capped ? 1.0f / a.softcap : 0.0f;

  // Per-lane ldmatrix offsets (bytes). Q/A fragment: lanes 0-15 rows 0-15 at column 0, lanes 16-31
  // rows 0-15 at column 8. K/B fragments (non-transposed, key-major tile): lanes 0-7 keys 0-7 dims
  // 0-7, 8-15 keys 0-7 dims 8-15, 16-23 keys 8-15 dims 0-7, 24-31 keys 8-15 dims 8-15 -> (b0, b1) of
  // key octet 0, then of key octet 1. V/B fragments (transposed): lanes 0-15 keys 0-15 at dim 0, 16-31
  // at dim 8 -> (b0, b1) of dim octet 0, then of dim octet 1.
  const uint32_t q_addr = smem_addr(Qs) + uint32_t(((warp * 16 + (lane & 15)) * LD + (lane >> 4) * 8) * 2);
  const uint32_t k_addr = smem_addr(Ks) + uint32_t((((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8) * 2);
  const uint32_t v_addr = smem_addr(Vs) + uint32_t(((lane & 15) * LD + (lane >> 4) * 8) * 2);

  cp_async_wait<1>();  // Q is in (the first K/V tile may still be in flight)
  __syncthreads();
  uint32_t q[kQRegs ? D / 16 : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(q_addr + kk * 32, q[kk][0], q[kk][1], q[kk][2], q[kk][3]);
  }

  float o[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;

  int step = 0;
  for (int32_t kt = kv_lo; kt < kv_hi; kt += KT, ++step) {
    const int buf = step & 1;
    cp_async_wait<0>();  // this step's tile (the only group in flight) is in, for this thread's copies
    __syncthreads();     // ... and every thread's; every warp is also done with the previous step's tile,
    // so its buffer can take the next one, copied while this one is worked on.
    if (kt + KT < kv_hi) fetch(buf ^ 1, kt + KT);
    cp_async_commit();

    // Warp-uniform: no row of the warp sees a key of the tile -> nothing to do (exactly what an
    // all-masked tile would give); every row sees every key -> no per-element mask.
    if (kt <= wmax && kt + KT - 1 >= wlo_min) {
      const bool full = kt + KT - 1 <= wmin && kt >= wlo_max;
      const uint32_t kc = k_addr + uint32_t(buf * KT * LD * 2), vc = v_addr + uint32_t(buf * KT * LD * 2);

      // S = Q Kᵀ for this warp's 16 rows and the tile's KT keys.
      float sc[KT / 8][4];
#pragma unroll
      for (int j = 0; j < KT / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a0, a1, a2, a3;
        if constexpr (kQRegs) {
          a0 = q[kk][0], a1 = q[kk][1], a2 = q[kk][2], a3 = q[kk][3];
        } else {
          ldsm_x4(q_addr + kk * 32, a0, a1, a2, a3);
        }
#pragma unroll
        for (int j = 0; j < KT / 8; j += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4(kc + uint32_t((j * 8 * LD + kk * 16) * 2), b0, b1, b2, b3);
          mma_bf16(sc[j], a0, a1, a2, a3, b0, b1);
          mma_bf16(sc[j + 1], a0, a1, a2, a3, b2, b3);
        }
      }

      // Softcap (applies to the scaled score, before the mask), mask (causal, window, padding rows)
      // on partly visible tiles, then the online softmax update.
      if (capped) {
#pragma unroll
        for (int j = 0; j < KT / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[j][e] = cap_l2 * tanhf(sc[j][e] * a.scale * inv_cap);
      }
      if (!full) {
#pragma unroll
        for (int j = 0; j < KT / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int32_t key = kt + j * 8 + 2 * tq + (e & 1);
            const bool ok = e < 2 ? (key >= loA && key <= posA) : (key >= loB && key <= posB);
            if (!ok) sc[j][e] = -INFINITY;
          }
      }
      float mxA = -INFINITY, mxB = -INFINITY;
#pragma unroll
      for (int j = 0; j < KT / 8; ++j) {
        mxA = fmaxf(mxA, fmaxf(sc[j][0], sc[j][1]));
        mxB = fmaxf(mxB, fmaxf(sc[j][2], sc[j][3]));
      }
#pragma unroll
      for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, o2));
        mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, o2));
      }
      const float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
      // Base-2 exponent offsets (0 while a row has seen no key: its p are all 0).
      const float bA = nA == -INFINITY ? 0.0f : nA * mul, bB = nB == -INFINITY ? 0.0f : nB * mul;
      const float cA = exp2_approx(mA * mul - bA), cB = exp2_approx(mB * mul - bB);
      mA = nA, mB = nB;
      float sA = 0.0f, sB = 0.0f;
#pragma unroll
      for (int j = 0; j < KT / 8; ++j) {
        sc[j][0] = exp2_approx(fmaf(sc[j][0], mul, -bA)), sc[j][1] = exp2_approx(fmaf(sc[j][1], mul, -bA));
        sc[j][2] = exp2_approx(fmaf(sc[j][2], mul, -bB)), sc[j][3] = exp2_approx(fmaf(sc[j][3], mul, -bB));
        sA += sc[j][0] + sc[j][1], sB += sc[j][2] + sc[j][3];
      }
      lA = lA * cA + sA, lB = lB * cB + sB;
#pragma unroll
      for (int d = 0; d < D / 8; ++d) o[d][0] *= cA, o[d][1] *= cA, o[d][2] *= cB, o[d][3] *= cB;

      // O += P V: P's accumulator layout is the A-fragment layout of the next mma (two key octets).
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk) {
        const uint32_t a0 = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), a1 = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
        const uint32_t a2 = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), a3 = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
        for (int d = 0; d < D / 8; d += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4_trans(vc + uint32_t((kk * 16 * LD + d * 8) * 2), b0, b1, b2, b3);
          mma_bf16(o[d], a0, a1, a2, a3, b0, b1);
          mma_bf16(o[d + 1], a0, a1, a2, a3, b2, b3);
        }
      }
    }
  }

#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    lA += __shfl_xor_sync(0xffffffffu, lA, o2);
    lB += __shfl_xor_sync(0xffffffffu, lB, o2);
  }
  const float iA = lA > 0 ? 1.0f / lA : 0.0f, iB = lB > 0 ? 1.0f / lB : 0.0f;
  uint16_t* outA = a.out + int64_t(tok0 + rA / G) * qrow + int64_t(g * G + rA % G) * D;
  uint16_t* outB = a.out + int64_t(tok0 + rB / G) * qrow + int64_t(g * G + rB % G) * D;
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    const int col = d * 8 + 2 * tq;
    if (validA) *reinterpret_cast<uint32_t*>(outA + col) = pack_bf16(o[d][0] * iA, o[d][1] * iA);
    if (validB) *reinterpret_cast<uint32_t*>(outB + col) = pack_bf16(o[d][2] * iB, o[d][3] * iB);
  }
}

// The 32-row kernel: each warp owns 32 query rows (two m16 row tiles), so every K and V fragment an
// ldmatrix brings feeds two mma's. Shared-memory reads per 64 keys for a block's 128 rows at head_dim
// 128: the 16-row kernel's 8 warps read the K and V tile (32 KB) each, 256 KB (~2048 clocks at 128
// B/clock) against 1024 mma's (~1024 clocks of tensor work); here 4 warps read K, V and one row tile's
// Q (40 KB) each, 160 KB, for the same 1024 mma's.
// Shape: the host builds tiles of kPrefillRows (128) rows, so a block is 4 warps (128 threads), with
// MinBlocks blocks per SM (2 at head_dim 96-128: 8 warps as in the 16-row kernel; 3 at 64, 4 at 32),
// one block's barrier and copy waits overlapping another's math (256 rows per block, 8 warps of 32,
// would need tiles of 256 rows). Registers (at most 255 a thread with 2 blocks of 128 threads): the
// output accumulators are D floats (128 at head_dim 128) and the scores KT. At head_dim 128, 64-key
// tiles spill (ptxas 13.0), whether Q comes from registers (64 more) or from shared memory; so KT =
// 32, and QRegs of the two row tiles keep their Q fragments in registers, the others read them from
// shared memory each tile (QRegs 1 at head_dim 96-128: 4 KB per warp per 32 keys, besides 16 KB of K
// and V). The shorter tiles get NBUF (3) buffers, two tiles' copies in flight while one is worked on.
// Shared memory: (128 + 2 NBUF KT)(D + 8) x 2 bytes, 85 KB at head_dim 128, so two blocks fit the SM's
// 228 KB. head_dim 256 stays on the 16-row kernel (its accumulators alone would be 256 registers).
constexpr int kWarps32 = kRows / 32;
constexpr int kThreads32 = kWarps32 * 32;
static_assert(kRows % 32 == 0, "prefill rows per tile come in pairs of m16 tiles, one pair per warp");

template <int D, int KT, int QRegs, int NBUF, int MinBlocks>
__global__ void __launch_bounds__(kThreads32, MinBlocks) attn_prefill32_kernel(AttnArgs a, const int32_t* tiles) {
  constexpr int LD = D + 8;
  constexpr int kChunks = KT * (D / 8) / kThreads32;  // 16-byte K (and V) copies per thread per tile
  static_assert(D % 32 == 0 && KT % 16 == 0 && (KT * (D / 8)) % kThreads32 == 0 && (kRows * (D / 8)) % kThreads32 == 0 &&
                    NBUF >= 2 && QRegs >= 0 && QRegs <= 2,
                "prefill attention tile shape");
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* Qs = smem;                  // [kRows][LD]
  uint16_t* Ks = Qs + kRows * LD;       // [NBUF][KT][LD]
  uint16_t* Vs = Ks + NBUF * KT * LD;   // [NBUF][KT][LD]

  const PrefillBlock<D> blk(a, tiles);
  const int g = blk.g, G = blk.G;
  const int32_t tok0 = blk.tok0, ntok = blk.ntok, kv_lo = blk.kv_lo, kv_hi = blk.kv_hi;
  const int64_t qrow = blk.qrow, kvrow = blk.kvrow;
  const int32_t* table = blk.table;
  blk.template load_q<kThreads32>(a, [&](int r, int c) { return smem_addr(Qs + r * LD + c * 8); });

  // K/V tile [kt, kt + KT) into buffer buf, as in the 16-row kernel (keys past kv_hi zero-filled).
  // Where the block's threads cover whole key rows (D / 8 divides 128), a thread copies one 16-byte
  // column of key rows frow + i * kRowStep: one shared and one global offset for all its copies, so
  // few registers stay live across the key loop.
  constexpr int kCols = D / 8;
  constexpr bool kFixedCol = kThreads32 % kCols == 0;
  constexpr int kRowStep = kThreads32 / kCols;
  const int fcol = threadIdx.x % kCols, frow = threadIdx.x / kCols;
  const int32_t kvrow32 = a.n_kv_heads * D, gcol = g * D + fcol * 8;
  auto fetch = [&](int buf, int32_t kt) {
    int64_t off[kChunks];
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if constexpr (kFixedCol) {
        const int32_t kp = kt + frow + i * kRowStep;
        off[i] = kp < kv_hi ? kv_slot(a, table, kp) * kvrow32 + gcol : -1;
      } else {
        const int idx = threadIdx.x + i * kThreads32, j = idx / kCols, c = idx % kCols;
        const int32_t kp = kt + j;
        off[i] = kp < kv_hi ? kv_slot(a, table, kp) * kvrow + int64_t(g) * D + c * 8 : -1;
      }
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const bool ok = off[i] >= 0;
      const int64_t o = ok ? off[i] : 0;
      uint32_t dst;  // K's shared address; V's is NBUF KT rows further
      if constexpr (kFixedCol) {
        dst = smem_addr(Ks) + uint32_t(((buf * KT + frow + i * kRowStep) * LD + fcol * 8) * 2);
      } else {
        const int idx = threadIdx.x + i * kThreads32, j = idx / kCols, c = idx % kCols;
        dst = smem_addr(Ks) + uint32_t(((buf * KT + j) * LD + c * 8) * 2);
      }
      cp_async16_zfill(dst, a.k_pool + o, ok);
      cp_async16_zfill(dst + uint32_t(NBUF * KT * LD * 2), a.v_pool + o, ok);
    }
  };
  // The first NBUF - 1 tiles, one cp.async group each (empty past the range).
#pragma unroll
  for (int i = 0; i < NBUF - 1; ++i) {
    if (kv_lo + i * KT < kv_hi) fetch(i, kv_lo + i * KT);
    cp_async_commit();
  }

  // The lane's four rows, h = 0..3: row tile h / 2 (16 rows each), half h % 2 (accumulator elements
  // 0-1: row gq, 2-3: row gq + 8): row warp * 32 + 16 (h / 2) + 8 (h % 2) + gq.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
  // Key k is visible to a row at position p iff 0 <= p - k < win (unsigned: k > p wraps past win; a
  // padding row has p = -1 and sees nothing).
  const uint32_t win = a.window > 0 ? uint32_t(a.window) : uint32_t(INT_MAX);
  int32_t pos[4];
  int32_t pmin = INT_MAX, pmax = -1;
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const int r = warp * 32 + (h >> 1) * 16 + (h & 1) * 8 + gq;
    const bool valid = r / G < ntok;
    pos[h] = valid ? a.pos[tok0 + r / G] : -1;
    if (valid) pmin = min(pmin, pos[h]);
    pmax = max(pmax, pos[h]);
  }
  // The warp's position range over its valid rows (none valid: wmax = -1, every tile skipped).
  const int32_t wmin = __reduce_min_sync(0xffffffffu, pmin), wmax = __reduce_max_sync(0xffffffffu, pmax);
  // The lowest and the highest first visible key over those rows (0 without a window).
  const int32_t wlo_min = a.window > 0 ? wmin - (a.window - 1) : 0, wlo_max = a.window > 0 ? wmax - (a.window - 1) : 0;

  // Base-2 scores as in the 16-row kernel.
  const bool capped = a.softcap > 0;
  const float mul = capped ? 1.0f : a.scale * kLog2e;
  const float cap_l2 = a.softcap * kLog2e, inv_cap = capped ? 1.0f / a.softcap : 0.0f;

  // Per-lane ldmatrix offsets (bytes), as in the 16-row kernel; row tile t's Q fragment is 16 rows
  // (16 LD elements) further.
  const uint32_t q_addr = smem_addr(Qs) + uint32_t(((warp * 32 + (lane & 15)) * LD + (lane >> 4) * 8) * 2);
  const uint32_t k_addr = smem_addr(Ks) + uint32_t((((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8) * 2);
  const uint32_t v_addr = smem_addr(Vs) + uint32_t(((lane & 15) * LD + (lane >> 4) * 8) * 2);
  constexpr uint32_t kQTile = 16 * LD * 2;

  cp_async_wait<NBUF - 1>();  // Q is in (the first K/V tiles may still be in flight)
  __syncthreads();
  uint32_t q[QRegs > 0 ? QRegs : 1][QRegs > 0 ? D / 16 : 1][4];
#pragma unroll
  for (int t = 0; t < QRegs; ++t)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(q_addr + t * kQTile + kk * 32, q[t][kk][0], q[t][kk][1], q[t][kk][2], q[t][kk][3]);

  float o[2][D / 8][4];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int d = 0; d < D / 8; ++d) o[t][d][0] = o[t][d][1] = o[t][d][2] = o[t][d][3] = 0.0f;
  float m[4], l[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) m[h] = -INFINITY, l[h] = 0.0f;

  // Step i works on buffer i % NBUF and first refills buffer (i - 1) % NBUF with tile i + NBUF - 1.
  int buf = 0;
  for (int32_t kt = kv_lo; kt < kv_hi; kt += KT) {
    cp_async_wait<NBUF - 2>();  // this step's tile is in, for this thread's copies (later ones may be in flight)
    __syncthreads();  // ... and every thread's; every warp is done with the previous step's buffer
    const int refill = buf == 0 ? NBUF - 1 : buf - 1;
    if (kt + (NBUF - 1) * KT < kv_hi) fetch(refill, kt + (NBUF - 1) * KT);
    cp_async_commit();

    // Warp-uniform skip / no-mask decisions over the warp's 32 rows.
    if (kt <= wmax && kt + KT - 1 >= wlo_min) {
      const bool full = kt + KT - 1 <= wmin && kt >= wlo_max;
      const uint32_t kc = k_addr + uint32_t(buf * KT * LD * 2), vc = v_addr + uint32_t(buf * KT * LD * 2);

      // S = Q Kᵀ for the warp's two row tiles: each K fragment feeds both.
      float sc[2][KT / 8][4];
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < KT / 8; ++j) sc[t][j][0] = sc[t][j][1] = sc[t][j][2] = sc[t][j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[2][4];
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          if (t < QRegs) {
            const int tr = t < QRegs ? t : 0;  // t (in bounds where the branch is dead too)
            qa[t][0] = q[tr][kk][0], qa[t][1] = q[tr][kk][1], qa[t][2] = q[tr][kk][2], qa[t][3] = q[tr][kk][3];
          } else {
            ldsm_x4(q_addr + t * kQTile + kk * 32, qa[t][0], qa[t][1], qa[t][2], qa[t][3]);
          }
        }
#pragma unroll
        for (int j = 0; j < KT / 8; j += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4(kc + uint32_t((j * 8 * LD + kk * 16) * 2), b0, b1, b2, b3);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            mma_bf16(sc[t][j], qa[t][0], qa[t][1], qa[t][2], qa[t][3], b0, b1);
            mma_bf16(sc[t][j + 1], qa[t][0], qa[t][1], qa[t][2], qa[t][3], b2, b3);
          }
        }
      }

      // Softcap, mask (on partly visible tiles), online softmax: element e of sc[t][j] is row
      // h = 2t + e / 2, key kt + 8j + 2tq + e % 2.
      if (capped) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int j = 0; j < KT / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[t][j][e] = cap_l2 * tanhf(sc[t][j][e] * a.scale * inv_cap);
      }
      if (!full) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int j = 0; j < KT / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int32_t key = kt + j * 8 + 2 * tq + (e & 1);
              if (uint32_t(pos[2 * t + (e >> 1)] - key) >= win) sc[t][j][e] = -INFINITY;
            }
      }
      float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < KT / 8; ++j) {
          mx[2 * t] = fmaxf(mx[2 * t], fmaxf(sc[t][j][0], sc[t][j][1]));
          mx[2 * t + 1] = fmaxf(mx[2 * t + 1], fmaxf(sc[t][j][2], sc[t][j][3]));
        }
      float b[4], c[4], s[4];
#pragma unroll
      for (int h = 0; h < 4; ++h) {
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], o2));
        const float n = fmaxf(m[h], mx[h]);
        // Base-2 exponent offset (0 while the row has seen no key: its p are all 0).
        b[h] = n == -INFINITY ? 0.0f : n * mul;
        c[h] = exp2_approx(m[h] * mul - b[h]);
        m[h] = n, s[h] = 0.0f;
      }
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < KT / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[t][j][e] = exp2_approx(fmaf(sc[t][j][e], mul, -b[2 * t + (e >> 1)]));
          s[2 * t] += sc[t][j][0] + sc[t][j][1], s[2 * t + 1] += sc[t][j][2] + sc[t][j][3];
        }
#pragma unroll
      for (int h = 0; h < 4; ++h) l[h] = l[h] * c[h] + s[h];
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int d = 0; d < D / 8; ++d) {
          o[t][d][0] *= c[2 * t], o[t][d][1] *= c[2 * t];
          o[t][d][2] *= c[2 * t + 1], o[t][d][3] *= c[2 * t + 1];
        }

      // O += P V: each V fragment feeds both row tiles.
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk) {
        uint32_t pa[2][4];
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          pa[t][0] = pack_bf16(sc[t][2 * kk][0], sc[t][2 * kk][1]), pa[t][1] = pack_bf16(sc[t][2 * kk][2], sc[t][2 * kk][3]);
          pa[t][2] = pack_bf16(sc[t][2 * kk + 1][0], sc[t][2 * kk + 1][1]), pa[t][3] = pack_bf16(sc[t][2 * kk + 1][2], sc[t][2 * kk + 1][3]);
        }
#pragma unroll
        for (int d = 0; d < D / 8; d += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4_trans(vc + uint32_t((kk * 16 * LD + d * 8) * 2), b0, b1, b2, b3);
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            mma_bf16(o[t][d], pa[t][0], pa[t][1], pa[t][2], pa[t][3], b0, b1);
            mma_bf16(o[t][d + 1], pa[t][0], pa[t][1], pa[t][2], pa[t][3], b2, b3);
          }
        }
      }
    }
    buf = buf == NBUF - 1 ? 0 : buf + 1;
  }

#pragma unroll
  for (int h = 0; h < 4; ++h) {
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) l[h] += __shfl_xor_sync(0xffffffffu, l[h], o2);
    const float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
    const int r = warp * 32 + (h >> 1) * 16 + (h & 1) * 8 + gq, t = h >> 1, e0 = (h & 1) * 2;
    if (pos[h] >= 0) {  // a valid row (padding rows have pos -1)
      uint16_t* out = a.out + int64_t(tok0 + r / G) * qrow + int64_t(g * G + r % G) * D;
#pragma unroll
      for (int d = 0; d < D / 8; ++d)
        *reinterpret_cast<uint32_t*>(out + d * 8 + 2 * tq) = pack_bf16(o[t][d][e0] * inv, o[t][d][e0 + 1] * inv);
    }
  }
}

template <int D, int KT>
void launch_p(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  constexpr size_t smem = size_t(kRows + 4 * KT) * (D + 8) * 2;  // Q, then K and V twice
  static bool attr_set = false;  // once per instantiation (the limit is a property of the function)
  if (!attr_set) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<D, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr_set = true;
  }
  dim3 grid(unsigned(n_tiles), unsigned(a.n_kv_heads));
  attn_prefill_kernel<D, KT><<<grid, kThreads, smem, s>>>(a, tiles);
  ARBOR_LAUNCH_CHECK("attn_prefill_kernel");
}

template <int D, int KT, int QRegs, int NBUF, int MinBlocks>
void launch_p32(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  constexpr size_t smem = size_t(kRows + 2 * NBUF * KT) * (D + 8) * 2;  // Q, then NBUF buffers of K and of V
  static_assert(MinBlocks * (smem + 1024) <= 228 * 1024, "prefill blocks per SM exceed shared memory");
  static bool attr_set = false;
  if (!attr_set) {
    auto* k = attn_prefill32_kernel<D, KT, QRegs, NBUF, MinBlocks>;
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    // All of the unified L1 as shared memory (this kernel's global reads bypass L1 or are few), so
    // MinBlocks blocks fit.
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)));
    attr_set = true;
  }
  dim3 grid(unsigned(n_tiles), unsigned(a.n_kv_heads));
  attn_prefill32_kernel<D, KT, QRegs, NBUF, MinBlocks><<<grid, kThreads32, smem, s>>>(a, tiles);
  ARBOR_LAUNCH_CHECK("attn_prefill32_kernel");
}

PrefillKernel g_kernel = PrefillKernel::Auto;  // set_prefill_kernel

}  // namespace

PrefillKernel prefill_kernel_for(int head_dim) {
  if ((g_kernel == PrefillKernel::Auto || g_kernel == PrefillKernel::Wgmma) && prefill_wgmma_supported(head_dim)) return PrefillKernel::Wgmma;
  if (g_kernel != PrefillKernel::Mma16 && head_dim <= 128) return PrefillKernel::Mma32;
  return PrefillKernel::Mma16;
}

const char* prefill_kernel_name(PrefillKernel k) {
  switch (k) {
    case PrefillKernel::Auto: return "auto";
    case PrefillKernel::Wgmma: return "wgmma";
    case PrefillKernel::Mma32: return "mma32";
    case PrefillKernel::Mma16: return "mma16";
  }
  return "?";
}

void launch_attention_prefill(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  if (n_tiles == 0) return;
  ARBOR_CU_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.n_heads / a.n_kv_heads <= kRows,
                 "cuda: attention prefill: %d query heads over %d kv heads (groups up to %d)", a.n_heads, a.n_kv_heads, kRows);
  const PrefillKernel k = prefill_kernel_for(a.head_dim);
  if (k == PrefillKernel::Wgmma) {
    launch_attention_prefill_wgmma(a, tiles, n_tiles, s);
    return;
  }
  if (k == PrefillKernel::Mma32) {
    // <head_dim, keys per tile, row tiles with Q in registers, K/V buffers, blocks per SM>: the largest
    // that ptxas (13.0, sm_90a) compiles without spills: 128 / 168 / 254 / 254 registers.
    switch (a.head_dim) {
      case 32: launch_p32<32, 32, 2, 3, 4>(a, tiles, n_tiles, s); return;
      case 64: launch_p32<64, 32, 2, 3, 3>(a, tiles, n_tiles, s); return;
      case 96: launch_p32<96, 32, 1, 3, 2>(a, tiles, n_tiles, s); return;
      case 128: launch_p32<128, 32, 1, 3, 2>(a, tiles, n_tiles, s); return;
      default: break;  // other head_dims: the 16-row kernel, which reports the unsupported ones
    }
  }
  switch (a.head_dim) {
    case 32: launch_p<32, 64>(a, tiles, n_tiles, s); break;
    case 64: launch_p<64, 64>(a, tiles, n_tiles, s); break;
    case 96: launch_p<96, 64>(a, tiles, n_tiles, s); break;
    case 128: launch_p<128, 64>(a, tiles, n_tiles, s); break;
    case 256: launch_p<256, 32>(a, tiles, n_tiles, s); break;
    default: fail_printf("cuda: prefill attention: head_dim %d is not supported (32, 64, 96, 128, 256)", a.head_dim);
  }
}

void set_prefill_kernel(PrefillKernel k) { g_kernel = k; }

PrefillKernel parse_prefill_kernel(const char* name) {
  const std::string n = name;
  if (n == "auto") return PrefillKernel::Auto;
  if (n == "wgmma") return PrefillKernel::Wgmma;
  if (n == "mma32") return PrefillKernel::Mma32;
  if (n == "mma16") return PrefillKernel::Mma16;
  fail_printf("cuda: prefill attention kernel '%s': auto, wgmma, mma32 or mma16", name);
}

}  // namespace arbor::cuda
