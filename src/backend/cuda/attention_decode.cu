// Split-K flash-decoding over the paged bf16 KV cache. One block per (key range, kv head, token):
// each lane holds 8 dims (16 bytes) of a key row, D/8 lanes cover a row, so a warp walks 256/D keys
// at once; the GQA group's query heads (up to 8 per block) share every K and V load. When a token's
// keys span several blocks, each writes its partial (o, max, sum) to scratch, and either the last of
// them to finish (a counter per (token, head block), reset by that block) merges them (one launch per
// layer) or a second kernel does (the launcher chooses by passing counters or not).
#include <cuda_bf16.h>

#include <cooperative_groups.h>

#include <cfloat>

#include "backend/cuda/attention_kv.h"
#include "backend/cuda/cp_async.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/qk_rows.h"

namespace arbor::cuda {

namespace {

// Query heads per block, HB = 4 or 8 (a larger GQA group is split over blocks): q and the
// accumulators take 2 x HB x 8 registers per lane, so groups of <= 4 use HB = 4 for occupancy.

// CLUSTER: the n_splits blocks of a (token, head chunk) are one thread-block cluster (n_splits <=
// kDecodeMaxCluster) and merge their partials through distributed shared memory, in this launch.
// kWarps: warps per block (4; 8 for 4-head blocks when asked: half the key steps per warp).
template <int D, int kHeads, bool PREP, bool CLUSTER, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) attn_decode_kernel(AttnArgs a, int n_splits, int head_chunks, float* scratch,
                                                                  unsigned* counters, QKPrepArgs pa) {
  pdl_trigger();
  constexpr int LPK = D / 8;         // lanes per key row
  constexpr int KPW = 32 / LPK;      // keys per warp step
  constexpr int NSG = kWarps * KPW;  // key slots per block step
  // Key steps whose K/V rows a lane has in flight (registers: 8 per step; 8-head blocks keep 2).
  constexpr int NPRE = kHeads <= 4 ? 4 : 2;
  __shared__ float sm_o[NSG][kHeads][D];
  __shared__ float sm_m[NSG][kHeads], sm_l[NSG][kHeads];
  // CLUSTER: this split's partial (unnormalised o, max, sum per head), read by the cluster's blocks.
  __shared__ float cl_o[CLUSTER ? kHeads : 1][CLUSTER ? D : 1], cl_m[kHeads], cl_l[kHeads];

  const int split = blockIdx.x, g = blockIdx.y / head_chunks, chunk = blockIdx.y % head_chunks;
  const int64_t t = blockIdx.z;
  const int G = a.n_heads / a.n_kv_heads;
  const int h0 = g * G + chunk * kHeads;                 // first query head of this block
  const int nh = min(kHeads, G - chunk * kHeads);        // heads in this block
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / LPK, sl = lane % LPK;
  const int sg = warp * KPW + sub;

  const int32_t pos = a.pos[t];
  const int32_t lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int32_t split_len = (pos + 1 - lo + n_splits - 1) / n_splits;  // this token's keys, cut in n_splits
  const int32_t k_begin = lo + split * split_len, k_end = min(pos + 1, k_begin + split_len);
  const int32_t* table = a.block_tables + int64_t(a.seq[t]) * a.max_blocks;
  const int64_t qrow = int64_t(a.n_heads) * D, kvrow = int64_t(a.n_kv_heads) * D;

  // With PREP (one token per sequence) every cache row but this step's key was written by earlier
  // steps, the block table and positions by the host, and the norm weights and rope tables at load:
  // the first NPRE key steps' K/V rows and the prep's constants are loaded before waiting on the
  // previous kernel (which writes q and the new key and value). Without PREP the previous kernel
  // writes the new keys into the cache, so the loads wait.
  auto load_kv = [&](int32_t kp, uint4& kq, uint4& vq) {  // this lane's 8 dims of key kp from the cache
    const int64_t off = kv_slot(a, table, kp) * kvrow + int64_t(g) * D + sl * 8;
    kq = *reinterpret_cast<const uint4*>(a.k_pool + off);
    vq = *reinterpret_cast<const uint4*>(a.v_pool + off);
  };
  // The split that holds pos prepares the token's own key (PREP).
  const bool owner = PREP && k_begin <= pos && pos < k_end;
  uint4 kr[NPRE], vr[NPRE];  // K/V rows of key steps kp0, kp0 + NSG, ... (a ring shifted every step)
  const int32_t kp0 = k_begin + warp * KPW + sub;
#pragma unroll
  for (int j = 0; j < NPRE; ++j) kr[j] = vr[j] = make_uint4(0, 0, 0, 0);
  PrepRow q_prep, k_prep;
  if (PREP) {
#pragma unroll
    for (int j = 0; j < NPRE; ++j)
      if (kp0 + j * NSG < k_end && kp0 + j * NSG != pos) load_kv(kp0 + j * NSG, kr[j], vr[j]);
    const int32_t rope_row = pa.rope_rows[t];  // pos, or its row in a longrope table's long regime
    load_prep_row<LPK>(pa, pa.q_norm, rope_row, sl, q_prep);
    if (owner) load_prep_row<LPK>(pa, pa.k_norm, rope_row, sl, k_prep);
  }
  pdl_wait();
  if (!PREP)
#pragma unroll
    for (int j = 0; j < NPRE; ++j)
      if (kp0 + j * NSG < k_end) load_kv(kp0 + j * NSG, kr[j], vr[j]);

  float q[kHeads][8], acc[kHeads][8], m[kHeads], l[kHeads];
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    m[i] = -INFINITY, l[i] = 0.0f;
    if (i < nh) {
      unpack8(*reinterpret_cast<const uint4*>(a.q + t * qrow + int64_t(h0 + i) * D + sl * 8), q[i]);
      if (PREP) prep_row<LPK>(pa, q_prep, lane, sl, q[i]);
#pragma unroll
      for (int e = 0; e < 8; ++e) q[i][e] *= a.scale;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
  }
  // PREP: the token's own key and value (position pos) come from the projections, not the cache: the
  // owner split prepares the key (every lane its dims) and its first head chunk stores both.
  uint4 k_own = make_uint4(0, 0, 0, 0), v_own = k_own;
  if (owner) {
    float kf[8];
    unpack8(*reinterpret_cast<const uint4*>(pa.k + t * kvrow + int64_t(g) * D + sl * 8), kf);
    prep_row<LPK>(pa, k_prep, lane, sl, kf);
    k_own = pack8(kf);
    v_own = *reinterpret_cast<const uint4*>(pa.v + t * kvrow + int64_t(g) * D + sl * 8);
    if (chunk == 0 && warp == 0 && sub == 0) {
      const int64_t off = kv_slot(a, table, pos) * kvrow + int64_t(g) * D + sl * 8;
      *reinterpret_cast<uint4*>(pa.k_pool + off) = k_own;
      *reinterpret_cast<uint4*>(pa.v_pool + off) = v_own;
    }
  }

  // The loop bound is uniform per warp (shuffles below need every lane); `live` masks the tail. The
  // K and V rows of the next NPRE - 1 steps are in flight during this step's math (at long contexts a
  // warp walks hundreds of keys, one dependent round trip per step otherwise).
  auto load = [&](int32_t kp, uint4& kq, uint4& vq) {
    kq = make_uint4(0, 0, 0, 0), vq = kq;
    if (PREP && kp == pos) kq = k_own, vq = v_own;
    else if (kp < k_end) load_kv(kp, kq, vq);
  };
  if (PREP)
#pragma unroll
    for (int j = 0; j < NPRE; ++j)
      if (kp0 + j * NSG == pos) kr[j] = k_own, vr[j] = v_own;
  for (int32_t base = k_begin + warp * KPW; base < k_end; base += NSG) {
    const int32_t kp = base + sub;
    const bool live = kp < k_end;
    const uint4 kq = kr[0], vq = vr[0];
#pragma unroll
    for (int j = 0; j + 1 < NPRE; ++j) kr[j] = kr[j + 1], vr[j] = vr[j + 1];
    load(kp + NPRE * NSG, kr[NPRE - 1], vr[NPRE - 1]);
    float kf[8], vf[8];
    unpack8(kq, kf);
    unpack8(vq, vf);
#pragma unroll
    for (int i = 0; i < kHeads; ++i) {
      if (i >= nh) break;
      float s = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) s = fmaf(q[i][e], kf[e], s);
#pragma unroll
      for (int o = LPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (!live) continue;
      if (a.softcap > 0) s = a.softcap * tanhf(s / a.softcap);
      const float mn = fmaxf(m[i], s);
      const float corr = __expf(m[i] - mn), p = __expf(s - mn);
      l[i] = l[i] * corr + p;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[i][e] = fmaf(acc[i][e], corr, p * vf[e]);
      m[i] = mn;
    }
  }

  // Merge the NSG key slots of the block.
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    if (i >= nh) break;
#pragma unroll
    for (int e = 0; e < 8; ++e) sm_o[sg][i][sl * 8 + e] = acc[i][e];
    if (sl == 0) sm_m[sg][i] = m[i], sm_l[sg][i] = l[i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nh * D; idx += blockDim.x) {
    const int i = idx / D, d = idx % D;
    float M = -INFINITY;
    for (int j = 0; j < NSG; ++j) M = fmaxf(M, sm_m[j][i]);
    float L = 0, O = 0;
    if (M > -INFINITY) {
      for (int j = 0; j < NSG; ++j) {
        const float w = __expf(sm_m[j][i] - M);  // 0 for empty slots (m = -inf)
        L += sm_l[j][i] * w;
        O += sm_o[j][i][d] * w;
      }
    }
    const int h = h0 + i;
    if (n_splits == 1) {
      a.out[t * qrow + int64_t(h) * D + d] = __bfloat16_as_ushort(__float2bfloat16(L > 0 ? O / L : 0.0f));
    } else if (CLUSTER) {
      cl_o[CLUSTER ? i : 0][CLUSTER ? d : 0] = O;
      if (d == 0) cl_m[i] = M, cl_l[i] = L;
    } else {
      float* p = scratch + ((t * a.n_heads + h) * n_splits + split) * (D + 2);
      p[d] = O;
      if (d == 0) p[D] = M, p[D + 1] = L;
    }
  }
  if constexpr (CLUSTER) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (n_splits == 1) return;  // uniform over the cluster (a cluster of one)
    // out = Σ_s O_s e^{M_s - M} / Σ_s L_s e^{M_s - M} over the cluster's blocks s, each output
    // (head, dim) by one thread of the cluster, from the blocks' shared memory.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every split's partial is in its block's shared memory
    const int S = n_splits;
    for (int idx = int(cluster.block_rank()) * blockDim.x + threadIdx.x; idx < nh * D; idx += S * blockDim.x) {
      const int i = idx / D, d = idx % D;
      float ms[kDecodeMaxCluster], ls[kDecodeMaxCluster], os[kDecodeMaxCluster];
#pragma unroll
      for (int r = 0; r < kDecodeMaxCluster; ++r)
        if (r < S) {
          ms[r] = *cluster.map_shared_rank(&cl_m[i], r);
          ls[r] = *cluster.map_shared_rank(&cl_l[i], r);
          os[r] = *cluster.map_shared_rank(&cl_o[CLUSTER ? i : 0][CLUSTER ? d : 0], r);
        }
      float M = -INFINITY, L = 0, O = 0;
#pragma unroll
      for (int r = 0; r < kDecodeMaxCluster; ++r)
        if (r < S) M = fmaxf(M, ms[r]);
#pragma unroll
      for (int r = 0; r < kDecodeMaxCluster; ++r)
        if (r < S && ms[r] > -INFINITY) {
          const float w = __expf(ms[r] - M);
          L += ls[r] * w, O += os[r] * w;
        }
      a.out[t * qrow + int64_t(h0 + i) * D + d] = __bfloat16_as_ushort(__float2bfloat16(L > 0 ? O / L : 0.0f));
    }
    cluster.sync();  // no block leaves while another may still read its shared memory
#endif
    return;
  }
  if (n_splits == 1 || !counters) return;

  // The last block of this (token, head block) merges every split's partial:
  // out = Σ_s O_s e^{M_s - M} / Σ_s L_s e^{M_s - M}.
  __shared__ bool last;
  __shared__ float Ms[kHeads], Ls[kHeads];
  __threadfence();  // this block's partials are visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* c = counters + t * gridDim.y + blockIdx.y;
    last = atomicAdd(c, 1u) == unsigned(n_splits - 1);
    if (last) *c = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Weights and sums of every split in the shared memory sm_o held (kHeads x 1024 floats >= 2 x
  // kHeads x n_splits: n_splits <= kDecodeMaxSplits).
  static_assert(NSG * D >= 2 * kDecodeMaxSplits, "the merge's weights must fit in sm_o");
  float* mw = &sm_o[0][0][0];
  float* lw = mw + nh * n_splits;
  const float* base = scratch + (t * a.n_heads + h0) * n_splits * (D + 2);
  for (int idx = threadIdx.x; idx < nh * n_splits; idx += blockDim.x) {
    const float* p = base + int64_t(idx) * (D + 2);  // head idx / n_splits, split idx % n_splits
    mw[idx] = __ldcg(p + D), lw[idx] = __ldcg(p + D + 1);
  }
  __syncthreads();
  // Per head: the largest max and the weighted sum, one warp per head (lanes over the splits).
  for (int i = warp; i < nh; i += kWarps) {
    float M = -INFINITY, L = 0;
    for (int s = lane; s < n_splits; s += 32) M = fmaxf(M, mw[i * n_splits + s]);
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (M > -INFINITY)
      for (int s = lane; s < n_splits; s += 32) L += lw[i * n_splits + s] * __expf(mw[i * n_splits + s] - M);
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0) Ms[i] = M, Ls[i] = L;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nh * n_splits; idx += blockDim.x) {
    const float m_s = mw[idx], M = Ms[idx / n_splits];
    mw[idx] = m_s == -INFINITY ? 0.0f : __expf(m_s - M);
  }
  __syncthreads();
  // Each thread sums J outputs (head, dim) at once over the splits: J independent loads in flight per split.
  constexpr int J = (kHeads * D + kWarps * 32 - 1) / (kWarps * 32);
  float O[J];
#pragma unroll
  for (int j = 0; j < J; ++j) O[j] = 0.0f;
#pragma unroll 2
  for (int s = 0; s < n_splits; ++s) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int idx = threadIdx.x + j * kWarps * 32, i = idx / D, d = idx % D;
      if (i < nh) O[j] += __ldcg(base + (int64_t(i) * n_splits + s) * (D + 2) + d) * mw[i * n_splits + s];
    }
  }
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int idx = threadIdx.x + j * kWarps * 32, i = idx / D, d = idx % D;
    if (i >= nh) continue;
    const float L = Ls[i];
    a.out[t * qrow + int64_t(h0 + i) * D + d] = __bfloat16_as_ushort(__float2bfloat16(L > 0 ? O[j] / L : 0.0f));
  }
}

// The merge as a second kernel (when the launcher is given no counters): out[t, h] = Σ_s O_s e^{M_s - M}
// / Σ_s L_s e^{M_s - M} over the splits s; one block of D threads per (h, t). Every load is issued at
// once: each split's (M, L) by one thread, and the partial outputs of up to kCombineFloats / D splits
// at a time straight into shared memory (cp.async, 4 bytes a thread and split), so the merge costs one
// round trip per chunk instead of one per few splits (Nsight on the previous version, which looped
// over the splits with dependent sums: 8.3 us for 8B at 33 splits).
constexpr int kCombineFloats = 8192;  // 32 KB of partial outputs per chunk
__global__ void attn_combine_kernel(const float* scratch, int n_splits, int D, int n_heads, uint16_t* out) {
  __shared__ float wgt[kDecodeMaxSplits], lsum[kDecodeMaxSplits];
  __shared__ __align__(16) float part[kCombineFloats];
  __shared__ float red[8];
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, d = threadIdx.x, lane = d % 32, warp = d / 32, warps = D / 32;
  const int64_t t = blockIdx.y;
  const float* p = scratch + (t * n_heads + h) * n_splits * (D + 2);
  const int chunk = kCombineFloats / D;
  auto fetch = [&](int s0) {
    const int n = min(chunk, n_splits - s0);
    for (int j = 0; j < n; ++j)
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(part + j * D + d)), "l"(p + int64_t(s0 + j) * (D + 2) + d));
    cp_async_commit();
  };
  fetch(0);
  for (int s = d; s < n_splits; s += D) wgt[s] = p[s * (D + 2) + D], lsum[s] = p[s * (D + 2) + D + 1];
  __syncthreads();
  // M: the largest split max; weights e^{M_s - M} (0 for empty splits); L = Σ weight * L_s.
  float m = -INFINITY;
  for (int s = d; s < n_splits; s += D) m = fmaxf(m, wgt[s]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  float M = red[0];
  for (int w = 1; w < warps; ++w) M = fmaxf(M, red[w]);
  __syncthreads();  // red is reused below
  float l = 0;
  for (int s = d; s < n_splits; s += D) {
    const float w = wgt[s] == -INFINITY ? 0.0f : __expf(wgt[s] - M);
    wgt[s] = w, l += w * lsum[s];
  }
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) red[warp] = l;
  float O = 0;
  for (int s0 = 0; s0 < n_splits; s0 += chunk) {
    cp_async_wait<0>();
    __syncthreads();  // the chunk (every thread's copies), the weights and red are in
    const int n = min(chunk, n_splits - s0);
#pragma unroll 8
    for (int j = 0; j < n; ++j) O += part[j * D + d] * wgt[s0 + j];
    if (s0 + chunk < n_splits) {
      __syncthreads();  // every thread is done with this chunk
      fetch(s0 + chunk);
    }
  }
  float L = 0;
  for (int w = 0; w < warps; ++w) L += red[w];
  out[(t * n_heads + h) * D + d] = __bfloat16_as_ushort(__float2bfloat16(L > 0 ? O / L : 0.0f));
}

template <int D, int HB, bool PREP, bool CLUSTER, int kWarps>
void launch_k(dim3 grid, int n_splits, int chunks, const AttnArgs& a, float* scratch, unsigned* counters, const QKPrepArgs& pa,
              cudaStream_t s) {
  auto* kernel = attn_decode_kernel<D, HB, PREP, CLUSTER, kWarps>;
  if (!CLUSTER) {
    pdl_launch(kernel, grid, kWarps * 32, 0, s, a, n_splits, chunks, scratch, counters, pa);
  } else {
    static bool attr_set = false;  // clusters over 8 blocks are "non-portable": allowed per kernel
    if (!attr_set) {
      ARBOR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      attr_set = true;
    }
    pdl_launch_cluster(kernel, grid, kWarps * 32, 0, s, dim3(unsigned(n_splits), 1, 1), a, n_splits, chunks, scratch, counters, pa);
  }
  ARBOR_LAUNCH_CHECK("attn_decode_kernel");
}
template <int D, bool PREP>
void launch_d(const AttnArgs& a, int64_t T, int n_splits, float* scratch, unsigned* counters, const QKPrepArgs& pa, bool cluster,
              bool wide, cudaStream_t s) {
  const int G = a.n_heads / a.n_kv_heads, hb = G <= 4 ? 4 : 8, chunks = (G + hb - 1) / hb;
  dim3 grid(unsigned(n_splits), unsigned(a.n_kv_heads * chunks), unsigned(T));
#define ARBOR_DECODE(HB, C, W) launch_k<D, HB, PREP, C, W>(grid, n_splits, chunks, a, scratch, counters, pa, s)
  if (hb == 4 && wide) cluster ? ARBOR_DECODE(4, true, 8) : ARBOR_DECODE(4, false, 8);
  else if (hb == 4) cluster ? ARBOR_DECODE(4, true, 4) : ARBOR_DECODE(4, false, 4);
  else cluster ? ARBOR_DECODE(8, true, 4) : ARBOR_DECODE(8, false, 4);
#undef ARBOR_DECODE
}
template <int D>
void launch_d(const AttnArgs& a, int64_t T, int n_splits, float* scratch, unsigned* counters, const QKPrepArgs* pa, bool cluster,
              bool wide, cudaStream_t s) {
  if (pa) launch_d<D, true>(a, T, n_splits, scratch, counters, *pa, cluster, wide, s);
  else launch_d<D, false>(a, T, n_splits, scratch, counters, QKPrepArgs{}, cluster, wide, s);
}

}  // namespace

void launch_attention_decode(const AttnArgs& a, int64_t T, int n_splits, float* scratch, unsigned* counters, cudaStream_t s,
                             const QKPrepArgs* prep, bool cluster, bool wide) {
  if (T == 0) return;
  ARBOR_CU_CHECK(!prep || ((prep->half % 8 == 0) && prep->head_dim == a.head_dim),
                 "cuda: attention decode with q/k prep: rope half %d (a multiple of 8), head_dim %d", prep ? prep->half : 0, a.head_dim);
  ARBOR_CU_CHECK(T <= 65535 && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && n_splits >= 1 && n_splits <= kDecodeMaxSplits &&
                     (n_splits == 1 || scratch || cluster),
                 "cuda: attention decode: T %lld, heads %d/%d, splits %d (1..%d)", (long long)T, a.n_heads, a.n_kv_heads, n_splits, kDecodeMaxSplits);
  ARBOR_CU_CHECK(!cluster || n_splits <= kDecodeMaxCluster, "cuda: attention decode: %d splits in one cluster (at most %d)", n_splits,
                 kDecodeMaxCluster);
  // The tensor-core kernel when turned on (ARBOR_CUDA_KV_MMA=1; attention_kv.h), except where the
  // splits merge in a cluster (no scratch).
  if (!cluster && launch_attention_decode_mma(a, KVCodecDev{0, 0, 0, 2 * a.head_dim}, KVCodecDev{0, 0, 0, 2 * a.head_dim}, T, n_splits, scratch,
                                              s, prep))
    return;
  switch (a.head_dim) {
    case 32: launch_d<32>(a, T, n_splits, scratch, counters, prep, cluster, wide, s); break;
    case 64: launch_d<64>(a, T, n_splits, scratch, counters, prep, cluster, wide, s); break;
    case 128: launch_d<128>(a, T, n_splits, scratch, counters, prep, cluster, wide, s); break;
    case 256: launch_d<256>(a, T, n_splits, scratch, counters, prep, cluster, wide, s); break;
    default: fail_printf("cuda: decode attention: head_dim %d is not supported (32, 64, 128, 256)", a.head_dim);
  }
  if (n_splits > 1 && !counters && !cluster) {
    dim3 grid(unsigned(a.n_heads), unsigned(T));
    pdl_launch(attn_combine_kernel, grid, unsigned(a.head_dim), 0, s, scratch, n_splits, a.head_dim, a.n_heads, a.out);
    ARBOR_LAUNCH_CHECK("attn_combine_kernel");
  }
}

}  // namespace arbor::cuda
