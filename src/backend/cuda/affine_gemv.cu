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
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.h"

namespace arbor::cuda {

namespace {

constexpr int kAffWarps = 8;                  // per block
constexpr int64_t kAffMaxXsBytes = 80 * 1024;  // x staged (bf16, in the lanes' order) in shared memory up to this

struct AffSegs {
  const uint32_t* codes[kAffineGemvMaxSegments];
  const uint32_t* sb[kAffineGemvMaxSegments];
  const float* bias[kAffineGemvMaxSegments];
  void* y[kAffineGemvMaxSegments];
  int64_t N[kAffineGemvMaxSegments];
  int64_t pair0[kAffineGemvMaxSegments];  // matrix i owns row pairs [pair0[i], pair0[i + 1])
  int n;
};

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
    const int si = segs.n > 2 && gp >= segs.pair0[2] ? 2 : segs.n > 1 && gp >= segs.pair0[1] ? 1 : 0;
    ca = cb = si == 0 ? segs.codes[0] : si == 1 ? segs.codes[1] : segs.codes[2];
    sa = sbb = si == 0 ? segs.sb[0] : si == 1 ? segs.sb[1] : segs.sb[2];
    ba = bb = si == 0 ? segs.bias[0] : si == 1 ? segs.bias[1] : segs.bias[2];
    y = si == 0 ? segs.y[0] : si == 1 ? segs.y[1] : segs.y[2];
    N = si == 0 ? segs.N[0] : si == 1 ? segs.N[1] : segs.N[2];
    row0 = (gp - (si == 0 ? 0 : si == 1 ? segs.pair0[1] : segs.pair0[2])) * 2;
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

void launch(const AffSegs& segs, int64_t pairs, const AffineWeights& w0, const uint16_t* x, bool y_f32, int64_t T, int n_sms, int gated_act,
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

void launch_affine_gemv_multi(const AffineGemvOut* outs, int n, const uint16_t* x, bool y_f32, int64_t T, int n_sms, CUstream_st* s) {
  ARBOR_CU_CHECK(n >= 1 && n <= kAffineGemvMaxSegments, "cuda: affine gemv: %d matrices in one launch (1..%d)", n, kAffineGemvMaxSegments);
  AffSegs segs{};
  segs.n = n;
  int64_t pairs = 0;
  for (int i = 0; i < n; ++i) {
    check_same(outs[0].w, outs[i].w, "gemv");
    segs.codes[i] = outs[i].w.codes, segs.sb[i] = outs[i].w.sb, segs.bias[i] = outs[i].bias, segs.y[i] = outs[i].y;
    segs.N[i] = outs[i].w.rows, segs.pair0[i] = pairs;
    pairs += (outs[i].w.rows + 1) / 2;
  }
  launch(segs, pairs, outs[0].w, x, y_f32, T, n_sms, -1, s);
}

void launch_affine_gemv_gated(const AffineGemvOut& gate, const AffineGemvOut& up, int act, const uint16_t* x, uint16_t* y, int64_t T,
                              int n_sms, CUstream_st* s) {
  check_same(gate.w, up.w, "gated gemv");
  ARBOR_CU_CHECK(gate.w.rows == up.w.rows, "cuda: affine gated gemv: gate has %lld rows, up %lld", (long long)gate.w.rows,
                 (long long)up.w.rows);
  AffSegs segs{};
  segs.n = 2;
  segs.codes[0] = gate.w.codes, segs.codes[1] = up.w.codes, segs.sb[0] = gate.w.sb, segs.sb[1] = up.w.sb;
  segs.bias[0] = gate.bias, segs.bias[1] = up.bias, segs.y[0] = y, segs.N[0] = gate.w.rows;
  launch(segs, gate.w.rows, gate.w, x, false, T, n_sms, act, s);
}

void launch_affine_embed(const AffineWeights& w, const int32_t* tokens, const int32_t* picked, int64_t T, float mul, uint16_t* out,
                         CUstream_st* s) {
  if (T == 0) return;
  const unsigned bx = unsigned(std::min<int64_t>((w.cols + 255) / 256, 64));
  pdl_launch(affine_embed_kernel, dim3(bx, unsigned(T)), dim3(256), 0, s, w, tokens, picked, mul, out);
  ARBOR_LAUNCH_CHECK("affine_embed_kernel");
}

}  // namespace arbor::cuda
