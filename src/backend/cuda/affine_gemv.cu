// MLX affine weights (affine.h's layout) for decode: a GEMV for 1-8 rows of activations, its fused forms
// (q/k/v segments, gate/up + activation), and the embedding gather.
//
// GEMV: the dense register GEMV's skeleton (gemv.cu: warps own a pair of output rows, small N split
// along K over up to 8 warps, the first weights fetched before griddepcontrol.wait). A lane's step is a
// chunk of 128 codes of each of its two rows: `bits` 16-byte loads per row (128 codes are a whole number
// of 16-byte words at every bit width), so 3/5/6-bit codes that straddle words are read once as part of
// whole units. A code becomes a float in two integer ops: its bits are moved to mantissa bits
// [23-bits, 23) under the exponent of 2^bits, which gives 2^bits + code exactly (4-bit: a word's nibbles
// spread to bytes, then one PRMT per code gives 128 + code: 11 ops per 8 codes); the offset is taken
// back once per 32-code unit with the unit's activation sum (s·Σx(2^b+q) + (b - s·2^b)·Σx). The block
// stages that sum per (row of x, unit) in shared memory, and x itself (bf16) when it fits (80 KB), both in
// the order the lanes read them (conflict-free), so the inner loop is one FMA per code and activation
// row plus one conversion per x value and row pair. x that does not fit is read from global memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/affine.h"
#include "backend/cuda/cp_async.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_sync.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/segments.h"

namespace arbor::cuda {

namespace {

constexpr int kAffWarps = 8;                  // per block
constexpr int64_t kAffMaxXsBytes = 80 * 1024;  // x staged (bf16, in the lanes' order) in shared memory up to this

// One launch's matrices (up to three over the same x; gated: gate and up, y and N from the gate) and
// its units, each kernel's own: v1 row pairs (gated: one gate/up row pair), v2 tiles of 16 rows (gated:
// 8 row pairs), v4 rows (gated: row pairs). Matrix i owns units [first[i], first[i + 1]); gated: all.
struct AffSegs {
  const uint32_t* codes[kAffineGemvMaxSegments];
  const uint32_t* sb[kAffineGemvMaxSegments];
  const float* bias[kAffineGemvMaxSegments];
  void* y[kAffineGemvMaxSegments];
  int64_t N[kAffineGemvMaxSegments];
  int64_t first[kAffineGemvMaxSegments];
  int n;
  int64_t units;
};

// outs[0..n) in units of rows_per_unit output rows, numbered consecutively over the matrices.
AffSegs plain_segments(const AffineGemvOut* outs, int n, int64_t rows_per_unit) {
  AffSegs segs{};
  segs.n = n;
  for (int i = 0; i < n; ++i) {
    segs.codes[i] = outs[i].w.codes, segs.sb[i] = outs[i].w.sb, segs.bias[i] = outs[i].bias, segs.y[i] = outs[i].y;
    segs.N[i] = outs[i].w.rows, segs.first[i] = segs.units;
    segs.units += (outs[i].w.rows + rows_per_unit - 1) / rows_per_unit;
  }
  return segs;
}

// gate and up into y in units of rows_per_unit row pairs.
AffSegs gated_segments(const AffineGemvOut& gate, const AffineGemvOut& up, uint16_t* y, int64_t rows_per_unit) {
  AffSegs segs{};
  segs.n = 2;
  segs.codes[0] = gate.w.codes, segs.codes[1] = up.w.codes, segs.sb[0] = gate.w.sb, segs.sb[1] = up.w.sb;
  segs.bias[0] = gate.bias, segs.bias[1] = up.bias, segs.y[0] = y, segs.N[0] = gate.w.rows;
  segs.units = (gate.w.rows + rows_per_unit - 1) / rows_per_unit;
  return segs;
}

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_stream1(const uint32_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// Code j of a chunk's words (j, and so the word and offset, are constants once the callers' loops are
// unrolled) as the float 2^BITS + code.
template <int BITS>
__device__ __forceinline__ float code_f(const uint32_t* w, int j) {
  constexpr int P = 23 - BITS;
  const int bit = j * BITS, wi = bit >> 5, off = bit & 31;
  uint32_t v;
  if (off + BITS > 32) v = __funnelshift_r(w[wi], w[wi + 1], off - P);  // straddles two words (off > P here)
  else if (off >= P) v = w[wi] >> (off - P);
  else v = w[wi] << (P - off);
  return __uint_as_float((v & (((1u << BITS) - 1u) << P)) | (uint32_t(127 + BITS) << 23));
}

// Byte k of a word whose bytes are 4-bit codes, as the float 128 + code: the byte goes to bits 16..23 under
// the exponent byte 0x43 (128.0f), one PRMT.
__device__ __forceinline__ float nib_f(uint32_t spread, int k) {
  return __uint_as_float(__byte_perm(spread, 0x43000000u, 0x7044u | (uint32_t(k) << 8)));
}

// A group's (scale, bias) word: scale in the low half.
__device__ __forceinline__ float2 sb_pair(uint32_t w, bool f16) {
  if (f16) return __half22float2(*reinterpret_cast<const __half2*>(&w));
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

__device__ __forceinline__ void bf16x8(const uint4& q, float* f) {
  const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) f[2 * i] = __uint_as_float(u[i] << 16), f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
}

// Block: kAffWarps warps; `wpr` consecutive warps share a pair of output rows (gated: row p of the gate
// and of the up matrix), each over a contiguous range of 128-code chunks. XS: x staged in shared memory.
// Shared memory (dynamic): Σx per (activation row, 32-column unit), then XS: x; both in the lanes' order.
template <int BITS, int NR, bool XS>
__global__ void __launch_bounds__(kAffWarps * 32) affine_gemv_kernel(AffSegs segs, const uint16_t* __restrict__ x, bool y_f32, int T, int64_t K,
                                                                     int gshift, bool sb_f16, int wpr, bool vec, int gated_act) {
  extern __shared__ __align__(16) float aff_smem[];
  __shared__ float red[kAffWarps][2][NR];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pair = warp / wpr, part = warp % wpr;
  const int64_t gp = int64_t(blockIdx.x) * (kAffWarps / wpr) + pair;
  const uint32_t* ca;
  const uint32_t* cb;
  const uint32_t* sa;
  const uint32_t* sbb;
  const float* ba;
  const float* bb;
  void* y;
  int64_t N, row0;
  bool has0, has1;
  if (gated_act >= 0) {
    ca = segs.codes[0], cb = segs.codes[1], sa = segs.sb[0], sbb = segs.sb[1], ba = segs.bias[0], bb = segs.bias[1], y = segs.y[0];
    N = segs.N[0], row0 = gp;
    has0 = has1 = gp < N;
  } else {
    const int si = unit_segment(segs.n, segs.first, gp);
    ca = cb = seg_pick(segs.codes, si);
    sa = sbb = seg_pick(segs.sb, si);
    ba = bb = seg_pick(segs.bias, si);
    y = seg_pick(segs.y, si);
    N = seg_pick(segs.N, si);
    row0 = (gp - seg_pick(segs.first, si)) * 2;
    has0 = row0 < N, has1 = row0 + 1 < N;
  }
  // Rows past the matrix read row 0 (valid memory) and are not stored.
  const int64_t rowa = has0 ? row0 : 0, rowb = gated_act >= 0 ? rowa : (has1 ? row0 + 1 : 0);
  const int64_t units = K / 32, chunks = (units + 3) / 4, words = K * BITS / 32, groups = K >> gshift;
  const uint32_t* c0 = ca + rowa * words;
  const uint32_t* c1 = cb + rowb * words;
  const uint32_t* s0 = sa + rowa * groups;
  const uint32_t* s1 = sbb + rowb * groups;
  const int64_t cbeg = chunks * part / wpr, cend = chunks * (part + 1) / wpr;

  uint32_t w0[4 * BITS], w1[4 * BITS], g0[4], g1[4];
  auto load = [&](int64_t c) {
    if (c >= cend) return;
    if (vec && c * 4 + 4 <= units) {
#pragma unroll
      for (int i = 0; i < BITS; ++i) {
        const uint4 a = ld_stream(c0 + (c * BITS + i) * 4), b = ld_stream(c1 + (c * BITS + i) * 4);
        w0[4 * i] = a.x, w0[4 * i + 1] = a.y, w0[4 * i + 2] = a.z, w0[4 * i + 3] = a.w;
        w1[4 * i] = b.x, w1[4 * i + 1] = b.y, w1[4 * i + 2] = b.z, w1[4 * i + 3] = b.w;
      }
    } else {
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int i = 0; i < BITS; ++i) {
          const bool in = c * 4 + u < units;
          w0[u * BITS + i] = in ? ld_stream1(c0 + (c * 4 + u) * BITS + i) : 0u;
          w1[u * BITS + i] = in ? ld_stream1(c1 + (c * 4 + u) * BITS + i) : 0u;
        }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t unit = c * 4 + u, g = unit < units ? (unit * 32) >> gshift : 0;
      g0[u] = __ldg(s0 + g), g1[u] = __ldg(s1 + g);
    }
  };
  // The first weights do not depend on the previous kernel: fetched before waiting for it.
  load(cbeg + lane);
  pdl_trigger();
  pdl_wait();

  // Σx per (activation row, unit), and x itself (XS), staged in the order the lanes read them: a lane owns
  // chunk c = cbeg + lane + 32i, so at each step the warp's lanes read 32 consecutive 16-byte slots (no bank
  // conflicts; x read in place would put every lane 256 bytes apart). Slot of (c, u, sb8):
  // ((c / 32) * 16 + u * 4 + sb8) * 32 + c % 32, in uint4 (8 bf16); Σx of (c, u): ((c / 32) * 4 + u) * 32 + c % 32.
  const int64_t rows32 = (chunks + 31) / 32, xs_row = rows32 * 16 * 32, xsum_row = rows32 * 4 * 32;
  float* xsum = aff_smem;
  uint4* xs = reinterpret_cast<uint4*>(aff_smem + int64_t(T) * xsum_row);
  for (int64_t i = threadIdx.x; i < int64_t(T) * units; i += kAffWarps * 32) {
    const int64_t t = i / units, unit = i % units, c = unit / 4, u = unit % 4;
    const uint16_t* xp = x + t * K + unit * 32;
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint4 v;
      if (vec) {
        v = __ldg(reinterpret_cast<const uint4*>(xp) + q);
      } else {
        uint32_t h[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) h[e] = uint32_t(xp[q * 8 + 2 * e]) | uint32_t(xp[q * 8 + 2 * e + 1]) << 16;
        v = make_uint4(h[0], h[1], h[2], h[3]);
      }
      float f[8];
      bf16x8(v, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += f[e];
      if (XS) xs[t * xs_row + ((c >> 5) * 16 + u * 4 + q) * 32 + (c & 31)] = v;
    }
    xsum[t * xsum_row + ((c >> 5) * 4 + u) * 32 + (c & 31)] = sum;
  }
  __syncthreads();

  constexpr float kM = BITS == 4 ? 128.0f : float(1 << BITS);  // the codes' float offset (code_f, nib_f)
  float acc[2][NR];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[j][r] = 0.0f;

  for (int64_t c = cbeg + lane; c < cend; c += 32) {
    if (c != cbeg + lane) load(c);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t unit = c * 4 + u;
      if (unit >= units) break;
      float S0[NR], S1[NR];
#pragma unroll
      for (int r = 0; r < NR; ++r) S0[r] = S1[r] = 0.0f;
#pragma unroll
      for (int sb8 = 0; sb8 < 4; ++sb8) {
        float v0[8], v1[8];
        if constexpr (BITS == 4) {  // one word: its even and odd nibbles spread to bytes, each byte a float by one PRMT
          const uint32_t a = w0[u * 4 + sb8], b = w1[u * 4 + sb8];
          const uint32_t al = a & 0x0f0f0f0fu, ah = (a >> 4) & 0x0f0f0f0fu, bl = b & 0x0f0f0f0fu, bh = (b >> 4) & 0x0f0f0f0fu;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            v0[2 * k] = nib_f(al, k), v0[2 * k + 1] = nib_f(ah, k);
            v1[2 * k] = nib_f(bl, k), v1[2 * k + 1] = nib_f(bh, k);
          }
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            v0[e] = code_f<BITS>(w0, u * 32 + sb8 * 8 + e);
            v1[e] = code_f<BITS>(w1, u * 32 + sb8 * 8 + e);
          }
        }
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          if (r >= T) break;
          float xv[8];
          if (XS) {
            bf16x8(xs[r * xs_row + ((c >> 5) * 16 + u * 4 + sb8) * 32 + (c & 31)], xv);
          } else if (vec) {
            bf16x8(__ldg(reinterpret_cast<const uint4*>(x + r * K + unit * 32 + sb8 * 8)), xv);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) xv[e] = __uint_as_float(uint32_t(x[r * K + unit * 32 + sb8 * 8 + e]) << 16);
          }
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            S0[r] = fmaf(v0[e], xv[e], S0[r]);
            S1[r] = fmaf(v1[e], xv[e], S1[r]);
          }
        }
      }
      const float2 p0 = sb_pair(g0[u], sb_f16), p1 = sb_pair(g1[u], sb_f16);
      const float o0 = p0.y - p0.x * kM, o1 = p1.y - p1.x * kM;
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        if (r >= T) break;
        const float sx = xsum[r * xsum_row + ((c >> 5) * 4 + u) * 32 + (c & 31)];
        acc[0][r] = fmaf(p0.x, S0[r], fmaf(o0, sx, acc[0][r]));
        acc[1][r] = fmaf(p1.x, S1[r], fmaf(o1, sx, acc[1][r]));
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
      const float g = __bfloat162float(__float2bfloat16(acc[0][r] + b0)), up = __bfloat162float(__float2bfloat16(acc[1][r] + b1));
      static_cast<__nv_bfloat16*>(y)[r * N + row0] = __float2bfloat16(act_value(gated_act, g) * up);
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

template <int BITS, int NR, bool XS>
void launch_t(unsigned grid, size_t smem, cudaStream_t s, const AffSegs& segs, const uint16_t* x, bool y_f32, int T, int64_t K, int gshift,
              bool sb_f16, int wpr, bool vec, int gated_act) {
  auto* kernel = affine_gemv_kernel<BITS, NR, XS>;
  static bool attr = false;  // dynamic shared memory past 48 KB (XS: x of up to 80 KB plus the sums)
  if (!attr) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    attr = true;
  }
  pdl_launch(kernel, dim3(grid), dim3(kAffWarps * 32), smem, s, segs, x, y_f32, T, K, gshift, sb_f16, wpr, vec, gated_act);
  ARBOR_LAUNCH_CHECK("affine_gemv_kernel");
}

template <int BITS, int NR>
void launch_xs(bool xs, unsigned grid, size_t smem, cudaStream_t s, const AffSegs& segs, const uint16_t* x, bool y_f32, int T, int64_t K,
               int gshift, bool sb_f16, int wpr, bool vec, int gated_act) {
  if (xs) launch_t<BITS, NR, true>(grid, smem, s, segs, x, y_f32, T, K, gshift, sb_f16, wpr, vec, gated_act);
  else launch_t<BITS, NR, false>(grid, smem, s, segs, x, y_f32, T, K, gshift, sb_f16, wpr, vec, gated_act);
}

template <int BITS>
void launch_bits(int nr, bool xs, unsigned grid, size_t smem, cudaStream_t s, const AffSegs& segs, const uint16_t* x, bool y_f32, int T,
                 int64_t K, int gshift, bool sb_f16, int wpr, bool vec, int gated_act) {
#define ARBOR_AFF(NR) launch_xs<BITS, NR>(xs, grid, smem, s, segs, x, y_f32, T, K, gshift, sb_f16, wpr, vec, gated_act)
  if (nr == 1) ARBOR_AFF(1);
  else if (nr == 2) ARBOR_AFF(2);
  else if (nr == 4) ARBOR_AFF(4);
  else ARBOR_AFF(8);
#undef ARBOR_AFF
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void launch(const AffSegs& segs, const AffineWeights& w0, const uint16_t* x, bool y_f32, int64_t T, int n_sms, int gated_act,
            cudaStream_t s) {
  const int64_t K = w0.cols;
  const int bits = w0.bits;
  ARBOR_CU_CHECK(T >= 1 && T <= kAffineGemvMaxRows, "cuda: affine gemv: %lld rows of activations (1..%lld)", (long long)T,
                 (long long)kAffineGemvMaxRows);
  ARBOR_CU_CHECK(bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8, "cuda: affine gemv: %d bits (2/3/4/5/6/8)", bits);
  ARBOR_CU_CHECK(w0.group_size == 32 || w0.group_size == 64 || w0.group_size == 128, "cuda: affine gemv: group size %d (32/64/128)",
                 w0.group_size);
  ARBOR_CU_CHECK(K > 0 && K % w0.group_size == 0, "cuda: affine gemv: %lld columns are not whole groups of %d", (long long)K, w0.group_size);
  const int gshift = w0.group_size == 32 ? 5 : w0.group_size == 64 ? 6 : 7;
  const int64_t units = K / 32, chunks = (units + 3) / 4, rows32 = (chunks + 31) / 32;
  // 16-byte loads: rows of whole 16-byte words and aligned bases (x too: its rows are read 8 values at a time).
  bool vec = (K * bits) % 128 == 0 && aligned16(x);
  for (int i = 0; i < segs.n; ++i) vec = vec && aligned16(segs.codes[i]);
  // ARBOR_CUDA_AFFINE_XS=0: x always read from global memory (A/B runs).
  static const bool xs_on = [] {
    const char* e = std::getenv("ARBOR_CUDA_AFFINE_XS");
    return !(e && std::atoi(e) == 0);
  }();
  const size_t xsum_bytes = size_t(T * rows32) * 4 * 32 * 4, xs_bytes = size_t(T * rows32) * 16 * 32 * 16;
  const bool xs = xs_on && xs_bytes <= size_t(kAffMaxXsBytes);
  const size_t smem = xsum_bytes + (xs ? xs_bytes : 0);
  ARBOR_CU_CHECK(smem <= 200 * 1024, "cuda: affine gemv: %lld x %lld activations need %zu bytes of shared memory (200 KB at most)",
                 (long long)T, (long long)K, smem);
  // K split: as the dense GEMV (about half the SMs' warp slots busy), but never below 32 chunks a warp:
  // a chunk is one lane's step.
  int wpr = 1;
  const int64_t pairs = segs.units;
  while (wpr < kAffWarps && pairs * wpr < int64_t(n_sms) * 32 && chunks / (wpr * 2) >= 32) wpr *= 2;
  const int64_t pairs_per_block = kAffWarps / wpr;
  const unsigned grid = unsigned((pairs + pairs_per_block - 1) / pairs_per_block);
  const int nr = T == 1 ? 1 : T == 2 ? 2 : T <= 4 ? 4 : 8;
  const int t = int(T);
  switch (bits) {
    case 2: launch_bits<2>(nr, xs, grid, smem, s, segs, x, y_f32, t, K, gshift, w0.sb_f16, wpr, vec, gated_act); break;
    case 3: launch_bits<3>(nr, xs, grid, smem, s, segs, x, y_f32, t, K, gshift, w0.sb_f16, wpr, vec, gated_act); break;
    case 4: launch_bits<4>(nr, xs, grid, smem, s, segs, x, y_f32, t, K, gshift, w0.sb_f16, wpr, vec, gated_act); break;
    case 5: launch_bits<5>(nr, xs, grid, smem, s, segs, x, y_f32, t, K, gshift, w0.sb_f16, wpr, vec, gated_act); break;
    case 6: launch_bits<6>(nr, xs, grid, smem, s, segs, x, y_f32, t, K, gshift, w0.sb_f16, wpr, vec, gated_act); break;
    default: launch_bits<8>(nr, xs, grid, smem, s, segs, x, y_f32, t, K, gshift, w0.sb_f16, wpr, vec, gated_act); break;
  }
}

void check_same(const AffineWeights& a, const AffineWeights& b, const char* what) {
  ARBOR_CU_CHECK(a.cols == b.cols && a.bits == b.bits && a.group_size == b.group_size && a.sb_f16 == b.sb_f16,
                 "cuda: affine %s: matrices differ (%lld cols %d-bit g%d %s vs %lld cols %d-bit g%d %s)", what, (long long)a.cols, a.bits,
                 a.group_size, a.sb_f16 ? "f16" : "bf16", (long long)b.cols, b.bits, b.group_size, b.sb_f16 ? "f16" : "bf16");
}

// ---- v2: the tensor-core decode GEMV (2/3/4/8-bit; the default for 2..8 activation rows) ---------------
// Checked on an H100 (session 18: tests/cuda/affine_gemv_test.cpp's V2 cases, memcheck clean) and measured
// on the 8B at 4-bit g64: batch 8 1334 tok/s against v1's 381 (v1 reads the weights once per row there),
// batch 1 238 tok/s against v1's 307. So by default v2 runs 2..8 rows, and one row runs v4 (below) where it
// applies, else v1; ARBOR_CUDA_AFFINE_GEMV = 1/2/3 forces one kernel for every row count.
//
// Mapping. A warp owns a tile of 16 weight rows (the MMA's M; gated: 8 gate rows then the same 8 up rows)
// for all T <= 8 activation rows at once (the MMA's N: x rows past T are zeros), so the dequantization and
// the MMAs cost the same at T = 1 and T = 8. Lane (g = lane/4, j = lane%4) holds M-rows g and g+8, as
// mma.sync m16n8k16's A fragment does. K is walked in steps; in a step each lane loads 32 bytes of each of
// its two rows as NP "pieces" of L = group_size*bits/32 bytes (capped at 16): piece p of the quad (j = 0..3)
// is 4L consecutive bytes of the row, lane j's L of them at j*L, so a piece's columns lie in one group (4-bit
// g32: 4-byte loads; g64: 8; g128 and 8-bit g64/g128: 16; 8-bit g128: a piece is half a group). One 32-bit
// word of a lane gives two MMAs' A values. A nibble moved to mantissa bits 3..6 under the exponent of 16 is
// the bf16 16 + nibble (under 256's: 256 + 16·nibble): 4-bit word (q0..q7): ((w >> (4i - 3)) & 0x00780078) |
// 0x41804180 is the bf16 pair (16 + q_i, 16 + q_{i+4}), one SHF + one LOP3 per two codes; MMA 1 takes pairs
// (q0,q4),(q1,q5), MMA 2 (q2,q6),(q3,q7), and the lane's B values are x at the same columns: a 16-byte load
// of its 8 x values, 4 PRMT. 8-bit word (q0..q3): low nibbles as 16 + l, high nibbles | 0x43804380 as 256 +
// 16h, pairs (q0,q2),(q1,q3), two MMAs into the same accumulators: Σ x (272 + q). Codes in bf16 are exact,
// products exact in f32. Each piece's MMAs start from zero; then acc += scale · C + (bias − M·scale) · Σx
// (M = 16 or 272: small offsets, so little cancels), Σx per (activation row, piece) from one more MMA per
// 16 columns with an A of ones (the tensor cores are otherwise idle here; no table, no prologue, no shared
// memory but the K split's).
//
// 2- and 3-bit codes (the file's bit stream, not repacked): 8 codes are 2 or 3 whole bytes (a "chunk"), so
// a piece is 32 columns, lane j's the chunk at columns 8j..8j+7, which it reads as the aligned word (2-bit)
// or two words (3-bit; neighbouring lanes' loads overlap and merge in L1) that hold it. A funnel shift
// brings the chunk to bit 0, one SHF + LOP3 moves codes 4..7 to bit 16, and each pair (q_i, q_{i+4}) is then
// one SHF + LOP3 as for nibbles (16 + q under the exponent of 16). The MMA's K sums run over a quad's 4
// chunks, all in one group; the group's GS/32 pieces share c and Σx before its scale is applied.
//
// Pipelining: blocks of 8 warps, at most 2 per SM, each walking units (8/wpr tiles; wpr warps split a
// tile's K steps and add their partial sums through shared memory at the unit's end) grid-stride. The loads
// of a warp's next step (the next unit's first step across unit boundaries) are issued before the current
// step is computed, in a second register buffer: 2 KB per warp, 32 KB per SM in flight. The first step is
// loaded before griddepcontrol.wait. With each load a lane asks L2 for one 128-byte line of the step after
// (codes or scale words of its rows; ARBOR_CUDA_AFFINE_V2_PF, default 1 step at 4 and 8 bits: +4-12 % at 2-8
// rows on an H100, session 27), and where K is whole steps the instance without per-piece tests against K runs
// (FULL: 4-bit b=2 +5.5 %; Nsight counted ~650 instructions a 2 KB warp-step, and the PTX's op mix puts most of
// them in address and bounds arithmetic, not the unpacking or the MMAs).
//
// v3 (ARBOR_CUDA_AFFINE_GEMV=3): the same warps and arithmetic, but a warp's steps travel through a ring of
// STAGES steps in shared memory (cp.async, each lane's bytes lane-interleaved: conflict-free to read back
// into the register buffer): STAGES - 1 steps (6 KB a warp, 96 KB an SM at g64) in flight instead of one.
constexpr int kV2Warps = 8;
constexpr int kV2BlocksPerSm = 2;
constexpr int kV2LaneRowBytes = 32;  // code bytes per lane per weight row per step

int g_v2_variant = -1;  // set_affine_gemv_variant; -1: from ARBOR_CUDA_AFFINE_GEMV (unset: 0, by rows)
int g_v2_xpf = -1;      // set_affine_v2_x_ahead; -1: from ARBOR_CUDA_AFFINE_V2_XPF (unset: 2)

// Columns a v2 step covers (V2Geo::STEP_COLS, which the host needs for the K split): whole pieces of 32 bytes a
// lane and row at 4/8 bits, 8 or 4 pieces of 32 columns at 2 and 3/5/6 bits (8 spill at 3 bits, g32/g64).
constexpr int v2_step_cols(int bits) { return bits == 2 || bits == 4 ? 256 : 128; }

template <int BITS, int GS>
struct V2Geo {
  // 2-, 3-, 5- and 6-bit codes ("chunked"): 8 codes are BITS whole bytes, so a piece is 32 columns, lane j's
  // the 8 codes at 8j..8j+7 of it, read as the one (2-bit) or two (3/5/6-bit) aligned 32-bit words that hold
  // them; a group is GS/32 pieces whose MMA sums share its scale (PPG).
  static constexpr bool CH = BITS == 2 || BITS == 3 || BITS == 5 || BITS == 6;
  static constexpr int L = CH ? 4 : (GS * BITS / 32 < 16 ? GS * BITS / 32 : 16);  // bytes per lane per piece
  static constexpr int NP = CH ? (BITS == 2 ? 8 : 4) : kV2LaneRowBytes / L;  // pieces per step
  static constexpr int CPB = CH ? 1 : 8 / BITS;                        // codes per byte (4/8-bit)
  static constexpr int LANE_COLS = CH ? 8 : L * CPB;                   // a lane's columns in a piece
  static constexpr int PIECE_COLS = 4 * LANE_COLS;                     // the quad's: the group, 64 (8-bit g128), 32 (2/3-bit)
  static constexpr int STEP_COLS = NP * PIECE_COLS;
  static constexpr int STEP_ROW_BYTES = CH ? STEP_COLS * BITS / 8 : 4 * kV2LaneRowBytes;  // bytes of a row per step
  static constexpr int WPP = CH ? (BITS == 2 ? 1 : 2) : L / 4;         // words per lane per piece
  static constexpr int PPG = CH ? GS / 32 : 1;                         // pieces per group
  // The codes' offset in the MMA sums: the bf16 exponent a code sits under (16 + q to 4 bits, 32 + q at 5, 64 + q
  // at 6; 8-bit: 256 + 16·hi and 16 + lo).
  static constexpr float kM = BITS == 8 ? 272.0f : BITS == 6 ? 64.0f : BITS == 5 ? 32.0f : 16.0f;
  static_assert(BITS >= 2 && BITS <= 8 && BITS != 7, "v2: 2-, 3-, 4-, 5-, 6- and 8-bit codes");
  static_assert(CH ? STEP_COLS % GS == 0 : GS % PIECE_COLS == 0, "a piece lies inside one group, a group inside one step");
  static_assert(STEP_COLS == v2_step_cols(BITS), "v2_step_cols says what a step covers");
};

// Chunked widths: the bf16 pair (16 + q_i, 16 + q_{i+4}) of a chunk's codes q0..q7 once `spread` has put
// q0..q3 at bits 0.. and q4..q7 at bits 16.. (BITS apart): the pair shifted to bits 3.. and 19.., masked,
// under the exponent of 16 (one SHF + one LOP3, as nib_pair).
template <int BITS, int I>
__device__ __forceinline__ uint32_t chunk_pair(uint32_t spread) {
  constexpr int SH = BITS * I - 3;
  constexpr uint32_t kMask = BITS == 3 ? 0x00380038u : 0x00180018u;
  const uint32_t v = SH >= 0 ? (spread >> (SH >= 0 ? SH : 0)) : (spread << (SH < 0 ? -SH : 0));
  return (v & kMask) | 0x41804180u;
}

// 5- and 6-bit chunks (40 or 48 bits): lo holds q0..q3 at bits 0.. and hi q4..q7 at bits 0.. (BITS apart; anything
// above). The bf16 pair (E + q_i, E + q_{i+4}) with q at mantissa bits 7 - BITS.. under the exponent E = 32 (5-bit)
// or 64 (6-bit): two shifts and two LOP3.
template <int BITS, int I>
__device__ __forceinline__ uint32_t wide_chunk_pair(uint32_t lo, uint32_t hi) {
  constexpr int P = 7 - BITS, SL = BITS * I - P, SH = 16 + P - BITS * I;  // right shift of lo, left shift of hi
  constexpr uint32_t kHalf = ((1u << BITS) - 1u) << P, kMagic = BITS == 5 ? 0x42004200u : 0x42804280u;
  const uint32_t a = SL >= 0 ? lo >> (SL >= 0 ? SL : 0) : lo << (SL < 0 ? -SL : 0);
  const uint32_t b = SH >= 0 ? hi << (SH >= 0 ? SH : 0) : hi >> (SH < 0 ? -SH : 0);
  return (a & kHalf) | (b & (kHalf << 16)) | kMagic;
}

// Chunk bits (q0..q7 at bits 0.., BITS each; anything above) spread: the low four codes stay, the high four
// move to bit 16 (one SHF, one LOP3).
template <int BITS>
__device__ __forceinline__ uint32_t chunk_spread(uint32_t v) {
  constexpr uint32_t kLow = (1u << (4 * BITS)) - 1u;
  return (v & kLow) | ((v << (16 - 4 * BITS)) & ~kLow);
}

template <int L>
__device__ __forceinline__ void v2_load(const uint8_t* p, uint32_t* w) {
  if constexpr (L == 16) {
    const uint4 v = ld_stream(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (L == 8) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else {  // 4 bytes: the quad reads half a 32-byte sector; the next piece reads the other half from L1
    asm("ld.global.nc.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
  }
}

// The nibbles at bits SH + 3 and SH + 19 of w (SH < 0: shifted left) at bits 3..6 of each bf16 half, under
// `magic`'s exponent: 0x41804180 gives 16 + nibble, 0x43804380 256 + 16·nibble.
template <int SH>
__device__ __forceinline__ uint32_t nib_pair(uint32_t w, uint32_t magic) {
  const uint32_t v = SH >= 0 ? (w >> (SH >= 0 ? SH : 0)) : (w << (SH < 0 ? -SH : 0));
  return (v & 0x00780078u) | magic;
}

// The A registers of one code word of M-rows g (wa) and g + 8 (wb), 4- or 8-bit: A[0..3] for the word's first MMA,
// A[4..7] for its second (4-bit: codes (q0,q4),(q1,q5) then (q2,q6),(q3,q7) as 16 + q; 8-bit: low nibbles as 16 + l,
// then high nibbles as 256 + 16·h).
template <int BITS>
__device__ __forceinline__ void v2_word_a(uint32_t wa, uint32_t wb, uint32_t* A) {
  constexpr uint32_t kLo = 0x41804180u, kHi = BITS == 4 ? kLo : 0x43804380u;
  constexpr int S1 = BITS == 4 ? 1 : 5, S2 = BITS == 4 ? 5 : 1;  // the second and third nibble pairs' shifts
  A[0] = nib_pair<-3>(wa, kLo), A[1] = nib_pair<-3>(wb, kLo), A[2] = nib_pair<S1>(wa, kLo), A[3] = nib_pair<S1>(wb, kLo);
  A[4] = nib_pair<S2>(wa, kHi), A[5] = nib_pair<S2>(wb, kHi), A[6] = nib_pair<9>(wa, kHi), A[7] = nib_pair<9>(wb, kHi);
}

// Where the warp's tile is: the code and scale/bias rows of its M-rows g and g + 8 (rows past a matrix read
// its row 0 and are not stored).
struct V2Rows {
  const uint32_t* c[2];
  const uint32_t* s[2];
  int64_t row[2];  // output row of each M-row (gated: the gate/up row), -1 when past the matrix
  int si;
};

template <int BITS, int GS>
__device__ __forceinline__ V2Rows v2_rows(const AffSegs& segs, int64_t tile, int g, bool gated, int64_t K) {
  const int64_t words = K * BITS / 32, groups = K / GS;
  V2Rows r;
  if (tile >= segs.units) tile = 0;  // a block's last unit past the end: computes tile 0, stores nothing
  if (gated) {
    const int64_t row = tile * 8 + g;
    const bool in = row < segs.N[0];
    const int64_t rr = in ? row : 0;
    r.si = 0;
    r.c[0] = segs.codes[0] + rr * words, r.s[0] = segs.sb[0] + rr * groups;
    r.c[1] = segs.codes[1] + rr * words, r.s[1] = segs.sb[1] + rr * groups;
    r.row[0] = r.row[1] = in ? row : -1;
  } else {
    const int si = unit_segment(segs.n, segs.first, tile);
    const uint32_t* codes = seg_pick(segs.codes, si);
    const uint32_t* sb = seg_pick(segs.sb, si);
    const int64_t N = seg_pick(segs.N, si);
    const int64_t row0 = (tile - seg_pick(segs.first, si)) * 16 + g;
    r.si = si;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + 8 * h;
      const bool in = row < N;
      r.c[h] = codes + (in ? row : 0) * words, r.s[h] = sb + (in ? row : 0) * groups;
      r.row[h] = in ? row : -1;
    }
  }
  return r;
}

template <int BITS, int GS>
struct V2Buf {
  uint32_t w[2][V2Geo<BITS, GS>::NP][V2Geo<BITS, GS>::WPP];  // [M-row g / g+8][piece][word]
  uint32_t sb[2][V2Geo<BITS, GS>::NP];
};

// One stage of a warp's v3 ring: codes [row h][piece p][lane][L bytes], then scale/bias words [h][p][lane].
template <int BITS, int GS>
struct V2Ring {
  static constexpr int kCodeBytes = 2 * V2Geo<BITS, GS>::NP * 32 * V2Geo<BITS, GS>::L;
  static constexpr int kBytes = kCodeBytes + 2 * V2Geo<BITS, GS>::NP * 32 * 4;
  static constexpr int kStages = V2Geo<BITS, GS>::NP == 8 ? 3 : 4;  // <= 96 KB a block
};

template <int L>
__device__ __forceinline__ void cp_async_n(uint32_t dst, const void* src) {
  if constexpr (L == 16) cp_async16(dst, src);
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(L));
}

// Wide instances (NT > 1) run one block an SM: at two (128 registers) they spilled 200-800 bytes a thread.
constexpr int v2_blocks_per_sm(int nt) { return nt > 1 ? 1 : kV2BlocksPerSm; }

template <int BITS, int GS, int STAGES, int XPF, bool IM, bool FULL, int NT>
__global__ void __launch_bounds__(kV2Warps * 32, v2_blocks_per_sm(NT))
    affine_gemv_v2_kernel(AffSegs segs, const uint16_t* __restrict__ x, bool y_f32, int T, int64_t K, bool sb_f16, int wpr, int64_t units,
                          int gated_act, const unsigned char* __restrict__ ximg, int pf) {
  static_assert(!IM || ((BITS == 4 || NT > 1) && STAGES == 0), "v5: 4-bit codes, register buffers (the wide image: 4/8-bit)");
  static_assert(NT == 1 || ((BITS == 4 || BITS == 8) && STAGES == 0 && XPF == 0), "wide (NT > 1): 4/8-bit, register buffers, x per piece");
  static_assert(!IM || NT == 1 || FULL, "the wide image: whole steps");
  using G = V2Geo<BITS, GS>;
  __shared__ float4 red[2][kV2Warps][NT][32];       // partial sums of the wpr warps of a tile, by unit parity
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, j = lane % 4;
  const int tpu = kV2Warps / wpr, slot = warp / wpr, part = warp % wpr;
  const bool gated = gated_act >= 0;
  const int64_t steps = (K + G::STEP_COLS - 1) / G::STEP_COLS;
  const int64_t sbeg = steps * part / wpr, send = steps * (part + 1) / wpr;

  // L2 prefetch pf steps ahead of the loads (pf > 0): the step the walk reaches pf steps after (u, s) (across unit
  // boundaries), one 128-byte line a lane: lane j = 0/1 the codes of M-row g / g + 8, j = 2/3 their (scale, bias) words.
  // The register buffers hold one step in flight a warp (2 KB at 4-bit; 16 warps an SM); the prefetches let DRAM see
  // pf + 1 steps a warp while the loads then wait on L2 only.
  // (Computed from (u, s) at each step. Session 28 tried walking the prefetch position instead, without the 64-bit
  // division: 2-3 % slower at 2 and 8 rows on an H200, the walk's state being live registers the whole loop.)
  const int64_t nsteps = send - sbeg;
  auto prefetch = [&](int64_t u, int64_t s) {
    const int64_t ahead = s - sbeg + pf, up = u + int64_t(gridDim.x) * (ahead / nsteps), sp = sbeg + ahead % nsteps;
    if (up >= units) return;
    const V2Rows r = v2_rows<BITS, GS>(segs, up * tpu + slot, g, gated, K);
    const bool h = j & 1;  // selects, not r.c[j & 1]: a runtime index would put r in local memory
    const char* a = j < 2 ? reinterpret_cast<const char*>(h ? r.c[1] : r.c[0]) + sp * G::STEP_ROW_BYTES
                          : reinterpret_cast<const char*>((h ? r.s[1] : r.s[0]) + (sp * G::STEP_COLS) / GS);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
  };
  // The rows of the unit load() last saw: looked up once a unit, not once a step.
  // (Four scalars, not a V2Rows: a struct kept across iterations went to local memory.)
  int64_t lr_u = -1;
  const uint32_t *lc0 = nullptr, *lc1 = nullptr, *ls0 = nullptr, *ls1 = nullptr;
  auto load = [&](V2Buf<BITS, GS>& b, int64_t u, int64_t s) {
    if (u >= units) return;
    if (pf > 0) prefetch(u, s);
    if (u != lr_u) {
      const V2Rows n = v2_rows<BITS, GS>(segs, u * tpu + slot, g, gated, K);
      lc0 = n.c[0], lc1 = n.c[1], ls0 = n.s[0], ls1 = n.s[1], lr_u = u;
    }
    struct {
      const uint32_t* c[2];
      const uint32_t* s[2];
    } r{{lc0, lc1}, {ls0, ls1}};
#pragma unroll
    for (int p = 0; p < G::NP; ++p) {
      const int64_t c0 = s * G::STEP_COLS + p * G::PIECE_COLS;
      if (!FULL && c0 >= K) break;  // the last step's pieces past K (K is whole pieces: group_size | K; FULL: whole steps)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (G::CH) {
          // Chunk j of piece P is bytes [BITS·(4P + j), +BITS): words BITS·P + a0 and BITS·P + a1 (a1 = a0 past
          // the piece's last word, so nothing past the row is read; 3/5/6 bits), 2-bit word 2P + j/2.
          const int64_t P = c0 / 32;
          if constexpr (BITS != 2) {
            const int a0 = (BITS * j) >> 2, a1 = a0 == BITS - 1 ? a0 : a0 + 1;
            b.w[h][p][0] = __ldg(r.c[h] + BITS * P + a0);
            b.w[h][p][1] = __ldg(r.c[h] + BITS * P + a1);
          } else {
            b.w[h][p][0] = __ldg(r.c[h] + 2 * P + (j >> 1));
          }
          if (p % G::PPG == 0) b.sb[h][p] = __ldg(r.s[h] + c0 / GS);
        } else {
          const uint8_t* base = reinterpret_cast<const uint8_t*>(r.c[h]) + s * G::STEP_ROW_BYTES + p * 4 * G::L + j * G::L;
          v2_load<G::L>(base, b.w[h][p]);
          b.sb[h][p] = __ldg(r.s[h] + c0 / GS);
        }
      }
    }
  };

  V2Buf<BITS, GS> b0, b1;
  int64_t u = blockIdx.x, s = sbeg;
  // v3's ring: this warp's STAGES stages.
  using R = V2Ring<BITS, GS>;
  extern __shared__ __align__(16) unsigned char v2_ring[];
  unsigned char* ring = v2_ring + size_t(warp) * STAGES * R::kBytes;
  auto issue = [&](int stage, int64_t uu, int64_t ss) {
    if (uu < units) {
      const V2Rows r = v2_rows<BITS, GS>(segs, uu * tpu + slot, g, gated, K);
      const uint32_t base = smem_addr(ring + stage * R::kBytes);
#pragma unroll
      for (int p = 0; p < G::NP; ++p) {
        const int64_t c0 = ss * G::STEP_COLS + p * G::PIECE_COLS;
        if (!FULL && c0 >= K) break;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int slotw = (h * G::NP + p) * 32 + lane;
          cp_async_n<G::L>(base + slotw * G::L,
                           reinterpret_cast<const uint8_t*>(r.c[h]) + ss * G::STEP_ROW_BYTES + p * 4 * G::L + j * G::L);
          cp_async_n<4>(base + R::kCodeBytes + slotw * 4, r.s[h] + c0 / GS);
        }
      }
    }
    cp_async_commit();  // empty groups too: every iteration waits for the same count
  };
  auto read = [&](V2Buf<BITS, GS>& b, int stage) {
    const unsigned char* base = ring + stage * R::kBytes;
#pragma unroll
    for (int p = 0; p < G::NP; ++p)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int slotw = (h * G::NP + p) * 32 + lane;
        if constexpr (G::L == 16) {
          const uint4 v = *reinterpret_cast<const uint4*>(base + slotw * 16);
          b.w[h][p][0] = v.x, b.w[h][p][1] = v.y, b.w[h][p][2] = v.z, b.w[h][p][3] = v.w;
        } else if constexpr (G::L == 8) {
          const uint2 v = *reinterpret_cast<const uint2*>(base + slotw * 8);
          b.w[h][p][0] = v.x, b.w[h][p][1] = v.y;
        } else {
          b.w[h][p][0] = *reinterpret_cast<const uint32_t*>(base + slotw * 4);
        }
        b.sb[h][p] = *reinterpret_cast<const uint32_t*>(base + R::kCodeBytes + slotw * 4);
      }
  };
  int64_t lu = u, ls = s;  // v3: the next step to issue
  if constexpr (STAGES > 0) {
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {  // the first weights do not depend on the previous kernel
      issue(i, lu, ls);
      if (++ls == send) ls = sbeg, lu += gridDim.x;
    }
  } else {
    load(b0, u, s);  // the first weights do not depend on the previous kernel
  }
  pdl_trigger();
  pdl_wait();

  // Per n-tile nt (activation rows 8nt..8nt+7): (M-row g, n 2j), (g, 2j+1), (g+8, 2j), (g+8, 2j+1).
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  const bool x_row = g < T;                  // this lane's B column n = g is a real activation row
  const uint16_t* xrow = x + int64_t(x_row ? g : 0) * K;

  // Chunked widths: where lane j's chunk starts in its first word (3-bit: bytes 0, 3, 6, 9 of the piece's 12).
  const int chunk_shift = BITS == 2 ? (j & 1) * 16 : ((BITS * j) & 3) * 8;
  float c[4], sx[4];
  // x at word wi of piece p of step s_ (8-bit: 4 values in .x, .y); zeros past K and for rows past T.
  constexpr int NXW = G::CH ? 1 : G::WPP;  // x loads per piece
  auto x_at = [&](int64_t s_, int p, int wi) -> uint4 {
    const int64_t c0 = s_ * G::STEP_COLS + p * G::PIECE_COLS;
    const int64_t col = c0 + j * G::LANE_COLS + (G::CH ? 0 : wi * 4 * G::CPB);
    if (!x_row || (!FULL && c0 >= K)) return make_uint4(0, 0, 0, 0);
    if constexpr (BITS == 8) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(xrow + col));
      return make_uint4(v.x, v.y, 0, 0);
    } else {
      return __ldg(reinterpret_cast<const uint4*>(xrow + col));
    }
  };
  auto compute_f = [&](const V2Buf<BITS, GS>& b, int64_t s) {
    // x of piece p is loaded XPF pieces ahead of its MMAs (XPF = 0: just before them).
    uint4 xs[XPF + 1][NXW];
#pragma unroll
    for (int q = 0; q < XPF && q < G::NP; ++q)
#pragma unroll
      for (int wi = 0; wi < NXW; ++wi) xs[q][wi] = x_at(s, q, wi);
#pragma unroll
    for (int p = 0; p < G::NP; ++p) {
      const int64_t c0 = s * G::STEP_COLS + p * G::PIECE_COLS;
      if (!FULL && c0 >= K) break;
      if (p + XPF < G::NP) {
#pragma unroll
        for (int wi = 0; wi < NXW; ++wi) xs[(p + XPF) % (XPF + 1)][wi] = x_at(s, p + XPF, wi);
      }
      const uint4* xp = xs[p % (XPF + 1)];
      // c: Σ x·(M + q) of the piece, C-fragment order; sx: Σx of the piece (an A of ones), columns n = 2j, 2j+1.
      // Chunked widths: of the group's pieces so far.
      constexpr uint32_t kOnes = 0x3f803f80u;
      if constexpr (G::CH) {
        if (p % G::PPG == 0) c[0] = c[1] = c[2] = c[3] = sx[0] = sx[1] = sx[2] = sx[3] = 0.0f;
        const uint4 xv = xp[0];
        const uint32_t x04 = __byte_perm(xv.x, xv.z, 0x5410), x15 = __byte_perm(xv.x, xv.z, 0x7632);
        const uint32_t x26 = __byte_perm(xv.y, xv.w, 0x5410), x37 = __byte_perm(xv.y, xv.w, 0x7632);
        if constexpr (BITS >= 5) {
          // The chunk's 40 or 48 bits from the 64 of its two words: q0..q3 (lo), q4..q7 (hi).
          uint32_t lo[2], hi[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint64_t v = (uint64_t(b.w[h][p][1]) << 32 | b.w[h][p][0]) >> chunk_shift;
            lo[h] = uint32_t(v), hi[h] = uint32_t(v >> (4 * BITS));
          }
          mma_bf16(c, wide_chunk_pair<BITS, 0>(lo[0], hi[0]), wide_chunk_pair<BITS, 0>(lo[1], hi[1]), wide_chunk_pair<BITS, 1>(lo[0], hi[0]),
                   wide_chunk_pair<BITS, 1>(lo[1], hi[1]), x04, x15);
          mma_bf16(c, wide_chunk_pair<BITS, 2>(lo[0], hi[0]), wide_chunk_pair<BITS, 2>(lo[1], hi[1]), wide_chunk_pair<BITS, 3>(lo[0], hi[0]),
                   wide_chunk_pair<BITS, 3>(lo[1], hi[1]), x26, x37);
        } else {
          uint32_t u[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t v = BITS == 3 ? __funnelshift_r(b.w[h][p][0], b.w[h][p][G::WPP - 1], chunk_shift) : b.w[h][p][0] >> chunk_shift;
            u[h] = chunk_spread<BITS>(v);
          }
          mma_bf16(c, chunk_pair<BITS, 0>(u[0]), chunk_pair<BITS, 0>(u[1]), chunk_pair<BITS, 1>(u[0]), chunk_pair<BITS, 1>(u[1]), x04, x15);
          mma_bf16(c, chunk_pair<BITS, 2>(u[0]), chunk_pair<BITS, 2>(u[1]), chunk_pair<BITS, 3>(u[0]), chunk_pair<BITS, 3>(u[1]), x26, x37);
        }
        mma_bf16(sx, kOnes, kOnes, kOnes, kOnes, x04, x15);
        mma_bf16(sx, kOnes, kOnes, kOnes, kOnes, x26, x37);
        if (p % G::PPG != G::PPG - 1) continue;  // the group's scale once its last piece is in
      } else {
      c[0] = c[1] = c[2] = c[3] = sx[0] = sx[1] = sx[2] = sx[3] = 0.0f;
#pragma unroll
      for (int wi = 0; wi < G::WPP; ++wi) {
        uint32_t A[8];
        v2_word_a<BITS>(b.w[0][p][wi], b.w[1][p][wi], A);
        if constexpr (BITS == 4) {
          const uint4 xv = xp[wi];
          const uint32_t x04 = __byte_perm(xv.x, xv.z, 0x5410), x15 = __byte_perm(xv.x, xv.z, 0x7632);
          const uint32_t x26 = __byte_perm(xv.y, xv.w, 0x5410), x37 = __byte_perm(xv.y, xv.w, 0x7632);
          mma_bf16(c, A[0], A[1], A[2], A[3], x04, x15);
          mma_bf16(c, A[4], A[5], A[6], A[7], x26, x37);
          mma_bf16(sx, kOnes, kOnes, kOnes, kOnes, x04, x15);
          mma_bf16(sx, kOnes, kOnes, kOnes, kOnes, x26, x37);
        } else {
          const uint2 xv = make_uint2(xp[wi].x, xp[wi].y);
          const uint32_t x02 = __byte_perm(xv.x, xv.y, 0x5410), x13 = __byte_perm(xv.x, xv.y, 0x7632);
          mma_bf16(c, A[0], A[1], A[2], A[3], x02, x13);
          mma_bf16(c, A[4], A[5], A[6], A[7], x02, x13);
          mma_bf16(sx, kOnes, kOnes, kOnes, kOnes, x02, x13);
        }
      }
      }
      const int pg = p - (G::PPG - 1);  // the group's first piece: where its (scale, bias) words are
      const float2 pa = sb_pair(b.sb[0][pg], sb_f16), pb = sb_pair(b.sb[1][pg], sb_f16);
      const float oa = pa.y - pa.x * G::kM, ob = pb.y - pb.x * G::kM;
      acc[0][0] = fmaf(pa.x, c[0], fmaf(oa, sx[0], acc[0][0]));
      acc[0][1] = fmaf(pa.x, c[1], fmaf(oa, sx[1], acc[0][1]));
      acc[0][2] = fmaf(pb.x, c[2], fmaf(ob, sx[0], acc[0][2]));
      acc[0][3] = fmaf(pb.x, c[3], fmaf(ob, sx[1], acc[0][3]));
    }
  };

  // v5 (IM): the image's B fragments and group sums for piece p of step s_ (affine_ximg_kernel's layout: hi plane of
  // activation row t at byte t·K, lo plane at (8 + t)·K, a column's byte at its index, each 8 columns' bytes even
  // columns first; then per group float2 (d, Σx) for rows 0..7). Lane (g, j): B column g = activation row g, its
  // bytes for the columns of lane j's words; meta for rows 2j, 2j + 1 (the C columns it holds).
  struct XIm {
    uint32_t h[2 * G::WPP], l[2 * G::WPP];
    float4 md;
  };
  const unsigned char* xim_hi = IM && NT == 1 ? ximg + int64_t(x_row ? g : 0) * K : nullptr;
  const unsigned char* xim_lo = IM && NT == 1 ? xim_hi + 8 * K : nullptr;
  const float4* xim_meta = IM && NT == 1 ? reinterpret_cast<const float4*>(ximg + 16 * K) : nullptr;
  auto xim_at = [&](XIm& v, int64_t s_, int p) {
    const int64_t c0 = s_ * G::STEP_COLS + p * G::PIECE_COLS;
    if (!FULL && c0 >= K) return;
    const int64_t col = c0 + j * G::LANE_COLS;
    if (x_row) {
#pragma unroll
      for (int q = 0; q < (2 * G::WPP + 3) / 4; ++q) {
        if constexpr (G::WPP == 1) {
          const uint2 a = __ldg(reinterpret_cast<const uint2*>(xim_hi + col)), b2 = __ldg(reinterpret_cast<const uint2*>(xim_lo + col));
          v.h[0] = a.x, v.h[1] = a.y, v.l[0] = b2.x, v.l[1] = b2.y;
        } else {
          const uint4 a = __ldg(reinterpret_cast<const uint4*>(xim_hi + col) + q), b2 = __ldg(reinterpret_cast<const uint4*>(xim_lo + col) + q);
          v.h[4 * q] = a.x, v.h[4 * q + 1] = a.y, v.h[4 * q + 2] = a.z, v.h[4 * q + 3] = a.w;
          v.l[4 * q] = b2.x, v.l[4 * q + 1] = b2.y, v.l[4 * q + 2] = b2.z, v.l[4 * q + 3] = b2.w;
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < 2 * G::WPP; ++e) v.h[e] = v.l[e] = 0u;
    }
    v.md = __ldg(xim_meta + (c0 / GS) * 4 + j);
  };
  // v5's step: per piece (a group: 4-bit pieces are whole groups) and word, one m16n8k32 u8 x s8 MMA against the hi
  // plane and one against the lo plane; A is the word's low nibbles (codes 0, 2, 4, 6 as bytes: k slots 4j..) and high
  // nibbles (codes 1, 3, 5, 7: k slots 16 + 4j..) of rows g and g + 8, so a code costs a share of one LOP3 (and of
  // one SHF), none of the FMA pipe. The group's exact sum S = 128·C_hi + C_lo (|S| <= GS·15·16256 < 2^31) then adds
  // scale·d·S + bias·Σx. The next piece's image is loaded before this one's MMAs.
  auto compute_im = [&](const V2Buf<BITS, GS>& b, int64_t s) {
    XIm xv[2];
    xim_at(xv[0], s, 0);
#pragma unroll
    for (int p = 0; p < G::NP; ++p) {
      const int64_t c0 = s * G::STEP_COLS + p * G::PIECE_COLS;
      if (!FULL && c0 >= K) break;
      if (p + 1 < G::NP) xim_at(xv[(p + 1) & 1], s, p + 1);
      const XIm& v = xv[p & 1];
      int ch[4] = {0, 0, 0, 0}, cl[4] = {0, 0, 0, 0};
#pragma unroll
      for (int wi = 0; wi < G::WPP; ++wi) {
        const uint32_t wa = b.w[0][p][wi], wb = b.w[1][p][wi];
        const uint32_t a0 = wa & 0x0f0f0f0fu, a1 = wb & 0x0f0f0f0fu, a2 = (wa >> 4) & 0x0f0f0f0fu, a3 = (wb >> 4) & 0x0f0f0f0fu;
        mma_u8s8(ch, a0, a1, a2, a3, v.h[2 * wi], v.h[2 * wi + 1]);
        mma_u8s8(cl, a0, a1, a2, a3, v.l[2 * wi], v.l[2 * wi + 1]);
      }
      const float2 pa = sb_pair(b.sb[0][p], sb_f16), pb = sb_pair(b.sb[1][p], sb_f16);
      const float4 md = v.md;
      acc[0][0] = fmaf(pa.x * md.x, float(128 * ch[0] + cl[0]), fmaf(pa.y, md.y, acc[0][0]));
      acc[0][1] = fmaf(pa.x * md.z, float(128 * ch[1] + cl[1]), fmaf(pa.y, md.w, acc[0][1]));
      acc[0][2] = fmaf(pb.x * md.x, float(128 * ch[2] + cl[2]), fmaf(pb.y, md.y, acc[0][2]));
      acc[0][3] = fmaf(pb.x * md.z, float(128 * ch[3] + cl[3]), fmaf(pb.y, md.w, acc[0][3]));
    }
  };
  // Wide (NT > 1 n-tiles, 9..32 activation rows; 4/8-bit): a piece's A fragments are unpacked once and meet each
  // n-tile's x in turn (x of activation row g + 8nt at the piece's columns, loaded just before its MMAs), so the
  // codes are read and unpacked once for all the rows, as at one n-tile.
  auto compute_w = [&](const V2Buf<BITS, GS>& b, int64_t s) {
#pragma unroll
    for (int p = 0; p < G::NP; ++p) {
      const int64_t c0 = s * G::STEP_COLS + p * G::PIECE_COLS;
      if (!FULL && c0 >= K) break;
      uint32_t A[G::WPP][8];  // per word: the two MMAs' A registers (rows g, g + 8; k low, k high)
#pragma unroll
      for (int wi = 0; wi < G::WPP; ++wi) v2_word_a<BITS>(b.w[0][p][wi], b.w[1][p][wi], A[wi]);
      const float2 pa = sb_pair(b.sb[0][p], sb_f16), pb = sb_pair(b.sb[1][p], sb_f16);
      const float oa = pa.y - pa.x * G::kM, ob = pb.y - pb.x * G::kM;
      const int64_t col = c0 + j * G::LANE_COLS;
      constexpr uint32_t kOnes = 0x3f803f80u;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const bool real = g + 8 * nt < T;
        float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sxx[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if constexpr (IM) {  // affine_wimg_kernel's image: B registers as loaded, Σx per piece
          const uint16_t* xr = reinterpret_cast<const uint16_t*>(ximg) + (real ? g + 8 * nt : 0) * K + col;
#pragma unroll
          for (int wi = 0; wi < G::WPP; ++wi) {
            if constexpr (BITS == 4) {
              const uint4 xv = real ? __ldg(reinterpret_cast<const uint4*>(xr + wi * 8)) : make_uint4(0, 0, 0, 0);
              mma_bf16(cc, A[wi][0], A[wi][1], A[wi][2], A[wi][3], xv.x, xv.y);
              mma_bf16(cc, A[wi][4], A[wi][5], A[wi][6], A[wi][7], xv.z, xv.w);
            } else {
              const uint2 xv = real ? __ldg(reinterpret_cast<const uint2*>(xr + wi * 4)) : make_uint2(0, 0);
              mma_bf16(cc, A[wi][0], A[wi][1], A[wi][2], A[wi][3], xv.x, xv.y);
              mma_bf16(cc, A[wi][4], A[wi][5], A[wi][6], A[wi][7], xv.x, xv.y);
            }
          }
          const int n0 = 8 * nt + 2 * j;
          const float2 sm = __ldg(reinterpret_cast<const float2*>(reinterpret_cast<const float*>(ximg + 2 * T * K) + (c0 / G::PIECE_COLS) * 32 + n0));
          sxx[0] = n0 < T ? sm.x : 0.0f, sxx[1] = n0 + 1 < T ? sm.y : 0.0f;
        } else {
          const uint16_t* xr = x + (real ? g + 8 * nt : 0) * K + col;
#pragma unroll
          for (int wi = 0; wi < G::WPP; ++wi) {
            if constexpr (BITS == 4) {
              const uint4 xv = real ? __ldg(reinterpret_cast<const uint4*>(xr + wi * 4 * G::CPB)) : make_uint4(0, 0, 0, 0);
              const uint32_t x04 = __byte_perm(xv.x, xv.z, 0x5410), x15 = __byte_perm(xv.x, xv.z, 0x7632);
              const uint32_t x26 = __byte_perm(xv.y, xv.w, 0x5410), x37 = __byte_perm(xv.y, xv.w, 0x7632);
              mma_bf16(cc, A[wi][0], A[wi][1], A[wi][2], A[wi][3], x04, x15);
              mma_bf16(cc, A[wi][4], A[wi][5], A[wi][6], A[wi][7], x26, x37);
              mma_bf16(sxx, kOnes, kOnes, kOnes, kOnes, x04, x15);
              mma_bf16(sxx, kOnes, kOnes, kOnes, kOnes, x26, x37);
            } else {
              const uint2 xv = real ? __ldg(reinterpret_cast<const uint2*>(xr + wi * 4 * G::CPB)) : make_uint2(0, 0);
              const uint32_t x02 = __byte_perm(xv.x, xv.y, 0x5410), x13 = __byte_perm(xv.x, xv.y, 0x7632);
              mma_bf16(cc, A[wi][0], A[wi][1], A[wi][2], A[wi][3], x02, x13);
              mma_bf16(cc, A[wi][4], A[wi][5], A[wi][6], A[wi][7], x02, x13);
              mma_bf16(sxx, kOnes, kOnes, kOnes, kOnes, x02, x13);
            }
          }
        }
        acc[nt][0] = fmaf(pa.x, cc[0], fmaf(oa, sxx[0], acc[nt][0]));
        acc[nt][1] = fmaf(pa.x, cc[1], fmaf(oa, sxx[1], acc[nt][1]));
        acc[nt][2] = fmaf(pb.x, cc[2], fmaf(ob, sxx[0], acc[nt][2]));
        acc[nt][3] = fmaf(pb.x, cc[3], fmaf(ob, sxx[1], acc[nt][3]));
      }
    }
  };
  auto compute = [&](const V2Buf<BITS, GS>& b, int64_t s) {
    if constexpr (NT > 1) compute_w(b, s);
    else if constexpr (IM) compute_im(b, s);
    else compute_f(b, s);
  };

  // The unit's end: the wpr warps of each tile add their sums (in part order), the first one stores.
  int finished = 0;  // units finished: red's buffer by parity (one barrier a unit suffices)
  auto finish = [&](int64_t uu) {
    if (wpr > 1) {
      const int par = finished++ & 1;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) red[par][warp][nt][lane] = make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
      __syncthreads();
      if (part == 0) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          float4 t = red[par][warp][nt][lane];
          for (int q = 1; q < wpr; ++q) {
            const float4 v = red[par][warp + q][nt][lane];
            t.x += v.x, t.y += v.y, t.z += v.z, t.w += v.w;
          }
          acc[nt][0] = t.x, acc[nt][1] = t.y, acc[nt][2] = t.z, acc[nt][3] = t.w;
        }
      }
    }
    const int64_t tile = uu * tpu + slot;
    if (part == 0 && tile < segs.units) {
      const V2Rows r = v2_rows<BITS, GS>(segs, tile, g, gated, K);
#pragma unroll
      for (int q = 0; q < 2 * NT; ++q) {
        const int nt = q / 2, e = q % 2;
        const int n = 8 * nt + 2 * j + e;
        if (n >= T) break;
        if (gated) {  // y = act(gate) * up, each rounded to bf16 first as the unfused ops store them
          if (r.row[0] < 0) break;
          const float b0 = segs.bias[0] ? segs.bias[0][r.row[0]] : 0.0f, b1 = segs.bias[1] ? segs.bias[1][r.row[0]] : 0.0f;
          const float gv = __bfloat162float(__float2bfloat16(acc[nt][e] + b0)), uv = __bfloat162float(__float2bfloat16(acc[nt][2 + e] + b1));
          static_cast<__nv_bfloat16*>(segs.y[0])[n * segs.N[0] + r.row[0]] = __float2bfloat16(act_value(gated_act, gv) * uv);
          continue;
        }
        const float* bias = seg_pick(segs.bias, r.si);
        void* y = seg_pick(segs.y, r.si);
        const int64_t N = seg_pick(segs.N, r.si);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (r.row[h] < 0) continue;
          const float v = acc[nt][2 * h + e] + (bias ? bias[r.row[h]] : 0.0f);
          if (y_f32) static_cast<float*>(y)[n * N + r.row[h]] = v;
          else static_cast<__nv_bfloat16*>(y)[n * N + r.row[h]] = __float2bfloat16(v);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  };

  // Two register buffers: the next step's loads are in flight while this one is computed.
  auto advance = [&](int64_t& uu, int64_t& ss) {
    if (++ss == send) ss = sbeg, uu += gridDim.x;
  };
  if constexpr (STAGES > 0) {
    int stage = 0;
#pragma unroll 1
    while (u < units) {
      cp_async_wait<STAGES - 2>();  // this step's group has landed
      read(b0, stage);
      issue(stage == 0 ? STAGES - 1 : stage - 1, lu, ls);  // the slot read (and computed) last iteration
      advance(lu, ls);
      compute(b0, s);
      int64_t un = u, sn = s;
      advance(un, sn);
      if (sn == sbeg) finish(u);
      u = un, s = sn;
      stage = stage + 1 == STAGES ? 0 : stage + 1;
    }
    cp_async_wait<0>();
    return;
  }
#pragma unroll 1
  while (u < units) {
    int64_t un = u, sn = s;
    advance(un, sn);
    load(b1, un, sn);
    compute(b0, s);
    if (sn == sbeg) finish(u);
    u = un, s = sn;
    if (u >= units) break;
    advance(un, sn);
    load(b0, un, sn);
    compute(b1, s);
    if (sn == sbeg) finish(u);
    u = un, s = sn;
  }
}

int env_choice(int& cached, const char* name, int hi, int def = 0);
int g_v2_pf = -1;  // set_affine_v2_prefetch; -1: from ARBOR_CUDA_AFFINE_V2_PF (unset: 1 for 4/8-bit codes, else 0)
// v2/v5's L2 prefetch distance in steps (0: none). Default 1 for 4- and 8-bit codes: session 27 on an H100, the 8B at
// g64, ctx 512, two rounds each: 4-bit b=2 442.6 / 443.6 tok/s without, 497.4 / 497.4 at 1 step, 487-491 at 2, 474-476
// at 3 (4 and 8 lost more), b=8 1443 -> 1616 / 1617 (+12 %); 8-bit b=2 375.9 / 375.3 -> 389.7 / 394.2, b=8 1228.4 /
// 1229.6 -> 1341.6 / 1347.7 (+9 %). 3-bit lost at b=8 (1237.5 / 1227.1 -> 1172.2 / 1171.0): off there and at the
// widths not measured.
int v2_prefetch(int bits) {
  static const int env = [] {
    const char* e = std::getenv("ARBOR_CUDA_AFFINE_V2_PF");
    const int v = e ? std::atoi(e) : -1;
    return v >= 0 && v <= 16 ? v : -1;
  }();
  const int v = g_v2_pf >= 0 ? g_v2_pf : env;
  return v >= 0 ? v : bits == 4 || bits == 8 ? 1 : 0;
}
// v2/v5 without the per-piece tests against K where K is whole steps (ARBOR_CUDA_AFFINE_V2_FULL=0: always with them; A/B).
int g_v2_full = -1;
bool v2_full() { return env_choice(g_v2_full, "ARBOR_CUDA_AFFINE_V2_FULL", 1, 1) == 1; }

template <int BITS, int GS, int STAGES, int XPF, bool IM = false, bool FULL = false, int NT = 1>
void launch_v2_s(unsigned grid, cudaStream_t s, const AffSegs& segs, const uint16_t* x, bool y_f32, int T, int64_t K, bool sb_f16, int wpr,
                 int64_t units, int gated_act, const unsigned char* ximg = nullptr) {
  auto* kernel = affine_gemv_v2_kernel<BITS, GS, STAGES, XPF, IM, FULL, NT>;
  const size_t smem = size_t(kV2Warps) * STAGES * V2Ring<BITS, GS>::kBytes;
  static bool attr = false;
  if (STAGES > 0 && !attr) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = true;
  }
  pdl_launch(kernel, dim3(grid), dim3(kV2Warps * 32), smem, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act, ximg, v2_prefetch(BITS));
  ARBOR_LAUNCH_CHECK("affine_gemv_v2_kernel");
}

// ---- v5: v2's walk with x as 15-bit integers and the codes on integer tensor cores (4-bit) ------------------
// A pre-pass (affine_ximg_kernel) writes x once per launch into the scratch image that v2's warps read their B
// fragments from (L1/L2: at most 16·K bytes plus 64 per group), instead of converting bf16 pairs per MMA. Each
// group of GS inputs of activation row t is quantized against its largest |x|: q = round(x / d), d = max|x| / 16256,
// split as q = 128·hi + lo (hi in -127..127, lo in 0..127: two s8 values), so an output's error from it is at most
// Σ|w|·d/2 over the groups, ~3e-5 of max|x| a group (bf16 x itself carries 2^-9 of each value).
// Why: v2 spends per 16 codes of a lane 8 SHF/LOP3 to make bf16 pairs and two bf16 MMAs, plus two more MMAs for Σx
// (an A of ones); here two LOP3 and one SHF per 8 codes, and two m16n8k32 MMAs (at twice the bf16 rate) per 32.
constexpr float kAffXq = 16256.0f;  // 127·128: |q| <= this, hi = q >> 7 in -127..127

// Bytes of the image for K inputs, group size gs: the 16 planes (hi, lo for rows 0..7), then float2 (d, Σx) per group
// and row.
int64_t ximg_bytes(int64_t K, int gs) { return 16 * K + (K / gs) * 8 * 8; }

// One warp per (activation row t in 0..7, 256 columns): lane l quantizes columns 8l..8l+7 of the span (whole groups
// of GS / 8 lanes: GS divides K and 256); rows t >= T write only zero meta.
__global__ void __launch_bounds__(256) affine_ximg_kernel(const uint16_t* __restrict__ x, int T, int64_t K, int gs, unsigned char* img) {
  pdl_trigger();  // the GEMV may fetch its first weights; it waits for this grid before reading img
  pdl_wait();
  const int lane = threadIdx.x % 32;
  const int64_t spans = (K + 255) / 256, wi = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (wi >= 8 * spans) return;  // warp-uniform
  const int t = int(wi / spans);
  const int64_t col = (wi % spans) * 256 + lane * 8;
  const bool in = col < K, live = in && t < T;
  float v[8];
  if (live) {
    bf16x8(__ldg(reinterpret_cast<const uint4*>(x + t * K + col)), v);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = 0.0f;
  }
  float m = 0.0f, sum = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(v[e])), sum += v[e];
  // fmaxf drops a NaN: a group holding one must still give NaN outputs, as the float kernels would
  bool bad = false;
#pragma unroll
  for (int e = 0; e < 8; ++e) bad = bad || !(fabsf(v[e]) <= 3.4e38f);
  for (int o = 1; o < gs / 8; o <<= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    bad = bad || __shfl_xor_sync(0xffffffffu, int(bad), o) != 0;
  }
  const float inv = !bad && m > 0.0f ? kAffXq / m : 0.0f, d = bad ? __int_as_float(0x7fc00000) : m / kAffXq;
  uint32_t h[2] = {0u, 0u}, l[2] = {0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e) {  // even columns into word 0, odd into word 1 (the k slots of a code word's nibbles)
    const int q = __float2int_rn(v[e] * inv), hi = q >> 7, lo = q & 127;
    h[e & 1] |= uint32_t(hi & 0xff) << (8 * (e >> 1));
    l[e & 1] |= uint32_t(lo) << (8 * (e >> 1));
  }
  if (live) {
    *reinterpret_cast<uint2*>(img + t * K + col) = make_uint2(h[0], h[1]);
    *reinterpret_cast<uint2*>(img + (8 + t) * K + col) = make_uint2(l[0], l[1]);
  }
  if (in && lane % (gs / 8) == 0)
    reinterpret_cast<float2*>(img + 16 * K)[(col / gs) * 8 + t] = live ? make_float2(d, sum) : make_float2(0.0f, 0.0f);
}

// The kernel choices' A/B knobs: `cached` (a setter's value, or -1) else the environment variable `name`, read once;
// anything outside 0..hi (or unset) is `def`, the default.
int env_choice(int& cached, const char* name, int hi, int def) {
  if (cached < 0) {
    const char* e = std::getenv(name);
    const int v = e ? std::atoi(e) : def;
    cached = v >= 0 && v <= hi ? v : def;
  }
  return cached;
}

// The wide kernel's image (IM with NT > 1): x [T, K] as bf16 with each 8 columns (4-bit; 8-bit: each 4) in the order
// the MMA's B registers take them, (x0, x4), (x1, x5), (x2, x6), (x3, x7) (8-bit: (x0, x2), (x1, x3)), so a lane's load
// is its B registers with no PRMT; then Σx per (piece of pc columns, row) as float [K / pc][32], which replaces the
// MMA of each word against an A of ones. One thread per 8 columns of a row; pc / 8 neighbours sum a piece.
int64_t wimg_bytes(int64_t K, int64_t T, int pc) { return 2 * T * K + (K / pc) * 32 * 4; }
// V2Geo's PIECE_COLS at 4/8 bits (launch_v2_t checks the two agree): a 4-bit piece is its group, an 8-bit one at most 64.
constexpr int wimg_piece_cols(int bits, int gs) { return bits == 4 || gs < 64 ? gs : 64; }
__global__ void __launch_bounds__(256) affine_wimg_kernel(const uint16_t* __restrict__ x, int T, int64_t K, bool four, int pc, unsigned char* img) {
  pdl_trigger();  // the GEMV may fetch its first weights; it waits for this grid before reading img
  pdl_wait();
  const int64_t chunks = K / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool live = i < int64_t(T) * chunks;  // no early return: the piece sum's shuffles take whole warps
  const int64_t t = live ? i / chunks : 0, col = live ? (i % chunks) * 8 : 0;
  const uint4 v = live ? __ldg(reinterpret_cast<const uint4*>(x + t * K + col)) : make_uint4(0, 0, 0, 0);
  float f[8];
  bf16x8(v, f);
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) sum += f[e];
  for (int o = 1; o < pc / 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!live) return;
  const uint4 w = four ? make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                                    __byte_perm(v.y, v.w, 0x7632))
                       : make_uint4(__byte_perm(v.x, v.y, 0x5410), __byte_perm(v.x, v.y, 0x7632), __byte_perm(v.z, v.w, 0x5410),
                                    __byte_perm(v.z, v.w, 0x7632));
  *reinterpret_cast<uint4*>(img + 2 * (t * K + col)) = w;
  if (col % pc == 0) reinterpret_cast<float*>(img + 2 * int64_t(T) * K)[(col / pc) * 32 + t] = sum;
}

template <int GS>
void launch_v5(unsigned grid, cudaStream_t s, const AffSegs& segs, const uint16_t* x, bool y_f32, int T, int64_t K, bool sb_f16, int wpr,
               int64_t units, int gated_act, unsigned char* ximg) {
  const int64_t spans = (K + 255) / 256;
  pdl_launch(affine_ximg_kernel, dim3(unsigned(spans)), dim3(256), 0, s, x, T, K, GS, ximg);
  ARBOR_LAUNCH_CHECK("affine_ximg_kernel");
  // (Its codes through v3's cp.async ring were tried in session 27 and removed: b=8 1272 against 1348 tok/s.)
  if (K % v2_step_cols(4) == 0 && v2_full())
    launch_v2_s<4, GS, 0, 0, true, true>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act, ximg);
  else
    launch_v2_s<4, GS, 0, 0, true>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act, ximg);
}

// v2 loads x that many pieces ahead of its MMAs (ARBOR_CUDA_AFFINE_V2_XPF=0/1/2 or set_affine_v2_x_ahead). Default 2:
// session 26 on an H100, the 8B 4-bit in two rounds, b=8 1380 -> 1440 tok/s (+4.3 % both), b=3 596 -> 622 (+4.4 %); 1
// gave +2.2-2.5 % at b=8.
int v2_x_ahead() { return env_choice(g_v2_xpf, "ARBOR_CUDA_AFFINE_V2_XPF", 2, 2); }

}  // namespace

// The GEMV for 9..32 rows ("wide": v2 with two or four n-tiles; 4/8-bit codes) instead of the tensor-core GEMM
// (affine_gemm.cu, which dequantizes tiles into shared memory). The default for 4-bit codes since session 28 (H200, the
// 8B at 4-bit g64, ctx 512, two rounds: b=16 2630.5 / 2629.6 tok/s against the GEMM's 1488.8 / 1486.3, b=32 3191.1 /
// 3198.6 against 2643.5 / 2646.1); for 8-bit codes to 16 rows since session 30 (an H100, the 8B at 8-bit g64, ctx 512, one
// round: b=16 1857.9 tok/s against the GEMM's 1524.3, but b=32 2481.1 against 2634.1). ARBOR_CUDA_AFFINE_WIDE = 8 (off), 16
// or 32 (the most rows it takes, 4- and 8-bit); set_affine_wide_rows for tests.
int g_wide_rows = -1;
int64_t affine_gemv_max_rows(int bits) {
  static const int env = [] {  // -1: unset
    const char* e = std::getenv("ARBOR_CUDA_AFFINE_WIDE");
    const int v = e ? std::atoi(e) : -1;
    return v == 8 || v == 16 || v == 32 ? v : -1;
  }();
  const int chosen = g_wide_rows >= 0 ? g_wide_rows : env;
  if (bits != 4 && bits != 8) return kAffineGemvMaxRows;
  // Unset: 4-bit codes to 32 rows, 8-bit codes to 16 (both measured above).
  return chosen >= 0 ? chosen : bits == 4 ? 32 : 16;
}
void set_affine_wide_rows(int rows) { g_wide_rows = rows == 8 || rows == 16 || rows == 32 ? rows : -1; }

namespace {

// The wide kernel: 9..16 rows as two n-tiles, 17..32 as four.
template <int BITS, int GS, bool IM, bool FULL>
void launch_wide(unsigned grid, cudaStream_t s, const AffSegs& segs, const uint16_t* x, bool y_f32, int T, int64_t K, bool sb_f16, int wpr,
                 int64_t units, int gated_act, const unsigned char* ximg) {
  if (T <= 16) launch_v2_s<BITS, GS, 0, 0, IM, FULL, 2>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act, ximg);
  else launch_v2_s<BITS, GS, 0, 0, IM, FULL, 4>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act, ximg);
}

template <int BITS, int GS>
void launch_v2_t(int variant, unsigned grid, cudaStream_t s, const AffSegs& segs, const uint16_t* x, bool y_f32, int T, int64_t K,
                 bool sb_f16, int wpr, int64_t units, int gated_act, unsigned char* ximg = nullptr) {
  [[maybe_unused]] constexpr int kRing = V2Ring<BITS, GS>::kStages;
  if constexpr (BITS == 4 || BITS == 8) {
    if (T > 8) {
      if (ximg) {  // x through the image (try_v2 passes one only where wimg_takes: K whole steps), affine_wimg_kernel first
        static_assert(V2Geo<BITS, GS>::PIECE_COLS == wimg_piece_cols(BITS, GS), "the image's Σx pieces are the kernel's");
        const int64_t threads = int64_t(T) * (K / 8);
        pdl_launch(affine_wimg_kernel, dim3(unsigned((threads + 255) / 256)), dim3(256), 0, s, x, T, K, BITS == 4,
                   wimg_piece_cols(BITS, GS), ximg);
        ARBOR_LAUNCH_CHECK("affine_wimg_kernel");
        launch_wide<BITS, GS, true, true>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act, ximg);
      } else if (K % v2_step_cols(BITS) == 0 && v2_full()) {
        launch_wide<BITS, GS, false, true>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act, nullptr);
      } else {
        launch_wide<BITS, GS, false, false>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act, nullptr);
      }
      return;
    }
  }
  if constexpr (!V2Geo<BITS, GS>::CH) {  // v3's ring carries whole lane pieces: 4- and 8-bit only
    if (variant == 3) {
      launch_v2_s<BITS, GS, kRing, 0>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act);
      return;
    }
  }
  const int xpf = v2_x_ahead();
  if (xpf == 1) launch_v2_s<BITS, GS, 0, 1>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act);
  else if (xpf == 2) {
    if constexpr (BITS == 4 || BITS == 8) {  // whole steps: no per-piece test against K (4/8-bit only: binary size)
      if (K % v2_step_cols(BITS) == 0 && v2_full()) {
        launch_v2_s<BITS, GS, 0, 2, false, true>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act);
        return;
      }
    }
    launch_v2_s<BITS, GS, 0, 2>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act);
  }
  else launch_v2_s<BITS, GS, 0, 0>(grid, s, segs, x, y_f32, T, K, sb_f16, wpr, units, gated_act);
}

// ARBOR_CUDA_AFFINE_GEMV (or set_affine_gemv_variant): 0 or 4 the default (v4 at one row where it applies, v2 from 2),
// 1/2/3 force v1/v2/v3, 5 forces v5 (4-bit; others as the default), 6 is v4 at one row and v5 from 2 (4-bit).
int v2_variant() { return env_choice(g_v2_variant, "ARBOR_CUDA_AFFINE_GEMV", 6); }

// Whether a launch over T rows runs the wide kernel through affine_wimg_kernel's image (with scratch for it): 4/8-bit,
// 9..32 rows, K whole steps, and chosen: opt-in (ARBOR_CUDA_AFFINE_WIDE_IMG=1 or set_affine_wide_image(1)), written in
// session 28 after its last device call: NOT YET RUN ON A GPU (CudaAffine.GemvWideMatchesTheReference runs it).
int g_wide_img = -1;
bool wimg_takes(const AffineWeights& w0, int64_t T) {
  return (w0.bits == 4 || w0.bits == 8) && T > 8 && T <= affine_gemv_max_rows(w0.bits) && w0.cols % v2_step_cols(w0.bits) == 0 && v2_full() &&
         env_choice(g_wide_img, "ARBOR_CUDA_AFFINE_WIDE_IMG", 1, 0) == 1;
}

// Whether a launch of 4-bit codes over T rows runs v5 (and so needs affine_ximg_kernel's image in scratch).
bool v5_takes(const AffineWeights& w0, int64_t T) {
  const int chosen = v2_variant();
  return w0.bits == 4 && T >= 1 && T <= 8 && (chosen == 5 || (chosen == 6 && T >= 2)) && w0.cols % w0.group_size == 0 &&
         (w0.group_size == 32 || w0.group_size == 64 || w0.group_size == 128);
}

// The v2 kernel (or v5 with scratch for its image) when it is chosen (forced, or by default for T >= 2) and applies
// (2/3/4/5/6/8-bit, aligned x and codes); false: the caller runs v1.
bool try_v2(const AffSegs& segs, const AffineWeights& w0, const uint16_t* x, bool y_f32, int64_t T, int n_sms, int gated_act, cudaStream_t s,
            float* scratch) {
  // By default from 2 rows (4/8-bit) or 3 (2/3-bit: at 2 rows v1, reading the codes twice, was still faster on
  // the 8B, H100: 3-bit 473 against 323 tok/s, 2-bit 508 against 372; at 4 rows v2 607 / 698 against 396 / 497).
  // 5/6-bit the same (session 24, H100: 6-bit 391 / 946 against v1's 285 / 367 tok/s at 3 / 8 rows, 274 against 307
  // at 2; 5-bit 418 / 1004 against 307 / 356, 286 against 334).
  const int chosen = v2_variant(), v2_from = w0.bits == 4 || w0.bits == 8 ? 2 : 3;
  const bool v5 = scratch && v5_takes(w0, T);
  int variant = v5 ? 5 : chosen == 0 || chosen >= 4 ? (T >= v2_from ? 2 : 1) : chosen;
  if (T > 8) variant = 2;  // wide: the v2 kernel with two or four n-tiles (to affine_gemv_max_rows, checked next)
  if (variant < 2 || w0.bits < 2 || w0.bits > 8 || w0.bits == 7 || T < 1 || T > affine_gemv_max_rows(w0.bits) || !aligned16(x)) return false;
  for (int i = 0; i < segs.n; ++i)
    if (!aligned16(segs.codes[i])) return false;
  const int64_t K = w0.cols;
  const int gs = w0.group_size;
  if ((gs != 32 && gs != 64 && gs != 128) || K % gs != 0) return false;
  const int64_t step_cols = v2_step_cols(w0.bits), steps = (K + step_cols - 1) / step_cols;
  // K split: until the tiles' warps fill the SMs' slots twice over, keeping two steps a warp.
  const int bps = v2_blocks_per_sm(T > 8 ? 2 : 1);
  const int64_t warp_slots = int64_t(n_sms) * bps * kV2Warps;
  // A/B knobs (device runs): ARBOR_CUDA_AFFINE_V2_WPR=1/2/4/8 forces the split (capped at one step a warp),
  // ARBOR_CUDA_AFFINE_V2_GRID=1 launches min(units, resident blocks) (some blocks one unit more) instead.
  static const int force_wpr = [] {
    const char* e = std::getenv("ARBOR_CUDA_AFFINE_V2_WPR");
    return e ? std::atoi(e) : 0;
  }();
  static const bool persistent = [] {
    const char* e = std::getenv("ARBOR_CUDA_AFFINE_V2_GRID");
    return e && std::atoi(e) == 1;
  }();
  int wpr = 1;
  if (force_wpr == 1 || force_wpr == 2 || force_wpr == 4 || force_wpr == 8)
    while (wpr < force_wpr && steps >= 2 * wpr) wpr *= 2;
  else
    while (wpr < kV2Warps && segs.units * wpr < 2 * warp_slots && steps >= 4 * wpr) wpr *= 2;
  const int64_t units = (segs.units + kV2Warps / wpr - 1) / (kV2Warps / wpr);
  // Blocks: every block the same number of units (rounds) where the resident blocks cannot take them at once.
  const int64_t resident = int64_t(n_sms) * bps, rounds = (units + resident - 1) / resident;
  const unsigned grid = unsigned(persistent ? std::min(units, resident) : (units + rounds - 1) / rounds);
  const int t = int(T);
  unsigned char* wimg = scratch && wimg_takes(w0, T) ? reinterpret_cast<unsigned char*>(scratch) : nullptr;
  if (variant == 5) {
    unsigned char* img = reinterpret_cast<unsigned char*>(scratch);
    if (gs == 32) launch_v5<32>(grid, s, segs, x, y_f32, t, K, w0.sb_f16, wpr, units, gated_act, img);
    else if (gs == 64) launch_v5<64>(grid, s, segs, x, y_f32, t, K, w0.sb_f16, wpr, units, gated_act, img);
    else launch_v5<128>(grid, s, segs, x, y_f32, t, K, w0.sb_f16, wpr, units, gated_act, img);
    return true;
  }
#define ARBOR_V2(B, G) launch_v2_t<B, G>(variant, grid, s, segs, x, y_f32, t, K, w0.sb_f16, wpr, units, gated_act, wimg)
  if (w0.bits == 2) {
    if (gs == 32) ARBOR_V2(2, 32);
    else if (gs == 64) ARBOR_V2(2, 64);
    else ARBOR_V2(2, 128);
  } else if (w0.bits == 3) {
    if (gs == 32) ARBOR_V2(3, 32);
    else if (gs == 64) ARBOR_V2(3, 64);
    else ARBOR_V2(3, 128);
  } else if (w0.bits == 5) {
    if (gs == 32) ARBOR_V2(5, 32);
    else if (gs == 64) ARBOR_V2(5, 64);
    else ARBOR_V2(5, 128);
  } else if (w0.bits == 6) {
    if (gs == 32) ARBOR_V2(6, 32);
    else if (gs == 64) ARBOR_V2(6, 64);
    else ARBOR_V2(6, 128);
  } else if (w0.bits == 4) {
    if (gs == 32) ARBOR_V2(4, 32);
    else if (gs == 64) ARBOR_V2(4, 64);
    else ARBOR_V2(4, 128);
  } else {
    if (gs == 32) ARBOR_V2(8, 32);
    else if (gs == 64) ARBOR_V2(8, 64);
    else ARBOR_V2(8, 128);
  }
#undef ARBOR_V2
  return true;
}

// ---- v4: the streaming GEMV for one activation row of 4-bit codes (the default where it applies) -------
// Measured on an H100 (session 18, against v1 in the same process): 8B at 4-bit g64, b=1 ctx 512 433 tok/s
// (61 % of roofline) against 306; per matrix gate/up 65 % of copy (v1 46 %), down 67 % (45 %), lm_head 79 %
// (58 %), q/o 43 % (40 %).
// gemv.cu's streaming kernel with codes in place of bf16 weights: two persistent blocks of 16 warps per
// SM, each warp owning a contiguous run of units (output rows, numbered consecutively over the launch's
// matrices; gated: gate/up row pairs) and pulling them through a private cp.async ring, kStrStages stages
// of 512 code bytes (1024 codes) per row deep, issued before griddepcontrol.wait. A lane's 16 bytes of a
// stage are 32 consecutive codes of one group, so its (scale, bias) word rides in the same ring (4-byte
// copies). x is staged once per block after the wait, bf16 in the lanes' order (conflict-free 16-byte
// reads) with Σx per lane's 32 columns, so a code costs one PRMT (nib_f: 128 + code) and one FMA, and a
// 32-code piece adds scale·S + (bias − 128·scale)·Σx. Takes T = 1, K a multiple of 1024, 16-byte aligned
// codes and x, and x small enough for two blocks an SM (K <= 16384); otherwise v1 runs.
// INTX (the default; ARBOR_CUDA_AFFINE_STREAM_INT=0 for the bf16-x path. Session 26 on an H100, two rounds: the 8B b=1
// 428.7 -> 477.7 and 437.0 -> 478.1 tok/s, +9-11 %; its error grows with an outlier in a piece, as the plain path's
// does, docs/cuda-notes.md session 24): Nsight showed the lm_head
// launch issue-bound (85 % of issue slots at 76 % of copy), so x is staged as 16-bit integers per 32-column piece
// (round(x / d), d = max|x| / 32767; high and low bytes in separate byte lanes) and a word's 8 codes meet them in 4
// __dp4a (low nibbles against the even columns' bytes, high nibbles against the odd ones'): ~57 lane ops a stage
// against ~130, exact integer sums (|Σ| < 2^24), w·x = scale·d·Σ + bias·Σx. Predicted: lm_head ~88 % of copy,
// gate/up ~80 %, the 8B b=1 +8–12 % on an H100 (more on an H200, whose bytes come 1.4x faster for the same issue rate).
constexpr int kStrWarps = 16;
constexpr int kStrStages = 4;
constexpr int kStrBlocksPerSm = 2;
constexpr int64_t kStrMaxK = 16384;

// Shared memory: codes ring [stages][RPU][threads] uint4, (scale, bias) ring [stages][RPU][threads] u32,
// x [K/32 pieces][4] uint4 (lane order: piece (c, lane)'s j-th 8 values at (c*4 + j)*32 + lane), Σx [K/32], INTX: d [K/32].
template <int RPU>
size_t str_smem_bytes(int64_t K, bool intx) {
  return size_t(kStrStages) * RPU * kStrWarps * 32 * (16 + 4) + size_t(K) * 2 + size_t(K / 32) * (intx ? 8 : 4);  // INTX: + the pieces' d
}

template <int RPU, bool INTX>
__global__ void __launch_bounds__(kStrWarps * 32, kStrBlocksPerSm) affine_stream_kernel(AffSegs segs, const uint16_t* __restrict__ x, bool y_f32,
                                                                                     int64_t K, int gshift, bool sb_f16, int64_t units,
                                                                                     int gated_act) {
  extern __shared__ __align__(16) uint4 str_smem[];
  constexpr int kThreads = kStrWarps * 32;
  constexpr uint32_t kSlot = kThreads * 16, kStage = kSlot * RPU, kSbSlot = kThreads * 4, kSbStage = kSbSlot * RPU;
  const int tid = threadIdx.x, lane = tid % 32;
  const int64_t warps = int64_t(gridDim.x) * kStrWarps, gw = int64_t(blockIdx.x) * kStrWarps + tid / 32;
  const int64_t u_beg = units * gw / warps, u_end = units * (gw + 1) / warps;
  const int chunks = int(K / 1024);
  const int64_t words = K / 8, groups = K >> gshift;
  const uint32_t base = smem_addr(str_smem);
  const uint32_t ring0 = base + uint32_t(tid) * 16u, sbring0 = base + kStrStages * kStage + uint32_t(tid) * 4u;
  const int64_t lane_group = (int64_t(lane) * 32) >> gshift, stage_groups = int64_t(1024) >> gshift;

  // Issue side: the next stage to fetch is chunk ic of unit iu, into ring slot islot.
  int64_t iu = u_beg;
  int ic = 0, islot = 0;
  const uint32_t* pc[RPU];
  const uint32_t* ps[RPU];
  auto point = [&] {
    if (RPU == 2) {
#pragma unroll
      for (int q = 0; q < RPU; ++q) pc[q] = segs.codes[q] + iu * words + lane * 4, ps[q] = segs.sb[q] + iu * groups + lane_group;
    } else {
      const int si = unit_segment(segs.n, segs.first, iu);
      const int64_t r = iu - seg_pick(segs.first, si);
      pc[0] = seg_pick(segs.codes, si) + r * words + lane * 4, ps[0] = seg_pick(segs.sb, si) + r * groups + lane_group;
    }
  };
  if (iu < u_end) point();
  auto issue = [&] {
    if (iu < u_end) {
#pragma unroll
      for (int q = 0; q < RPU; ++q) {
        cp_async16(ring0 + uint32_t(islot) * kStage + q * kSlot, pc[q] + ic * 128);
        cp_async4(sbring0 + uint32_t(islot) * kSbStage + q * kSbSlot, ps[q] + ic * stage_groups);
      }
      if (++ic == chunks) {
        ic = 0;
        if (++iu < u_end) point();
      }
    }
    cp_async_commit();  // empty groups keep the count uniform
    if (++islot == kStrStages) islot = 0;
  };
#pragma unroll 1
  for (int j = 0; j < kStrStages; ++j) issue();
  pdl_trigger();
  pdl_wait();

  // x in the lanes' order, and Σx per 32-column piece. INTX: each piece as 16-bit integers against its largest
  // value (q = round(x / d), d = max|x| / 32767), word j's 8 values as 4 byte lanes: the high (signed) and low
  // (unsigned) bytes of q at the even columns, then of the odd ones, so that a code word's low nibbles (codes
  // 0, 2, 4, 6 as bytes) and high nibbles meet them in __dp4a; d per piece beside Σx.
  uint4* xs = reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(str_smem) + size_t(kStrStages) * (kStage + kSbStage));
  float* xsum = reinterpret_cast<float*>(xs + K / 8);
  float* xd = xsum + K / 32;
  for (int64_t i = tid; i < K / 32; i += kThreads) {
    const int64_t c = i / 32, l = i % 32;
    float sum = 0.0f;
    if constexpr (INTX) {
      float amax = 0.0f;
#pragma unroll 1
      for (int j = 0; j < 4; ++j) {
        float f[8];
        bf16x8(__ldg(reinterpret_cast<const uint4*>(x + i * 32) + j), f);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum += f[e], amax = fmaxf(amax, fabsf(f[e]));
      }
      const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
#pragma unroll 1
      for (int j = 0; j < 4; ++j) {  // the piece again (from L1)
        float f[8];
        bf16x8(__ldg(reinterpret_cast<const uint4*>(x + i * 32) + j), f);
        uint32_t hi[2] = {0, 0}, lo[2] = {0, 0};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const uint32_t q = uint32_t(__float2int_rn(f[e] * inv)) & 0xffffu;
          hi[e & 1] |= (q >> 8) << (8 * (e >> 1));
          lo[e & 1] |= (q & 0xffu) << (8 * (e >> 1));
        }
        xs[(c * 4 + j) * 32 + l] = make_uint4(hi[0], lo[0], hi[1], lo[1]);
      }
      xd[i] = amax / 32767.0f;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(x + i * 32) + j);
        float f[8];
        bf16x8(v, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum += f[e];
        xs[(c * 4 + j) * 32 + l] = v;
      }
    }
    xsum[i] = sum;
  }
  __syncthreads();

  const uint4* ring = str_smem;
  const uint32_t* sbring = reinterpret_cast<const uint32_t*>(reinterpret_cast<const uint8_t*>(str_smem) + kStrStages * kStage);
  float acc[RPU];
#pragma unroll
  for (int q = 0; q < RPU; ++q) acc[q] = 0.0f;
  int cslot = 0;
#pragma unroll 1
  for (int64_t u = u_beg; u < u_end; ++u) {
#pragma unroll 1
    for (int c = 0; c < chunks; ++c) {
      cp_async_wait<kStrStages - 1>();  // this stage has landed
      uint4 wq[RPU];
      uint32_t sbw[RPU];
#pragma unroll
      for (int q = 0; q < RPU; ++q) wq[q] = ring[(cslot * RPU + q) * kThreads + tid], sbw[q] = sbring[(cslot * RPU + q) * kThreads + tid];
      if (++cslot == kStrStages) cslot = 0;
      issue();  // the slot is free once read into registers
      const float sx = xsum[c * 32 + lane];
      if constexpr (INTX) {
        // Σ code·q over the piece in integers (4 __dp4a a word: high bytes signed, low bytes unsigned), exact:
        // |Σ| <= 32·15·32767 < 2^24; then w·x = scale·d·Σ + bias·Σx.
        int Sh[RPU];
        unsigned Sl[RPU];
#pragma unroll
        for (int q = 0; q < RPU; ++q) Sh[q] = 0, Sl[q] = 0u;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint4 xv = xs[(c * 4 + j) * 32 + lane];
#pragma unroll
          for (int q = 0; q < RPU; ++q) {
            const uint32_t w = j == 0 ? wq[q].x : j == 1 ? wq[q].y : j == 2 ? wq[q].z : wq[q].w;
            const uint32_t lo = w & 0x0f0f0f0fu, hi = (w >> 4) & 0x0f0f0f0fu;  // codes 0,2,4,6 and 1,3,5,7 of the word
            Sh[q] = __dp4a(int(lo), int(xv.x), Sh[q]);
            Sl[q] = __dp4a(lo, xv.y, Sl[q]);
            Sh[q] = __dp4a(int(hi), int(xv.z), Sh[q]);
            Sl[q] = __dp4a(hi, xv.w, Sl[q]);
          }
        }
        const float d = xd[c * 32 + lane];
#pragma unroll
        for (int q = 0; q < RPU; ++q) {
          const float2 p = sb_pair(sbw[q], sb_f16);
          acc[q] = fmaf(p.x * d, float(Sh[q] * 256 + int(Sl[q])), fmaf(p.y, sx, acc[q]));
        }
      } else {
      float S[RPU];
#pragma unroll
      for (int q = 0; q < RPU; ++q) S[q] = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float xf[8];
        bf16x8(xs[(c * 4 + j) * 32 + lane], xf);
#pragma unroll
        for (int q = 0; q < RPU; ++q) {
          const uint32_t w = j == 0 ? wq[q].x : j == 1 ? wq[q].y : j == 2 ? wq[q].z : wq[q].w;
          const uint32_t lo = w & 0x0f0f0f0fu, hi = (w >> 4) & 0x0f0f0f0fu;  // codes 0,2,4,6 and 1,3,5,7 of the word
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            S[q] = fmaf(nib_f(lo, k), xf[2 * k], S[q]);
            S[q] = fmaf(nib_f(hi, k), xf[2 * k + 1], S[q]);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < RPU; ++q) {
        const float2 p = sb_pair(sbw[q], sb_f16);
        acc[q] = fmaf(p.x, S[q], fmaf(p.y - p.x * 128.0f, sx, acc[q]));
      }
      }
    }
    // The unit's last chunk: reduce over the warp, lane 0 writes, start the next unit.
#pragma unroll
    for (int q = 0; q < RPU; ++q)
      for (int o = 16; o > 0; o >>= 1) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
    if (lane == 0) {
      const int si = RPU == 2 ? 0 : unit_segment(segs.n, segs.first, u);
      const int64_t n = RPU == 2 ? u : u - seg_pick(segs.first, si);
      const float* bias = seg_pick(segs.bias, si);
      void* y = seg_pick(segs.y, si);
      const float b0 = bias ? bias[n] : 0.0f;
      if (RPU == 2) {  // act(gate) * up, each rounded to bf16 first as the unfused ops store them
        const float b1 = segs.bias[1] ? segs.bias[1][n] : 0.0f;
        const float g = __bfloat162float(__float2bfloat16(acc[0] + b0)), up = __bfloat162float(__float2bfloat16(acc[RPU - 1] + b1));
        static_cast<__nv_bfloat16*>(y)[n] = __float2bfloat16(act_value(gated_act, g) * up);
      } else if (y_f32) {
        static_cast<float*>(y)[n] = acc[0] + b0;
      } else {
        static_cast<__nv_bfloat16*>(y)[n] = __float2bfloat16(acc[0] + b0);
      }
    }
#pragma unroll
    for (int q = 0; q < RPU; ++q) acc[q] = 0.0f;
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory when the block exits
}

template <int RPU, bool INTX>
void launch_stream_x(dim3 grid, cudaStream_t s, const AffSegs& segs, const uint16_t* x, bool y_f32, int64_t K, int gshift, bool sb_f16,
                     int gated_act) {
  static bool attr = false;
  if (!attr) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(affine_stream_kernel<RPU, INTX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(str_smem_bytes<RPU>(kStrMaxK, INTX))));
    attr = true;
  }
  pdl_launch(affine_stream_kernel<RPU, INTX>, grid, dim3(kStrWarps * 32), str_smem_bytes<RPU>(K, INTX), s, segs, x, y_f32, K, gshift, sb_f16,
             segs.units, gated_act);
  ARBOR_LAUNCH_CHECK("affine_stream_kernel");
}

int g_stream_intx = -1;  // set_affine_stream_int_x; -1: from ARBOR_CUDA_AFFINE_STREAM_INT (unset: 1)

bool stream_int_x() { return env_choice(g_stream_intx, "ARBOR_CUDA_AFFINE_STREAM_INT", 1, 1) == 1; }

template <int RPU>
void launch_stream(dim3 grid, cudaStream_t s, const AffSegs& segs, const uint16_t* x, bool y_f32, int64_t K, int gshift, bool sb_f16,
                   int gated_act) {
  if (stream_int_x()) launch_stream_x<RPU, true>(grid, s, segs, x, y_f32, K, gshift, sb_f16, gated_act);
  else launch_stream_x<RPU, false>(grid, s, segs, x, y_f32, K, gshift, sb_f16, gated_act);
}

// The streaming kernel (segs in units of one row; gated: one row pair) where it applies; false: the caller
// runs another.
bool try_stream(const AffSegs& segs, const AffineWeights& w0, const uint16_t* x, bool y_f32, int64_t T, int n_sms, int gated_act,
                cudaStream_t s) {
  const int64_t K = w0.cols, units = segs.units;
  if (T != 1 || w0.bits != 4 || K % 1024 != 0 || K > kStrMaxK || !aligned16(x) || units < 1) return false;
  if (w0.group_size != 32 && w0.group_size != 64 && w0.group_size != 128) return false;
  for (int i = 0; i < segs.n; ++i)
    if (!aligned16(segs.codes[i])) return false;
  const int gshift = w0.group_size == 32 ? 5 : w0.group_size == 64 ? 6 : 7;
  // Every warp at least one unit: fewer blocks than the SMs' slots for small matrices.
  const int64_t blocks = std::min<int64_t>(int64_t(n_sms) * kStrBlocksPerSm, (units + kStrWarps - 1) / kStrWarps);
  const dim3 grid(unsigned(std::max<int64_t>(blocks, 1)));
  if (gated_act >= 0) launch_stream<2>(grid, s, segs, x, false, K, gshift, w0.sb_f16, gated_act);
  else launch_stream<1>(grid, s, segs, x, y_f32, K, gshift, w0.sb_f16, gated_act);
  return true;
}

// ---- embedding gather ---------------------------------------------------------------------------------
__global__ void affine_embed_kernel(AffineWeights w, const int32_t* tokens, const int32_t* picked, float mul, uint16_t* out) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.y;
  const int32_t tok = tokens[t];
  const int64_t row = tok >= 0 ? tok : picked[-1 - int64_t(tok)];  // token_from_last_pick (ids the argmax wrote, < vocab)
  const int64_t words = w.cols * w.bits / 32, groups = w.cols / w.group_size;
  const uint32_t* codes = w.codes + row * words;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < w.cols; c += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t bit = uint64_t(c) * uint64_t(w.bits);
    const int64_t wi = int64_t(bit >> 5);
    const int off = int(bit & 31);
    uint64_t v = codes[wi] >> off;
    if (off + w.bits > 32) v |= uint64_t(codes[wi + 1]) << (32 - off);
    const float q = float(uint32_t(v) & ((1u << w.bits) - 1u));
    const float2 p = sb_pair(w.sb[row * groups + c / w.group_size], w.sb_f16);
    const float val = __fadd_rn(__fmul_rn(p.x, q), p.y);  // the reference's separate multiply and add
    reinterpret_cast<__nv_bfloat16*>(out)[t * w.cols + c] = __float2bfloat16(__fmul_rn(val, mul));
  }
}

}  // namespace

int64_t affine_gemv_scratch_floats(const AffineWeights& w, int64_t T) {
  if (wimg_takes(w, T)) return (wimg_bytes(w.cols, T, wimg_piece_cols(w.bits, w.group_size)) + 3) / 4;
  return v5_takes(w, T) ? (ximg_bytes(w.cols, w.group_size) + 3) / 4 : 0;
}

// Each launch's kernel: v4 for one row where it applies (by default, or forced with 4), else v5 where it is chosen
// and has scratch, else v2 where it applies (by default for 2..8 rows, or forced with 2/3), else v1.

void launch_affine_gemv_multi(const AffineGemvOut* outs, int n, const uint16_t* x, bool y_f32, int64_t T, int n_sms, CUstream_st* s,
                              float* scratch) {
  ARBOR_CU_CHECK(n >= 1 && n <= kAffineGemvMaxSegments, "cuda: affine gemv: %d matrices in one launch (1..%d)", n, kAffineGemvMaxSegments);
  for (int i = 1; i < n; ++i) check_same(outs[0].w, outs[i].w, "gemv");
  const int chosen = v2_variant();
  if ((chosen == 0 || chosen == 4 || chosen == 6) && try_stream(plain_segments(outs, n, 1), outs[0].w, x, y_f32, T, n_sms, -1, s)) return;
  if (try_v2(plain_segments(outs, n, 16), outs[0].w, x, y_f32, T, n_sms, -1, s, scratch)) return;
  launch(plain_segments(outs, n, 2), outs[0].w, x, y_f32, T, n_sms, -1, s);
}

void launch_affine_gemv_gated(const AffineGemvOut& gate, const AffineGemvOut& up, int act, const uint16_t* x, uint16_t* y, int64_t T,
                              int n_sms, CUstream_st* s, float* scratch) {
  check_same(gate.w, up.w, "gated gemv");
  ARBOR_CU_CHECK(gate.w.rows == up.w.rows, "cuda: affine gated gemv: gate has %lld rows, up %lld", (long long)gate.w.rows,
                 (long long)up.w.rows);
  const int chosen = v2_variant();
  if ((chosen == 0 || chosen == 4 || chosen == 6) && try_stream(gated_segments(gate, up, y, 1), gate.w, x, false, T, n_sms, act, s)) return;
  if (try_v2(gated_segments(gate, up, y, 8), gate.w, x, false, T, n_sms, act, s, scratch)) return;
  launch(gated_segments(gate, up, y, 1), gate.w, x, false, T, n_sms, act, s);
}

void set_affine_gemv_variant(int v) { g_v2_variant = v >= 1 && v <= 6 ? v : -1; }
void set_affine_v2_x_ahead(int pieces) { g_v2_xpf = pieces >= 0 && pieces <= 2 ? pieces : -1; }
void set_affine_stream_int_x(int on) { g_stream_intx = on == 0 || on == 1 ? on : -1; }
void set_affine_v2_prefetch(int steps) { g_v2_pf = steps >= 0 && steps <= 16 ? steps : -1; }
void set_affine_wide_image(int on) { g_wide_img = on == 0 || on == 1 ? on : -1; }

void launch_affine_embed(const AffineWeights& w, const int32_t* tokens, const int32_t* picked, int64_t T, float mul, uint16_t* out,
                         CUstream_st* s) {
  if (T == 0) return;
  const unsigned bx = unsigned(std::min<int64_t>((w.cols + 255) / 256, 64));
  pdl_launch(affine_embed_kernel, dim3(bx, unsigned(T)), dim3(256), 0, s, w, tokens, picked, mul, out);
  ARBOR_LAUNCH_CHECK("affine_embed_kernel");
}

}  // namespace arbor::cuda
