// Trellis weights (trellis.h's layout) for decode: a GEMV for 1-16 rows of bf16 activations, both axes, in two
// families. The default, on integer tensor cores (trellis_imma_kernel, trellis_imma_axis0_kernel; the sections
// below say how): the LCG word of each weight is four u8 entries of an m16n8k32 A fragment, so the byte sum and the
// products are the MMA's, and x enters as 15-bit integers per group. The FP32 kernels (ARBOR_CUDA_TRELLIS_MMA=0;
// and where the staged x would not fit shared memory, or x is unaligned), the reference the others were measured against:
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
// shared memory; each warp takes 8 rows per step. Ranges split over blocks (both families) write f32 partials
// that trellis_reduce_kernel sums in split order (deterministic), adding the bias.
//
// For prefill (past kTrellisGemvMaxRows rows), launch_trellis_decode writes rows of W as bf16 for cuBLASLt.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_sync.h"
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

// The gated form's output for gate row r, activation row t, from the two sums (y·x, before scale/std): y = act(gate) *
// up, each rounded to bf16 first as the unfused ops store them.
__device__ __forceinline__ void store_gated(const TrSegs& segs, int gated_act, int64_t N, int64_t r, int t, float sum_gate, float sum_up) {
  const float bg = segs.bias[0] ? segs.bias[0][r] : 0.0f, bu = segs.bias[1] ? segs.bias[1][r] : 0.0f;
  const float g = __bfloat162float(__float2bfloat16(fmaf(sum_gate, segs.scales[0][r] * kTrInvStd, bg)));
  const float u = __bfloat162float(__float2bfloat16(fmaf(sum_up, segs.scales[1][r] * kTrInvStd, bu)));
  static_cast<__nv_bfloat16*>(segs.y[0])[t * N + r] = __float2bfloat16(act_value(gated_act, g) * u);
}

// The plain form's output for row r of matrix si, activation row t, from its sum (y·x, before scale/std).
__device__ __forceinline__ void store_row(const TrSegs& segs, int si, bool y_f32, int64_t N, int64_t r, int t, float sum) {
  const float* bias = seg_pick(segs.bias, si);
  store_y(seg_pick(segs.y, si), y_f32, t * N + r, fmaf(sum, seg_pick(segs.scales, si)[r] * kTrInvStd, bias ? bias[r] : 0.0f));
}

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
  if (gated) {
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r >= T) break;
      store_gated(segs, gated_act, N, row0, r, acc[0][r], acc[1][r]);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (row0 + j >= N) break;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (r >= T) break;
      store_row(segs, si, y_f32, N, row0 + j, r, acc[j][r]);
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

// outs[0..n) in units of rows_per_unit output rows numbered consecutively (plain), or gate = outs[0] and up =
// outs[1] into gated_y in units of rows_per_unit row pairs (gated_y non-null).
TrSegs make_segments(const TrellisGemvOut* outs, int n, uint16_t* gated_y, int64_t rows_per_unit) {
  TrSegs segs{};
  segs.n = n;
  for (int i = 0; i < n; ++i) {
    segs.words[i] = outs[i].w.words, segs.scales[i] = outs[i].w.scales, segs.bias[i] = outs[i].bias, segs.y[i] = outs[i].y;
    segs.N[i] = outs[i].w.rows, segs.first[i] = gated_y ? 0 : segs.units;
    if (!gated_y || i == 0) segs.units += (outs[i].w.rows + rows_per_unit - 1) / rows_per_unit;
  }
  if (gated_y) segs.y[0] = gated_y;
  return segs;
}

constexpr int kTrFp32MaxRows = 8;  // the FP32 kernels' instances go to 8 rows; more run as launches of 8
int g_trellis_mma = -1;  // set_trellis_gemv_mma: 0 the FP32 kernels, 1 the integer tensor-core ones, -1 from ARBOR_CUDA_TRELLIS_MMA
// Whether the GEMVs run on the integer tensor-core kernels (the default) or the FP32 ones (ARBOR_CUDA_TRELLIS_MMA=0).
// Measured on an H100 (session 21, 8B, b = 1/2/4/8 at ctx 512): k = 2 278.9 / 511.6 / 826.4 / 1110.5 tok/s against
// 239.4 / 403.9 / 646.5 / 736.6 with the kernels before (FP32 for one row, f16 tensor cores on axis 1 for more).
bool trellis_integer_mma() {
  static const int env = [] {
    const char* e = std::getenv("ARBOR_CUDA_TRELLIS_MMA");
    return e && e[0] == '0' ? 0 : 1;
  }();
  return g_trellis_mma >= 0 ? g_trellis_mma == 1 : env == 1;
}

// ---- axis 1 on integer tensor cores (the default) --------------------------------------------------------
// The FP32 kernel spends ~6-7 issue slots a weight (shift, mask, IMAD, dp4a, FADD, FFMA); here a weight costs the
// shift, the mask and the IMAD, because the LCG word goes into
// mma.sync m16n8k32 as four u8 entries of A and the byte sum happens in the tensor core (trellis.h,
// "trellis_imma_kernel's maps"). x is staged per CTA as integers per block of 256 inputs (q = 128·hi + lo, two
// s8 columns of B per activation row, |q| <= 16256 against the block's max|x|, the block's scale and 510·Σhi,
// 510·Σlo beside it), so all T <= 16 activation rows cost the same decode: columns 2t, 2t + 1 of n-tile t / 4
// (NN = 1, 2 or 4 n-tiles). A warp owns 16·MT weight rows as MT m-tiles (gated: 8·MT gate rows and
// the same up rows, gate in A rows g, up in g + 8) and a range of blocks (K split over up to 8 warps); each lane
// reads its 2k words of a block row with wide loads (the next block's before the current one's arithmetic) and
// takes the 2k+1-th from its neighbour by a shuffle. Per block the s32 sums (exact: |Σ y·hi| < 2^24) are turned
// into floats with the block's scale; the rows' scale and 1/std come at the end.
constexpr int kTiWarps = 8;

// Words [trellis_im_word0<K>(j), +2K) of a block row: 16-byte loads for k 2 and 4, 8-byte for k 3 (aligned: a
// block is 32k bytes and a lane's first word is a multiple of 2k).
template <int K>
__device__ __forceinline__ void ti_load(const uint32_t* p, uint32_t (&w)[2 * K]) {
  if constexpr (K == 3) {
#pragma unroll
    for (int e = 0; e < 3; ++e) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + e);
      w[2 * e] = v.x, w[2 * e + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < K / 2; ++e) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + e);
      w[4 * e] = v.x, w[4 * e + 1] = v.y, w[4 * e + 2] = v.z, w[4 * e + 3] = v.w;
    }
  }
}

// Byte i (0..15) of v in all four bytes of a register: one s8 input repeated over the four k slots of its LCG word.
__device__ __forceinline__ uint32_t ti_rep(const uint4& v, int i) {
  const uint32_t w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
  return __byte_perm(w, 0u, uint32_t(i & 3) * 0x1111u);
}

// A weight's state from a lane's words (trellis_im_state's windows) in one of two instruction mixes. V 0: shift
// right and mask (two ALU-pipe instructions); V 1, for windows inside one word (off + 12 <= 32, off > 0): a multiply
// that lifts the window to the top (IMAD, the FMA pipe, where the LCG's IMAD also runs) and a shift down (ALU), so
// the decode's integer work splits between the two pipes. The multiply is inline PTX, so the compiler does not fold
// the pair back into shift-and-mask. (Chosen at run time by ti_options().variant while both are measured.)
template <int V>
__device__ __forceinline__ uint32_t ti_window(uint32_t w, int off) {
  if (V == 0 || off == 0) return (w >> off) & 0xfffu;
  if (off == 20) return w >> 20;
  uint32_t u;
  asm("mul.lo.u32 %0, %1, %2;" : "=r"(u) : "r"(w), "r"(1u << (20 - off)));
  return u >> 20;
}
template <int K, int V>
__device__ __forceinline__ uint32_t ti_state(const uint32_t* W, int r) {
  const int rel = (63 - r) * K, w = rel >> 5, off = rel & 31;
  return off + 12 <= 32 ? ti_window<V>(W[w], off) : trellis_funnel(W[w], W[w + 1], off) & 0xfffu;
}
// The integer kernels' variants (trellis.h, set_trellis_gemv_options): variant 0 (shift and mask) or 1 (ti_window's
// IMAD lift, the default), small_tiles 0 (32-row tiles), 1 (16-row tiles where 32-row ones leave under two a SM) or
// 2 (16-row tiles everywhere, the default), prepass 0 (x staged per CTA), 1 (from 2 rows, the default) or 2 (always).
// Read from ARBOR_CUDA_TRELLIS_V / _MT / _PREPASS once; set_trellis_gemv_options overrides each (-1: back to those).
struct TiOptions {
  int variant, small_tiles, prepass, wide_ctas;  // wide_ctas: 1 runs 9..16 rows in CTAs of 16 warps (else 8)
  int occupancy;  // 1: the one-tile, one-n-tile instances bounded to 64 registers (4 CTAs an SM; opt-in A/B)
};
TiOptions g_ti_set{-1, -1, -1, -1, -1};
TiOptions ti_options() {
  static const TiOptions env = [] {
    auto digit = [](const char* name, int most, int dflt) {
      const char* e = std::getenv(name);
      return e && e[0] >= '0' && e[0] <= '0' + most ? e[0] - '0' : dflt;
    };
    // The defaults, measured on an H100 (session 22, 8B at k = 2, b = 1/2/4/8 at ctx 512, one process each): the
    // IMAD-lift window, 16-row tiles everywhere and the pre-pass from 2 rows: 322.9 / 613.6 / 1057.5 / 1444.8 tok/s
    // against 289.4 / 526.1 / 871.3 / 982.5 with shift-and-mask, 32-row tiles and x staged in every CTA.
    return TiOptions{digit("ARBOR_CUDA_TRELLIS_V", 1, 1), digit("ARBOR_CUDA_TRELLIS_MT", 2, 2), digit("ARBOR_CUDA_TRELLIS_PREPASS", 2, 1),
                     digit("ARBOR_CUDA_TRELLIS_W16", 1, 1), digit("ARBOR_CUDA_TRELLIS_OCC", 1, 0)};
  }();
  return {g_ti_set.variant >= 0 ? g_ti_set.variant : env.variant, g_ti_set.small_tiles >= 0 ? g_ti_set.small_tiles : env.small_tiles,
          g_ti_set.prepass >= 0 ? g_ti_set.prepass : env.prepass, g_ti_set.wide_ctas >= 0 ? g_ti_set.wide_ctas : env.wide_ctas,
          g_ti_set.occupancy >= 0 ? g_ti_set.occupancy : env.occupancy};
}

// Σ y·q of a group from its s32 sums of the hi and lo columns and the group's staged float4 (scale, 510·Σhi,
// 510·Σlo as int bits): 128·(C_hi - 510·Σhi) + (C_lo - 510·Σlo), each difference exact in a float (below 2^24).
__device__ __forceinline__ float ti_group_sum(const float4& md, int c_hi, int c_lo) {
  return fmaf(128.0f, float(c_hi - __float_as_int(md.y)), float(c_lo - __float_as_int(md.z)));
}

// A warp's walk over units first, first + step, ... (< end) with their words in two register buffers in turn, no
// copies: unit u computes from one while u + step's words arrive in the other. wa already holds first's words.
template <class Buf, class Load, class Work>
__device__ __forceinline__ void ti_two_buffers(int64_t first, int64_t end, int64_t step, Buf& wa, Buf& wb, Load&& load, Work&& work) {
#pragma unroll 1
  for (int64_t u = first; u < end; u += 2 * step) {
    if (u + step < end) load(wb, u + step);
    work(wa, u);
    if (u + step >= end) break;
    if (u + 2 * step < end) load(wa, u + 2 * step);
    work(wb, u + step);
  }
}

// Bytes of staged x a launch needs: 2T columns, then a float4 per (row, block): scale, 510·Σhi, 510·Σlo (as int bits).
__host__ __device__ inline size_t ti_smem_bytes(int T, int64_t Kin) {
  const int64_t nb = Kin / 256;
  return size_t(2 * T) * size_t(trellis_im_col_stride(nb)) + size_t(T) * size_t(nb) * 16;
}
// The staged x one CTA may hold (the kernel's static shared memory, at most 16 KB, comes on top; 227 KB in all): 8
// rows at 8192 inputs (~169 KB) and 16 rows at 4096 (~170 KB: just past the first, so the bound is not that); one row
// of a down projection on axis 1 (14336 inputs) ~37 KB, so up to 5 rows.
size_t ti_max_smem() { return size_t(200) << 10; }

// A warp's group of activations, E a lane (v), as 15-bit integers against the group's largest |v|: the lane's
// q = 128·hi + lo packed as E hi bytes (hi[e / 4], byte e % 4) and E lo bytes, and the group's float4: its scale
// (NaN when the group holds an inf or NaN, so its outputs are NaN as the FP32 kernels' would be), 510·Σhi and
// 510·Σlo (as int bits). The whole warp calls it.
template <int E>
__device__ __forceinline__ float4 ti_quantize(const float (&v)[E], uint32_t (&hi)[(E + 3) / 4], uint32_t (&lo)[(E + 3) / 4]) {
  float m = 0.0f;
  bool finite = true;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const float a = fabsf(v[e]);
    m = fmaxf(m, a), finite = finite && a <= 3.4e38f;
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  finite = __all_sync(0xffffffffu, finite);
  const float inv = m > 0.0f && finite ? kTrellisImQ / m : 0.0f;
  int hs = 0, ls = 0;
#pragma unroll
  for (int e = 0; e < (E + 3) / 4; ++e) hi[e] = lo[e] = 0u;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int q = trellis_im_q(v[e], inv), h = q >> 7, l = q & 127;
    hs += h, ls += l;
    hi[e / 4] |= uint32_t(h & 0xff) << (8 * (e % 4)), lo[e / 4] |= uint32_t(l) << (8 * (e % 4));
  }
  for (int o = 16; o > 0; o >>= 1) hs += __shfl_xor_sync(0xffffffffu, hs, o), ls += __shfl_xor_sync(0xffffffffu, ls, o);
  return make_float4(finite ? m / kTrellisImQ : __int_as_float(0x7fc00000), __int_as_float(510 * hs), __int_as_float(510 * ls), 0.0f);
}

// One (activation row t, block b) of the staged x into dst (shared memory, or the pre-pass's image in global memory:
// the same bytes, ti_smem_bytes(T, Kin) of them): lane l quantizes inputs 8l..8l+7 (segment l/8 of the block); a
// whole warp calls it.
__device__ __forceinline__ void ti_stage_pair(const uint16_t* __restrict__ x, int T, int64_t Kin, int t, int64_t b, int lane, unsigned char* dst) {
  const int64_t nb = Kin / 256, cs = trellis_im_col_stride(nb);
  const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + t * Kin + b * 256) + lane);
  float v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = bf16_of(xv, e);
  uint32_t hi[2], lo[2];
  const float4 md = ti_quantize(v, hi, lo);
  const int64_t off = trellis_im_seg(b, lane / 8) + (lane % 8) * 8;
  *reinterpret_cast<uint2*>(dst + (2 * t) * cs + off) = make_uint2(hi[0], hi[1]);
  *reinterpret_cast<uint2*>(dst + (2 * t + 1) * cs + off) = make_uint2(lo[0], lo[1]);
  if (lane == 0) reinterpret_cast<float4*>(dst + 2 * T * cs)[t * nb + b] = md;
}

// The pre-pass: x staged once per launch into img (global), a warp per (activation row, block), for the GEMV's CTAs
// to copy instead of each quantizing all of x (at T = 8 that staging cost as much as the GEMV's own work a CTA).
__global__ void __launch_bounds__(256) trellis_xquant_kernel(const uint16_t* __restrict__ x, int T, int64_t Kin, unsigned char* img) {
  pdl_trigger();  // the GEMV may start fetching its weights; it waits for this grid before reading img
  pdl_wait();
  const int64_t nb = Kin / 256, pi = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (pi < int64_t(T) * nb) ti_stage_pair(x, T, Kin, int(pi / nb), pi % nb, threadIdx.x % 32, img);
}

template <int K, int NN, int MT, int V, int W, int MINB = 0>
__global__ void __launch_bounds__(W * 32, MINB)
    trellis_imma_kernel(TrSegs segs, const uint16_t* __restrict__ x, const unsigned char* __restrict__ ximg, bool y_f32, int T, int64_t Kin,
                        int wpr, int gated_act) {
  constexpr int WPB = 8 * K, NW = 2 * K;
  extern __shared__ __align__(16) unsigned char ti_xs[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, j = lane % 4;
  const int tpb = W / wpr, part = warp % wpr;
  const int64_t tile = int64_t(blockIdx.x) * tpb + warp / wpr;
  const bool gated = gated_act >= 0, live = tile < segs.units;
  const int si = gated || !live ? 0 : unit_segment(segs.n, segs.first, tile);
  const int64_t N = seg_pick(segs.N, si);
  const int64_t nb = Kin / 256, row_words = nb * WPB, cs = trellis_im_col_stride(nb);
  // A rows of m-tile mt, half h (A row g + 8h): plain, 16·MT consecutive rows of matrix si; gated, gate (h = 0) and up
  // (h = 1) row base + 8·mt + g. Rows past the matrix read row 0 (valid memory) and are not stored.
  const int64_t base = !live ? N : gated ? tile * 8 * MT : (tile - seg_pick(segs.first, si)) * 16 * MT;
  int64_t row[MT][2];
  const uint32_t* wp[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row[mt][h] = gated ? base + 8 * mt + g : base + 16 * mt + 8 * h + g;
      const uint32_t* m = gated && h == 1 ? segs.words[1] : seg_pick(segs.words, si);
      wp[mt][h] = m + (row[mt][h] < N ? row[mt][h] : 0) * row_words + trellis_im_word0<K>(j);
    }
  const int64_t bbeg = nb * part / wpr, bend = nb * (part + 1) / wpr;
  uint32_t wa[MT][2][NW], wb[MT][2][NW];
  auto load = [&](uint32_t (&w)[MT][2][NW], int64_t b) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) ti_load<K>(wp[mt][h] + b * WPB, w[mt][h]);
  };
  // The first block's words do not depend on the previous kernel: fetched before waiting for it.
  if (bbeg < bend) load(wa, bbeg);
  pdl_trigger();
  pdl_wait();

  // x staged: copied from the pre-pass's image, or quantized here a warp per (activation row, block).
  const int64_t pairs = int64_t(T) * nb;
  if (ximg) {
    const int64_t n16 = int64_t(ti_smem_bytes(T, Kin)) / 16;
    for (int64_t i = tid; i < n16; i += W * 32) reinterpret_cast<uint4*>(ti_xs)[i] = __ldg(reinterpret_cast<const uint4*>(ximg) + i);
  } else {
    for (int64_t pi = warp; pi < pairs; pi += W) ti_stage_pair(x, T, Kin, int(pi / nb), pi % nb, lane, ti_xs);
  }
  const float4* meta = reinterpret_cast<const float4*>(ti_xs + 2 * T * cs);
  __syncthreads();

  float acc[MT][NN][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) acc[mt][nn][0] = acc[mt][nn][1] = 0.0f;
  const unsigned char* xc[NN];
  bool xon[NN];
#pragma unroll
  for (int nn = 0; nn < NN; ++nn) {
    const int col = 8 * nn + g;  // B column g of n-tile nn: activation row 4·nn + g/2, hi (g even) or lo
    xon[nn] = col < 2 * T;
    xc[nn] = ti_xs + (xon[nn] ? col : 0) * cs;
  }
  const int nbr = g * 4 + ((j + 3) & 3);  // the lane whose first word follows this lane's last
  // One block's MMAs from its words cw, into acc.
  auto block = [&](const uint32_t (&cw)[MT][2][NW], int64_t b) {
    uint32_t W[MT][2][NW + 1];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < NW; ++e) W[mt][h][e] = cw[mt][h][e];
        W[mt][h][NW] = __shfl_sync(0xffffffffu, cw[mt][h][0], nbr);
      }
    // Two accumulators a tile, for even and odd MMAs: two dependency chains of the MMA's latency instead of one.
    int c[MT][NN][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nn = 0; nn < NN; ++nn)
#pragma unroll
        for (int p = 0; p < 2; ++p) c[mt][nn][p][0] = c[mt][nn][p][1] = c[mt][nn][p][2] = c[mt][nn][p][3] = 0;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint4 xv[NN];
#pragma unroll
      for (int nn = 0; nn < NN; ++nn)
        xv[nn] = xon[nn] ? *reinterpret_cast<const uint4*>(xc[nn] + trellis_im_seg(b, j) + 16 * u) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int r = 16 * u + 2 * q;  // MMA 8u + q: lane-relative weights r (k slots 4j..) and r + 1 (16 + 4j..)
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          a[mt][0] = trellis_lcg(ti_state<K, V>(W[mt][0], r)), a[mt][1] = trellis_lcg(ti_state<K, V>(W[mt][1], r));
          a[mt][2] = trellis_lcg(ti_state<K, V>(W[mt][0], r + 1)), a[mt][3] = trellis_lcg(ti_state<K, V>(W[mt][1], r + 1));
        }
#pragma unroll
        for (int nn = 0; nn < NN; ++nn) {
          const uint32_t b0 = ti_rep(xv[nn], 2 * q), b1 = ti_rep(xv[nn], 2 * q + 1);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma_u8s8(c[mt][nn][q & 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
        }
      }
    }
    // The block's sums: C columns 2j (hi) and 2j + 1 (lo) of n-tile nn are activation row 4·nn + j.
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) {
      const int t = 4 * nn + j;
      if (t >= T) continue;
      const float4 md = meta[t * nb + b];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int* c0 = c[mt][nn][0];
        const int* c1 = c[mt][nn][1];
        acc[mt][nn][0] = fmaf(md.x, ti_group_sum(md, c0[0] + c1[0], c0[1] + c1[1]), acc[mt][nn][0]);
        acc[mt][nn][1] = fmaf(md.x, ti_group_sum(md, c0[2] + c1[2], c0[3] + c1[3]), acc[mt][nn][1]);
      }
    }
  };
  ti_two_buffers(bbeg, bend, 1, wa, wb, load, block);

  // The wpr warps of a tile add their partial sums; part 0 stores. [W][NN][32]: static shared memory in 8-warp CTAs;
  // 16-warp ones (whose 32 KB would not fit beside the staged x) reuse the staged x's, read by no one once every warp
  // is past its loop (launch_imma's smem leaves room).
  __shared__ float4 red_static[W == 16 ? 1 : W][NN][32];
  float4* red = W == 16 ? reinterpret_cast<float4*>(ti_xs) : &red_static[0][0][0];
  if (W == 16 && wpr > 1) __syncthreads();
  if (wpr > 1)
#pragma unroll
    for (int nn = 0; nn < NN; ++nn)
      red[(warp * NN + nn) * 32 + lane] = make_float4(acc[0][nn][0], acc[0][nn][1], acc[MT - 1][nn][0], acc[MT - 1][nn][1]);
  __syncthreads();
  if (part != 0 || !live) return;
  for (int q = 1; q < wpr; ++q)
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) {
      const float4 v = red[((warp + q) * NN + nn) * 32 + lane];
      acc[0][nn][0] += v.x, acc[0][nn][1] += v.y;
      if (MT == 2) acc[MT - 1][nn][0] += v.z, acc[MT - 1][nn][1] += v.w;
    }
#pragma unroll
  for (int nn = 0; nn < NN; ++nn) {
    const int t = 4 * nn + j;
    if (t >= T) continue;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (gated) {
        if (row[mt][0] < N) store_gated(segs, gated_act, N, row[mt][0], t, acc[mt][nn][0], acc[mt][nn][1]);
        continue;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (row[mt][h] < N) store_row(segs, si, y_f32, N, row[mt][h], t, acc[mt][nn][h]);
    }
  }
}

// segs in tiles of mt m-tiles (make_segments with 16·mt rows a unit, gated 8·mt).
template <int K>
void launch_imma(const TrSegs& segs, int mt, int64_t Kin, const uint16_t* x, unsigned char* ximg, bool y_f32, int T, int n_sms, int gated_act,
                 cudaStream_t s) {
  const int64_t nb = Kin / 256, units = segs.units;
  // K split: until the tiles' warps fill the SMs' slots twice over, keeping at least one block a warp.
  // Warps a CTA: 8; 16 at 9..16 rows (ARBOR_CUDA_TRELLIS_W16=0 keeps 8 there), whose staged x (~170 KB at 4096
  // inputs) and registers (142-182 at 8 warps) leave one CTA an SM: the same CTA with twice the warps, capped at 128
  // registers (ptxas: 24-80 bytes of spills). Session 24, H100, the 8B at k = 2: 12 rows 1334 -> 1433 tok/s, 16 rows
  // 1759 -> 1886 (+7 %, two rounds each; the prediction was ~1.3x).
  const int nn = T <= 4 ? 0 : T <= 8 ? 1 : 2, W = nn == 2 && ti_options().wide_ctas == 1 ? 16 : kTiWarps;
  int wpr = 1;
  while (wpr < W && units * wpr < int64_t(n_sms) * 2 * kTiWarps && nb / (wpr * 2) >= 1) wpr *= 2;
  const int64_t per_block = W / wpr;
  const unsigned grid = unsigned((units + per_block - 1) / per_block);
  using Kern = void (*)(TrSegs, const uint16_t*, const unsigned char*, bool, int, int64_t, int, int);
  // [variant][m-tiles - 1][n-tiles: 1 (T <= 4), 2 (T <= 8), 4 (T <= 16; one m-tile only, for registers); then 4 with 16 warps]
  const Kern kerns[2][2][4] = {
      {{trellis_imma_kernel<K, 1, 1, 0, 8>, trellis_imma_kernel<K, 2, 1, 0, 8>, trellis_imma_kernel<K, 4, 1, 0, 8>, trellis_imma_kernel<K, 4, 1, 0, 16>},
       {trellis_imma_kernel<K, 1, 2, 0, 8>, trellis_imma_kernel<K, 2, 2, 0, 8>, nullptr, nullptr}},
      {{trellis_imma_kernel<K, 1, 1, 1, 8>, trellis_imma_kernel<K, 2, 1, 1, 8>, trellis_imma_kernel<K, 4, 1, 1, 8>, trellis_imma_kernel<K, 4, 1, 1, 16>},
       {trellis_imma_kernel<K, 1, 2, 1, 8>, trellis_imma_kernel<K, 2, 2, 1, 8>, nullptr, nullptr}}};
  // One m-tile and one n-tile (1-4 rows) bounded to 64 registers, four 8-warp CTAs an SM instead of three: [variant].
  const Kern occ_kerns[2] = {trellis_imma_kernel<K, 1, 1, 0, 8, 4>, trellis_imma_kernel<K, 1, 1, 1, 8, 4>};
  static bool attr = false;
  if (!attr) {
    for (Kern k : occ_kerns) ARBOR_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ti_max_smem())));
    for (auto& v : kerns)
      for (auto& m : v)
        for (Kern k : m)
          if (k) ARBOR_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ti_max_smem())));
    attr = true;
  }
  // The staged x (16-warp CTAs: or the partial sums' exchange at the end where that is larger).
  const size_t smem = W == 16 ? std::max(ti_smem_bytes(T, Kin), size_t(W) * (size_t(1) << nn) * 32 * sizeof(float4)) : ti_smem_bytes(T, Kin);
  if (ximg) {
    pdl_launch(trellis_xquant_kernel, dim3(unsigned((T * nb + 7) / 8)), dim3(256), 0, s, x, T, Kin, ximg);
    ARBOR_LAUNCH_CHECK("trellis_xquant_kernel");
  }
  const Kern kern = ti_options().occupancy == 1 && mt == 1 && nn == 0 ? occ_kerns[ti_options().variant]
                                                                      : kerns[ti_options().variant][mt - 1][nn + (W == 16 ? 1 : 0)];
  ARBOR_CU_CHECK(kern && smem <= ti_max_smem(), "cuda: trellis gemv: no integer kernel for %d rows, %d m-tiles, K %lld", T, mt, (long long)Kin);
  pdl_launch(kern, dim3(grid), dim3(W * 32), smem, s, segs, x,
             static_cast<const unsigned char*>(ximg), y_f32, T, Kin, wpr, gated_act);
  ARBOR_LAUNCH_CHECK("trellis_imma_kernel");
}

// ---- axis 0 on integer tensor cores (the default) --------------------------------------------------------
// Block (ob, split) as the other axis-0 kernels: outputs [256·ob, +256), input rows [split·rpc, +rpc). Warp w owns the
// 64 outputs of chunks 8·(w % 4) .. +7 and every other group of 64 input rows (w / 4 = 0 or 1 first). Per 8-input
// step, lane (g, j) decodes chunk 8·(w % 4) + g of input rows 2j and 2j + 1 (16 weights, the FP32 kernels' lane
// decode: two words a row) as LCG words, which are the A registers of four m16n8k32 MMAs (outputs 2m, 2m + 1 as
// rows g, g + 8; trellis.h "Axis 0 (trellis_imma_axis0_kernel)"); B is the staged x·scale/std of those two inputs,
// one 2-byte shared load a column. x·scale/std is staged per block as integers per group of 64 inputs (its scale,
// 510·Σhi, 510·Σlo beside it); the s32 sums become floats once per group. A group's 32 words a lane are loaded
// while the group before is computed.
constexpr int64_t kTiaGroup = 64;

template <int K, int NN, int V>
__global__ void __launch_bounds__(kTrWarps * 32)
    trellis_imma_axis0_kernel(const uint32_t* __restrict__ words, const float* __restrict__ scales, const float* __restrict__ bias,
                              const uint16_t* __restrict__ x, void* __restrict__ y, bool y_f32, float* __restrict__ partial, int T,
                              int64_t R, int64_t N, int64_t rpc) {
  constexpr int WPB = 8 * K;
  extern __shared__ __align__(16) unsigned char tia_xs[];  // [2T][ld] bytes, then a float4 per (row, group)
  __shared__ float4 red[4][NN][2][32];                       // the second-half warps' sums, [output group][n-tile][half of 8][lane]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, j = lane % 4;
  const int og = warp % 4, half = warp / 4, chunk = trellis_a0_chunk(og, g);
  const int64_t ob = blockIdx.x, split = blockIdx.y, r0 = split * rpc, ld = trellis_ia0_col_stride(rpc);
  const int64_t row_words = N / 256 * WPB, groups = rpc / kTiaGroup;  // rpc: a multiple of 64
  const uint32_t* base = words + ob * WPB;
  const int wi = trellis_lane_word<K>(chunk), wi2 = trellis_lane_word2<K>(chunk), off = trellis_lane_off<K>(chunk);
  // Words of group G: step st, row s (input r0 + 64·G + 8·st + 2j + s); past R a valid row (its staged x is 0).
  // A group wholly inside R (all but maybe the last) steps a pointer by 8 rows instead of clamping each row.
  uint32_t wa[8][2][2], wb[8][2][2];
  auto load = [&](uint32_t (&w)[8][2][2], int64_t G) {
    const int64_t i0 = r0 + kTiaGroup * G + 2 * j;
    if (r0 + kTiaGroup * (G + 1) <= R) {
      const uint32_t* p = base + i0 * row_words;
#pragma unroll
      for (int st = 0; st < 8; ++st, p += 8 * row_words)
#pragma unroll
        for (int sr = 0; sr < 2; ++sr) w[st][sr][0] = __ldg(p + sr * row_words + wi), w[st][sr][1] = __ldg(p + sr * row_words + wi2);
      return;
    }
#pragma unroll
    for (int st = 0; st < 8; ++st)
#pragma unroll
      for (int sr = 0; sr < 2; ++sr) {
        const int64_t i = i0 + 8 * st + sr;
        const uint32_t* p = base + (i < R ? i : R - 1) * row_words;
        w[st][sr][0] = __ldg(p + wi), w[st][sr][1] = __ldg(p + wi2);
      }
  };
  if (half < groups) load(wa, half);
  pdl_trigger();
  pdl_wait();
  // Stage x·scale/std: a warp per (activation row, group), lane l quantizing inputs 2l, 2l + 1 of the group.
  float4* meta = reinterpret_cast<float4*>(tia_xs + 2 * T * ld);
  for (int64_t pi = warp; pi < int64_t(T) * groups; pi += kTrWarps) {
    const int t = int(pi / groups);
    const int64_t G = pi % groups, i0 = r0 + kTiaGroup * G + 2 * lane;
    const float v[2] = {i0 < R ? __uint_as_float(uint32_t(x[t * R + i0]) << 16) * (scales[i0] * kTrInvStd) : 0.0f,
                        i0 + 1 < R ? __uint_as_float(uint32_t(x[t * R + i0 + 1]) << 16) * (scales[i0 + 1] * kTrInvStd) : 0.0f};
    uint32_t hi[1], lo[1];
    const float4 md = ti_quantize(v, hi, lo);
    const int64_t at = kTiaGroup * G + 2 * lane;
    *reinterpret_cast<uint16_t*>(tia_xs + (2 * t) * ld + at) = uint16_t(hi[0]);
    *reinterpret_cast<uint16_t*>(tia_xs + (2 * t + 1) * ld + at) = uint16_t(lo[0]);
    if (lane == 0) meta[t * groups + G] = md;
  }
  __syncthreads();

  float acc[NN][8];
#pragma unroll
  for (int nn = 0; nn < NN; ++nn)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[nn][e] = 0.0f;
  const unsigned char* xc[NN];
  bool xon[NN];
#pragma unroll
  for (int nn = 0; nn < NN; ++nn) {
    const int col = 8 * nn + g;
    xon[nn] = col < 2 * T;
    xc[nn] = tia_xs + (xon[nn] ? col : 0) * ld;
  }
  // One group's MMAs from its words cw, into acc.
  auto group = [&](const uint32_t (&cw)[8][2][2], int64_t G) {
    int c[NN][4][4];
#pragma unroll
    for (int nn = 0; nn < NN; ++nn)
#pragma unroll
      for (int m = 0; m < 4; ++m) c[nn][m][0] = c[nn][m][1] = c[nn][m][2] = c[nn][m][3] = 0;
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      uint32_t h[2][8];
#pragma unroll
      for (int sr = 0; sr < 2; ++sr) {
        uint32_t lo, hi;
        trellis_lane_align(cw[st][sr][0], cw[st][sr][1], off, lo, hi);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int sh = (7 - e) * K;
          h[sr][e] = trellis_lcg(sh + 12 <= 32 ? ti_window<V>(lo, sh) : trellis_funnel(lo, hi, sh) & 0xfffu);
        }
      }
#pragma unroll
      for (int nn = 0; nn < NN; ++nn) {
        const uint32_t xb = xon[nn] ? *reinterpret_cast<const uint16_t*>(xc[nn] + kTiaGroup * G + 8 * st + 2 * j) : 0u;
        const uint32_t b0 = __byte_perm(xb, 0u, 0x0000u), b1 = __byte_perm(xb, 0u, 0x1111u);
#pragma unroll
        for (int m = 0; m < 4; ++m) mma_u8s8(c[nn][m], h[0][2 * m], h[0][2 * m + 1], h[1][2 * m], h[1][2 * m + 1], b0, b1);
      }
    }
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) {
      const int t = 4 * nn + j;
      if (t >= T) continue;
      const float4 md = meta[t * groups + G];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        acc[nn][2 * m] = fmaf(md.x, ti_group_sum(md, c[nn][m][0], c[nn][m][1]), acc[nn][2 * m]);
        acc[nn][2 * m + 1] = fmaf(md.x, ti_group_sum(md, c[nn][m][2], c[nn][m][3]), acc[nn][2 * m + 1]);
      }
    }
  };
  ti_two_buffers(half, groups, 2, wa, wb, load, group);  // this warp's groups: every other one from `half`
  if (half == 1) {
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) {
      red[og][nn][0][lane] = make_float4(acc[nn][0], acc[nn][1], acc[nn][2], acc[nn][3]);
      red[og][nn][1][lane] = make_float4(acc[nn][4], acc[nn][5], acc[nn][6], acc[nn][7]);
    }
  }
  __syncthreads();
  if (half == 1) return;
  const bool direct = gridDim.y == 1;
#pragma unroll
  for (int nn = 0; nn < NN; ++nn) {
    const int t = 4 * nn + j;
    if (t >= T) continue;
    const float4 v0 = red[og][nn][0][lane], v1 = red[og][nn][1][lane];
    const float add[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t n = ob * 256 + 8 * chunk + e;
      const float v = acc[nn][e] + add[e];
      if (direct) store_y(y, y_f32, t * N + n, v + (bias ? bias[n] : 0.0f));
      else partial[(split * T + t) * N + n] = v;
    }
  }
}

// Whether the integer axis-1 GEMV stages x once per launch in a pre-pass (trellis_xquant_kernel, into scratch) rather
// than in every CTA: by default from 2 rows (at 1 row it measured level: 322.9 tok/s with it from 2 rows, 323.9 always).
bool ti_prepass(int64_t T) {
  const int mode = ti_options().prepass;
  return mode == 2 || (mode == 1 && T >= 2);
}
// Whether axis 1 over Kin inputs and T rows runs on the integer kernel, its staged x within ti_max_smem() (x must also
// be 16-byte aligned; else the FP32 one).
bool ti_on(int64_t Kin, int64_t T) { return trellis_integer_mma() && ti_smem_bytes(int(T), Kin) <= ti_max_smem(); }
// Floats of scratch an axis-1 launch over K inputs and T rows needs (its pre-pass's image), 0 if none.
int64_t axis1_scratch_floats(int64_t Kin, int64_t T) { return ti_on(Kin, T) && ti_prepass(T) ? int64_t(ti_smem_bytes(int(T), Kin) + 3) / 4 : 0; }

// The axis-1 GEMV over outs (gated: gate = outs[0], up = outs[1] into gated_y) at the instance of (k, rows): the
// integer tensor-core kernel where it is on and applies (its staged x within ti_max_smem, x 16-byte aligned), else the FP32 one.
void launch_axis1_any(const TrellisGemvOut* outs, int n, uint16_t* gated_y, int bits, int64_t Kin, const uint16_t* x, bool y_f32, int64_t T,
                      float* scratch, int n_sms, int gated_act, cudaStream_t s) {
  const int t = int(T);
  if (ti_on(Kin, T) && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    unsigned char* ximg = ti_prepass(T) && scratch ? reinterpret_cast<unsigned char*>(scratch) : nullptr;
    // One m-tile a warp (16 rows) by default, and always past 8 rows (registers): fewer registers (76-126 at up to 8
    // rows against 124-210 for two m-tiles), so more CTAs an SM, and more tiles for the small matrices. Two m-tiles
    // (32 rows; x's bytes replicated once for both) with ARBOR_CUDA_TRELLIS_MT=0, or =1 where 32-row tiles still
    // leave two a SM (A/B runs).
    int64_t rows = 0;
    for (int i = 0; i < (gated_y ? 1 : n); ++i) rows += outs[i].w.rows;
    const int st = ti_options().small_tiles;
    const int mt = T > 8 || st == 2 ? 1 : st != 1 || (gated_y ? rows / 16 : rows / 32) >= 2 * int64_t(n_sms) ? 2 : 1;
    const TrSegs segs = make_segments(outs, n, gated_y, gated_y ? 8 * mt : 16 * mt);
    if (bits == 2) launch_imma<2>(segs, mt, Kin, x, ximg, y_f32, t, n_sms, gated_act, s);
    else if (bits == 3) launch_imma<3>(segs, mt, Kin, x, ximg, y_f32, t, n_sms, gated_act, s);
    else launch_imma<4>(segs, mt, Kin, x, ximg, y_f32, t, n_sms, gated_act, s);
    return;
  }
  // The FP32 kernels, 8 rows of activations a launch at most.
  for (int t0 = 0; t0 < t; t0 += kTrFp32MaxRows) {
    const int tc = std::min(kTrFp32MaxRows, t - t0), nr = tc == 1 ? 1 : tc == 2 ? 2 : tc <= 4 ? 4 : 8;
    TrSegs segs = make_segments(outs, n, gated_y, gated_y ? 1 : 2);
    for (int i = 0; i < segs.n; ++i)
      if (segs.y[i]) segs.y[i] = static_cast<char*>(segs.y[i]) + int64_t(t0) * segs.N[i] * (gated_y ? 2 : y_f32 ? 4 : 2);
    const uint16_t* xc = x + int64_t(t0) * Kin;
#define ARBOR_TR_AXIS1(KK)                                                              \
  if (nr == 1) launch_axis1<KK, 1>(segs, Kin, xc, y_f32, tc, n_sms, gated_act, s);       \
  else if (nr == 2) launch_axis1<KK, 2>(segs, Kin, xc, y_f32, tc, n_sms, gated_act, s);  \
  else if (nr == 4) launch_axis1<KK, 4>(segs, Kin, xc, y_f32, tc, n_sms, gated_act, s);  \
  else launch_axis1<KK, 8>(segs, Kin, xc, y_f32, tc, n_sms, gated_act, s);
    if (bits == 2) { ARBOR_TR_AXIS1(2) }
    else if (bits == 3) { ARBOR_TR_AXIS1(3) }
    else { ARBOR_TR_AXIS1(4) }
#undef ARBOR_TR_AXIS1
  }
}

// Both axis-0 kernels take these parameters, the same grid (256 outputs x a split of the input rows) and plan.
using Axis0Kernel = void (*)(const uint32_t*, const float*, const float*, const uint16_t*, void*, bool, float*, int, int64_t, int64_t,
                             int64_t);

// Axis 0 (stored [in, out]: R coded rows = inputs, N outputs) with `kernel`, whose dynamic shared memory is
// smem_per_row * rpc + smem_fixed bytes; the split partials then summed by trellis_reduce_kernel.
void launch_axis0(Axis0Kernel kernel, size_t smem_per_row, size_t smem_fixed, const TrellisWeights& w, const uint16_t* x, const float* bias,
                  void* y, bool y_f32, int T, float* scratch, int n_sms, cudaStream_t s) {
  const int64_t R = w.cols, N = w.rows;
  const Axis0Plan p = axis0_plan(R, N, n_sms);
  ARBOR_CU_CHECK(p.splits == 1 || scratch, "cuda: trellis gemv: axis 0 over %lld blocks of rows needs scratch", (long long)p.splits);
  pdl_launch(kernel, dim3(unsigned(N / 256), unsigned(p.splits)), dim3(kTrWarps * 32), smem_per_row * size_t(p.rpc) + smem_fixed, s,
             w.words, w.scales, bias, x, y, y_f32, scratch, T, R, N, p.rpc);
  ARBOR_LAUNCH_CHECK("trellis axis-0 gemv kernel");
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
void launch_axis0_k(const TrellisWeights& w, const uint16_t* x, const float* bias, void* y, bool y_f32, int T, float* scratch, int n_sms,
                    cudaStream_t s) {
  if (trellis_integer_mma()) {  // 2T·(rpc + 8) staged bytes and T·rpc/64 float4s: at most 3T a row, 24T fixed (rpc a multiple of 64)
    const Axis0Kernel kerns[2][3] = {{trellis_imma_axis0_kernel<K, 1, 0>, trellis_imma_axis0_kernel<K, 2, 0>, trellis_imma_axis0_kernel<K, 4, 0>},
                                     {trellis_imma_axis0_kernel<K, 1, 1>, trellis_imma_axis0_kernel<K, 2, 1>, trellis_imma_axis0_kernel<K, 4, 1>}};
    static bool attr = false;  // 16 rows at 1024 rows a block stage ~49 KB, past the 48 KB default
    if (!attr) {
      for (auto& v : kerns)
        for (Axis0Kernel k : v)
          ARBOR_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                int(3 * kTrellisGemvMaxRows * kTrMaxRowsPerBlock + 24 * kTrellisGemvMaxRows)));
      attr = true;
    }
    launch_axis0(kerns[ti_options().variant][T <= 4 ? 0 : T <= 8 ? 1 : 2], size_t(T) * 3, size_t(T) * 24, w, x, bias, y, y_f32, T, scratch,
                 n_sms, s);
    return;
  }
  // The FP32 kernel, 8 rows of activations a launch at most (the split partials in scratch reused in turn).
  for (int t0 = 0; t0 < T; t0 += kTrFp32MaxRows) {
    const int tc = std::min(kTrFp32MaxRows, T - t0), nr = tc == 1 ? 1 : tc == 2 ? 2 : tc <= 4 ? 4 : 8;
    const Axis0Kernel k = nr == 1   ? trellis_gemv_axis0_kernel<K, 1>
                          : nr == 2 ? trellis_gemv_axis0_kernel<K, 2>
                          : nr == 4 ? trellis_gemv_axis0_kernel<K, 4>
                                    : trellis_gemv_axis0_kernel<K, 8>;
    launch_axis0(k, size_t(nr) * 4, size_t(kTrWarps) * 256 * 4, w, x + int64_t(t0) * w.cols, bias,
                 static_cast<char*>(y) + int64_t(t0) * w.rows * (y_f32 ? 4 : 2), y_f32, tc, scratch, n_sms, s);
  }
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

void launch_trellis_gemv_multi(const TrellisGemvOut* outs, int n, const uint16_t* x, bool y_f32, int64_t T, float* scratch, int n_sms,
                               CUstream_st* s) {
  ARBOR_CU_CHECK(n >= 1 && n <= kTrellisGemvMaxSegments, "cuda: trellis gemv: %d matrices in one launch (1..%d)", n, kTrellisGemvMaxSegments);
  check_fusable(outs, n, T, "gemv");
  launch_axis1_any(outs, n, nullptr, outs[0].w.bits, outs[0].w.cols, x, y_f32, T, scratch, n_sms, -1, s);
}

void launch_trellis_gemv_gated(const TrellisGemvOut& gate, const TrellisGemvOut& up, int act, const uint16_t* x, uint16_t* y, int64_t T,
                               float* scratch, int n_sms, CUstream_st* s) {
  const TrellisGemvOut both[2] = {gate, up};
  check_fusable(both, 2, T, "gated gemv");
  ARBOR_CU_CHECK(gate.w.rows == up.w.rows, "cuda: trellis gated gemv: gate has %lld rows, up %lld", (long long)gate.w.rows, (long long)up.w.rows);
  launch_axis1_any(both, 2, y, gate.w.bits, gate.w.cols, x, false, T, scratch, n_sms, act, s);
}

int64_t trellis_gemv_scratch_floats(const TrellisWeights& w, int64_t T, int n_sms) {
  if (w.axis == 1) return axis1_scratch_floats(w.cols, T);
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
  if (w.axis == 1) {
    const TrellisGemvOut o{w, bias, y};
    launch_axis1_any(&o, 1, nullptr, w.bits, w.cols, x, y_f32, T, scratch, n_sms, -1, s);
    return;
  }
  switch (w.bits) {
    case 2: launch_axis0_k<2>(w, x, bias, y, y_f32, int(T), scratch, n_sms, s); break;
    case 3: launch_axis0_k<3>(w, x, bias, y, y_f32, int(T), scratch, n_sms, s); break;
    default: launch_axis0_k<4>(w, x, bias, y, y_f32, int(T), scratch, n_sms, s); break;
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

int64_t trellis_gemv_fused_scratch_floats(int64_t cols, int64_t T) { return axis1_scratch_floats(cols, T); }

void set_trellis_gemv_mma(int mode) { g_trellis_mma = mode == 0 || mode == 1 ? mode : -1; }

void set_trellis_gemv_options(int variant, int small_tiles, int prepass, int wide_ctas, int occupancy) {
  g_ti_set = {variant >= 0 && variant <= 1 ? variant : -1, small_tiles >= 0 && small_tiles <= 2 ? small_tiles : -1,
              prepass >= 0 && prepass <= 2 ? prepass : -1, wide_ctas >= 0 && wide_ctas <= 1 ? wide_ctas : -1,
              occupancy >= 0 && occupancy <= 1 ? occupancy : -1};
}

}  // namespace arbor::cuda
