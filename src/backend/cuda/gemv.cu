// GEMV for decode: y [T, N] = x [T, K] · W[N, K]ᵀ for T = 1..8 rows of activations. Memory-bound: every
// weight byte is read once with 16-byte streaming loads (L1::no_allocate, so x stays in L1), each lane
// keeps 2 rows x 4 loads = 128 bytes in flight, and small N is split along K over up to 8 warps so
// the grid still fills every SM. Up to three matrices with the same K (q/k/v, gate/up) run as one
// launch: their row pairs are numbered consecutively and each warp finds its matrix from its pair.
//
// For 1-2 activation rows and K a multiple of 256 a second kernel streams instead (gemv_stream_kernel):
// two persistent blocks of 16 warps per SM, each warp owning a contiguous run of output rows (gated:
// of gate/up row pairs) and pulling its weights through a private cp.async ring in shared memory,
// kStages x 512 bytes deep, filled before griddepcontrol.wait (so with programmatic dependent launch
// the weights start streaming while the previous kernel finishes); x is copied to shared memory once
// per block after the wait.
//
// For 3-8 rows, bf16 weights and K a multiple of 512, a third kernel runs the products on tensor cores
// (gemv_mma_kernel, below): 16 weight rows are an MMA's M and the activation rows its N.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cp_async.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_sync.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/segments.h"

namespace arbor::cuda {

namespace {

constexpr int kWarps = 8;   // per block (256 threads)
constexpr int kUnroll = 4;  // 16-byte loads per lane per row before the first use (8 measured slower)

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <bool F16>
__device__ __forceinline__ void unpack8(const uint4& q, float* f) {
  const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (F16) {
      float2 p = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
      f[2 * i] = p.x, f[2 * i + 1] = p.y;
    } else {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
}

template <bool F16>
__device__ __forceinline__ float w_at(const uint16_t* w, int64_t i) {
  if constexpr (F16) return __half2float(reinterpret_cast<const __half*>(w)[i]);
  else return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(w)[i]);
}

// Block: kWarps warps; `wpr` consecutive warps share one pair of output rows, each summing a
// contiguous part of K. acc[j][r]: output row (row0 + j), activation row r.
template <int NR, bool F16>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvSegments segs, const uint16_t* __restrict__ x, bool y_f32, int T,
                                                           int64_t K, int wpr, bool vec, int gated_act) {
  __shared__ float red[kWarps][2][NR];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = warp / wpr, part = warp % wpr;
  const int64_t gp = int64_t(blockIdx.x) * (kWarps / wpr) + pair;
  // A warp's two rows: rows (2p, 2p + 1) of the matrix its pair p belongs to (segments are
  // consecutive ranges of pairs); gated: row p of the gate and row p of the up matrix.
  const uint16_t* __restrict__ wa;
  const uint16_t* __restrict__ wb;
  const float* __restrict__ ba;
  const float* __restrict__ bb;
  void* y;
  int64_t N, row0;
  bool has0, has1;
  if (gated_act >= 0) {
    wa = segs.w[0], wb = segs.w[1], ba = segs.bias[0], bb = segs.bias[1], y = segs.y[0], N = segs.N[0], row0 = gp;
    has0 = has1 = gp < N;
  } else {
    const int si = segs.n > 2 && gp >= segs.pair0[2] ? 2 : segs.n > 1 && gp >= segs.pair0[1] ? 1 : 0;
    wa = wb = si == 0 ? segs.w[0] : si == 1 ? segs.w[1] : segs.w[2];
    ba = bb = si == 0 ? segs.bias[0] : si == 1 ? segs.bias[1] : segs.bias[2];
    y = si == 0 ? segs.y[0] : si == 1 ? segs.y[1] : segs.y[2];
    N = si == 0 ? segs.N[0] : si == 1 ? segs.N[1] : segs.N[2];
    row0 = (gp - (si == 0 ? 0 : si == 1 ? segs.pair0[1] : segs.pair0[2])) * 2;
    has0 = row0 < N, has1 = row0 + 1 < N;
  }
  const int64_t rowa = has0 ? row0 : 0, rowb = gated_act >= 0 ? rowa : (has1 ? row0 + 1 : 0);
  float acc[2][NR];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[j][r] = 0.0f;

  pdl_trigger();
  if (vec) {
    const int64_t nv = K / 8, beg = nv * part / wpr, end = nv * (part + 1) / wpr;
    const uint4* w0 = reinterpret_cast<const uint4*>(wa + rowa * K);
    const uint4* w1 = reinterpret_cast<const uint4*>(wb + rowb * K);
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    uint4 q0[kUnroll], q1[kUnroll];
    auto load = [&](int64_t i0) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + u * 32;
        q0[u] = i < end && has0 ? ld_stream(w0 + i) : make_uint4(0, 0, 0, 0);
        q1[u] = i < end && has1 ? ld_stream(w1 + i) : make_uint4(0, 0, 0, 0);
      }
    };
    // The first weights are fetched before waiting for the kernel that writes x (they do not depend
    // on it): with programmatic dependent launch that load overlaps the previous kernel's tail.
    load(beg + lane);
    pdl_wait();
    for (int64_t i0 = beg + lane; i0 < end; i0 += 32 * kUnroll) {
      if (i0 != beg + lane) load(i0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + u * 32;
        if (i >= end) break;
        float f0[8], f1[8];
        unpack8<F16>(q0[u], f0);
        unpack8<F16>(q1[u], f1);
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          if (r >= T) break;
          float xf[8];
          unpack8<false>(__ldg(xv + r * nv + i), xf);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            acc[0][r] = fmaf(f0[e], xf[e], acc[0][r]);
            acc[1][r] = fmaf(f1[e], xf[e], acc[1][r]);
          }
        }
      }
    }
  } else {  // K not a multiple of 8 (or unaligned): one element per lane per step
    pdl_wait();
    const int64_t beg = K * part / wpr, end = K * (part + 1) / wpr;
    for (int64_t k = beg + lane; k < end; k += 32) {
      const float a = has0 ? w_at<F16>(wa, rowa * K + k) : 0.0f;
      const float b = has1 ? w_at<F16>(wb, rowb * K + k) : 0.0f;
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        if (r >= T) break;
        const float xf = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(x)[r * K + k]);
        acc[0][r] = fmaf(a, xf, acc[0][r]);
        acc[1][r] = fmaf(b, xf, acc[1][r]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int r = 0; r < NR; ++r)
      for (int o = 16; o > 0; o >>= 1) acc[j][r] += __shfl_xor_sync(0xffffffffu, acc[j][r], o);
  if (wpr > 1) {
    if (lane == 0)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int r = 0; r < NR; ++r) red[warp][j][r] = acc[j][r];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        float s = 0;
        for (int p = 0; p < wpr; ++p) s += red[warp + p][j][r];
        acc[j][r] = s;
      }
  }
  if (lane != 0) return;
  if (gated_act >= 0) {  // y = act(gate) * up, each rounded to bf16 first as the unfused ops store them
    if (!has0) return;
    const float b0 = ba ? ba[row0] : 0.0f, b1 = bb ? bb[row0] : 0.0f;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r >= T) break;
      const float g = __bfloat162float(__float2bfloat16(acc[0][r] + b0)), u = __bfloat162float(__float2bfloat16(acc[1][r] + b1));
      static_cast<__nv_bfloat16*>(y)[r * N + row0] = __float2bfloat16(act_value(gated_act, g) * u);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int64_t n = row0 + j;
    if (n >= N) break;
    const float b = ba ? ba[n] : 0.0f;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r >= T) break;
      const float v = acc[j][r] + b;
      if (y_f32)
        static_cast<float*>(y)[r * N + n] = v;
      else
        static_cast<__nv_bfloat16*>(y)[r * N + n] = __float2bfloat16(v);
    }
  }
}

template <int NR>
void launch_nr(bool f16, dim3 grid, cudaStream_t s, const GemvSegments& segs, const uint16_t* x, bool y_f32, int T, int64_t K, int wpr,
               bool vec, int gated_act) {
  if (f16)
    pdl_launch(gemv_kernel<NR, true>, grid, kWarps * 32, 0, s, segs, x, y_f32, T, K, wpr, vec, gated_act);
  else
    pdl_launch(gemv_kernel<NR, false>, grid, kWarps * 32, 0, s, segs, x, y_f32, T, K, wpr, vec, gated_act);
  ARBOR_LAUNCH_CHECK("gemv_kernel");
}


// ---- streaming kernel ------------------------------------------------------------------------------
constexpr int kStreamWarps = 16;  // 512 threads per block
// Stages in flight per warp, blocks per SM, the largest x kept in shared memory: measured on the H200
// (docs/cuda-notes.md, session 3): x from shared memory instead of L1 was the big step (o/q GEMV 64 ->
// 78%), then 2 blocks of 4 stages beat 1 block of 8, 12 or 16.
constexpr int kStages = 4;
constexpr int kStreamBlocksPerSm = 2;
constexpr int64_t kStreamMaxXBytes = 64 * 1024;
constexpr int kStreamSmemLimit = 200 * 1024;  // every stream kernel's shared-memory limit (as all variants were measured)

// The streaming kernels' start: the ring's first STAGES stages of weights are issued (they do not
// depend on the previous kernel), then the successor may launch, then wait for the previous kernel,
// which writes x.
template <int STAGES, class Issue>
__device__ __forceinline__ void prime_ring(Issue& issue) {
#pragma unroll 1
  for (int j = 0; j < STAGES; ++j) issue();
  pdl_trigger();
  pdl_wait();
}

// Unit u of the launch: one output row (plain: the matrices' rows numbered consecutively, row0[i] the
// first of matrix i) or one gate/up row pair (gated). q picks the gate (0) or up (1) row.
template <int RPU>
__device__ __forceinline__ int stream_seg(const GemvSegments& segs, int64_t u) {
  return RPU == 2 ? 0 : unit_segment(segs.n, segs.pair0, u);
}
template <int RPU>
__device__ __forceinline__ const uint16_t* stream_row(const GemvSegments& segs, int64_t u, int64_t K, int q) {
  if (RPU == 2) return (q == 0 ? segs.w[0] : segs.w[1]) + u * K;
  const int si = stream_seg<RPU>(segs, u);
  return seg_pick(segs.w, si) + (u - seg_pick(segs.pair0, si)) * K;
}

// Unit u's outputs (the launch's row numbering: the matrices' rows numbered consecutively, or gate/up
// row pairs) for activation rows r0 .. r0 + NR - 1: sum0 (plain; gated: the gate row) and sum1 (gated:
// the up row) plus the bias, into its matrix's y; gated stores act(gate) * up, each rounded to bf16
// first as the unfused ops store them. Shared by the streaming and tensor-core kernels.
template <int RPU, int NR>
__device__ __forceinline__ void store_unit(const GemvSegments& segs, int64_t u, int r0, const float (&sum0)[NR], const float (&sum1)[NR],
                                           bool y_f32, int gated_act) {
  const int si = stream_seg<RPU>(segs, u);
  const int64_t N = seg_pick(segs.N, si), n = RPU == 2 ? u : u - seg_pick(segs.pair0, si);
  const float* bias = seg_pick(segs.bias, si);
  void* y = seg_pick(segs.y, si);
  const float b0 = bias ? bias[n] : 0.0f;
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    const int r = r0 + i;
    if (RPU == 2) {
      const float b1 = segs.bias[1] ? segs.bias[1][n] : 0.0f;
      const float g = __bfloat162float(__float2bfloat16(sum0[i] + b0));
      const float up = __bfloat162float(__float2bfloat16(sum1[i] + b1));
      static_cast<__nv_bfloat16*>(y)[r * N + n] = __float2bfloat16(act_value(gated_act, g) * up);
    } else if (y_f32) {
      static_cast<float*>(y)[r * N + n] = sum0[i] + b0;
    } else {
      static_cast<__nv_bfloat16*>(y)[r * N + n] = __float2bfloat16(sum0[i] + b0);
    }
  }
}

// RPU: weight rows per unit (1 plain, 2 gated); NR: activation rows (1 or 2). pair0 here holds each
// matrix's first row (not row pair). Every lane reads its own ring slots only, so the ring needs no
// barrier: cp.async.wait_group orders a thread's copies before its own reads.
template <int RPU, int NR, bool F16, bool XS>
__global__ void __launch_bounds__(kStreamWarps * 32, 2) gemv_stream_kernel(GemvSegments segs, const uint16_t* __restrict__ x,
                                                                             bool y_f32, int64_t K, int64_t units, int gated_act) {
  extern __shared__ __align__(16) uint4 ring[];  // [kStages][RPU][kStreamWarps * 32]
  const int tid = threadIdx.x, lane = tid % 32;
  const int64_t warps = int64_t(gridDim.x) * kStreamWarps, gw = int64_t(blockIdx.x) * kStreamWarps + tid / 32;
  const int64_t u_beg = units * gw / warps, u_end = units * (gw + 1) / warps;
  const int chunks = int(K / 256);  // 512-byte stages per row
  const uint32_t ring0 = smem_addr(ring) + uint32_t(tid) * 16u;
  constexpr uint32_t kSlot = kStreamWarps * 32 * 16, kStageBytes = kSlot * RPU;

  // Issue side: the next stage to fetch is chunk ic of unit iu, into ring slot islot.
  int64_t iu = u_beg;
  int ic = 0, islot = 0;
  const uint16_t* p0 = iu < u_end ? stream_row<RPU>(segs, iu, K, 0) + lane * 8 : nullptr;
  const uint16_t* p1 = RPU == 2 && iu < u_end ? stream_row<RPU>(segs, iu, K, 1) + lane * 8 : nullptr;
  auto issue = [&] {
    if (iu < u_end) {
      const uint32_t dst = ring0 + uint32_t(islot) * kStageBytes;
      cp_async16(dst, p0 + ic * 256);
      if (RPU == 2) cp_async16(dst + kSlot, p1 + ic * 256);
      if (++ic == chunks) {
        ic = 0;
        if (++iu < u_end) {
          p0 = stream_row<RPU>(segs, iu, K, 0) + lane * 8;
          if (RPU == 2) p1 = stream_row<RPU>(segs, iu, K, 1) + lane * 8;
        }
      }
    }
    cp_async_commit();  // empty groups keep the count uniform
    if (++islot == kStages) islot = 0;
  };
  prime_ring<kStages>(issue);

  const int64_t nv = K / 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x) + lane;
  if (XS) {
    uint4* xs = ring + kStages * RPU * kStreamWarps * 32;
    for (int64_t i = tid; i < NR * nv; i += kStreamWarps * 32) xs[i] = reinterpret_cast<const uint4*>(x)[i];
    __syncthreads();
    xv = xs + lane;
  }
  float acc[RPU][NR];
#pragma unroll
  for (int q = 0; q < RPU; ++q)
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[q][r] = 0.0f;
  int cslot = 0;
#pragma unroll 1
  for (int64_t u = u_beg; u < u_end; ++u) {
#pragma unroll 1
    for (int c = 0; c < chunks; ++c) {
      cp_async_wait<kStages - 1>();  // this stage has landed
      const uint4* slot = ring + cslot * (RPU * kStreamWarps * 32) + tid;
      uint4 wq[RPU];
#pragma unroll
      for (int q = 0; q < RPU; ++q) wq[q] = slot[q * kStreamWarps * 32];
      if (++cslot == kStages) cslot = 0;
      issue();  // the slot is free once read into registers
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        float xf[8];
        unpack8<false>(XS ? xv[r * nv + c * 32] : __ldg(xv + r * nv + c * 32), xf);
#pragma unroll
        for (int q = 0; q < RPU; ++q) {
          float f[8];
          unpack8<F16>(wq[q], f);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[q][r] = fmaf(f[e], xf[e], acc[q][r]);
        }
      }
    }
    // The unit's last chunk: reduce over the warp, lane 0 writes, start the next unit.
#pragma unroll
    for (int q = 0; q < RPU; ++q)
#pragma unroll
      for (int r = 0; r < NR; ++r)
        for (int o = 16; o > 0; o >>= 1) acc[q][r] += __shfl_xor_sync(0xffffffffu, acc[q][r], o);
    if (lane == 0) store_unit<RPU, NR>(segs, u, 0, acc[0], acc[RPU - 1], y_f32, gated_act);
#pragma unroll
    for (int q = 0; q < RPU; ++q)
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[q][r] = 0.0f;
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory when the block exits
}

bool g_stream = true;

template <int RPU, int NR, bool F16>
void launch_stream_t(dim3 grid, size_t smem, cudaStream_t s, const GemvSegments& segs, const uint16_t* x, bool y_f32, int64_t K,
                     int64_t units, int gated_act) {
  static bool attr_set = false;  // once per instantiation
  const size_t x_bytes = size_t(NR * K * 2);
  const bool xs = int64_t(x_bytes) <= kStreamMaxXBytes;
  if (!attr_set) {
    // Every instantiation may use up to kStreamSmemLimit, whatever this launch needs.
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(gemv_stream_kernel<RPU, NR, F16, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kStreamSmemLimit));
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(gemv_stream_kernel<RPU, NR, F16, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kStreamSmemLimit));
    attr_set = true;
  }
  if (xs)
    pdl_launch(gemv_stream_kernel<RPU, NR, F16, true>, grid, kStreamWarps * 32, smem + x_bytes, s, segs, x, y_f32, K, units, gated_act);
  else
    pdl_launch(gemv_stream_kernel<RPU, NR, F16, false>, grid, kStreamWarps * 32, smem, s, segs, x, y_f32, K, units, gated_act);
  ARBOR_LAUNCH_CHECK("gemv_stream_kernel");
}

// True when it launched: 1-2 rows, K a multiple of 256, 16-byte aligned weights and x. segs.pair0
// holds each matrix's first row (by_rows), not row pair.
bool launch_stream(const GemvSegments& segs, int64_t units, bool f16, const uint16_t* x, bool y_f32, int64_t T, int64_t K, int n_sms,
                   bool vec, int gated_act, cudaStream_t s) {
  if (!g_stream || !vec || T > 2 || K % 256 != 0) return false;
  const int rpu = gated_act >= 0 ? 2 : 1;
  // Every warp gets at least one unit: fewer blocks than SMs for small matrices.
  const int64_t blocks = std::min<int64_t>(int64_t(n_sms) * kStreamBlocksPerSm, (units + kStreamWarps - 1) / kStreamWarps);
  const dim3 grid(unsigned(std::max<int64_t>(blocks, 1)));
  const size_t smem = size_t(kStages) * rpu * kStreamWarps * 32 * 16;
#define ARBOR_STREAM(R, N, F) launch_stream_t<R, N, F>(grid, smem, s, segs, x, y_f32, K, units, gated_act)
  if (rpu == 2) {
    if (T == 1) f16 ? ARBOR_STREAM(2, 1, true) : ARBOR_STREAM(2, 1, false);
    else f16 ? ARBOR_STREAM(2, 2, true) : ARBOR_STREAM(2, 2, false);
  } else {
    if (T == 1) f16 ? ARBOR_STREAM(1, 1, true) : ARBOR_STREAM(1, 1, false);
    else f16 ? ARBOR_STREAM(1, 2, true) : ARBOR_STREAM(1, 2, false);
  }
#undef ARBOR_STREAM
  return true;
}

// ---- tensor-core streaming kernel (3-8 activation rows) ---------------------------------------------
// y = x · Wᵀ as Wᵀ's tiles times x on mma.sync m16n8k16: a row group of 16 output rows is the MMA's
// M, the (up to 8) activation rows its N, so every weight byte is read once whatever the rows. Blocks of
// 8 warps own contiguous runs of row groups; the warps of a block split K and each streams its K slice
// of the group's 16 rows through a private cp.async ring, filled before griddepcontrol.wait and
// continuing across row groups. A stage is 16 rows x 64 k: each row's 128 bytes are one whole cache
// line, copied by 8 lanes (session 8's first version fetched 32 bytes of each of 16 rows a step and
// read x through L1: Nsight showed DRAM at 45% of its peak, L1 hits 30-50%; docs/cuda-notes.md, session
// 9). x sits in shared memory for the whole launch when its T rows fit in 64 KB (K <= 4096 at 8 rows),
// rows padded by 16 bytes so the fragment reads hit distinct banks; otherwise it is read from global
// memory one stage ahead. At the end of a group the warps' partial tiles are summed in shared memory.
// Gated: gate and up rows of a group side by side (two tiles a stage).
constexpr int kMmaWarps = 8;
constexpr int kMmaStages = 4;
constexpr int kMmaK = 64;                    // k per stage
constexpr int64_t kMmaMaxXBytes = 64 * 1024;  // x in shared memory up to this

// Byte offset of (row, 16-byte chunk c) in a 16 x 64 tile: 128-byte rows, chunks XOR-swizzled by row so
// the 8 row reads of an ldmatrix (one chunk column) hit distinct banks. The one-panel case of wgmma.h's
// swz_offset (c < 8), kept apart: its panel term is arithmetic this kernel's inner loop does not need.
__device__ __forceinline__ uint32_t mma_off(int row, int c) { return uint32_t(row * 128 + ((c ^ (row & 7)) << 4)); }

template <int RPU, bool XS>
__global__ void __launch_bounds__(kMmaWarps * 32) gemv_mma_kernel(GemvSegments segs, const uint16_t* __restrict__ x, bool y_f32,
                                                                  int T, int64_t K, int64_t rows, int gated_act) {
  extern __shared__ __align__(16) unsigned char gemv_mma_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr uint32_t kTile = 16 * kMmaK * 2, kStage = kTile * RPU, kWarpRing = kStage * kMmaStages;
  const uint32_t ring0 = smem_addr(gemv_mma_smem) + uint32_t(warp) * kWarpRing;
  float* red = reinterpret_cast<float*>(gemv_mma_smem + kMmaWarps * kWarpRing);  // [warp][RPU][lane][4]
  uint16_t* xs = reinterpret_cast<uint16_t*>(red + kMmaWarps * RPU * 128);         // XS: [T][K + 8]
  const int64_t xstride = K + 8;
  const int64_t groups = (rows + 15) / 16;
  const int64_t g_beg = groups * blockIdx.x / gridDim.x, g_end = groups * (blockIdx.x + 1) / gridDim.x;
  const int64_t kslice = K / kMmaWarps, k0 = kslice * warp;  // this warp's K range
  const int stages = int(kslice / kMmaK);

  // Issue side: stage (group ig, stage is); lane copies chunk lane%8 of rows j*4 + lane/8, j = 0..3.
  const int lr = lane >> 3, lc = lane & 7;
  int64_t ig = g_beg;
  int is = 0, islot = 0;
  const uint16_t* p0[4];
  const uint16_t* p1[4];
  bool pv[4];
  auto row_ptrs = [&] {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t rr = ig * 16 + j * 4 + lr;
      pv[j] = ig < g_end && rr < rows;
      p0[j] = pv[j] ? stream_row<RPU>(segs, rr, K, 0) + k0 + lc * 8 : segs.w[0];
      if (RPU == 2) p1[j] = pv[j] ? stream_row<2>(segs, rr, K, 1) + k0 + lc * 8 : segs.w[0];
    }
  };
  row_ptrs();
  auto issue = [&] {
    if (ig < g_end) {
      const uint32_t dst = ring0 + uint32_t(islot) * kStage;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t off = mma_off(j * 4 + lr, lc);
        cp_async16_zfill(dst + off, pv[j] ? p0[j] + is * kMmaK : p0[j], pv[j]);
        if (RPU == 2) cp_async16_zfill(dst + kTile + off, pv[j] ? p1[j] + is * kMmaK : p1[j], pv[j]);
      }
      if (++is == stages) {
        is = 0;
        ++ig;
        row_ptrs();
      }
    }
    cp_async_commit();  // empty groups keep the count uniform
    if (++islot == kMmaStages) islot = 0;
  };
  prime_ring<kMmaStages>(issue);

  // x fragments: B[k][n] = x[n][k]; lane holds n = lane/4, k = 2(lane%4) (+1) and +8.
  const int bn = lane >> 2, bk = (lane & 3) * 2;
  const bool bvalid = bn < T;
  const uint32_t* xr;
  if (XS) {
    for (int64_t i = threadIdx.x; i < int64_t(T) * (K / 8); i += kMmaWarps * 32) {
      const int64_t r = i / (K / 8), c = i % (K / 8);
      *reinterpret_cast<uint4*>(xs + r * xstride + c * 8) = reinterpret_cast<const uint4*>(x)[i];
    }
    __syncthreads();
    xr = reinterpret_cast<const uint32_t*>(xs + int64_t(bvalid ? bn : 0) * xstride + k0 + bk);
  } else {
    xr = reinterpret_cast<const uint32_t*>(x + int64_t(bvalid ? bn : 0) * K + k0 + bk);
  }
  // One stage's fragments: step j's pair at xr[stage * 32 + j * 8] and [... + 4] (u32 units).
  uint32_t xb[8];
  auto load_x = [&](int st) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = bvalid && st < stages;
      xb[2 * j] = ok ? (XS ? xr[st * 32 + j * 8] : __ldg(xr + st * 32 + j * 8)) : 0u;
      xb[2 * j + 1] = ok ? (XS ? xr[st * 32 + j * 8 + 4] : __ldg(xr + st * 32 + j * 8 + 4)) : 0u;
    }
  };
  // ldmatrix: lanes 8i..8i+7 address matrix i's rows (rows +8 for odd i, k half i/2).
  const int lrow = (lane & 7) + ((lane >> 3) & 1) * 8, lhalf = lane >> 4;
  int cslot = 0;
#pragma unroll 1
  for (int64_t g = g_beg; g < g_end; ++g) {
    float acc[RPU][4];
#pragma unroll
    for (int q = 0; q < RPU; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
    load_x(0);
#pragma unroll 1
    for (int st = 0; st < stages; ++st) {
      cp_async_wait<kMmaStages - 1>();  // this stage has landed
      __syncwarp();                      // every lane's copies of it
      uint32_t a[4][RPU][4];
      const uint32_t slot = ring0 + uint32_t(cslot) * kStage;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < RPU; ++q) ldsm_x4(slot + q * kTile + mma_off(lrow, j * 2 + lhalf), a[j][q][0], a[j][q][1], a[j][q][2], a[j][q][3]);
      if (++cslot == kMmaStages) cslot = 0;
      __syncwarp();  // every lane has read the slot before any refills it
      issue();
      uint32_t c[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) c[e] = xb[e];
      load_x(st + 1);  // the next stage's fragments, in flight during these MMAs
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < RPU; ++q) mma_bf16(acc[q], a[j][q][0], a[j][q][1], a[j][q][2], a[j][q][3], c[2 * j], c[2 * j + 1]);
    }
    // Sum the warps' tiles: C[row][n] sits in lane (row % 8) * 4 + n / 2, register (row / 8) * 2 + n % 2.
#pragma unroll
    for (int q = 0; q < RPU; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[((warp * RPU + q) * 32 + lane) * 4 + e] = acc[q][e];
    __syncthreads();
    if (threadIdx.x < 128) {
      const int row = threadIdx.x / 8, n = threadIdx.x % 8;
      const int src = ((row % 8) * 4 + n / 2) * 4 + (row / 8) * 2 + n % 2;
      float v[RPU];
#pragma unroll
      for (int q = 0; q < RPU; ++q) {
        v[q] = 0.0f;
        for (int w = 0; w < kMmaWarps; ++w) v[q] += red[(w * RPU + q) * 128 + src];
      }
      const int64_t rr = g * 16 + row;
      if (n < T && rr < rows) store_unit<RPU, 1>(segs, rr, n, {v[0]}, {v[RPU - 1]}, y_f32, gated_act);
    }
    __syncthreads();  // red is read before the next group writes it
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory when the block exits
}

// On by default (faster than cuBLASLt at 4 and 8 rows for the 8B and Qwen3-0.6B: docs/cuda-notes.md,
// session 9); ARBOR_CUDA_GEMV_MMA=0 sends 3-8 rows to cuBLASLt (read by the CudaBackend constructor,
// beside the other switches).
bool g_mma = true;

bool mma_takes(int64_t T, int64_t K, bool f16) { return g_mma && !f16 && T >= 3 && T <= 8 && K % 512 == 0; }

constexpr int kMmaSmemLimit = 210 * 1024;  // the largest launch: gated, x of 8 x 4096 in shared memory (200.1 KB)

template <int RPU, bool XS>
void launch_mma_t(int64_t groups, int n_sms, size_t smem, cudaStream_t s, const GemvSegments& segs, const uint16_t* x, bool y_f32,
                  int64_t T, int64_t K, int64_t rows, int gated_act) {
  auto* kernel = gemv_mma_kernel<RPU, XS>;
  // Blocks per SM by shared memory, cached per size (a model has a few: x's size follows T and K).
  static std::vector<std::pair<size_t, int>> per_sm;
  if (per_sm.empty()) ARBOR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMmaSmemLimit));
  auto it = std::find_if(per_sm.begin(), per_sm.end(), [&](const auto& e) { return e.first == smem; });
  if (it == per_sm.end()) {
    int n = 0;
    ARBOR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kMmaWarps * 32, smem));
    per_sm.emplace_back(smem, std::max(1, n));
    it = per_sm.end() - 1;
  }
  const dim3 grid(unsigned(std::max<int64_t>(1, std::min<int64_t>(groups, int64_t(n_sms) * it->second))));
  pdl_launch(kernel, grid, kMmaWarps * 32, smem, s, segs, x, y_f32, int(T), K, rows, gated_act);
}

// True when it launched: mma_takes, 16-byte aligned weights and x. segs.pair0 holds each matrix's
// first row (by_rows).
bool launch_mma(const GemvSegments& segs, int64_t rows, bool f16, const uint16_t* x, bool y_f32, int64_t T, int64_t K, int n_sms,
                bool vec, int gated_act, cudaStream_t s) {
  if (!vec || !mma_takes(T, K, f16)) return false;
  const int64_t groups = (rows + 15) / 16;
  const int rpu = gated_act >= 0 ? 2 : 1;
  const size_t x_bytes = size_t(T) * size_t(K + 8) * 2;
  const bool xs = int64_t(T * K * 2) <= kMmaMaxXBytes;
  const size_t smem = size_t(kMmaWarps) * kMmaStages * 16 * kMmaK * 2 * rpu + size_t(kMmaWarps) * rpu * 128 * 4 + (xs ? x_bytes : 0);
#define ARBOR_MMA(R, XS) launch_mma_t<R, XS>(groups, n_sms, smem, s, segs, x, y_f32, T, K, rows, gated_act)
  if (rpu == 2) xs ? ARBOR_MMA(2, true) : ARBOR_MMA(2, false);
  else xs ? ARBOR_MMA(1, true) : ARBOR_MMA(1, false);
#undef ARBOR_MMA
  ARBOR_LAUNCH_CHECK("gemv_mma_kernel");
  return true;
}

int g_warps_per_sm = 32;

void launch(const GemvSegments& segs, int64_t pairs, DType w_dtype, const uint16_t* x, DType y_dtype, int64_t T, int64_t K, int n_sms,
            bool vec, int gated_act, cudaStream_t s) {
  ARBOR_CU_CHECK(T >= 1 && T <= kGemvMaxRows, "cuda: gemv: %lld rows (1..%lld supported)", (long long)T, (long long)kGemvMaxRows);
  ARBOR_CU_CHECK(w_dtype == DType::BF16 || w_dtype == DType::F16, "cuda: gemv: weight dtype %s (BF16 or F16)", dtype_name(w_dtype).data());
  ARBOR_CU_CHECK(y_dtype == DType::BF16 || y_dtype == DType::F32, "cuda: gemv: output dtype %s (BF16 or F32)", dtype_name(y_dtype).data());
  const bool f16 = w_dtype == DType::F16, f32 = y_dtype == DType::F32;
  int64_t units = segs.N[0];
  for (int i = 1; gated_act < 0 && i < segs.n; ++i) units += segs.N[i];
  // The streaming kernels number the matrices' rows consecutively (pair0: first rows, not row pairs).
  GemvSegments by_rows = segs;
  if (gated_act < 0)
    for (int i = 0; i < segs.n; ++i) by_rows.pair0[i] = i == 0 ? 0 : by_rows.pair0[i - 1] + segs.N[i - 1];
  if (launch_stream(by_rows, units, f16, x, f32, T, K, n_sms, vec, gated_act, s)) return;
  if (launch_mma(by_rows, units, f16, x, f32, T, K, n_sms, vec, gated_act, s)) return;
  // K split: the fewest warps per row pair that give about half the SMs' warp slots (64 per SM) work;
  // more than that only queue up. (Splitting further to end on whole waves of blocks measured slower:
  // docs/cuda-notes.md.)
  int wpr = 1;
  while (wpr < kWarps && pairs * wpr < int64_t(n_sms) * g_warps_per_sm) wpr *= 2;
  const int64_t pairs_per_block = kWarps / wpr;
  dim3 grid(unsigned((pairs + pairs_per_block - 1) / pairs_per_block));
  const int t = int(T);
  if (T == 1) launch_nr<1>(f16, grid, s, segs, x, f32, t, K, wpr, vec, gated_act);
  else if (T == 2) launch_nr<2>(f16, grid, s, segs, x, f32, t, K, wpr, vec, gated_act);
  else if (T <= 4) launch_nr<4>(f16, grid, s, segs, x, f32, t, K, wpr, vec, gated_act);
  else launch_nr<8>(f16, grid, s, segs, x, f32, t, K, wpr, vec, gated_act);
}

}  // namespace

void set_gemv_warps_per_sm(int w) { g_warps_per_sm = w < 1 ? 1 : w; }
void set_gemv_stream(bool on) { g_stream = on; }
void set_gemv_mma(bool on) { g_mma = on; }
bool gemv_mma_takes(int64_t T, int64_t K, DType w_dtype) { return w_dtype == DType::BF16 && mma_takes(T, K, false); }


void launch_gemv_multi(const GemvOut* outs, int n, DType w_dtype, const uint16_t* x, DType y_dtype, int64_t T, int64_t K, int n_sms,
                       cudaStream_t s) {
  ARBOR_CU_CHECK(n >= 1 && n <= kGemvMaxSegments, "cuda: gemv: %d matrices in one launch (1..%d)", n, kGemvMaxSegments);
  bool vec = K % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  GemvSegments segs{};
  segs.n = n;
  int64_t pairs = 0;
  for (int i = 0; i < n; ++i) {
    vec = vec && reinterpret_cast<uintptr_t>(outs[i].w) % 16 == 0;
    segs.w[i] = static_cast<const uint16_t*>(outs[i].w), segs.bias[i] = outs[i].bias, segs.y[i] = outs[i].y;
    segs.N[i] = outs[i].N, segs.pair0[i] = pairs;
    pairs += (outs[i].N + 1) / 2;
  }
  launch(segs, pairs, w_dtype, x, y_dtype, T, K, n_sms, vec, -1, s);
}

void launch_gemv(const void* w, DType w_dtype, const uint16_t* x, const float* bias, void* y, DType y_dtype, int64_t T, int64_t N,
                 int64_t K, int n_sms, cudaStream_t s) {
  const GemvOut one{w, bias, y, N};
  launch_gemv_multi(&one, 1, w_dtype, x, y_dtype, T, K, n_sms, s);
}

void launch_gemv_gated(const GemvOut& gate, const GemvOut& up, ActOp act, DType w_dtype, const uint16_t* x, uint16_t* y, int64_t T,
                       int64_t K, int n_sms, cudaStream_t s) {
  ARBOR_CU_CHECK(gate.N == up.N, "cuda: gated gemv: gate has %lld rows, up %lld", (long long)gate.N, (long long)up.N);
  const bool vec = K % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(gate.w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(up.w) % 16 == 0;
  GemvSegments segs{};
  segs.n = 2;
  segs.w[0] = static_cast<const uint16_t*>(gate.w), segs.w[1] = static_cast<const uint16_t*>(up.w);
  segs.bias[0] = gate.bias, segs.bias[1] = up.bias, segs.y[0] = y, segs.N[0] = gate.N;
  launch(segs, gate.N, w_dtype, x, DType::BF16, T, K, n_sms, vec, int(act), s);
}

}  // namespace arbor::cuda
