// Flash attention for prefill on Hopper's warpgroup MMA (wgmma, sm_90a), head_dim 64 and 128, over
// the paged bf16 KV cache. Same tiles and semantics as attention_prefill.cu's mma.sync kernels (a
// block owns kPrefillRows = 128 query rows = tokens x the GQA group's heads; causal, window, softcap,
// online softmax in base 2), different engine: two warpgroups of 64 rows each; S = Q Kᵀ for a
// 128-key tile is D/16 wgmmas with both operands read from shared memory by the tensor cores (no
// ldmatrix, no register fragments of K), and O += P V takes P from registers (the S accumulators,
// rounded to bf16, already sit in the A-fragment layout) and V from shared memory, N-major. Q, K and
// V live in shared memory in the 128-byte-swizzled layout of wgmma.h, filled by cp.async (the KV
// cache is paged, so rows are gathered one 16-byte chunk at a time) one tile ahead, in three K/V
// buffers. Between the per-tile barriers the warpgroups run independently, so one's softmax can
// overlap the other's MMAs. Measured against other shapes of it (docs/cuda-notes.md, session 7).
#include <climits>

#include "backend/cuda/attention_prefill.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/wgmma.h"

namespace arbor::cuda {

namespace {

constexpr int kRows = kPrefillRows;  // 128: two warpgroups of 64
constexpr int kThreads = 256;
constexpr int kKeys = 128;  // keys per K/V tile
constexpr int kBufs = 3;

template <int D>
constexpr size_t wg_smem_bytes() {
  return size_t(kRows + 2 * kBufs * kKeys) * D * 2 + 1024;  // + alignment slack for the 1024-byte swizzle atoms
}

// P V of a tile is waited for only after the next tile's S = Q Kᵀ is issued (its tail overlaps the
// barrier and the next tile's start), so with kBufs = 3 buffers the copies run one tile ahead: the
// buffer refilled at step t held tile t - 2, whose last reader (P V(t - 2)) finished in step t - 1.
template <int D>
__global__ void __launch_bounds__(kThreads, 1) attn_prefill_wg_kernel(AttnArgs a, const int32_t* tiles) {
#if ARBOR_WGMMA_OK
  static_assert(D == 64 || D == 128, "wgmma prefill: head_dim 64 or 128");
  constexpr uint32_t kQBytes = kRows * D * 2, kTileBytes = kKeys * D * 2;
  extern __shared__ uint8_t smem_raw[];
  __shared__ int32_t warp_range[8][2];  // each warp's (min, max) position over its valid rows
  const uint32_t q_s = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t k_s = q_s + kQBytes, v_s = k_s + kBufs * kTileBytes;

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
      cp_async16_zfill(dst + kBufs * kTileBytes, a.v_pool + o, ok);
    }
  };
  if (kv_lo < kv_hi) fetch(0, kv_lo);
  cp_async_commit();

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
  for (int32_t kt = kv_lo; kt < kv_hi; kt += kKeys, buf = buf == kBufs - 1 ? 0 : buf + 1) {
    cp_async_wait<0>();   // this tile (and Q) are in, for this thread's copies
    fence_proxy_async();  // ... visible to the tensor cores' reads
    __syncthreads();      // ... for every thread's copies; both warpgroups are past the previous step
    if (kt + kKeys < kv_hi) fetch(buf == kBufs - 1 ? 0 : buf + 1, kt + kKeys);
    cp_async_commit();

    if (kt > gmax || kt + kKeys - 1 < glo_min) {  // no row of the warpgroup sees a key of it
      wgmma_wait<0>();                            // the previous P V, before its buffer is refilled
      continue;
    }
    // S = Q Kᵀ (the previous tile's P V may still run; both are done after the wait).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kKeys>(s, q_desc(kk), k_desc(buf, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin<kKeys / 2>(s);
    wgmma_pin<D / 2>(o);

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
void launch_wg(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  constexpr size_t smem = wg_smem_bytes<D>();
  static_assert(smem <= 227 * 1024, "wgmma prefill: shared memory per block");
  static bool attr_set = false;
  if (!attr_set) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_wg_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr_set = true;
  }
  dim3 grid(unsigned(n_tiles), unsigned(a.n_kv_heads));
  attn_prefill_wg_kernel<D><<<grid, kThreads, smem, s>>>(a, tiles);
  ARBOR_LAUNCH_CHECK("attn_prefill_wg_kernel");
}


}  // namespace

bool prefill_wgmma_supported(int head_dim) {
  return current_device_cc() == 90 && (head_dim == 64 || head_dim == 128);  // the kernel is sm_90a SASS
}

void launch_attention_prefill_wgmma(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  switch (a.head_dim) {
    case 64: launch_wg<64>(a, tiles, n_tiles, s); return;
    case 128: launch_wg<128>(a, tiles, n_tiles, s); return;
    default: fail_printf("cuda: wgmma prefill attention: head_dim %d (64 or 128)", a.head_dim);
  }
}

}  // namespace arbor::cuda
