// Flash attention for prefill on Hopper's warpgroup MMA (wgmma, sm_90a), head_dim 64 and 128, over
// the paged bf16 KV cache. Same tiles and semantics as attention_prefill.cu's mma.sync kernels (a
// block owns kPrefillRows = 128 query rows = tokens x the GQA group's heads; causal, window, softcap,
// online softmax in base 2), different engine: two warpgroups of 64 rows each; S = Q Kᵀ for a
// 128-key tile is D/16 wgmmas with both operands read from shared memory by the tensor cores (no
// ldmatrix, no register fragments of K), and O += P V takes P from registers (the S accumulators,
// rounded to bf16, already sit in the A-fragment layout) and V from shared memory, N-major. Q, K and
// V live in shared memory in the 128-byte-swizzled layout of wgmma.h, filled by cp.async (the KV
// cache is paged, so rows are gathered one 16-byte chunk at a time); K/V tiles are double-buffered,
// the next tile's copies in flight while this one is worked on. The two warpgroups run their
// softmax and their MMAs independently, so one's exponentials overlap the other's tensor work.
#include <climits>
#include <cstdlib>

#include "backend/cuda/attention_prefill.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/wgmma.h"

namespace arbor::cuda {

namespace {

constexpr int kRows = kPrefillRows;  // 128: two warpgroups of 64
constexpr int kThreads = 256;
constexpr int kKeys = 128;  // keys per K/V tile
template <int D, int NB>
constexpr size_t wg_smem_bytes() {
  return size_t(kRows + 2 * NB * kKeys) * D * 2 + 1024;  // + alignment slack for the 1024-byte swizzle atoms
}

// NB K/V buffers; DEFER: P V of a tile is waited for only after the next tile's S = Q Kᵀ is issued
// (needs NB = 3: the tile copied ahead goes two buffers back). Copies run NB - 1 - DEFER tiles ahead.
template <int D, int NB, bool DEFER, bool PING>
__global__ void __launch_bounds__(kThreads, 1) attn_prefill_wg_kernel(AttnArgs a, const int32_t* tiles) {
#if ARBOR_WGMMA_OK
  static_assert(D == 64 || D == 128, "wgmma prefill: head_dim 64 or 128");
  static_assert(NB >= 2 && (!DEFER || NB >= 3), "wgmma prefill: buffers");
  constexpr int kAhead = NB - 1 - (DEFER ? 1 : 0);  // tiles in flight besides the one worked on
  constexpr uint32_t kQBytes = kRows * D * 2, kTileBytes = kKeys * D * 2;
  extern __shared__ uint8_t smem_raw[];
  __shared__ int32_t warp_range[8][2];  // each warp's (min, max) position over its valid rows
  const uint32_t q_s = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t k_s = q_s + kQBytes, v_s = k_s + NB * kTileBytes;

  const PrefillBlock<D> blk(a, tiles);
  const int g = blk.g, G = blk.G;
  const int32_t tok0 = blk.tok0, ntok = blk.ntok, kv_lo = blk.kv_lo, kv_hi = blk.kv_hi;
  const int64_t qrow = blk.qrow;
  const int32_t* table = blk.table;
  blk.template load_q<kThreads>(a, [&](int r, int c) { return q_s + swz_offset(r, c, kRows); });

  // K/V tile [kt, kt + kKeys) into buffer buf (keys past kv_hi zero-filled: P = 0 times a V row
  // must stay 0). A thread copies one 16-byte column of rows frow + i * kStep; the step is a
  // multiple of 8, so the swizzled column is the same for all of them.
  constexpr int kCols = D / 8, kStep = kThreads / kCols, kCopies = kKeys / kStep;
  static_assert(kThreads % kCols == 0 && kStep % 8 == 0 && kKeys % kStep == 0, "wgmma prefill: copy shape");
  const int fcol = threadIdx.x % kCols, frow = threadIdx.x / kCols;
  const uint32_t fdst = swz_offset(frow, fcol, kKeys);
  const int32_t kvrow32 = a.n_kv_heads * D, gcol = g * D + fcol * 8;
  auto fetch = [&](int buf, int32_t kt) {
    int64_t off[kCopies];
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int32_t kp = kt + frow + i * kStep;
      off[i] = kp < kv_hi ? kv_slot(a, table, kp) * kvrow32 + gcol : -1;
    }
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool ok = off[i] >= 0;
      const int64_t o = ok ? off[i] : 0;
      const uint32_t dst = k_s + uint32_t(buf) * kTileBytes + fdst + uint32_t(i * kStep * 128);
      cp_async16_zfill(dst, a.k_pool + o, ok);
      cp_async16_zfill(dst + NB * kTileBytes, a.v_pool + o, ok);
    }
  };
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (kv_lo + i * kKeys < kv_hi) fetch(i, kv_lo + i * kKeys);
    cp_async_commit();
  }

  // This thread's two rows (accumulator elements 0-1 and 2-3 of every 8-column group): row
  // 64 wg + 16 (warp % 4) + lane / 4, and 8 further.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, tq = lane & 3;
  const uint32_t win = a.window > 0 ? uint32_t(a.window) : uint32_t(INT_MAX);
  int32_t pos[2];
  int32_t pmin = INT_MAX, pmax = -1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wg * 64 + (warp % 4) * 16 + h * 8 + (lane >> 2);
    const bool valid = r / G < ntok;
    pos[h] = valid ? a.pos[tok0 + r / G] : -1;
    if (valid) pmin = min(pmin, pos[h]);
    pmax = max(pmax, pos[h]);
  }
  const int32_t wmin = __reduce_min_sync(0xffffffffu, pmin), wmax = __reduce_max_sync(0xffffffffu, pmax);
  if (lane == 0) warp_range[warp][0] = wmin, warp_range[warp][1] = wmax;
  __syncthreads();
  // The warpgroup's range decides which tiles it skips (its MMAs are warpgroup-wide); the warp's
  // decides where it masks per element.
  int32_t gmin = INT_MAX, gmax = -1;
#pragma unroll
  for (int w = 0; w < 4; ++w) gmin = min(gmin, warp_range[wg * 4 + w][0]), gmax = max(gmax, warp_range[wg * 4 + w][1]);
  const int32_t glo_min = a.window > 0 ? gmin - (a.window - 1) : 0;
  const int32_t wlo_max = a.window > 0 ? wmax - (a.window - 1) : 0;

  const bool capped = a.softcap > 0;
  const float mul = capped ? 1.0f : a.scale * kLog2e;
  const float cap_l2 = a.softcap * kLog2e, inv_cap = capped ? 1.0f / a.softcap : 0.0f;

  // Descriptors. Q (K-major, the warpgroup's 64 rows): k16 step kk is 32 bytes into slab kk / 4.
  // K (K-major, the tile's 128 keys as N): the same. V (N-major, 16 keys per step = 2048 bytes;
  // 64-column slabs kKeys * 128 bytes apart).
  const uint32_t q_wg = q_s + uint32_t(wg * 64 * 128);
  auto q_desc = [&](int kk) { return wgmma_desc(q_wg + uint32_t((kk >> 2) * kRows * 128 + (kk & 3) * 32), 16, 1024); };
  auto k_desc = [&](int buf, int kk) {
    return wgmma_desc(k_s + uint32_t(buf) * kTileBytes + uint32_t((kk >> 2) * kKeys * 128 + (kk & 3) * 32), 16, 1024);
  };
  auto v_desc = [&](int buf, int kk) { return wgmma_desc(v_s + uint32_t(buf) * kTileBytes + uint32_t(kk * 16 * 128), kKeys * 128, 1024); };

  float o[D / 2], s[kKeys / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  int buf = 0;
  for (int32_t kt = kv_lo; kt < kv_hi; kt += kKeys, buf = buf == NB - 1 ? 0 : buf + 1) {
    cp_async_wait<kAhead - 1>();  // this tile (and Q) are in, for this thread's copies
    fence_proxy_async();          // ... visible to the tensor cores' reads
    __syncthreads();  // ... for every thread's copies; both warpgroups are done with the buffer refilled next
    {
      const int ahead = buf + kAhead >= NB ? buf + kAhead - NB : buf + kAhead;
      if (kt + kAhead * kKeys < kv_hi) fetch(ahead, kt + kAhead * kKeys);
      cp_async_commit();
    }

    const bool skip = kt > gmax || kt + kKeys - 1 < glo_min;  // no row of the warpgroup sees a key of it
    // PING: warpgroup 1 issues its S only once warpgroup 0's is done, so one's softmax runs while
    // the other's MMAs do (named barrier 1: 128 threads arrive, 128 wait; both take part every tile).
    if constexpr (PING) {
      if (wg == 1) asm volatile("bar.sync 1, 256;\n" ::: "memory");
    }
    if (skip) {
      if constexpr (DEFER) wgmma_wait<0>();  // the previous P V, before its buffer is refilled
      if constexpr (PING) {
        if (wg == 0) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
      }
      continue;
    }
    // S = Q Kᵀ (with DEFER, the previous tile's P V may still run; both are done after the wait).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kKeys>(s, q_desc(kk), k_desc(buf, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin<kKeys / 2>(s);
    wgmma_pin<D / 2>(o);
    if constexpr (PING) {
      if (wg == 0) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    }

    // Softcap, mask where some row of the warp sees only part of the tile, online softmax: element
    // s[4j + e] is row e / 2, key kt + 8j + 2 tq + e % 2.
    if (capped) {
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) s[i] = cap_l2 * tanhf(s[i] * a.scale * inv_cap);
    }
    const bool full = kt + kKeys - 1 <= wmin && kt >= wlo_max;
    if (!full) {
#pragma unroll
      for (int i = 0; i < kKeys / 2; ++i) {
        const int32_t key = kt + (i >> 2) * 8 + 2 * tq + (i & 1);
        if (uint32_t(pos[(i >> 1) & 1] - key) >= win) s[i] = -INFINITY;
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kKeys / 2; i += 4) mx[0] = fmaxf(mx[0], fmaxf(s[i], s[i + 1])), mx[1] = fmaxf(mx[1], fmaxf(s[i + 2], s[i + 3]));
    float b[2], c[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int o2 = 1; o2 <= 2; o2 <<= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], o2));
      const float n = fmaxf(m[h], mx[h]);
      b[h] = n == -INFINITY ? 0.0f : n * mul;  // 0 while the row has seen no key (its p are all 0)
      c[h] = exp2_approx(m[h] * mul - b[h]);
      m[h] = n;
    }
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) {
      s[i] = exp2_approx(fmaf(s[i], mul, -b[(i >> 1) & 1]));
      sum[(i >> 1) & 1] += s[i];
    }
    l[0] = l[0] * c[0] + sum[0], l[1] = l[1] * c[1] + sum[1];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] *= c[(i >> 1) & 1];

    // O += P V: the accumulators of keys 16kk..16kk+15 (8-column groups 2kk, 2kk + 1) are the
    // m16n8k16 A fragment of the warp's rows.
    uint32_t p[kKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      p[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]), p[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]), p[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_rs<D, 1>(o, p[kk], v_desc(buf, kk), 1);
    wgmma_commit();
    if constexpr (!DEFER) {
      wgmma_wait<0>();
      wgmma_pin<D / 2>(o);
    }
  }
  if constexpr (DEFER) {
    wgmma_wait<0>();
    wgmma_pin<D / 2>(o);
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) l[h] += __shfl_xor_sync(0xffffffffu, l[h], o2);
    if (pos[h] < 0) continue;  // a padding row
    const float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
    const int r = wg * 64 + (warp % 4) * 16 + h * 8 + (lane >> 2);
    uint16_t* out = a.out + int64_t(tok0 + r / G) * qrow + int64_t(g * G + r % G) * D;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(out + j * 8 + 2 * tq) = pack_bf16(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
  }
#else
  __trap();  // launched only where the device is sm_90 (prefill_wgmma_supported)
#endif
}

template <int D, int NB, bool DEFER, bool PING>
void launch_wg(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  constexpr size_t smem = wg_smem_bytes<D, NB>();
  static_assert(smem <= 227 * 1024, "wgmma prefill: shared memory per block");
  static bool attr_set = false;
  if (!attr_set) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_wg_kernel<D, NB, DEFER, PING>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr_set = true;
  }
  dim3 grid(unsigned(n_tiles), unsigned(a.n_kv_heads));
  attn_prefill_wg_kernel<D, NB, DEFER, PING><<<grid, kThreads, smem, s>>>(a, tiles);
  ARBOR_LAUNCH_CHECK("attn_prefill_wg_kernel");
}


// The pipelined kernel: 64-key tiles, Q fragments in registers (S = Q Kᵀ takes A from registers, so
// shared memory serves only K, V and the copies), and two score buffers per thread, so the tensor
// cores compute the next tile's S while this tile's softmax runs:
//   issue S(i+1); softmax of S(i); wait for P V(i-1), rescale O; issue P V(i); wait for S(i+1).
// K and V have rings of three 64-key slots each; after the barrier of step i the block copies
// K(i+2) and V(i+1) (K is needed a step before V), into slots whose last readers finished before
// that barrier. Both warpgroups walk every tile of the block (a tile one of them cannot see is
// masked whole: at most about one per warpgroup), so the pipeline has no branches.
constexpr int kPKeys = 64;
constexpr int kRing = 3;

template <int D>
constexpr size_t wgp_smem_bytes() {
  return size_t(kRows + 2 * kRing * kPKeys) * D * 2 + 1024;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1) attn_prefill_wgp_kernel(AttnArgs a, const int32_t* tiles) {
#if ARBOR_WGMMA_OK
  static_assert(D == 64 || D == 128, "wgmma prefill: head_dim 64 or 128");
  constexpr uint32_t kQBytes = kRows * D * 2, kSlot = kPKeys * D * 2;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t q_s = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t k_s = q_s + kQBytes, v_s = k_s + kRing * kSlot;

  const PrefillBlock<D> blk(a, tiles);
  const int g = blk.g, G = blk.G;
  const int32_t tok0 = blk.tok0, ntok = blk.ntok, kv_lo = blk.kv_lo, kv_hi = blk.kv_hi;
  const int64_t qrow = blk.qrow;
  const int32_t* table = blk.table;
  // Steps come in pairs (the two score buffers swap roles), so an odd tile count gets one more step
  // over keys past kv_hi: copied as zeros and masked whole.
  const int n_tiles = (kv_hi - kv_lo + kPKeys - 1) / kPKeys, n_steps = (n_tiles + 1) & ~1;

  // Copies of K or V rows [kt, kt + 64) into a slot (keys past kv_hi zero-filled), one 16-byte
  // column of rows frow + i * kStep per thread.
  constexpr int kCols = D / 8, kStep = kThreads / kCols, kCopies = kPKeys / kStep;
  static_assert(kThreads % kCols == 0 && kStep % 8 == 0 && kPKeys % kStep == 0, "wgmma prefill: copy shape");
  const int fcol = threadIdx.x % kCols, frow = threadIdx.x / kCols;
  const uint32_t fdst = swz_offset(frow, fcol, kPKeys);
  const int32_t kvrow32 = a.n_kv_heads * D, gcol = g * D + fcol * 8;
  auto fetch = [&](const uint16_t* pool, uint32_t slot_base, int32_t kt) {
    int64_t off[kCopies];
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int32_t kp = kt + frow + i * kStep;
      off[i] = kp < kv_hi ? kv_slot(a, table, kp) * kvrow32 + gcol : -1;
    }
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool ok = off[i] >= 0;
      cp_async16_zfill(slot_base + fdst + uint32_t(i * kStep * 128), pool + (ok ? off[i] : 0), ok);
    }
  };
  auto kslot = [&](int t) { return k_s + uint32_t(t % kRing) * kSlot; };
  auto vslot = [&](int t) { return v_s + uint32_t(t % kRing) * kSlot; };

  blk.template load_q<kThreads>(a, [&](int r, int c) { return q_s + swz_offset(r, c, kRows); });
  fetch(a.k_pool, kslot(0), kv_lo), fetch(a.v_pool, vslot(0), kv_lo), fetch(a.k_pool, kslot(1), kv_lo + kPKeys);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, tq = lane & 3;
  const uint32_t win = a.window > 0 ? uint32_t(a.window) : uint32_t(INT_MAX);
  int32_t pos[2];
  int32_t pmin = INT_MAX, pmax = -1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wg * 64 + (warp % 4) * 16 + h * 8 + (lane >> 2);
    const bool valid = r / G < ntok;
    pos[h] = valid ? a.pos[tok0 + r / G] : -1;
    if (valid) pmin = min(pmin, pos[h]);
    pmax = max(pmax, pos[h]);
  }
  const int32_t wmin = __reduce_min_sync(0xffffffffu, pmin), wmax = __reduce_max_sync(0xffffffffu, pmax);
  const int32_t wlo_max = a.window > 0 ? wmax - (a.window - 1) : 0;
  const bool capped = a.softcap > 0;
  const float mul = capped ? 1.0f : a.scale * kLog2e;
  const float cap_l2 = a.softcap * kLog2e, inv_cap = capped ? 1.0f / a.softcap : 0.0f;

  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  // Q fragments (m16n8k16 A layout) of the warp's 16 rows, k16 step kk: lanes 0-15 rows 0-15 at
  // chunk 2kk, lanes 16-31 at chunk 2kk + 1.
  uint32_t q[D / 16][4];
  {
    const int r = wg * 64 + (warp % 4) * 16 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(q_s + swz_offset(r, 2 * kk + (lane >> 4), kRows), q[kk][0], q[kk][1], q[kk][2], q[kk][3]);
  }
  auto k_desc = [&](int t, int kk) { return wgmma_desc(kslot(t) + uint32_t((kk >> 2) * kPKeys * 128 + (kk & 3) * 32), 16, 1024); };
  auto v_desc = [&](int t, int kk) { return wgmma_desc(vslot(t) + uint32_t(kk * 16 * 128), kPKeys * 128, 1024); };
  auto issue_s = [&](float* sc, int t) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_rs<kPKeys, 0>(sc, q[kk], k_desc(t, kk), kk > 0);
    wgmma_commit();
  };

  float o[D / 2], sa[kPKeys / 2], sb[kPKeys / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kPKeys / 2; ++i) sa[i] = sb[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  issue_s(sa, 0);
  wgmma_wait<0>();
  wgmma_pin<kPKeys / 2>(sa);

  // Step t: s holds S(t) (done); the next S goes to sn.
  auto step = [&](int t, float* s, float* sn) {
    const int32_t kt = kv_lo + t * kPKeys;
    cp_async_wait<0>();  // K(t + 1), V(t): this thread's copies
    fence_proxy_async();
    __syncthreads();  // everyone's; every thread is past step t - 1 (S(t) and P V(t - 2) done)
    // (Past the last step these are zeros, and the S issued from them unused: the pipeline has no
    // branches, which keeps ptxas from serializing the MMAs.)
    fetch(a.k_pool, kslot(t + 2), kt + 2 * kPKeys);
    fetch(a.v_pool, vslot(t + 1), kt + kPKeys);
    cp_async_commit();
    issue_s(sn, t + 1);

    if (capped) {
#pragma unroll
      for (int i = 0; i < kPKeys / 2; ++i) s[i] = cap_l2 * tanhf(s[i] * a.scale * inv_cap);
    }
    if (!(kt + kPKeys - 1 <= wmin && kt >= wlo_max)) {
#pragma unroll
      for (int i = 0; i < kPKeys / 2; ++i) {
        const int32_t key = kt + (i >> 2) * 8 + 2 * tq + (i & 1);
        if (uint32_t(pos[(i >> 1) & 1] - key) >= win) s[i] = -INFINITY;
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kPKeys / 2; i += 4) mx[0] = fmaxf(mx[0], fmaxf(s[i], s[i + 1])), mx[1] = fmaxf(mx[1], fmaxf(s[i + 2], s[i + 3]));
    float b[2], c[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int o2 = 1; o2 <= 2; o2 <<= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], o2));
      const float n = fmaxf(m[h], mx[h]);
      b[h] = n == -INFINITY ? 0.0f : n * mul;
      c[h] = exp2_approx(m[h] * mul - b[h]);
      m[h] = n;
    }
#pragma unroll
    for (int i = 0; i < kPKeys / 2; ++i) {
      s[i] = exp2_approx(fmaf(s[i], mul, -b[(i >> 1) & 1]));
      sum[(i >> 1) & 1] += s[i];
    }
    l[0] = l[0] * c[0] + sum[0], l[1] = l[1] * c[1] + sum[1];
    wgmma_wait<1>();  // P V(t - 1) is done (S(t + 1) may still run): O can change
    wgmma_pin<D / 2>(o);
    // Rescale O unless no row of the warp changed its max (common once the running max settles).
    if (!__all_sync(0xffffffffu, c[0] == 1.0f && c[1] == 1.0f)) {
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] *= c[(i >> 1) & 1];
    }
    uint32_t p[kPKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kPKeys / 16; ++kk) {
      p[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]), p[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]), p[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPKeys / 16; ++kk) wgmma_rs<D, 1>(o, p[kk], v_desc(t, kk), 1);
    wgmma_commit();
    wgmma_wait<1>();  // S(t + 1) is done (P V(t) may still run)
    wgmma_pin<kPKeys / 2>(sn);
  };
#pragma unroll 1
  for (int t = 0; t < n_steps; t += 2) {
    step(t, sa, sb);
    step(t + 1, sb, sa);
  }
  wgmma_wait<0>();
  wgmma_pin<D / 2>(o);

#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) l[h] += __shfl_xor_sync(0xffffffffu, l[h], o2);
    if (pos[h] < 0) continue;  // a padding row
    const float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
    const int r = wg * 64 + (warp % 4) * 16 + h * 8 + (lane >> 2);
    uint16_t* out = a.out + int64_t(tok0 + r / G) * qrow + int64_t(g * G + r % G) * D;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(out + j * 8 + 2 * tq) = pack_bf16(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
  }
#else
  __trap();  // launched only where the device is sm_90 (prefill_wgmma_supported)
#endif
}

template <int D>
void launch_wgp(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  constexpr size_t smem = wgp_smem_bytes<D>();
  static_assert(smem <= 227 * 1024, "wgmma prefill: shared memory per block");
  static bool attr_set = false;
  if (!attr_set) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_wgp_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr_set = true;
  }
  dim3 grid(unsigned(n_tiles), unsigned(a.n_kv_heads));
  attn_prefill_wgp_kernel<D><<<grid, kThreads, smem, s>>>(a, tiles);
  ARBOR_LAUNCH_CHECK("attn_prefill_wgp_kernel");
}
}  // namespace

bool prefill_wgmma_supported(int head_dim) {
  static const int cc = [] {
    int dev = 0, major = 0, minor = 0;
    ARBOR_CUDA_CHECK(cudaGetDevice(&dev));
    ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major * 10 + minor;
  }();
  return cc == 90 && (head_dim == 64 || head_dim == 128);
}

void launch_attention_prefill_wgmma(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  static const int variant = [] {
    const char* e = std::getenv("ARBOR_CUDA_WG_VARIANT");  // A/B only (0: 2 buffers, 1: 3, 2: 3 deferred, 3/4: 2/3 ping-pong)
    return e ? std::atoi(e) : 2;
  }();
  switch (a.head_dim * 8 + variant) {
    case 64 * 8 + 0: launch_wg<64, 2, false, false>(a, tiles, n_tiles, s); return;
    case 64 * 8 + 1: launch_wg<64, 3, false, false>(a, tiles, n_tiles, s); return;
    case 64 * 8 + 2: launch_wg<64, 3, true, false>(a, tiles, n_tiles, s); return;
    case 64 * 8 + 3: launch_wg<64, 2, false, true>(a, tiles, n_tiles, s); return;
    case 64 * 8 + 4: launch_wg<64, 3, false, true>(a, tiles, n_tiles, s); return;
    case 64 * 8 + 5: launch_wgp<64>(a, tiles, n_tiles, s); return;
    case 128 * 8 + 0: launch_wg<128, 2, false, false>(a, tiles, n_tiles, s); return;
    case 128 * 8 + 1: launch_wg<128, 3, false, false>(a, tiles, n_tiles, s); return;
    case 128 * 8 + 2: launch_wg<128, 3, true, false>(a, tiles, n_tiles, s); return;
    case 128 * 8 + 3: launch_wg<128, 2, false, true>(a, tiles, n_tiles, s); return;
    case 128 * 8 + 4: launch_wg<128, 3, false, true>(a, tiles, n_tiles, s); return;
    case 128 * 8 + 5: launch_wgp<128>(a, tiles, n_tiles, s); return;
    default: fail_printf("cuda: wgmma prefill attention: head_dim %d (64 or 128)", a.head_dim);
  }
}

}  // namespace arbor::cuda
