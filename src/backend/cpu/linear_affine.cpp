// Affine linear layers (linear_affine.h): argument checks, the reference kernel, and the choice of kernel
// (ISA level x GEMV/GEMM) with the once-per-call preparation both fast paths share (x permuted into the
// decode order, Σx per group) and the thread splits.
#include "backend/cpu/linear_affine.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "core/error.h"
#include "quant/affine.h"

namespace arbor::cpu {

namespace {

inline float scale_at(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

void check_args(const char* who, const float* x, int64_t T, const AffineMatrix& w, float* y) {
  ARBOR_CHECK(w.bits == 2 || w.bits == 3 || w.bits == 4 || w.bits == 5 || w.bits == 6 || w.bits == 8,
              "{}: {} bits not supported (supported: 2, 3, 4, 5, 6, 8)", who, w.bits);
  ARBOR_CHECK(w.group_size == 32 || w.group_size == 64 || w.group_size == 128, "{}: group size {} not supported (supported: 32, 64, 128)",
              who, w.group_size);
  ARBOR_CHECK(w.sdtype == DType::F32 || w.sdtype == DType::F16 || w.sdtype == DType::BF16,
              "{}: scales/biases dtype {} not supported (supported: F32, F16, BF16)", who, dtype_name(w.sdtype));
  ARBOR_CHECK(T >= 0 && w.N >= 1 && w.K >= 1 && w.K % w.group_size == 0, "{}: bad shape x [{}, {}], W [{}, {}] in groups of {}", who, T,
              w.K, w.N, w.K, w.group_size);
  ARBOR_CHECK(T == 0 || (x && w.packed && w.scales && w.biases && y), "{}: null pointer", who);
}

bool isa_supported(LinearIsa isa) {
  for (LinearIsa i : linear_isas_supported())
    if (i == isa) return true;
  return false;
}

// Per-thread scratch that grows once and is then reused (64-byte aligned); one buffer per Tag.
template <int Tag>
float* thread_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n + 16) buf.resize(n + 16);
  auto p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
}

// Rows of W per GEMV work grain (the split is static: one contiguous run of rows per thread, as the
// dense GEMV).
constexpr int64_t kGemvGrain = 16;

// Columns [c0, c1) of one row of x (c0, c1 multiples of the group size): xp in the decode order of kLanes-lane
// vectors (xp[u + kLanes*k + i] = x[u + (32/kLanes)*i + k] per 32-column unit u), and Σx per group, summed
// as 8 partial f32 sums of G/8 terms each.
constexpr int64_t kPrepCols = 1024;  // a multiple of every group size
constexpr int64_t kPrepInlineCols = 16384;  // q8 GEMV: T·K up to this prepared on the calling thread
template <int kLanes>
void prepare(const float* xr, int64_t c0, int64_t c1, int64_t G, float* xp, float* sx) {
  constexpr int c = 32 / kLanes;
  for (int64_t u = c0; u < c1; u += 32)
    for (int k = 0; k < c; ++k)
      for (int i = 0; i < kLanes; ++i) xp[u + kLanes * k + i] = xr[u + c * i + k];
  for (int64_t g0 = c0; g0 < c1; g0 += G) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = g0; j < g0 + G; j += 8)
      for (int l = 0; l < 8; ++l) acc[l] += xr[j + l];
    sx[g0 / G] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
}

}  // namespace

void affine_dequantize_row(const AffineMatrix& w, int64_t n, float* out) {
  const int64_t words = w.K * w.bits / 32, groups = w.K / w.group_size;
  const uint32_t* row = w.packed + n * words;
  for (int64_t g = 0; g < groups; ++g) {
    const float sg = scale_at(w.scales, w.sdtype, n * groups + g), bg = scale_at(w.biases, w.sdtype, n * groups + g);
    for (int64_t j = g * w.group_size; j < (g + 1) * w.group_size; ++j) {
      const float p = sg * float(quant::affine_get_code(row, j, w.bits));  // separate multiply and add
      out[j] = p + bg;
    }
  }
}

void linear_affine_reference(ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w, const float* bias, float* y) {
  check_args("linear_affine_reference", x, T, w, y);
  if (T == 0) return;
  const int64_t K = w.K;
  // About 64 KiB of codes per chunk, at least one row.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, K * w.bits / 8));
  pool.parallel_for(w.N, grain, [&](int, int64_t n0, int64_t n1) {
    std::vector<float> row(size_t(K), 0.0f);
    for (int64_t n = n0; n < n1; ++n) {
      affine_dequantize_row(w, n, row.data());
      const float bn = bias ? bias[n] : 0.0f;
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * K;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t k = 0;
        for (; k + 8 <= K; k += 8)
          for (int u = 0; u < 8; ++u) acc[u] += row[size_t(k + u)] * xt[k + u];
        for (; k < K; ++k) acc[0] += row[size_t(k)] * xt[k];
        const float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        y[t * w.N + n] = sum + bn;
      }
    }
  });
}

void linear_affine_q8_reference(ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w, const float* bias, float* y) {
  check_args("linear_affine_q8_reference", x, T, w, y);
  if (T == 0) return;
  const int64_t K = w.K, G = w.group_size, groups = K / G, blocks = K / 32;
  // x quantized per 32 columns (f32 operations as the kernel's: max, divide, multiply, round to nearest even).
  std::vector<int32_t> q(size_t(T * K));
  std::vector<float> d(size_t(T * blocks)), sx(size_t(T * groups));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + t * K + b * 32;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      d[size_t(t * blocks + b)] = amax / 127.0f;
      for (int j = 0; j < 32; ++j) {
        const float v = xb[j] * inv;
        q[size_t(t * K + b * 32 + j)] = int32_t(std::nearbyint(v));
      }
    }
    for (int64_t g = 0; g < groups; ++g) {
      double s = 0;
      for (int64_t j = g * G; j < (g + 1) * G; ++j) s += x[t * K + j];
      sx[size_t(t * groups + g)] = float(s);
    }
  }
  const int64_t words = K * w.bits / 32;
  pool.parallel_for(w.N, 16, [&](int, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint32_t* row = w.packed + n * words;
      for (int64_t t = 0; t < T; ++t) {
        double acc = bias ? bias[n] : 0.0;
        for (int64_t g = 0; g < groups; ++g) {
          double gs = 0;
          for (int64_t b = g * G / 32; b < (g + 1) * G / 32; ++b) {
            int64_t isum = 0;
            for (int64_t j = b * 32; j < b * 32 + 32; ++j) isum += int64_t(quant::affine_get_code(row, j, w.bits)) * q[size_t(t * K + j)];
            gs += double(d[size_t(t * blocks + b)]) * double(isum);
          }
          acc += double(scale_at(w.scales, w.sdtype, n * groups + g)) * gs +
                 double(scale_at(w.biases, w.sdtype, n * groups + g)) * double(sx[size_t(t * groups + g)]);
        }
        y[t * w.N + n] = float(acc);
      }
    }
  });
}

namespace {
bool bf16_gemm(LinearIsa isa, int64_t T, GemmMode mode) {
  return isa == LinearIsa::Avx512Bf16 && ((T > kLinearGemvMaxT && mode == GemmMode::Bf16) || mode == GemmMode::Bf16Prompt);
}
bool q8_gemv(LinearIsa isa, int64_t T, GemmMode mode, int bits) {
  return mode == GemmMode::Bf16 && T <= kLinearGemvMaxT && linear_affine_q8_applies(isa, bits);
}
// The q8 GEMV's VNNI form: on the AVX-512 levels of a CPU with AVX512_VNNI (cpu_features honours
// ARBOR_CPU_MAX_ISA, so avx512 or below turns it off); the AVX2 form otherwise.
bool q8_vnni(LinearIsa isa) {
  return (isa == LinearIsa::Avx512 || isa == LinearIsa::Avx512Bf16) && cpu_features().avx512_vnni;
}
// 3, 5 and 6 bits: the VNNI form with VBMI's byte permute and bit-field extraction (no AVX2 form).
bool q8_vbmi(LinearIsa isa) { return q8_vnni(isa) && cpu_features().avx512_vbmi; }
bool q8_vbmi_bits(int bits) { return bits == 3 || bits == 5 || bits == 6; }
}  // namespace

bool linear_affine_q8_applies(LinearIsa isa, int bits) {
  if (q8_vbmi_bits(bits)) return q8_vbmi(isa);
  return isa != LinearIsa::Scalar && (bits == 2 || bits == 4 || bits == 8);
}

bool linear_affine_q8_applies(int bits) { return linear_affine_q8_applies(linear_isas_supported().back(), bits); }

std::string linear_affine_kernel_name(LinearIsa isa, int64_t T, GemmMode mode, int bits) {
  if (isa == LinearIsa::Scalar) return "scalar-affine-reference";
  if (bf16_gemm(isa, T, mode)) return "avx512bf16-affine-gemm-bf16";
  if (q8_gemv(isa, T, mode, bits))
    return q8_vbmi_bits(bits) ? "avx512vbmi-affine-gemv-q8" : q8_vnni(isa) ? "avx512vnni-affine-gemv-q8" : "avx2-affine-gemv-q8";
  if (isa == LinearIsa::Avx512Bf16) isa = LinearIsa::Avx512;  // the exact paths use no bf16 instructions
  return fmt::format("{}-affine-{}", linear_isa_name(isa), T <= kLinearGemvMaxT ? "gemv" : "gemm");
}

std::string linear_affine_kernel_name(int64_t T, GemmMode mode, int bits) {
  return linear_affine_kernel_name(linear_isas_supported().back(), T, mode, bits);
}

namespace {
// The q8 GEMV over n matrices of one K, bits and group size, all reading x: x quantized per 32 columns into
// the decode order, per span the lanes' d, Σx per group, once on the caller's scratch in chunks of kPrepCols
// columns of one token row; then the rows of all the matrices, end to end, over the pool in one pass.
void q8_run(LinearIsa isa, ThreadPool& pool, const float* x, int64_t T, const AffineOut* outs, int n) {
  const AffineMatrix& w = outs[0].w;
  const bool vnni = q8_vnni(isa);
  const int64_t K = w.K, G = w.group_size, groups = K / G;
  const int64_t S = vnni ? affine_detail::q8_span_codes_avx512(w.bits) : affine_detail::q8_span_codes(w.bits);
  const int64_t lanes = vnni ? 16 : 8, spans = (K + S - 1) / S, Kp = spans * S, xb = !vnni && w.bits == 8 ? 2 : 1;
  auto* xq = reinterpret_cast<uint8_t*>(thread_scratch<3>(size_t((T * Kp * xb + 3) / 4)));
  float* xd = thread_scratch<4>(size_t(T * spans * lanes));
  float* sx = thread_scratch<1>(size_t(T * groups));
  auto prep = vnni ? affine_detail::q8_prepare_avx512 : affine_detail::q8_prepare_avx2;
  const int64_t chunks = (K + kPrepCols - 1) / kPrepCols;
  auto prep_range = [&](int, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / chunks, c0 = (i % chunks) * kPrepCols, c1 = std::min(K, c0 + kPrepCols);
      prep(x + t * K, K, G, w.bits, c0, c1, xq + t * Kp * xb, xd + t * spans * lanes, sx + t * groups);
    }
  };
  // A decode row's x is a few microseconds of work: on the caller, without a second fork and join.
  if (T * K <= kPrepInlineCols) prep_range(0, 0, T * chunks);
  else pool.parallel_for(T * chunks, 1, prep_range);
  constexpr int kMaxOuts = 8;
  ARBOR_CHECK(n >= 1 && n <= kMaxOuts, "linear_affine_multi: {} matrices (1..{})", n, kMaxOuts);
  affine_detail::Q8Args a[kMaxOuts];
  int64_t first[kMaxOuts + 1] = {0};  // matrix i's rows are [first[i], first[i+1]) of the pass
  for (int i = 0; i < n; ++i) {
    const AffineMatrix& m = outs[i].w;
    a[i] = affine_detail::Q8Args{xq, xd, sx, T, K, m.N, reinterpret_cast<const uint8_t*>(m.packed), m.scales, m.biases, m.sdtype,
                                 m.bits, int(G), outs[i].bias, outs[i].y};
    first[i + 1] = first[i] + m.N;
  }
  auto gemv = vnni ? affine_detail::q8_gemv_avx512vnni : affine_detail::q8_gemv_avx2;
  pool.parallel_for(first[n], kGemvGrain, [&](int, int64_t r0, int64_t r1) {
    for (int i = 0; i < n; ++i) {
      const int64_t lo = std::max(r0, first[i]), hi = std::min(r1, first[i + 1]);
      if (lo < hi) gemv(a[i], lo - first[i], hi - first[i]);
    }
  });
}
}  // namespace

bool linear_affine_multi_fuses(const AffineMatrix* ws, int n, int64_t T, GemmMode mode) {
  static const LinearIsa best = linear_isas_supported().back();
  if (n < 1 || n > 8 || !q8_gemv(best, T, mode, ws[0].bits)) return false;
  for (int i = 1; i < n; ++i)
    if (ws[i].K != ws[0].K || ws[i].bits != ws[0].bits || ws[i].group_size != ws[0].group_size) return false;
  return true;
}

void linear_affine_multi(ThreadPool& pool, const float* x, int64_t T, const AffineOut* outs, int n, GemmMode mode) {
  static const LinearIsa best = linear_isas_supported().back();
  ARBOR_CHECK(n >= 1 && n <= 8, "linear_affine_multi: {} matrices (1..8)", n);
  AffineMatrix ws[8];
  for (int i = 0; i < n; ++i) {
    check_args("linear_affine_multi", x, T, outs[i].w, outs[i].y);
    ws[i] = outs[i].w;
  }
  if (T == 0) return;
  if (!linear_affine_multi_fuses(ws, n, T, mode)) {
    for (int i = 0; i < n; ++i) linear_affine_with_isa(best, pool, x, T, outs[i].w, outs[i].bias, outs[i].y, mode);
    return;
  }
  q8_run(best, pool, x, T, outs, n);
}

void linear_affine_with_isa(LinearIsa isa, ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w, const float* bias,
                            float* y, GemmMode mode) {
  check_args("linear_affine", x, T, w, y);
  ARBOR_CHECK(isa_supported(isa), "linear_affine: kernel level '{}' not supported by this CPU ({}; supported: {})", linear_isa_name(isa),
              cpu_features().brand, cpu_features().summary());
  if (T == 0) return;
  if (isa == LinearIsa::Scalar) return linear_affine_reference(pool, x, T, w, bias, y);
  if (bf16_gemm(isa, T, mode)) {
    // Natural column pairs (pack_panel_bf16_avx512bf16): x is rounded by gemm_bf16 itself, no permutation.
    const affine_detail::Args a{nullptr, nullptr, T, w.K, w.N, reinterpret_cast<const uint8_t*>(w.packed), w.scales, w.biases, w.sdtype,
                                w.bits, w.group_size, bias, y};
    return gemm_bf16_panels(pool, x, T, w.K, w.N, bias, y, affine_detail::pack_panel_bf16_avx512bf16, &a);
  }
  if (q8_gemv(isa, T, mode, w.bits)) {
    const AffineOut out{w, bias, y};
    return q8_run(isa, pool, x, T, &out, 1);
  }
  const bool avx2 = isa == LinearIsa::Avx2;
  const int64_t K = w.K, G = w.group_size, groups = K / G;
  // x permuted into the decode order of each 32-code unit, and Σx per group: once per call, on the caller's
  // scratch (the workers only read it), in chunks of kPrepCols columns of one token row.
  float* xp = thread_scratch<0>(size_t(T * K));
  float* sx = thread_scratch<1>(size_t(T * groups));
  const int64_t chunks = (K + kPrepCols - 1) / kPrepCols;
  pool.parallel_for(T * chunks, 1, [&](int, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / chunks, c0 = (i % chunks) * kPrepCols, c1 = std::min(K, c0 + kPrepCols);
      if (avx2)
        prepare<8>(x + t * K, c0, c1, G, xp + t * K, sx + t * groups);
      else
        prepare<16>(x + t * K, c0, c1, G, xp + t * K, sx + t * groups);
    }
  });
  const affine_detail::Args a{xp, sx, T, K, w.N, reinterpret_cast<const uint8_t*>(w.packed), w.scales, w.biases, w.sdtype, w.bits,
                              w.group_size, bias, y};
  if (T <= kLinearGemvMaxT) {
    auto fn = avx2 ? affine_detail::gemv_avx2 : affine_detail::gemv_avx512;
    pool.parallel_for(w.N, kGemvGrain, [&](int, int64_t n0, int64_t n1) { fn(a, n0, n1); });
    return;
  }
  // Prefill: the dense blocked GEMM over dequantized panels, on the permuted x. Split by column panels when
  // there are enough of them, else by tokens (a small N), as the dense GEMM.
  auto gemm = avx2 ? linear_detail::gemm_avx2_panels : linear_detail::gemm_avx512_panels;
  auto pack = avx2 ? affine_detail::pack_panel_avx2 : affine_detail::pack_panel_avx512;
  const linear_detail::Args d{xp, T, K, nullptr, DType::F32, w.N, bias, y};
  const int64_t panels = (w.N + linear_detail::kGemmPanelN - 1) / linear_detail::kGemmPanelN;
  if (pool.size() == 1 || panels >= 2 * pool.size() || T < 2 * pool.size()) {
    pool.parallel_for(w.N, linear_detail::kGemmPanelN, [&](int, int64_t n0, int64_t n1) {
      gemm(d, n0, n1, thread_scratch<2>(linear_detail::kGemmScratchFloats), pack, &a);
    });
    return;
  }
  pool.parallel_for(T, 1, [&](int, int64_t t0, int64_t t1) {
    linear_detail::Args s = d;
    s.x = xp + t0 * K, s.y = y + t0 * w.N, s.T = t1 - t0;
    gemm(s, 0, w.N, thread_scratch<2>(linear_detail::kGemmScratchFloats), pack, &a);
  });
}

void linear_affine(ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w, const float* bias, float* y, GemmMode mode) {
  static const LinearIsa best = linear_isas_supported().back();
  linear_affine_with_isa(best, pool, x, T, w, bias, y, mode);
}

}  // namespace arbor::cpu
