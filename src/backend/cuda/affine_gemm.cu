// Tensor-core GEMM for MLX affine-quantized weights (formats.md §2): y [T, rows] = x [T, cols] · Wᵀ for
// 9..64 activation rows (batched decode) and prefill, with W dequantized inside the main loop.
//
// A block owns 128 weight rows (the MMA's M) x BN activation rows (its N: 64 for T <= 64, else 128) and
// walks K in tiles of 64. Each tile's codes (64*bits/32 words per weight row, as in the file), its
// scale/bias words (one or two groups) and the x tile go global -> shared with cp.async, 3 or 4 tiles deep;
// once a tile has landed the block's 256 threads dequantize its codes to a bf16 tile in shared memory
// (w = float(scale) * q + float(bias), one multiply and one add as the reference does, then rounded to
// bf16), and the warps run mma.sync m16n8k16 (bf16 in, f32 accumulate) with ldmatrix fragments of
// that tile and the x tile. 8 codes of a row start on a byte boundary for every bit width (8 * bits
// bits), so a thread's 8 codes are two shared words at most, funnel-shifted: 3/5/6-bit codes that
// straddle words need no special case.
//
// When the M x N tiles do not fill the GPU (small T, few rows) K is split over blocks (grid z); each
// split writes f32 partials to a scratch [splits, T, rows] and affine_reduce_kernel sums them in
// split order, adds the bias and stores y. The tail of K (cols not a multiple of 64: group size 32)
// and rows/T past the matrix are zero-filled by cp.async, so every tile is whole in shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/affine_gemm.h"
#include "backend/cuda/cp_async.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mma_sync.h"

namespace arbor::cuda {

namespace {

constexpr int kBM = 128;     // weight rows per block
constexpr int kBK = 64;      // K per tile
// Threads per block: 256 (8 warps), 512 for BN = 256 (16 warps: one block per SM whose dequantized tile
// feeds twice the MMAs).
template <int BN>
constexpr int threads_of() { return BN == 256 ? 512 : 256; }
constexpr int kRowElems = kBK + 8;  // bf16 per shared row: 8 of padding keeps ldmatrix conflict-free
constexpr int kMaxSplits = 16;

std::atomic<int> g_forced_splits{0};
std::atomic<int> g_variant{0};  // prefill kernel: 0 plain, 1 pipelined, 2 plain with BN = 256 (512 threads)

template <int BITS, int BN>
struct Layout {
  static constexpr int CW = kBK * BITS / 32;                   // code words per weight row per tile
  static constexpr int x_bytes = BN * kRowElems * 2;           // x tile, bf16
  static constexpr int code_bytes = (kBM * CW + 4) * 4;        // + the dequant's look-ahead word past the last row
  static constexpr int sb_bytes = kBM * 2 * 4;                 // up to two groups per row per tile (group size 32)
  static constexpr int stage_bytes = x_bytes + code_bytes + sb_bytes;
  static constexpr int a_bytes = kBM * kRowElems * 2;          // the dequantized tile, bf16
  static_assert(x_bytes % 16 == 0 && code_bytes % 16 == 0 && sb_bytes % 16 == 0);
};

struct Params {
  const uint32_t* codes;
  const uint32_t* sb;
  const uint16_t* x;
  const float* bias;
  void* y;
  float* partial;  // [splits, T, rows] when K is split, else null
  int64_t rows, cols, row_words, row_groups;
  int T, gs, gs_shift, ktiles, tiles_per_split, code_vec;
  bool sb_f16, y_f32;
};

// cp.async of V bytes (4, 8 or 16), or V zero bytes when !valid.
template <int V>
__device__ __forceinline__ void cp_async_v(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? V : 0;
  if constexpr (V == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(V), "r"(n));
}

template <int V, int CW, int kThreads>
__device__ __forceinline__ void load_codes(const Params& p, uint32_t dst, int64_t m0, int64_t w0) {
  constexpr int per = CW * 4 / V;  // copies per weight row
  constexpr int total = kBM * per, iters = (total + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < iters; ++it) {
    const int c = int(threadIdx.x) + it * kThreads;
    if (total % kThreads != 0 && c >= total) break;
    const int r = c / per, j = c % per;
    const int64_t m = m0 + r, w = w0 + j * (V / 4);
    const bool ok = m < p.rows && w < p.row_words;  // V > 4 only when no tile is partial
    cp_async_v<V>(dst + uint32_t(r * CW + j * (V / 4)) * 4, ok ? p.codes + m * p.row_words + w : p.codes, ok);
  }
}

template <int BITS, int BN>
__device__ __forceinline__ void load_tile(const Params& p, unsigned char* st, int64_t m0, int n0, int kt) {
  using L = Layout<BITS, BN>;
  constexpr int kThreads = threads_of<BN>();
  const int64_t k0 = int64_t(kt) * kBK;
  const uint32_t xs = smem_addr(st);
  static_assert(BN * 8 % kThreads == 0 && kBM * 8 % kThreads == 0);
#pragma unroll
  for (int it = 0; it < BN * 8 / kThreads; ++it) {  // BN rows x 8 copies of 8 bf16
    const int c = int(threadIdx.x) + it * kThreads;
    const int r = c >> 3, j = c & 7;
    const int n = n0 + r;
    const int64_t k = k0 + j * 8;
    const bool ok = n < p.T && k < p.cols;
    cp_async16_zfill(xs + uint32_t(r * kRowElems + j * 8) * 2, ok ? p.x + int64_t(n) * p.cols + k : p.x, ok);
  }
  const uint32_t cs = smem_addr(st + L::x_bytes);
  const int64_t w0 = int64_t(kt) * L::CW;
  if constexpr (L::CW % 4 == 0) {
    if (p.code_vec == 16) {
      load_codes<16, L::CW, kThreads>(p, cs, m0, w0);
    } else if (p.code_vec == 8) {
      load_codes<8, L::CW, kThreads>(p, cs, m0, w0);
    } else {
      load_codes<4, L::CW, kThreads>(p, cs, m0, w0);
    }
  } else {
    if (p.code_vec == 8) {
      load_codes<8, L::CW, kThreads>(p, cs, m0, w0);
    } else {
      load_codes<4, L::CW, kThreads>(p, cs, m0, w0);
    }
  }
  const uint32_t ss = smem_addr(st + L::x_bytes + L::code_bytes);
  const int64_t g0 = k0 >> p.gs_shift;
#pragma unroll
  for (int it = 0; it < (kBM * 2 + kThreads - 1) / kThreads; ++it) {
    const int c = int(threadIdx.x) + it * kThreads;
    if (c >= kBM * 2) break;
    const int r = c >> 1, j = c & 1;
    const int64_t m = m0 + r, g = g0 + j;
    const bool ok = m < p.rows && g < p.row_groups && (j == 0 || p.gs == 32);
    cp_async_v<4>(ss + uint32_t(c) * 4, ok ? p.sb + m * p.row_groups + g : p.sb, ok);
  }
}

// The cp.async ring depth and the shared memory of a configuration. The plain kernel: 3 tiles for BN = 128
// (compute-bound), 4 for BN = 64 (more bytes in flight), one dequantized tile. The pipelined one: 3 tiles,
// two dequantized tiles (one being filled while the other feeds the MMAs).
template <int BN, bool PIPE>
constexpr int stages_of() { return PIPE ? 3 : (BN >= 128 ? 3 : 4); }
template <int BITS, int BN, bool PIPE>
constexpr int smem_of() { return stages_of<BN, PIPE>() * Layout<BITS, BN>::stage_bytes + (PIPE ? 2 : 1) * Layout<BITS, BN>::a_bytes; }

// Chunk c (row c / 8, codes 8 (c % 8) ..+8) of the landed tile's codes -> bf16 weights in As [kBM][kRowElems].
template <int BITS, int BN>
__device__ __forceinline__ void dequant_chunk(const Params& p, const unsigned char* st, uint16_t* As, int c) {
  using L = Layout<BITS, BN>;
  constexpr bool kTwoWords = !(BITS == 2 || BITS == 4);  // 8 codes from a byte offset may cross a word
  constexpr uint32_t kMask = (1u << BITS) - 1;
  const uint32_t* cw = reinterpret_cast<const uint32_t*>(st + L::x_bytes);
  const uint32_t* sbw = reinterpret_cast<const uint32_t*>(st + L::x_bytes + L::code_bytes);
  {
    const int r = c >> 3, kc = c & 7;
    const int byte = kc * BITS;  // the 8 codes start at bit kc * 8 * BITS of the row's tile
    const uint32_t* wp = cw + r * L::CW + (byte >> 2);
    uint64_t v = wp[0];
    if constexpr (kTwoWords) v |= uint64_t(wp[1]) << 32;
    v >>= (byte & 3) * 8;
    const uint32_t s = sbw[r * 2 + (p.gs == 32 ? (kc >> 2) : 0)];
    float scale, bias;
    if (p.sb_f16) {
      scale = __half2float(__ushort_as_half(uint16_t(s & 0xffffu)));
      bias = __half2float(__ushort_as_half(uint16_t(s >> 16)));
    } else {
      scale = __uint_as_float(s << 16);
      bias = __uint_as_float(s & 0xffff0000u);
    }
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t q0 = uint32_t(v >> (2 * i * BITS)) & kMask, q1 = uint32_t(v >> ((2 * i + 1) * BITS)) & kMask;
      // float(q) exactly, without the slow int -> float conversion: 2^23 + q, minus 2^23.
      const float f0 = __uint_as_float(0x4B000000u | q0) - 8388608.0f, f1 = __uint_as_float(0x4B000000u | q1) - 8388608.0f;
      __nv_bfloat162 h = __floats2bfloat162_rn(__fadd_rn(__fmul_rn(scale, f0), bias), __fadd_rn(__fmul_rn(scale, f1), bias));
      out[i] = *reinterpret_cast<uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(As + r * kRowElems + kc * 8) = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

template <int BITS, int BN>
__device__ __forceinline__ void dequant_tile(const Params& p, const unsigned char* st, uint16_t* As) {
  constexpr int kThreads = threads_of<BN>();
#pragma unroll
  for (int it = 0; it < kBM * 8 / kThreads; ++it) dequant_chunk<BITS, BN>(p, st, As, int(threadIdx.x) + it * kThreads);
}

// One 16-wide K step of a warp's MMAs: A fragments from the dequantized tile (a_base: this lane's
// ldmatrix row), B fragments from the x tile (xs: likewise).
template <int MT, int NT>
__device__ __forceinline__ void mma_step(float (&acc)[MT][NT][4], uint32_t a_base, uint32_t xs, int kk) {
  uint32_t a[MT][4], b[NT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) ldsm_x4(a_base + uint32_t(mt * 16 * kRowElems + kk * 16) * 2, a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
#pragma unroll
  for (int np = 0; np < NT / 2; ++np)
    ldsm_x4(xs + uint32_t(np * 16 * kRowElems + kk * 16) * 2, b[2 * np][0], b[2 * np][1], b[2 * np + 1][0], b[2 * np + 1][1]);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[nt][0], b[nt][1]);
}

// WM x WN warps; each owns (kBM / WM) weight rows x (BN / WN) activation rows of the block's tile.
// Plain (PIPE false): each tile is dequantized, then multiplied, a barrier between; two blocks per SM
// (registers capped at 128; shared memory ~101 KB for BN = 128, ~92 KB for 64) overlap one's dequant with
// the other's MMAs. Pipelined (PIPE true): two dequantized tiles; while the warps multiply tile i they
// dequantize tile i + 1 (one chunk per 16-wide K step), one barrier per tile; one block per SM.
template <int BITS, int BN, int WM, int WN, bool PIPE>
__global__ void __launch_bounds__(threads_of<BN>(), (PIPE || BN == 256) ? 1 : 2) affine_gemm_kernel(Params p) {
  constexpr int kThreads = threads_of<BN>();
  using L = Layout<BITS, BN>;
  constexpr int kStages = stages_of<BN, PIPE>();
  constexpr int WTM = kBM / WM, WTN = BN / WN, MT = WTM / 16, NT = WTN / 8;
  static_assert(WM * WN * 32 == kThreads && MT >= 1 && NT % 2 == 0);
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* As = reinterpret_cast<uint16_t*>(smem + kStages * L::stage_bytes);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp % WM, wn = warp / WM;
  const int64_t m0 = int64_t(blockIdx.x) * kBM;
  const int n0 = int(blockIdx.y) * BN;
  const int kt0 = int(blockIdx.z) * p.tiles_per_split;
  const int nk = min(p.ktiles, kt0 + p.tiles_per_split) - kt0;  // >= 1: the launcher leaves no split empty

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_tile<BITS, BN>(p, smem + s * L::stage_bytes, m0, n0, kt0 + s);
    cp_async_commit();
  }
  // Per lane, the shared addresses of its ldmatrix rows (k offset added per 16-wide step).
  const uint32_t a_base = smem_addr(As + (wm * WTM + (lane & 15)) * kRowElems + (lane >> 4) * 8);
  const uint32_t x_off = uint32_t((wn * WTN + (lane & 7) + (lane >> 4) * 8) * kRowElems + ((lane >> 3) & 1) * 8) * 2;

  if constexpr (PIPE) {
    static_assert(kStages == 3 && kBM * 8 == kThreads * (kBK / 16), "one dequant chunk per thread per K step");
    constexpr uint32_t kABytes = L::a_bytes;
    cp_async_wait<kStages - 2>();
    __syncthreads();
    dequant_tile<BITS, BN>(p, smem, As);  // tile 0 -> As[0]
    for (int i = 0; i < nk; ++i) {
      cp_async_wait<0>();  // tile i + 1 landed (the last one issued)
      __syncthreads();     // ... for every thread; As[i % 2] complete; every warp is done with tile i - 1
      if (i + kStages - 1 < nk) load_tile<BITS, BN>(p, smem + ((i + kStages - 1) % kStages) * L::stage_bytes, m0, n0, kt0 + i + kStages - 1);
      cp_async_commit();
      const bool next = i + 1 < nk;
      const unsigned char* nst = smem + ((i + 1) % kStages) * L::stage_bytes;
      uint16_t* An = As + ((i + 1) & 1) * (kBM * kRowElems);
      const uint32_t ab = a_base + (i & 1) * kABytes, xs = smem_addr(smem + (i % kStages) * L::stage_bytes) + x_off;
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        if (next) dequant_chunk<BITS, BN>(p, nst, An, int(threadIdx.x) + kk * kThreads);
        mma_step<MT, NT>(acc, ab, xs, kk);
      }
    }
  } else {
    for (int i = 0; i < nk; ++i) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // tile i landed for every thread; every warp is done with tile i - 1
      const unsigned char* st = smem + (i % kStages) * L::stage_bytes;
      dequant_tile<BITS, BN>(p, st, As);
      if (i + kStages - 1 < nk) load_tile<BITS, BN>(p, smem + ((i + kStages - 1) % kStages) * L::stage_bytes, m0, n0, kt0 + i + kStages - 1);
      cp_async_commit();
      __syncthreads();  // As holds tile i
      const uint32_t xs = smem_addr(st) + x_off;
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) mma_step<MT, NT>(acc, a_base, xs, kk);
    }
  }
  cp_async_wait<0>();

  // acc[mt][nt]: {(row g, col 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)}; rows are weight rows, cols tokens.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + wm * WTM + mt * 16 + g + 8 * h;
      if (m >= p.rows) continue;
      const float b = (p.partial || !p.bias) ? 0.0f : p.bias[m];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int n = n0 + wn * WTN + nt * 8 + 2 * t + j;
          if (n >= p.T) continue;
          const float v = acc[mt][nt][2 * h + j];
          if (p.partial) {
            p.partial[(int64_t(blockIdx.z) * p.T + n) * p.rows + m] = v;
          } else if (p.y_f32) {
            static_cast<float*>(p.y)[int64_t(n) * p.rows + m] = v + b;
          } else {
            static_cast<__nv_bfloat16*>(p.y)[int64_t(n) * p.rows + m] = __float2bfloat16_rn(v + b);
          }
        }
    }
}

// y = sum over splits of part (in split order) + bias.
__global__ void affine_reduce_kernel(const float* __restrict__ part, int splits, int64_t TN, int64_t N, const float* __restrict__ bias,
                                     void* y, bool y_f32) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < TN; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int z = 0; z < splits; ++z) s += part[int64_t(z) * TN + i];
    if (bias) s += bias[i % N];
    if (y_f32) static_cast<float*>(y)[i] = s;
    else static_cast<__nv_bfloat16*>(y)[i] = __float2bfloat16_rn(s);
  }
}

int block_cols(int64_t T) { return T <= 64 ? 64 : g_variant.load() == 2 ? 256 : 128; }

// Splits of K so the grid has about two blocks per SM, each split at least 4 tiles; 1 when the M x N
// tiles alone fill the GPU.
int pick_splits(const AffineWeights& w, int64_t T, int n_sms, int* tiles_per_split) {
  const int ktiles = int((w.cols + kBK - 1) / kBK);
  const int64_t blocks = ((w.rows + kBM - 1) / kBM) * ((T + block_cols(T) - 1) / block_cols(T));
  int splits = g_forced_splits.load();
  if (splits <= 0) {
    splits = 1;
    if (blocks < n_sms) splits = int(std::min<int64_t>((2 * int64_t(n_sms) + blocks - 1) / blocks, std::max(1, ktiles / 4)));
  }
  splits = std::clamp(splits, 1, std::min(kMaxSplits, ktiles));
  const int per = (ktiles + splits - 1) / splits;
  *tiles_per_split = per;
  return (ktiles + per - 1) / per;  // no split left empty
}

template <int BITS, int BN, int WM, int WN, bool PIPE>
void launch_cfg(const Params& p, dim3 grid, cudaStream_t s) {
  constexpr int smem = smem_of<BITS, BN, PIPE>();
  static bool attr_set = false;  // per process: one device, as the backend runs
  if (!attr_set) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(affine_gemm_kernel<BITS, BN, WM, WN, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  affine_gemm_kernel<BITS, BN, WM, WN, PIPE><<<grid, threads_of<BN>(), smem, s>>>(p);
  ARBOR_LAUNCH_CHECK("affine_gemm_kernel");
}

template <int BITS>
void launch_bits(const Params& p, dim3 grid, cudaStream_t s) {
  if (p.T <= 64) launch_cfg<BITS, 64, 4, 2, false>(p, grid, s);
  else if (g_variant.load() == 1) launch_cfg<BITS, 128, 2, 4, true>(p, grid, s);
  else if (g_variant.load() == 2) launch_cfg<BITS, 256, 2, 8, false>(p, grid, s);
  else launch_cfg<BITS, 128, 2, 4, false>(p, grid, s);
}

// Rows [row0, row0 + n) of W dequantized to bf16 [n, cols] (the prefill path for many activation rows: this,
// then cuBLASLt). Thread i takes 8 codes (one 16-byte store); the arithmetic is dequant_chunk's.
template <int BITS>
__global__ void affine_dequant_kernel(const uint32_t* __restrict__ codes, const uint32_t* __restrict__ sb, bool sb_f16, int64_t row0,
                                      int64_t n, int64_t cols, int gs_shift, uint16_t* __restrict__ out) {
  constexpr uint32_t kMask = (1u << BITS) - 1;
  const int64_t chunks_per_row = cols / 8, total = n * chunks_per_row, row_words = cols * BITS / 32, groups = cols >> gs_shift;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks_per_row, c = i - r * chunks_per_row, row = row0 + r;
    const int64_t byte = c * BITS;  // 8 codes start at bit 8·BITS·c
    const uint32_t* wp = codes + row * row_words + (byte >> 2);
    uint64_t v = __ldg(wp);
    if ((byte >> 2) + 1 < row_words) v |= uint64_t(__ldg(wp + 1)) << 32;
    v >>= (byte & 3) * 8;
    const uint32_t s = __ldg(sb + row * groups + ((c * 8) >> gs_shift));
    float scale, bias;
    if (sb_f16) {
      scale = __half2float(__ushort_as_half(uint16_t(s & 0xffffu)));
      bias = __half2float(__ushort_as_half(uint16_t(s >> 16)));
    } else {
      scale = __uint_as_float(s << 16);
      bias = __uint_as_float(s & 0xffff0000u);
    }
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t q0 = uint32_t(v >> (2 * k * BITS)) & kMask, q1 = uint32_t(v >> ((2 * k + 1) * BITS)) & kMask;
      const float f0 = __uint_as_float(0x4B000000u | q0) - 8388608.0f, f1 = __uint_as_float(0x4B000000u | q1) - 8388608.0f;
      __nv_bfloat162 h = __floats2bfloat162_rn(__fadd_rn(__fmul_rn(scale, f0), bias), __fadd_rn(__fmul_rn(scale, f1), bias));
      o[k] = *reinterpret_cast<uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(out + r * cols + c * 8) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

void check_weights(const AffineWeights& w) {
  if (w.bits != 2 && w.bits != 3 && w.bits != 4 && w.bits != 5 && w.bits != 6 && w.bits != 8)
    fail_printf("affine GEMM: %d-bit codes are not supported (2, 3, 4, 5, 6, 8)", w.bits);
  if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128)
    fail_printf("affine GEMM: group size %d is not supported (32, 64, 128)", w.group_size);
  if (w.rows < 1 || w.cols < 1 || w.cols % w.group_size != 0)
    fail_printf("affine GEMM: a [%lld, %lld] weight needs cols a positive multiple of the group size %d", (long long)w.rows,
                (long long)w.cols, w.group_size);
  if (!w.codes || !w.sb) fail_printf("affine GEMM: null codes or scale/bias pointer");
}

}  // namespace

void set_affine_gemm_splits(int splits) { g_forced_splits.store(std::max(0, splits)); }
void set_affine_gemm_variant(int v) { g_variant.store(v == 1 || v == 2 ? v : 0); }

int64_t affine_gemm_scratch_floats(const AffineWeights& w, int64_t T, int n_sms) {
  if (T < 1) return 0;
  int per = 0;
  const int splits = pick_splits(w, T, n_sms, &per);
  return splits > 1 ? int64_t(splits) * T * w.rows : 0;
}

void launch_affine_gemm(const AffineWeights& w, const uint16_t* x, const float* bias, void* y, DType y_dtype, int64_t T,
                        float* scratch, int n_sms, cudaStream_t s) {
  check_weights(w);
  if (y_dtype != DType::BF16 && y_dtype != DType::F32) fail_printf("affine GEMM: output must be bf16 or f32");
  if (T < 1) return;
  if (T > 65535LL * 64) fail_printf("affine GEMM: %lld rows of activations are too many", (long long)T);
  if ((reinterpret_cast<uintptr_t>(x) & 15) != 0) fail_printf("affine GEMM: x must be 16-byte aligned");
  Params p{};
  p.codes = w.codes, p.sb = w.sb, p.x = x, p.bias = bias, p.y = y;
  p.rows = w.rows, p.cols = w.cols, p.row_words = w.cols * w.bits / 32, p.row_groups = w.cols / w.group_size;
  p.T = int(T), p.gs = w.group_size, p.gs_shift = w.group_size == 32 ? 5 : w.group_size == 64 ? 6 : 7, p.sb_f16 = w.sb_f16, p.y_f32 = y_dtype == DType::F32;
  p.ktiles = int((w.cols + kBK - 1) / kBK);
  int splits = pick_splits(w, T, n_sms, &p.tiles_per_split);
  if (splits > 1 && !scratch) {  // no room for partials: one split
    splits = 1;
    p.tiles_per_split = p.ktiles;
  }
  p.partial = splits > 1 ? scratch : nullptr;
  // Code copies: 16 bytes when every tile's row of codes is whole and 16-byte aligned, else 8, else 4.
  const uintptr_t ca = reinterpret_cast<uintptr_t>(w.codes);
  const bool whole = w.cols % kBK == 0;
  const int tile_words = kBK * w.bits / 32;
  p.code_vec = 4;
  if (whole && tile_words % 4 == 0 && p.row_words % 4 == 0 && ca % 16 == 0) p.code_vec = 16;
  else if (whole && tile_words % 2 == 0 && p.row_words % 2 == 0 && ca % 8 == 0) p.code_vec = 8;
  const dim3 grid(unsigned((w.rows + kBM - 1) / kBM), unsigned((T + block_cols(T) - 1) / block_cols(T)), unsigned(splits));
  switch (w.bits) {
    case 2: launch_bits<2>(p, grid, s); break;
    case 3: launch_bits<3>(p, grid, s); break;
    case 4: launch_bits<4>(p, grid, s); break;
    case 5: launch_bits<5>(p, grid, s); break;
    case 6: launch_bits<6>(p, grid, s); break;
    default: launch_bits<8>(p, grid, s); break;
  }
  if (splits > 1) {
    const int64_t TN = T * w.rows;
    const int blocks = int(std::min<int64_t>((TN + 255) / 256, int64_t(n_sms) * 8));
    affine_reduce_kernel<<<blocks, 256, 0, s>>>(scratch, splits, TN, w.rows, bias, y, p.y_f32);
    ARBOR_LAUNCH_CHECK("affine_reduce_kernel");
  }
}

void launch_affine_dequant(const AffineWeights& w, int64_t row0, int64_t n, uint16_t* out, int n_sms, cudaStream_t s) {
  check_weights(w);
  if (row0 < 0 || n < 0 || row0 + n > w.rows) fail_printf("affine dequant: rows [%lld, %lld) of a %lld-row weight", (long long)row0,
                                                            (long long)(row0 + n), (long long)w.rows);
  if ((reinterpret_cast<uintptr_t>(out) & 15) != 0) fail_printf("affine dequant: the output must be 16-byte aligned");
  if (n == 0) return;
  const int gs_shift = w.group_size == 32 ? 5 : w.group_size == 64 ? 6 : 7;
  const int64_t total = n * (w.cols / 8);
  const int blocks = int(std::min<int64_t>((total + 255) / 256, int64_t(n_sms) * 16));
  switch (w.bits) {
#define ARBOR_AFF_DEQ(B) \
  case B: affine_dequant_kernel<B><<<blocks, 256, 0, s>>>(w.codes, w.sb, w.sb_f16, row0, n, w.cols, gs_shift, out); break;
    ARBOR_AFF_DEQ(2) ARBOR_AFF_DEQ(3) ARBOR_AFF_DEQ(4) ARBOR_AFF_DEQ(5) ARBOR_AFF_DEQ(6) ARBOR_AFF_DEQ(8)
#undef ARBOR_AFF_DEQ
  }
  ARBOR_LAUNCH_CHECK("affine_dequant_kernel");
}

}  // namespace arbor::cuda
