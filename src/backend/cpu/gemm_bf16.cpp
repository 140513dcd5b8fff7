// The bf16-activation prefill GEMM (gemm_bf16.h): x rounded to bf16 pairs once per call, bf16 weights (f16 ones
// rounded to bf16 on the way) packed into 32-column panels of k pairs (one 16x16 transpose of 32-bit words per 16
// pairs x 16 rows), a 12 x 32 register tile of f32 accumulators fed by one vdpbf16ps per weight vector and token
// row (the token's pair broadcast from memory). Blocking, outermost first, per thread's column range:
// 256 tokens x 256 columns, finished one k block (kKCP pairs) at a time, so that block's x slice
// (256 x kKCP x 4 B) and y block (256 KiB) stay in L2 while each packed panel (32 x kKCP x 4 B) sits in
// L1 for all 256 tokens. Also the dot-product peak microbenchmark bench measures prefill against.
#include "backend/cpu/avx512_common.h"  // first: it must precede <immintrin.h>

#include "backend/cpu/gemm_bf16.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "core/error.h"

namespace arbor::cpu {

namespace {

constexpr int kMR = 12;          // token rows per register tile: 12 x 2 accumulators + 2 weight vectors
constexpr int64_t kNR = 32;      // columns per packed panel (two zmm of f32 sums)
constexpr int64_t kKCP = kGemmBf16PanelPairs;  // k pairs per packed panel: 256 x 32 x 4 B = 32 KiB (L1 is 48 KiB here)
constexpr int64_t kBlockT = 256; // tokens per cache block
constexpr int64_t kGroupN = 256; // columns per cache block

struct Job {
  const uint32_t* xb;  // [T, ldx] bf16 pairs of x (zero past K; the pad past Kh is never read)
  int64_t T, K, Kh;    // Kh = ceil(K / 2)
  int64_t ldx;         // xb's row stride in words: x_row_stride(Kh)
  const uint16_t* W;   // [N, K] bf16, or f16 when f16 (rounded to bf16 as panels are packed)
  bool f16;
  int64_t N;
  const float* bias;
  float* y;            // [T, N]
};

// Per-thread scratch that grows once and is then reused (64-byte aligned); one buffer per Tag.
template <int Tag, typename T>
T* thread_scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n + 64 / sizeof(T)) buf.resize(n + 64 / sizeof(T));
  auto p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<T*>((p + 63) & ~uintptr_t(63));
}

// P[p][j] (p < kcp rounded up to 16, j < 32) = the bf16 pair W[nb+j][2(pb+p)], W[nb+j][2(pb+p)+1] as
// one 32-bit word; zero past row nb+nw or past K (an odd K gets a zero partner, matching x's zero).
ARBOR_BF16 void pack_panel(const Job& J, int64_t nb, int64_t nw, int64_t pb, int64_t kcp, uint32_t* P) {
  for (int h = 0; h < 2; ++h) {
    for (int64_t g = 0; g < kcp; g += 16) {
      const int64_t k0 = 2 * (pb + g);
      const int64_t left = J.K - k0;  // elements of the row left from this group on
      const __mmask32 m = left >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << left) - 1);
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t j = 16 * h + i;
        r[i] = j < nw ? _mm512_maskz_loadu_epi16(m, J.W + (nb + j) * J.K + k0) : _mm512_setzero_si512();
        if (J.f16) {  // 32 f16 -> f32 -> 32 bf16 (round to nearest even), in order; masked-off zeros stay zero
          const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(r[i]));
          const __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(r[i], 1));
          r[i] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
        }
      }
      transpose16x16_epi32(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_store_si512(P + (g + i) * kNR + 16 * h, r[i]);
    }
  }
}

// y[0..MR, 0..32 masked] (+)= xb[0..MR, pairs 0..kcp] · P; on the first k block y is overwritten
// (+ bias). One vdpbf16ps per (row, weight vector, k pair).
template <int MR>
ARBOR_BF16 void tile(const uint32_t* xs, int64_t ldx, const uint32_t* P, int64_t kcp, float* y, int64_t ldy,
                     __mmask16 m0, __mmask16 m1, const float* bias, bool first) {
  __m512 acc[MR][2];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kcp; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_load_si512(P + p * kNR);
    const __m512bh w1 = (__m512bh)_mm512_load_si512(P + p * kNR + 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(int(xs[i * ldx + p]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], w0, xv);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], w1, xv);
    }
  }
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (first && bias) b0 = _mm512_maskz_loadu_ps(m0, bias), b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* yr = y + i * ldy;
    __m512 v0 = first ? b0 : _mm512_maskz_loadu_ps(m0, yr);
    __m512 v1 = first ? b1 : _mm512_maskz_loadu_ps(m1, yr + 16);
    _mm512_mask_storeu_ps(yr, m0, _mm512_add_ps(v0, acc[i][0]));
    _mm512_mask_storeu_ps(yr + 16, m1, _mm512_add_ps(v1, acc[i][1]));
  }
}

template <int MR>
ARBOR_BF16 void tile_any(int mr, const uint32_t* xs, int64_t ldx, const uint32_t* P, int64_t kcp, float* y,
                         int64_t ldy, __mmask16 m0, __mmask16 m1, const float* bias, bool first) {
  if constexpr (MR > 1) {
    if (mr < MR) return tile_any<MR - 1>(mr, xs, ldx, P, kcp, y, ldy, m0, m1, bias, first);
  }
  tile<MR>(xs, ldx, P, kcp, y, ldy, m0, m1, bias, first);
}

ARBOR_BF16 void pack_dense(const void* ctx, int64_t nb, int64_t nw, int64_t pb, int64_t kcp, uint32_t* P) {
  pack_panel(*static_cast<const Job*>(ctx), nb, nw, pb, kcp, P);
}

// The dense weight rows the next panel will pack, fetched into L2 a slice at a time while the current
// panel's tiles run: without it each pack waited on memory (32 rows, 1 KiB of each, rows 4 KiB or more
// apart), and packing took ~20 % of the GEMM's time on Zen 5 at 512 tokens (measured by skipping it:
// 65 -> 84 % of the dot peak).
struct PanelPrefetch {
  const char* base = nullptr;  // first byte of row 0's range; null: nothing to fetch
  int64_t row_bytes = 0, rows = 0, stride = 0;
  int64_t per_row() const { return (row_bytes + 63) / 64 + 1; }  // +1: the range need not start on a line
  int64_t lines() const { return base ? rows * per_row() : 0; }
  void fetch(int64_t l0, int64_t l1) const {  // lines [l0, l1) of lines(), row-major
    const int64_t pr = per_row();
    for (int64_t l = l0; l < l1; ++l) _mm_prefetch(base + (l / pr) * stride + (l % pr) * 64, _MM_HINT_T1);
  }
};

// Output columns [n0, n1) for tokens [t0, t1); `pack` supplies each weight panel (dense weights, J.W
// set: the next panel's rows are prefetched).
ARBOR_BF16 void gemm_range(const Job& J, int64_t t0, int64_t t1, int64_t n0, int64_t n1, uint32_t* P, Bf16PanelPacker pack,
                           const void* ctx) {
  // The panel after (nb, pb) in this loop order: the group's next columns, else its next k block, else
  // the next group's first (or the next token block's).
  auto next_panel = [&](int64_t ng, int64_t ne, int64_t nb, int64_t pb) {
    PanelPrefetch f;
    if (!J.W) return f;
    int64_t nn = nb + kNR, pn = pb, en = ne;
    if (nn >= ne) {
      nn = ng, pn = pb + kKCP;
      if (pn >= J.Kh) nn = ng + kGroupN, pn = 0, en = std::min(n1, nn + kGroupN);
      if (nn >= n1) nn = n0, pn = 0, en = std::min(n1, n0 + kGroupN);
    }
    const int64_t k0 = 2 * pn;
    f.base = reinterpret_cast<const char*>(J.W + nn * J.K + k0);
    f.row_bytes = 2 * std::min(J.K - k0, 2 * kKCP);
    f.rows = std::min(kNR, en - nn);
    f.stride = 2 * J.K;
    return f;
  };
  for (int64_t tb = t0; tb < t1; tb += kBlockT) {
    const int64_t te = std::min(t1, tb + kBlockT);
    const int64_t tiles = (te - tb + kMR - 1) / kMR;
    for (int64_t ng = n0; ng < n1; ng += kGroupN) {
      const int64_t ne = std::min(n1, ng + kGroupN);
      for (int64_t pb = 0; pb < J.Kh; pb += kKCP) {
        const int64_t kcp = std::min(kKCP, J.Kh - pb);
        for (int64_t nb = ng; nb < ne; nb += kNR) {
          const int64_t nw = std::min(kNR, ne - nb);
          const uint32_t cols = nw >= 32 ? 0xffffffffu : (1u << nw) - 1;
          const __mmask16 m0 = __mmask16(cols), m1 = __mmask16(cols >> 16);
          pack(ctx, nb, nw, pb, kcp, P);
          const PanelPrefetch pf = next_panel(ng, ne, nb, pb);
          const int64_t lines = pf.lines();
          for (int64_t i = 0, t = tb; t < te; ++i, t += kMR) {
            pf.fetch(lines * i / tiles, lines * (i + 1) / tiles);
            const int mr = int(std::min<int64_t>(kMR, te - t));
            tile_any<kMR>(mr, J.xb + t * J.ldx + pb, J.ldx, P, kcp, J.y + t * J.N + nb, J.N, m0, m1,
                          J.bias ? J.bias + nb : nullptr, pb == 0);
          }
        }
      }
    }
  }
}

// xb's row stride: Kh rounded up to an odd multiple of 16 words (64 B), so that the kMR rows a tile
// reads at once fall in kMR different L1 sets. At Kh = 1024 or 4096 (K = 2048, 8192) the plain stride
// is a multiple of 4 KiB: all 12 rows then share one set of the 12-way L1 with the packed panel, and
// on Zen 5 the micro-kernel ran at 300 GFLOP/s a thread instead of 405 (a standalone loop, session 20).
int64_t x_row_stride(int64_t Kh) {
  const int64_t lines = (Kh + 15) / 16;
  return 16 * (lines | 1);
}

// Rows [t0, t1) of x [T, K] -> xb [T, ldx]: bf16 round-to-nearest-even, pairs in order, zero past K.
ARBOR_BF16 void round_rows(const float* x, int64_t K, int64_t Kh, int64_t ldx, int64_t t0, int64_t t1, uint32_t* xb) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* xr = x + t * K;
    uint32_t* out = xb + t * ldx;
    for (int64_t k = 0; k < K; k += 32) {
      const int64_t left = K - k;
      const __mmask16 m0 = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
      const __mmask16 m1 = left >= 32 ? __mmask16(0xffff) : left > 16 ? __mmask16((1u << (left - 16)) - 1) : __mmask16(0);
      const __m512 a = _mm512_maskz_loadu_ps(m0, xr + k), b = _mm512_maskz_loadu_ps(m1, xr + k + 16);
      const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a's 16 in the low half, b's above
      const int64_t words = std::min<int64_t>(16, Kh - k / 2);
      _mm512_mask_storeu_epi32(out + k / 2, __mmask16((1u << words) - 1), v);
    }
  }
}

// ---- Peak microbenchmark ----------------------------------------------------------------------------
// 24 independent accumulator chains (enough to cover 2 ports x latency <= 12 on any core), `iters`
// rounds each; the result is summed so the compiler keeps the work. Returns FLOP per round. No asm
// barrier on the accumulators: one (session 18 removed it) made GCC keep the array in memory and store
// all 24 registers every round, which held Zen 5 to a third of its vdpbf16ps rate (137 of ~410 GFLOP/s a
// thread) — below what the GEMM itself reached, so prefill read as 155 % of "peak".
ARBOR_BF16 float peak_loop_bf16(int64_t iters, float seed) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(seed * float(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f"))) float peak_loop_fma512(int64_t iters, float seed) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(seed * float(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) float peak_loop_fma256(int64_t iters, float seed) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(seed * float(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float f[8];
  _mm256_store_ps(f, s);
  return f[0] + f[7];
}

}  // namespace

std::string_view gemm_mode_name(GemmMode m) {
  return m == GemmMode::Exact ? "exact" : m == GemmMode::Bf16 ? "bf16" : "bf16-prompt";
}

GemmMode parse_gemm_mode(std::string_view s, const char* what) {
  if (s == "exact") return GemmMode::Exact;
  if (s == "bf16") return GemmMode::Bf16;
  fail("arguments: {} must be 'exact' or 'bf16', got '{}'", what, s);
}

bool gemm_bf16_applies(DType wtype) { return (wtype == DType::BF16 || wtype == DType::F16) && cpu_features().avx512_bf16; }

namespace {

// x rounded to bf16 pairs once, then the blocked GEMM with `pack`'s panels (ctx == nullptr: the dense
// weights of the Job).
void run_gemm(ThreadPool& pool, const float* x, int64_t T, int64_t K, const uint16_t* W, bool w_f16, int64_t N, const float* bias,
              float* y, Bf16PanelPacker pack, const void* ctx) {
  const int64_t Kh = (K + 1) / 2, ldx = x_row_stride(Kh);
  uint32_t* xb = thread_scratch<0, uint32_t>(size_t(T * ldx));  // the caller's: kept for the workers
  pool.parallel_for(T, 1, [&](int, int64_t t0, int64_t t1) { round_rows(x, K, Kh, ldx, t0, t1, xb); });
  const Job J{xb, T, K, Kh, ldx, W, w_f16, N, bias, y};
  if (!ctx) ctx = &J;
  const int64_t threads = pool.size(), panels = (N + kNR - 1) / kNR;
  // By column panels when there are enough of them (each thread streams its own weights once per
  // token block), else by tokens (a small N: a router, a test shape).
  if (threads == 1 || panels >= 2 * threads || T < 2 * threads) {
    pool.parallel_for(N, kNR, [&](int, int64_t n0, int64_t n1) {
      gemm_range(J, 0, T, n0, n1, thread_scratch<1, uint32_t>(size_t(kNR * kKCP)), pack, ctx);
    });
  } else {
    pool.parallel_for(T, 1, [&](int, int64_t t0, int64_t t1) {
      gemm_range(J, t0, t1, 0, N, thread_scratch<1, uint32_t>(size_t(kNR * kKCP)), pack, ctx);
    });
  }
}

}  // namespace

void gemm_bf16(ThreadPool& pool, const float* x, int64_t T, int64_t K, const void* W, DType wtype, int64_t N,
               const float* bias, float* y) {
  ARBOR_CHECK(gemm_bf16_applies(wtype), "gemm_bf16: needs bf16 or f16 weights and an AVX-512 BF16 CPU (weights {}, CPU {}: {})",
              dtype_name(wtype), cpu_features().brand, cpu_features().summary());
  ARBOR_CHECK(T >= 0 && K >= 1 && N >= 1, "gemm_bf16: bad shape x [{}, {}], W [{}, {}]", T, K, N, K);
  ARBOR_CHECK(T == 0 || (x && W && y), "gemm_bf16: null pointer (x={}, W={}, y={})", fmt::ptr(x), fmt::ptr(W), fmt::ptr(y));
  if (T == 0) return;
  run_gemm(pool, x, T, K, static_cast<const uint16_t*>(W), wtype == DType::F16, N, bias, y, pack_dense, nullptr);
}

void gemm_bf16_panels(ThreadPool& pool, const float* x, int64_t T, int64_t K, int64_t N, const float* bias, float* y,
                      Bf16PanelPacker pack, const void* ctx) {
  ARBOR_CHECK(cpu_features().avx512_bf16, "gemm_bf16: needs an AVX-512 BF16 CPU (CPU {}: {})", cpu_features().brand,
              cpu_features().summary());
  ARBOR_CHECK(T >= 0 && K >= 1 && N >= 1 && pack && ctx, "gemm_bf16_panels: bad shape x [{}, {}], W [{}, {}] or no packer", T, K, N, K);
  if (T == 0) return;
  run_gemm(pool, x, T, K, nullptr, false, N, bias, y, pack, ctx);
}

void gemm_bf16_reference(const float* x, int64_t T, int64_t K, const void* W, int64_t N, const float* bias, float* y) {
  const uint16_t* w = static_cast<const uint16_t*>(W);
  std::vector<double> xr(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) xr[size_t(k)] = double(bf16_to_f32(f32_to_bf16(x[t * K + k])));
    for (int64_t n = 0; n < N; ++n) {
      double s = bias ? double(bias[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += xr[size_t(k)] * double(bf16_to_f32(w[n * K + k]));
      y[t * N + n] = float(s);
    }
  }
}

DotPeak measure_dot_peak(ThreadPool& pool, double seconds) {
  using Clock = std::chrono::steady_clock;
  const CpuFeatures& f = cpu_features();
  DotPeak r;
  r.threads = pool.size();
  float (*loop)(int64_t, float) = nullptr;
  double flop_per_iter = 0;
  if (f.avx512_bf16) {
    loop = peak_loop_bf16, flop_per_iter = 24 * 64, r.what = "vdpbf16ps zmm";  // 16 lanes x 2 pairs x 2 FLOP
  } else if (f.avx512) {
    loop = peak_loop_fma512, flop_per_iter = 24 * 32, r.what = "vfmadd231ps zmm";
  } else if (f.avx2) {
    loop = peak_loop_fma256, flop_per_iter = 12 * 16, r.what = "vfmadd231ps ymm";
  } else {
    r.what = "scalar";
    return r;
  }
  // Calibrate on one thread, then run every thread at once for about `seconds`, twice; the best of
  // the two (on a shared machine the first can lose time to a neighbour).
  int64_t iters = 1 << 14;
  for (;;) {
    auto t0 = Clock::now();
    volatile float sink = loop(iters, 1e-3f);
    (void)sink;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0.02 || iters > (int64_t(1) << 34)) {
      iters = std::max<int64_t>(1, int64_t(double(iters) * seconds / 2 / std::max(s, 1e-9)));
      break;
    }
    iters *= 4;
  }
  for (int rep = 0; rep < 2; ++rep) {
    std::atomic<int64_t> ns_max{0};
    std::atomic<int> sum_sink{0};
    pool.run_on_all([&](int) {
      auto t0 = Clock::now();
      const float v = loop(iters, 1e-3f);
      const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      int64_t prev = ns_max.load();
      while (ns > prev && !ns_max.compare_exchange_weak(prev, ns)) {
      }
      sum_sink += v > 0 ? 1 : 0;
    });
    // The slowest thread bounds the rate every thread sustained together.
    const double rate = double(iters) * flop_per_iter * double(r.threads) / (double(ns_max.load()) * 1e-9);
    r.flops = std::max(r.flops, rate);
  }
  return r;
}

}  // namespace arbor::cpu
