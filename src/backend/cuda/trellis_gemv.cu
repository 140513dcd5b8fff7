// Trellis weights (trellis.h's layout) for decode: a GEMV for 1-8 rows of bf16 activations, both axes.
//
// Each weight is decoded once, in registers. Lane l of a warp owns weights 8l..8l+7 of a 256-weight block:
// their bits, with the 12-bit windows of all eight, lie in two consecutive words of the block (the second
// wrapping to word 0 for lane 0: tail-biting), at most 7k + 12 <= 40 bits from bit (248 - 8l)·k. One
// funnel shift per lane aligns that span to bit 0 of a 64-bit pair; weight j's state is then a funnel shift
// by the constant (7 - j)·k and a mask. The 1MAD value: one IMAD (state·34038481 + 76625530), one __dp4a
// summing the four bytes into the accumulator 0x4B000000 (so the 32-bit result is the float 2^23 + sum,
// exact), one FADD taking 2^23 + 510 back: y in [-510, 510] as an exact float. The kernels sum y·x in f32 and
// apply 1/147.800537109375 and the row scale once (axis 1) or fold them into x (axis 0).
//
// Axis 1 (y[t][o] = scale[o]/std · Σ_i y(o, i) x[t][i]): a warp owns two output rows and a range of their
// blocks (K split over up to 8 warps when there are few rows), 4 blocks per step with the next step's words
// loaded before the current step's arithmetic; x is read 8 bf16 values (16 bytes) per lane per block.
// Axis 0 (stored transposed [in, out·k/32]: y[t][o] = Σ_i (x[t][i]·scale[i]/std) · y(i, o)): a block of 8
// warps owns 256 outputs (lane l: outputs 8l..8l+7) and a range of input rows, staged as x·scale/std in
// shared memory; each warp takes 8 rows per step. Ranges split over blocks write f32 partials that
// trellis_reduce_kernel sums in split order (deterministic), adding the bias.
//
// For prefill (past kTrellisGemvMaxRows rows), launch_trellis_decode writes rows of W as bf16 for cuBLASLt.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/segments.h"
#include "backend/cuda/trellis.h"

namespace arbor::cuda {

namespace {

constexpr int kTrWarps = 8;                        // per block
constexpr int kTrU = 4;                            // axis 1: blocks per warp step
constexpr int kTrG = 8;                            // axis 0: rows per warp step
constexpr int64_t kTrMaxRowsPerBlock = 1024;       // axis 0: rows one block stages (x·scale: NR x 4 KB at most)
constexpr float kTrInvStd = 1.0f / 147.800537109375f;  // as quant::trellis_1mad_value

// bf16 element j of 8 packed in a uint4, as a float.
__device__ __forceinline__ float bf16_of(const uint4& v, int j) {
  const uint32_t w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
  return __uint_as_float(j % 2 == 0 ? w << 16 : w & 0xffff0000u);
}

__device__ __forceinline__ uint4 load_x8(const uint16_t* p, bool vec) {
  if (vec) return __ldg(reinterpret_cast<const uint4*>(p));
  uint32_t h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) h[e] = uint32_t(__ldg(p + 2 * e)) | uint32_t(__ldg(p + 2 * e + 1)) << 16;
  return make_uint4(h[0], h[1], h[2], h[3]);
}

__device__ __forceinline__ void store_y(void* y, bool y_f32, int64_t i, float v) {
  if (y_f32) static_cast<float*>(y)[i] = v;
  else static_cast<__nv_bfloat16*>(y)[i] = __float2bfloat16(v);
}

// ---- axis 1 -------------------------------------------------------------------------------------------
// One launch's axis-1 matrices over the same x: up to three (q/k/v), their row pairs numbered consecutively
// (matrix i's first pair is first[i]); or gated (gate_act >= 0): gate and up, a unit being gate row n with up
// row n, y and N from the gate, y = act(gate) * up.
struct TrSegs {
  const uint32_t* words[kTrellisGemvMaxSegments];
  const float* scales[kTrellisGemvMaxSegments];
  const float* bias[kTrellisGemvMaxSegments];
  void* y[kTrellisGemvMaxSegments];
  int64_t N[kTrellisGemvMaxSegments];
  int64_t first[kTrellisGemvMaxSegments];
  int n;
  int64_t units;
};

template <int K, int NR>
__global__ void __launch_bounds__(kTrWarps * 32)
    trellis_gemv_axis1_kernel(TrSegs segs, const uint16_t* __restrict__ x, bool y_f32, int T, int64_t Kin, int wpr, bool vec, int gated_act) {
  constexpr int WPB = 8 * K;
  __shared__ float red[kTrWarps][2][NR];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = warp / wpr, part = warp % wpr;
  const int64_t unit = int64_t(blockIdx.x) * (kTrWarps / wpr) + pair;
  const bool gated = gated_act >= 0;
  const int si = gated ? 0 : unit_segment(segs.n, segs.first, unit);
  const int64_t N = seg_pick(segs.N, si);
  // Plain: rows row0, row0 + 1 of matrix si; gated: row row0 of gate (a) and of up (b).
  const int64_t row0 = gated ? unit : (unit - seg_pick(segs.first, si)) * 2;
  const bool has0 = row0 < N, has1 = gated ? has0 : row0 + 1 < N;
  // Rows past the matrix read row 0 (valid memory) and are not stored.
  const int64_t ra = has0 ? row0 : 0, rb = gated ? ra : has1 ? row0 + 1 : ra;
  const int64_t nb = Kin / 256, row_words = nb * WPB;
  const uint32_t* wa = seg_pick(segs.words, si) + ra * row_words;
  const uint32_t* wb = (gated ? segs.words[1] : seg_pick(segs.words, si)) + rb * row_words;
  const int64_t bbeg = nb * part / wpr, bend = nb * (part + 1) / wpr;
  const int ia = trellis_lane_word<K>(lane), ib = trellis_lane_word2<K>(lane), off = trellis_lane_off<K>(lane);

  uint32_t cur[4][kTrU];
  auto load = [&](uint32_t (&w)[4][kTrU], int64_t b) {
#pragma unroll
    for (int u = 0; u < kTrU; ++u) {
      const int64_t bb = (b + u < bend ? b + u : bbeg) * WPB;  // past the range: a block of the range, unused
      w[0][u] = __ldg(wa + bb + ia), w[1][u] = __ldg(wa + bb + ib);
      w[2][u] = __ldg(wb + bb + ia), w[3][u] = __ldg(wb + bb + ib);
    }
  };
  // The first words do not depend on the previous kernel: fetched before waiting for it.
  if (bbeg < bend) load(cur, bbeg);
  pdl_trigger();
  pdl_wait();

  float acc[2][NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) acc[0][r] = acc[1][r] = 0.0f;
  for (int64_t b = bbeg; b < bend; b += kTrU) {
    uint32_t nxt[4][kTrU];
    if (b + kTrU < bend) load(nxt, b + kTrU);
#pragma unroll
    for (int u = 0; u < kTrU; ++u) {
      if (b + u >= bend) break;
      uint4 xv[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r)
        if (r < T) xv[r] = load_x8(x + r * Kin + (b + u) * 256 + 8 * lane, vec);
      uint32_t alo, ahi, blo, bhi;
      trellis_lane_align(cur[0][u], cur[1][u], off, alo, ahi);
      trellis_lane_align(cur[2][u], cur[3][u], off, blo, bhi);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float ya = trellis_lane_y<K>(alo, ahi, j), yb = trellis_lane_y<K>(blo, bhi, j);
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          if (r >= T) break;
          const float xf = bf16_of(xv[r], j);
          acc[0][r] = fmaf(ya, xf, acc[0][r]);
          acc[1][r] = fmaf(yb, xf, acc[1][r]);
        }
      }
    }
    if (b + kTrU < bend) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int u = 0; u < kTrU; ++u) cur[q][u] = nxt[q][u];
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
  if (lane != 0 || !has0) return;
  if (gated) {  // y = act(gate) * up, each rounded to bf16 first as the unfused ops store them
    const float sg = segs.scales[0][row0] * kTrInvStd, su = segs.scales[1][row0] * kTrInvStd;
    const float bg = segs.bias[0] ? segs.bias[0][row0] : 0.0f, bu = segs.bias[1] ? segs.bias[1][row0] : 0.0f;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r >= T) break;
      const float g = __bfloat162float(__float2bfloat16(fmaf(acc[0][r], sg, bg)));
      const float u = __bfloat162float(__float2bfloat16(fmaf(acc[1][r], su, bu)));
      static_cast<__nv_bfloat16*>(segs.y[0])[r * N + row0] = __float2bfloat16(act_value(gated_act, g) * u);
    }
    return;
  }
  const float* scales = seg_pick(segs.scales, si);
  const float* bias = seg_pick(segs.bias, si);
  void* y = seg_pick(segs.y, si);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int64_t n = row0 + j;
    if (n >= N) break;
    const float sc = scales[n] * kTrInvStd, bv = bias ? bias[n] : 0.0f;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r >= T) break;
      store_y(y, y_f32, r * N + n, fmaf(acc[j][r], sc, bv));
    }
  }
}

// ---- axis 0 -------------------------------------------------------------------------------------------
// Block (ob, split): outputs [256·ob, 256·ob + 256), input rows [split·rpc, split·rpc + rpc) ∩ [0, R).
// Shared memory (dynamic): cs [NR][rpc] = x·scale/std of those rows (0 past R), then red [kTrWarps][256].
template <int K, int NR>
__global__ void __launch_bounds__(kTrWarps * 32)
    trellis_gemv_axis0_kernel(const uint32_t* __restrict__ words, const float* __restrict__ scales, const float* __restrict__ bias,
                              const uint16_t* __restrict__ x, void* __restrict__ y, bool y_f32, float* __restrict__ partial, int T,
                              int64_t R, int64_t N, int64_t rpc) {
  constexpr int WPB = 8 * K;
  extern __shared__ __align__(16) float tr_smem[];
  float* cs = tr_smem;
  float* red = tr_smem + NR * rpc;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t ob = blockIdx.x, split = blockIdx.y, r0 = split * rpc;
  const int64_t row_words = N / 256 * WPB;
  const uint32_t* base = words + ob * WPB;
  const int ia = trellis_lane_word<K>(lane), ib = trellis_lane_word2<K>(lane), off = trellis_lane_off<K>(lane);
  const int64_t groups = rpc / kTrG;  // rpc is a multiple of kTrWarps * kTrG

  uint32_t cur[2][kTrG];
  auto load = [&](uint32_t (&w)[2][kTrG], int64_t g) {
#pragma unroll
    for (int q = 0; q < kTrG; ++q) {
      const int64_t i = r0 + g * kTrG + q < R ? r0 + g * kTrG + q : R - 1;  // past R: a valid row, its x·scale is 0
      w[0][q] = __ldg(base + i * row_words + ia), w[1][q] = __ldg(base + i * row_words + ib);
    }
  };
  if (warp < groups) load(cur, warp);
  pdl_trigger();
  pdl_wait();
  for (int64_t i = threadIdx.x; i < int64_t(T) * rpc; i += kTrWarps * 32) {
    const int64_t t = i / rpc, r = i % rpc, row = r0 + r;
    cs[t * rpc + r] = row < R ? __uint_as_float(uint32_t(x[t * R + row]) << 16) * (scales[row] * kTrInvStd) : 0.0f;
  }
  __syncthreads();

  float acc[8][NR];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[j][r] = 0.0f;
  for (int64_t g = warp; g < groups; g += kTrWarps) {
    uint32_t nxt[2][kTrG];
    if (g + kTrWarps < groups) load(nxt, g + kTrWarps);
    float c[NR][kTrG];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r >= T) break;
      const float4 c0 = reinterpret_cast<const float4*>(cs + r * rpc + g * kTrG)[0];
      const float4 c1 = reinterpret_cast<const float4*>(cs + r * rpc + g * kTrG)[1];
      c[r][0] = c0.x, c[r][1] = c0.y, c[r][2] = c0.z, c[r][3] = c0.w, c[r][4] = c1.x, c[r][5] = c1.y, c[r][6] = c1.z, c[r][7] = c1.w;
    }
#pragma unroll
    for (int q = 0; q < kTrG; ++q) {
      uint32_t lo, hi;
      trellis_lane_align(cur[0][q], cur[1][q], off, lo, hi);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float yv = trellis_lane_y<K>(lo, hi, j);
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          if (r >= T) break;
          acc[j][r] = fmaf(yv, c[r][q], acc[j][r]);
        }
      }
    }
    if (g + kTrWarps < groups) {
#pragma unroll
      for (int q = 0; q < kTrG; ++q) cur[0][q] = nxt[0][q], cur[1][q] = nxt[1][q];
    }
  }

  // The 8 warps' sums of each output, row by row of x; one partial (or y) per block.
  const bool direct = gridDim.y == 1;
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if (r >= T) break;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 8; ++j) red[warp * 256 + 8 * lane + j] = acc[j][r];
    __syncthreads();
    const int o = threadIdx.x;  // 256 threads: one output each
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kTrWarps; ++w) s += red[w * 256 + o];
    const int64_t n = ob * 256 + o;
    if (direct) store_y(y, y_f32, r * N + n, s + (bias ? bias[n] : 0.0f));
    else partial[(split * T + r) * N + n] = s;
  }
}

// y[t][n] = Σ_split partial[split][t][n] (in split order) + bias[n].
__global__ void trellis_reduce_kernel(const float* __restrict__ partial, int splits, int T, int64_t N, const float* __restrict__ bias,
                                      void* __restrict__ y, bool y_f32) {
  pdl_trigger();
  pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(T) * N) return;
  const int64_t n = i % N;
  float s = 0.0f;
  for (int p = 0; p < splits; ++p) s += partial[int64_t(p) * T * N + i];
  store_y(y, y_f32, i, s + (bias ? bias[n] : 0.0f));
}

// Axis 0's split of the input rows over blocks: about 4 blocks per SM, at most kTrMaxRowsPerBlock rows each.
struct Axis0Plan {
  int64_t rpc, splits;
};
Axis0Plan axis0_plan(int64_t R, int64_t N, int n_sms) {
  constexpr int64_t unit = kTrWarps * kTrG;
  const int64_t nbo = N / 256;
  int64_t splits = std::max<int64_t>(1, (4 * int64_t(n_sms) + nbo - 1) / nbo);
  splits = std::min(splits, (R + unit - 1) / unit);
  int64_t rpc = (R + splits - 1) / splits;
  rpc = std::min(kTrMaxRowsPerBlock, (rpc + unit - 1) / unit * unit);
  return {rpc, (R + rpc - 1) / rpc};
}

template <int K, int NR>
void launch_axis1(const TrSegs& segs, int64_t Kin, const uint16_t* x, bool y_f32, int T, int n_sms, int gated_act, cudaStream_t s) {
  const int64_t nb = Kin / 256, units = segs.units;
  // K split: about half the SMs' warp slots busy, but at least kTrU blocks a warp.
  int wpr = 1;
  while (wpr < kTrWarps && units * wpr < int64_t(n_sms) * 32 && nb / (wpr * 2) >= kTrU) wpr *= 2;
  const int64_t per_block = kTrWarps / wpr;
  const unsigned grid = unsigned((units + per_block - 1) / per_block);
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  pdl_launch(trellis_gemv_axis1_kernel<K, NR>, dim3(grid), dim3(kTrWarps * 32), 0, s, segs, x, y_f32, T, Kin, wpr, vec, gated_act);
  ARBOR_LAUNCH_CHECK("trellis_gemv_axis1_kernel");
}

TrSegs plain_segments(const TrellisGemvOut* outs, int n) {
  TrSegs segs{};
  segs.n = n;
  for (int i = 0; i < n; ++i) {
    segs.words[i] = outs[i].w.words, segs.scales[i] = outs[i].w.scales, segs.bias[i] = outs[i].bias, segs.y[i] = outs[i].y;
    segs.N[i] = outs[i].w.rows, segs.first[i] = segs.units;
    segs.units += (outs[i].w.rows + 1) / 2;
  }
  return segs;
}

template <int K, int NR>
void launch_kn(const TrellisWeights& w, const uint16_t* x, const float* bias, void* y, bool y_f32, int T, float* scratch, int n_sms,
               cudaStream_t s) {
  if (w.axis == 1) {
    const TrellisGemvOut o{w, bias, y};
    launch_axis1<K, NR>(plain_segments(&o, 1), w.cols, x, y_f32, T, n_sms, -1, s);
    return;
  }
  const int64_t R = w.cols, N = w.rows;  // stored [in, out]: R coded rows (inputs), N outputs
  const Axis0Plan p = axis0_plan(R, N, n_sms);
  ARBOR_CU_CHECK(p.splits == 1 || scratch, "cuda: trellis gemv: axis 0 over %lld blocks of rows needs scratch", (long long)p.splits);
  const size_t smem = size_t(NR * p.rpc + kTrWarps * 256) * 4;
  pdl_launch(trellis_gemv_axis0_kernel<K, NR>, dim3(unsigned(N / 256), unsigned(p.splits)), dim3(kTrWarps * 32), smem, s, w.words,
             w.scales, bias, x, y, y_f32, scratch, T, R, N, p.rpc);
  ARBOR_LAUNCH_CHECK("trellis_gemv_axis0_kernel");
  if (p.splits > 1) {
    const int64_t n = int64_t(T) * N;
    pdl_launch(trellis_reduce_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, s, static_cast<const float*>(scratch), int(p.splits),
               T, N, bias, y, y_f32);
    ARBOR_LAUNCH_CHECK("trellis_reduce_kernel");
  }
}

// ---- decode to bf16 (prefill: cuBLASLt runs on the decoded rows) ----------------------------------------
// Weight = bf16((y · (1/147.800537109375)) · scale): quant::trellis_decode_linear's f32 weight, rounded.
__device__ __forceinline__ uint16_t trellis_weight_bf16(float yv, float scale) {
  return __bfloat16_as_ushort(__float2bfloat16(__fmul_rn(__fmul_rn(yv, kTrInvStd), scale)));
}

// Axis 1: a warp per (row, block) of the slice; lane l decodes weights 8l..8l+7 and stores them as 16 bytes.
template <int K>
__global__ void trellis_decode_axis1_kernel(const uint32_t* __restrict__ words, const float* __restrict__ scales, int64_t row0, int64_t n,
                                            int64_t Kin, uint16_t* __restrict__ out) {
  constexpr int WPB = 8 * K;
  pdl_trigger();
  pdl_wait();  // out may still be read by the previous slice's GEMM
  const int lane = threadIdx.x % 32;
  const int ia = trellis_lane_word<K>(lane), ib = trellis_lane_word2<K>(lane), off = trellis_lane_off<K>(lane);
  const int64_t nb = Kin / 256, units = n * nb, warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t u = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; u < units; u += warps) {
    const int64_t r = u / nb, b = u % nb;
    const uint32_t* wb = words + (row0 + r) * nb * WPB + b * WPB;
    uint32_t lo, hi;
    trellis_lane_align(__ldg(wb + ia), __ldg(wb + ib), off, lo, hi);
    const float sc = scales[row0 + r];
    uint32_t packed[4];
#pragma unroll
    for (int j = 0; j < 8; j += 2)
      packed[j / 2] = uint32_t(trellis_weight_bf16(trellis_lane_y<K>(lo, hi, j), sc)) |
                      uint32_t(trellis_weight_bf16(trellis_lane_y<K>(lo, hi, j + 1), sc)) << 16;
    *reinterpret_cast<uint4*>(out + r * Kin + b * 256 + 8 * lane) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

// Axis 0 (stored [in, out]): a block per (256 outputs, 64 inputs): each warp decodes 8 input rows' block of
// those outputs (lane l: outputs 8l..8l+7) into a shared tile [256][64], then writes it out transposed, a
// warp per output row at a time (64 inputs: two coalesced 2-byte stores a lane).
constexpr int kTrDecIn = 64;
template <int K>
__global__ void __launch_bounds__(256) trellis_decode_axis0_kernel(const uint32_t* __restrict__ words, const float* __restrict__ scales,
                                                                   int64_t o0, int64_t R, int64_t N, uint16_t* __restrict__ out) {
  constexpr int WPB = 8 * K, kPad = kTrDecIn + 2;
  __shared__ uint16_t tile[256 * kPad];
  pdl_trigger();
  pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ia = trellis_lane_word<K>(lane), ib = trellis_lane_word2<K>(lane), off = trellis_lane_off<K>(lane);
  const int64_t ob = blockIdx.x, i0 = int64_t(blockIdx.y) * kTrDecIn, row_words = N / 256 * WPB;
  const uint32_t* base = words + (o0 / 256 + ob) * WPB;
#pragma unroll 1
  for (int q = warp; q < kTrDecIn; q += 8) {
    const int64_t i = i0 + q;
    if (i >= R) break;
    uint32_t lo, hi;
    trellis_lane_align(__ldg(base + i * row_words + ia), __ldg(base + i * row_words + ib), off, lo, hi);
    const float sc = scales[i];
#pragma unroll
    for (int j = 0; j < 8; ++j) tile[(8 * lane + j) * kPad + q] = trellis_weight_bf16(trellis_lane_y<K>(lo, hi, j), sc);
  }
  __syncthreads();
  const int64_t cols = std::min<int64_t>(kTrDecIn, R - i0);
  for (int o = warp; o < 256; o += 8) {
    uint16_t* dst = out + (ob * 256 + o) * R + i0;
    if (lane < cols) dst[lane] = tile[o * kPad + lane];
    if (lane + 32 < cols) dst[lane + 32] = tile[o * kPad + lane + 32];
  }
}

template <int K>
void launch_decode_k(const TrellisWeights& w, int64_t row0, int64_t n, uint16_t* out, int n_sms, cudaStream_t s) {
  if (w.axis == 1) {
    const int64_t units = n * (w.cols / 256);
    const unsigned grid = unsigned(std::min<int64_t>((units + 7) / 8, int64_t(n_sms) * 8));
    pdl_launch(trellis_decode_axis1_kernel<K>, dim3(grid), dim3(256), 0, s, w.words, w.scales, row0, n, w.cols, out);
    ARBOR_LAUNCH_CHECK("trellis_decode_axis1_kernel");
    return;
  }
  const dim3 grid(unsigned(n / 256), unsigned((w.cols + kTrDecIn - 1) / kTrDecIn));
  pdl_launch(trellis_decode_axis0_kernel<K>, grid, dim3(256), 0, s, w.words, w.scales, row0, w.cols, w.rows, out);
  ARBOR_LAUNCH_CHECK("trellis_decode_axis0_kernel");
}

template <int K>
void launch_k(int nr, const TrellisWeights& w, const uint16_t* x, const float* bias, void* y, bool y_f32, int T, float* scratch, int n_sms,
              cudaStream_t s) {
  if (nr == 1) launch_kn<K, 1>(w, x, bias, y, y_f32, T, scratch, n_sms, s);
  else if (nr == 2) launch_kn<K, 2>(w, x, bias, y, y_f32, T, scratch, n_sms, s);
  else if (nr == 4) launch_kn<K, 4>(w, x, bias, y, y_f32, T, scratch, n_sms, s);
  else launch_kn<K, 8>(w, x, bias, y, y_f32, T, scratch, n_sms, s);
}

// launch_axis1 at the instance of (k, rows).
void launch_axis1_any(const TrSegs& segs, int bits, int64_t Kin, const uint16_t* x, bool y_f32, int64_t T, int n_sms, int gated_act,
                      cudaStream_t s) {
  const int nr = T == 1 ? 1 : T == 2 ? 2 : T <= 4 ? 4 : 8, t = int(T);
#define ARBOR_TR_AXIS1(KK)                                                            \
  if (nr == 1) launch_axis1<KK, 1>(segs, Kin, x, y_f32, t, n_sms, gated_act, s);       \
  else if (nr == 2) launch_axis1<KK, 2>(segs, Kin, x, y_f32, t, n_sms, gated_act, s);  \
  else if (nr == 4) launch_axis1<KK, 4>(segs, Kin, x, y_f32, t, n_sms, gated_act, s);  \
  else launch_axis1<KK, 8>(segs, Kin, x, y_f32, t, n_sms, gated_act, s);
  if (bits == 2) { ARBOR_TR_AXIS1(2) }
  else if (bits == 3) { ARBOR_TR_AXIS1(3) }
  else { ARBOR_TR_AXIS1(4) }
#undef ARBOR_TR_AXIS1
}

// The checks every axis-1 fused launch makes: rows, and matrices that agree with the first.
void check_fusable(const TrellisGemvOut* outs, int n, int64_t T, const char* what) {
  ARBOR_CU_CHECK(T >= 1 && T <= kTrellisGemvMaxRows, "cuda: trellis %s: %lld rows of activations (1..%lld)", what, (long long)T,
                 (long long)kTrellisGemvMaxRows);
  for (int i = 0; i < n; ++i) {
    const TrellisWeights& w = outs[i].w;
    ARBOR_CU_CHECK(w.axis == 1 && w.bits == outs[0].w.bits && (w.bits == 2 || w.bits == 3 || w.bits == 4) && w.cols == outs[0].w.cols &&
                       w.cols % 256 == 0 && w.rows > 0,
                   "cuda: trellis %s: matrix %d ([%lld, %lld] k=%d axis %d) does not fuse with the first ([%lld, %lld] k=%d axis %d): "
                   "axis 1, the same k and columns (whole blocks of 256)",
                   what, i, (long long)w.rows, (long long)w.cols, w.bits, w.axis, (long long)outs[0].w.rows, (long long)outs[0].w.cols,
                   outs[0].w.bits, outs[0].w.axis);
  }
}

}  // namespace

void launch_trellis_gemv_multi(const TrellisGemvOut* outs, int n, const uint16_t* x, bool y_f32, int64_t T, int n_sms, CUstream_st* s) {
  ARBOR_CU_CHECK(n >= 1 && n <= kTrellisGemvMaxSegments, "cuda: trellis gemv: %d matrices in one launch (1..%d)", n, kTrellisGemvMaxSegments);
  check_fusable(outs, n, T, "gemv");
  launch_axis1_any(plain_segments(outs, n), outs[0].w.bits, outs[0].w.cols, x, y_f32, T, n_sms, -1, s);
}

void launch_trellis_gemv_gated(const TrellisGemvOut& gate, const TrellisGemvOut& up, int act, const uint16_t* x, uint16_t* y, int64_t T,
                               int n_sms, CUstream_st* s) {
  const TrellisGemvOut both[2] = {gate, up};
  check_fusable(both, 2, T, "gated gemv");
  ARBOR_CU_CHECK(gate.w.rows == up.w.rows, "cuda: trellis gated gemv: gate has %lld rows, up %lld", (long long)gate.w.rows, (long long)up.w.rows);
  TrSegs segs{};
  segs.n = 2;
  segs.words[0] = gate.w.words, segs.words[1] = up.w.words, segs.scales[0] = gate.w.scales, segs.scales[1] = up.w.scales;
  segs.bias[0] = gate.bias, segs.bias[1] = up.bias, segs.y[0] = y, segs.N[0] = gate.w.rows, segs.units = gate.w.rows;
  launch_axis1_any(segs, gate.w.bits, gate.w.cols, x, false, T, n_sms, act, s);
}

int64_t trellis_gemv_scratch_floats(const TrellisWeights& w, int64_t T, int n_sms) {
  if (w.axis == 1) return 0;
  const Axis0Plan p = axis0_plan(w.cols, w.rows, n_sms);
  return p.splits > 1 ? p.splits * T * w.rows : 0;
}

void launch_trellis_gemv(const TrellisWeights& w, const uint16_t* x, const float* bias, void* y, bool y_f32, int64_t T, float* scratch,
                         int n_sms, CUstream_st* s) {
  ARBOR_CU_CHECK(T >= 1 && T <= kTrellisGemvMaxRows, "cuda: trellis gemv: %lld rows of activations (1..%lld)", (long long)T,
                 (long long)kTrellisGemvMaxRows);
  ARBOR_CU_CHECK(w.bits == 2 || w.bits == 3 || w.bits == 4, "cuda: trellis gemv: k = %d (2, 3, 4)", w.bits);
  ARBOR_CU_CHECK(w.axis == 0 || w.axis == 1, "cuda: trellis gemv: axis %d (0, 1)", w.axis);
  ARBOR_CU_CHECK(w.rows > 0 && w.cols > 0 && w.coded_cols() % 256 == 0, "cuda: trellis gemv: [%lld, %lld] axis %d: coded length not whole blocks of 256",
                 (long long)w.rows, (long long)w.cols, w.axis);
  const int nr = T == 1 ? 1 : T == 2 ? 2 : T <= 4 ? 4 : 8;
  switch (w.bits) {
    case 2: launch_k<2>(nr, w, x, bias, y, y_f32, int(T), scratch, n_sms, s); break;
    case 3: launch_k<3>(nr, w, x, bias, y, y_f32, int(T), scratch, n_sms, s); break;
    default: launch_k<4>(nr, w, x, bias, y, y_f32, int(T), scratch, n_sms, s); break;
  }
}

void launch_trellis_decode(const TrellisWeights& w, int64_t row0, int64_t n, uint16_t* out, int n_sms, CUstream_st* s) {
  ARBOR_CU_CHECK(w.bits == 2 || w.bits == 3 || w.bits == 4, "cuda: trellis decode: k = %d (2, 3, 4)", w.bits);
  ARBOR_CU_CHECK(w.axis == 0 || w.axis == 1, "cuda: trellis decode: axis %d (0, 1)", w.axis);
  ARBOR_CU_CHECK(w.coded_cols() % 256 == 0 && row0 >= 0 && n >= 1 && row0 + n <= w.rows && (w.axis == 1 || (row0 % 256 == 0 && n % 256 == 0)) &&
                     reinterpret_cast<uintptr_t>(out) % 16 == 0,
                 "cuda: trellis decode: rows [%lld, %lld) of [%lld, %lld] axis %d (axis 0: whole blocks of 256 outputs; out 16-byte aligned)",
                 (long long)row0, (long long)(row0 + n), (long long)w.rows, (long long)w.cols, w.axis);
  switch (w.bits) {
    case 2: launch_decode_k<2>(w, row0, n, out, n_sms, s); break;
    case 3: launch_decode_k<3>(w, row0, n, out, n_sms, s); break;
    default: launch_decode_k<4>(w, row0, n, out, n_sms, s); break;
  }
}

}  // namespace arbor::cuda
