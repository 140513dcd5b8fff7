// LDLQ for the trellis encoder (trellis_ldlq.h): the input Hessian, its factor, and the coding loops for
// both axes.
#include "quant/trellis_ldlq.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace arbor::quant {
namespace {

// Calls fn(i0, i1) over [0, n) on the pool (or here), chunks of `grain`.
void over(ThreadPool* pool, int64_t n, int64_t grain, const std::function<void(int, int64_t, int64_t)>& fn) {
  if (pool && n > grain)
    pool->parallel_for(n, grain, fn);
  else
    fn(0, 0, n);
}

// Σ a[p]·b[p] over n doubles in a fixed order for a given kernel (so the factor does not depend on the thread
// count): AVX-512 in 2 x 8 lanes, AVX2 in 2 x 4 lanes (FMA), the plain reference in 4 scalar chains; each ends by adding
// its lanes and the tail in order.
double dot_d_plain(const double* a, const double* b, int64_t n) {
  double s[4] = {0, 0, 0, 0};
  int64_t p = 0;
  for (; p + 4 <= n; p += 4)
    for (int l = 0; l < 4; ++l) s[l] += a[p + l] * b[p + l];
  double t = (s[0] + s[1]) + (s[2] + s[3]);
  for (; p < n; ++p) t += a[p] * b[p];
  return t;
}
__attribute__((target("avx512f"))) double dot_d_avx512(const double* a, const double* b, int64_t n) {
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  int64_t p = 0;
  for (; p + 16 <= n; p += 16) {
    s0 = _mm512_fmadd_pd(_mm512_loadu_pd(a + p), _mm512_loadu_pd(b + p), s0);
    s1 = _mm512_fmadd_pd(_mm512_loadu_pd(a + p + 8), _mm512_loadu_pd(b + p + 8), s1);
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, _mm512_add_pd(s0, s1));
  double t = 0;
  for (int l = 0; l < 8; ++l) t += lanes[l];
  for (; p < n; ++p) t += a[p] * b[p];
  return t;
}
__attribute__((target("avx2,fma"))) double dot_d_avx2(const double* a, const double* b, int64_t n) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t p = 0;
  for (; p + 8 <= n; p += 8) {
    s0 = _mm256_fmadd_pd(_mm256_loadu_pd(a + p), _mm256_loadu_pd(b + p), s0);
    s1 = _mm256_fmadd_pd(_mm256_loadu_pd(a + p + 4), _mm256_loadu_pd(b + p + 4), s1);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(s0, s1));
  double t = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; p < n; ++p) t += a[p] * b[p];
  return t;
}

// In place: the lower Cholesky factor L of the symmetric positive definite a [n, n] (a = L Lᵀ; the
// upper triangle is zeroed). False when a pivot is not positive. Column by column; a column's rows below the
// diagonal (each a dot product with the pivot row) on the pool: each element is summed in the same order as on
// one thread, so the factor is the same bit for bit (an 8B's down projection, n = 14336, is ~1e12 multiply-adds).
using DotD = double (*)(const double*, const double*, int64_t);
bool cholesky_lower(std::vector<double>& a, int64_t n, ThreadPool* pool, DotD dot) {
  for (int64_t j = 0; j < n; ++j) {
    const double d = a[size_t(j * n + j)] - dot(a.data() + j * n, a.data() + j * n, j);
    if (!(d > 0)) return false;
    const double ljj = std::sqrt(d);
    a[size_t(j * n + j)] = ljj;
    const double* aj = a.data() + j * n;
    over(pool, n - j - 1, std::max<int64_t>(1, 32768 / std::max<int64_t>(j, 1)), [&](int, int64_t r0, int64_t r1) {
      for (int64_t i = j + 1 + r0; i < j + 1 + r1; ++i) {
        double* ai = a.data() + i * n;
        ai[j] = (ai[j] - dot(ai, aj, j)) / ljj;
      }
    });
    for (int64_t i = 0; i < j; ++i) a[size_t(i * n + j)] = 0;
  }
  return true;
}

// The upper triangular R with H⁻¹ = Rᵀ R (positive diagonal), without forming H⁻¹: with J the reversal,
// J H J = L Lᵀ gives H = U Uᵀ for U = J L J (upper), so H⁻¹ = U⁻ᵀ U⁻¹ and R = U⁻¹.
bool inverse_cholesky_upper(const std::vector<double>& h, int64_t n, std::vector<double>& r, ThreadPool* pool, DotD dot) {
  std::vector<double> a(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) a[size_t(i * n + j)] = h[size_t((n - 1 - i) * n + (n - 1 - j))];
  if (!cholesky_lower(a, n, pool, dot)) return false;
  std::vector<double> u(static_cast<size_t>(n * n));  // U[i][j] = L[n-1-i][n-1-j], upper
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) u[size_t(i * n + j)] = a[size_t((n - 1 - i) * n + (n - 1 - j))];
  std::vector<double>().swap(a);
  // R = U⁻¹ (upper): column by column, back substitution of U r_c = e_c. The columns are independent: on the pool,
  // the longest first (column c costs ~c²/2), each into a row of rt (R transposed, so its reads run along memory).
  std::vector<double> rt(static_cast<size_t>(n * n), 0.0);
  over(pool, n, 8, [&](int, int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t c = n - 1 - k;
      double* rc = rt.data() + c * n;  // rc[p] = R[p][c]
      rc[c] = 1.0 / u[size_t(c * n + c)];
      for (int64_t i = c - 1; i >= 0; --i) {
        const double* ui = u.data() + i * n;
        rc[i] = -dot(ui + i + 1, rc + i + 1, c - i) / ui[i];
      }
    }
  });
  r.assign(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = i; c < n; ++c) r[size_t(i * n + c)] = rt[size_t(c * n + i)];
  return true;
}

// Σ_t a[r][t]·b[c][t] for a 4 x 4 tile of rows of xᵀ (row stride ld; Tp a multiple of 16 entries, zero-padded),
// into out[r][c]: 16-lane partial sums (AVX-512: 16 accumulators, 8 row loads per 16 entries of t; AVX2: the tile as
// two 4 x 2 halves, 8 accumulators each, within its 16 registers), each summed across its lanes at the end. The
// plain loop is the reference the tests hold them to.
void tile_dots_plain(const float* a, const float* b, int64_t ld, int64_t Tp, float (&out)[4][4]) {
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) {
      float s = 0;
      for (int64_t t = 0; t < Tp; ++t) s += a[r * ld + t] * b[c * ld + t];
      out[r][c] = s;
    }
}
__attribute__((target("avx512f"))) void tile_dots_avx512(const float* a, const float* b, int64_t ld, int64_t Tp, float (&out)[4][4]) {
  __m512 acc[4][4];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < Tp; t += 16) {
    __m512 va[4], vb[4];
    for (int r = 0; r < 4; ++r) va[r] = _mm512_loadu_ps(a + r * ld + t), vb[r] = _mm512_loadu_ps(b + r * ld + t);
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(va[r], vb[c], acc[r][c]);
  }
  alignas(64) float lanes[16];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) {
      _mm512_store_ps(lanes, acc[r][c]);
      float sum = 0;
      for (int l = 0; l < 16; ++l) sum += lanes[l];
      out[r][c] = sum;
    }
}
__attribute__((target("avx2,fma"))) void tile_dots_avx2(const float* a, const float* b, int64_t ld, int64_t Tp, float (&out)[4][4]) {
  for (int c0 = 0; c0 < 4; c0 += 2) {
    __m256 acc[4][2];
    for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t t = 0; t < Tp; t += 8) {
      const __m256 b0 = _mm256_loadu_ps(b + c0 * ld + t), b1 = _mm256_loadu_ps(b + (c0 + 1) * ld + t);
      for (int r = 0; r < 4; ++r) {
        const __m256 va = _mm256_loadu_ps(a + r * ld + t);
        acc[r][0] = _mm256_fmadd_ps(va, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(va, b1, acc[r][1]);
      }
    }
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 2; ++c) {
        const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r][c]), _mm256_extractf128_ps(acc[r][c], 1));
        const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        out[r][c0 + c] = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
      }
  }
}

using TileDots = void (*)(const float*, const float*, int64_t, int64_t, float (&)[4][4]);
bool cpu_has(const char* isa) {
  __builtin_cpu_init();
  if (std::string(isa) == "avx512") return __builtin_cpu_supports("avx512f");
  if (std::string(isa) == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return std::string(isa) == "plain";
}
struct LdlqKernels {
  TileDots tiles;
  DotD dot;
};
LdlqKernels kernels_for(const std::string& isa) {
  if (isa == "avx512") return {tile_dots_avx512, dot_d_avx512};
  if (isa == "avx2") return {tile_dots_avx2, dot_d_avx2};
  return {tile_dots_plain, dot_d_plain};
}
std::string g_isa;  // set_ldlq_isa's choice; empty: the best this CPU has
LdlqKernels kernels() {
  static const LdlqKernels best = kernels_for(cpu_has("avx512") ? "avx512" : cpu_has("avx2") ? "avx2" : "plain");
  return g_isa.empty() ? best : kernels_for(g_isa);
}

}  // namespace

bool set_ldlq_isa(const std::string& isa) {
  if (!isa.empty() && !cpu_has(isa.c_str())) return false;
  g_isa = isa;
  return true;
}

bool ldlq_inverse_factor(const std::vector<double>& h, int64_t n, std::vector<double>& r, ThreadPool* pool) {
  return inverse_cholesky_upper(h, n, r, pool, kernels().dot);
}

void InputHessian::add(const float* x, int64_t T, ThreadPool* pool) {
  if (T <= 0) return;
  const int64_t n = n_;
  // xᵀ [n rounded up to 4, T rounded up to 16], zero-padded, so each Σ_t x_i x_j is a dot product of two rows. The
  // upper triangle in work items of 16 rows i x 64 rows j (the i rows stay in L1, the j rows in L2 across the item),
  // 4 x 4 tiles inside, each summed in f32 over this call's rows, then into the double sum. The items are
  // independent (each (i, j) is one item's), so they run on the pool in any order.
  const TileDots dots = kernels().tiles;
  const int64_t ld = (T + 15) / 16 * 16, n4 = (n + 3) / 4 * 4;
  std::vector<float> xt(static_cast<size_t>(n4 * ld), 0.0f);
  over(pool, n, 64, [&](int, int64_t i0, int64_t i1) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = i0; i < i1; ++i) xt[size_t(i * ld + t)] = x[t * n + i];
  });
  constexpr int64_t kI = 16, kJ = 64;
  const int64_t ni = (n4 + kI - 1) / kI, nj = (n4 + kJ - 1) / kJ;
  over(pool, ni * nj, 1, [&](int, int64_t k0, int64_t k1) {
    float out[4][4];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t I0 = k / nj * kI, J0 = k % nj * kJ;
      if (J0 + kJ <= I0) continue;  // wholly below the diagonal
      for (int64_t i = I0; i < std::min(I0 + kI, n4); i += 4)
        for (int64_t j = std::max(J0, i); j < std::min(J0 + kJ, n4); j += 4) {
          dots(xt.data() + i * ld, xt.data() + j * ld, ld, ld, out);
          for (int r = 0; r < 4 && i + r < n; ++r)
            for (int c = 0; c < 4 && j + c < n; ++c)
              if (j + c >= i + r) sum_[size_t((i + r) * n + j + c)] += double(out[r][c]);
        }
    }
  });
  rows_ += uint64_t(T);
}

std::vector<double> InputHessian::mean() const {
  InputHessian copy(*this);
  return copy.take_mean();
}

std::vector<double> InputHessian::take_mean() {
  ARBOR_CHECK(rows_ > 0, "ldlq: the input Hessian has no rows (the calibration never reached this linear)");
  const double inv = 1.0 / double(rows_);
  for (int64_t i = 0; i < n_; ++i)
    for (int64_t j = i; j < n_; ++j) sum_[size_t(i * n_ + j)] = sum_[size_t(j * n_ + i)] = sum_[size_t(i * n_ + j)] * inv;
  std::vector<double> m = std::move(sum_);
  sum_.clear(), n_ = 0, rows_ = 0;
  return m;
}

TrellisEncoded trellis_encode_linear_ldlq(const std::string& name, const float* w, int64_t out, int64_t in, int k, int axis,
                                          const std::vector<double>& h, ThreadPool* pool, const TrellisEncodeOptions& opt,
                                          const LdlqOptions& lopt) {
  const TrellisParams p{k, 12, 256};
  ARBOR_CHECK(int64_t(h.size()) == in * in, "ldlq: '{}': an input Hessian of {} values for {} inputs (expected {})", name, h.size(), in,
              in * in);
  ARBOR_CHECK(k >= 2 && k <= 4, "ldlq: '{}': bits {} (supported: 2, 3, 4)", name, k);
  ARBOR_CHECK(axis == 0 || axis == 1, "ldlq: '{}': axis {} (supported: 0, 1)", name, axis);
  const int64_t coded = axis == 1 ? in : out;
  ARBOR_CHECK(coded >= p.T && coded % p.T == 0, "ldlq: '{}': cannot code [{}, {}] along its {} in blocks of {}", name, out, in,
              axis == 1 ? "inputs" : "outputs", p.T);
  for (int64_t i = 0; i < out * in; ++i)
    ARBOR_CHECK(std::isfinite(w[i]), "ldlq: '{}': weight [{}, {}] is {}", name, i / in, i % in, w[i]);

  double diag = 0;
  for (int64_t i = 0; i < in; ++i) diag += h[size_t(i * in + i)];
  diag /= double(in);
  ARBOR_CHECK(std::isfinite(diag) && diag >= 0, "ldlq: '{}': the input Hessian has mean diagonal {} (E[x xᵀ] has none below 0)", name,
              diag);
  if (diag == 0) return trellis_encode_linear(name, w, out, in, k, axis, pool, opt);  // no nonzero input ever reached it
  // The order the inputs are coded in: axis 0 may take the largest E[x_i²] first (act order: the inputs
  // whose error costs most are coded while the most inputs remain to absorb it); axis 1 codes whole blocks.
  std::vector<int64_t> order(static_cast<size_t>(in));
  for (int64_t i = 0; i < in; ++i) order[size_t(i)] = i;
  if (axis == 0 && lopt.act_order)
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return h[size_t(a * in + a)] > h[size_t(b * in + b)]; });
  std::vector<double> hd(h.size());
  for (int64_t i = 0; i < in; ++i)
    for (int64_t j = 0; j < in; ++j) hd[size_t(i * in + j)] = h[size_t(order[size_t(i)] * in + order[size_t(j)])];
  for (int64_t i = 0; i < in; ++i) hd[size_t(i * in + i)] += lopt.damp * diag;
  std::vector<double> r;  // of the Hessian in coding order
  ARBOR_CHECK(ldlq_inverse_factor(hd, in, r, pool), "ldlq: '{}': the input Hessian is not positive definite with damping {} (raise --damp)",
              name, lopt.damp);

  const double code_rms = trellis_code_rms(p.L);
  const float gain = opt.scale_gain > 0 ? opt.scale_gain : trellis_default_scale_gain(k);
  TrellisEncoded enc;
  TrellisGeometry& g = enc.geometry;
  g.params = p, g.axis = axis;
  g.rows = axis == 1 ? out : in, g.cols = axis == 1 ? in : out;
  g.in_features = in, g.out_features = out;
  const int64_t wpr = g.words_per_row(), wpb = p.words_per_block();
  enc.words.assign(size_t(g.rows * wpr), 0u);
  enc.scales.resize(size_t(g.rows));
  TrellisBlockPaths paths(p, pool, opt);

  if (axis == 0) {
    // s [in, out] in coding order: row i holds input order[i]'s weights over the outputs, coded one at a time
    // into that input's stored row.
    std::vector<float> s(static_cast<size_t>(in * out));
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) s[size_t(i * out + o)] = w[o * in + order[size_t(i)]];
    const int64_t nb = out / p.T;
    std::vector<float> tgt(static_cast<size_t>(out)), dec(static_cast<size_t>(out)), e(static_cast<size_t>(out));
    std::vector<uint16_t> st(static_cast<size_t>(out));
    for (int64_t i = 0; i < in; ++i) {
      float* si = s.data() + i * out;
      const uint16_t sb = trellis_row_scale(si, out, code_rms, gain);
      enc.scales[size_t(order[size_t(i)])] = sb;
      const float scale = f16_to_f32(sb), inv = 1.0f / scale;
      for (int64_t o = 0; o < out; ++o) tgt[size_t(o)] = si[o] * inv;
      paths.run(tgt.data(), nb, st.data());
      uint32_t* row = enc.words.data() + order[size_t(i)] * wpr;
      for (int64_t b = 0; b < nb; ++b) trellis_pack_block(st.data() + b * p.T, p, row + b * wpb);
      trellis_decode_row(row, out, p, scale, dec.data());
      const double rii = r[size_t(i * in + i)];
      for (int64_t o = 0; o < out; ++o) e[size_t(o)] = float((double(si[o]) - double(dec[size_t(o)])) / rii);
      over(pool, in - i - 1, 16, [&](int, int64_t j0, int64_t j1) {
        for (int64_t j = i + 1 + j0; j < i + 1 + j1; ++j) {
          const float rij = float(r[size_t(i * in + j)]);
          float* sj = s.data() + j * out;
          for (int64_t o = 0; o < out; ++o) sj[o] -= rij * e[size_t(o)];
        }
      });
    }
    return enc;
  }

  // Axis 1: s [out, in] coded 256 inputs at a time; each row's scale from its original weights.
  std::vector<float> s(w, w + out * in);
  std::vector<float> inv(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    const uint16_t sb = trellis_row_scale(w + o * in, in, code_rms, gain);
    enc.scales[size_t(o)] = sb;
    inv[size_t(o)] = 1.0f / f16_to_f32(sb);
  }
  const int64_t B = p.T, nblk = in / B;
  std::vector<float> tgt(static_cast<size_t>(out * B)), err(static_cast<size_t>(out * B));
  std::vector<uint16_t> st(static_cast<size_t>(out * B));
  std::vector<double> m;  // R_bb⁻¹ R_b,rest [B, rest]
  for (int64_t b = 0; b < nblk; ++b) {
    const int64_t c0 = b * B, rest = in - c0 - B;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t c = 0; c < B; ++c) tgt[size_t(o * B + c)] = s[size_t(o * in + c0 + c)] * inv[size_t(o)];
    paths.run(tgt.data(), out, st.data());
    over(pool, out, 16, [&](int, int64_t o0, int64_t o1) {
      std::vector<float> dec(static_cast<size_t>(B));
      for (int64_t o = o0; o < o1; ++o) {
        uint32_t* blk = enc.words.data() + o * wpr + b * wpb;
        trellis_pack_block(st.data() + o * B, p, blk);
        trellis_decode_block(blk, p, f16_to_f32(enc.scales[size_t(o)]), dec.data());
        for (int64_t c = 0; c < B; ++c) err[size_t(o * B + c)] = s[size_t(o * in + c0 + c)] - dec[size_t(c)];
      }
    });
    if (rest == 0) break;
    // m = R_bb⁻¹ R_b,rest: back substitution down the block's rows, every column at once.
    m.assign(size_t(B * rest), 0.0);
    for (int64_t i = B - 1; i >= 0; --i) {
      const double* ri = r.data() + (c0 + i) * in;
      double* mi = m.data() + i * rest;
      for (int64_t c = 0; c < rest; ++c) mi[c] = ri[c0 + B + c];
      for (int64_t q = i + 1; q < B; ++q) {
        const double riq = ri[c0 + q];
        const double* mq = m.data() + q * rest;
        for (int64_t c = 0; c < rest; ++c) mi[c] -= riq * mq[c];
      }
      const double rii = ri[c0 + i];
      for (int64_t c = 0; c < rest; ++c) mi[c] /= rii;
    }
    std::vector<float> mf(m.begin(), m.end());
    over(pool, out, 8, [&](int, int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        float* so = s.data() + o * in + c0 + B;
        const float* eo = err.data() + o * B;
        for (int64_t i = 0; i < B; ++i) {
          const float ei = eo[i];
          if (ei == 0) continue;
          const float* mi = mf.data() + i * rest;
          for (int64_t c = 0; c < rest; ++c) so[c] -= ei * mi[c];
        }
      }
    });
  }
  return enc;
}

double hessian_proxy_loss(const float* w, const float* w_hat, int64_t out, int64_t in, const std::vector<double>& h) {
  double total = 0;
  std::vector<double> e(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) e[size_t(i)] = double(w[o * in + i]) - double(w_hat[o * in + i]);
    for (int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (int64_t j = 0; j < in; ++j) s += h[size_t(i * in + j)] * e[size_t(j)];
      total += e[size_t(i)] * s;
    }
  }
  return total / double(out);
}

}  // namespace arbor::quant
