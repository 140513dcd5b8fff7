// LDLQ for the trellis encoder (trellis_ldlq.h): the input Hessian, its factor, and the coding loops for
// both axes.
#include "quant/trellis_ldlq.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

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

// In place: the lower Cholesky factor L of the symmetric positive definite a [n, n] (a = L Lᵀ; the
// upper triangle is zeroed). False when a pivot is not positive. Column by column; a column's rows below the
// diagonal (each a dot product with the pivot row) on the pool: each element is summed in the same order as on
// one thread, so the factor is the same bit for bit (an 8B's down projection, n = 14336, is ~1e12 multiply-adds).
bool cholesky_lower(std::vector<double>& a, int64_t n, ThreadPool* pool) {
  for (int64_t j = 0; j < n; ++j) {
    double d = a[size_t(j * n + j)];
    for (int64_t p = 0; p < j; ++p) d -= a[size_t(j * n + p)] * a[size_t(j * n + p)];
    if (!(d > 0)) return false;
    const double ljj = std::sqrt(d);
    a[size_t(j * n + j)] = ljj;
    const double* aj = a.data() + j * n;
    over(pool, n - j - 1, std::max<int64_t>(1, 32768 / std::max<int64_t>(j, 1)), [&](int, int64_t r0, int64_t r1) {
      for (int64_t i = j + 1 + r0; i < j + 1 + r1; ++i) {
        double* ai = a.data() + i * n;
        double s = ai[j];
        for (int64_t p = 0; p < j; ++p) s -= ai[p] * aj[p];
        ai[j] = s / ljj;
      }
    });
    for (int64_t i = 0; i < j; ++i) a[size_t(i * n + j)] = 0;
  }
  return true;
}

// The upper triangular R with H⁻¹ = Rᵀ R (positive diagonal), without forming H⁻¹: with J the reversal,
// J H J = L Lᵀ gives H = U Uᵀ for U = J L J (upper), so H⁻¹ = U⁻ᵀ U⁻¹ and R = U⁻¹.
bool inverse_cholesky_upper(const std::vector<double>& h, int64_t n, std::vector<double>& r, ThreadPool* pool) {
  std::vector<double> a(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) a[size_t(i * n + j)] = h[size_t((n - 1 - i) * n + (n - 1 - j))];
  if (!cholesky_lower(a, n, pool)) return false;
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
        double s = 0;
        for (int64_t p = i + 1; p <= c; ++p) s += ui[p] * rc[p];
        rc[i] = -s / ui[i];
      }
    }
  });
  r.assign(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = i; c < n; ++c) r[size_t(i * n + c)] = rt[size_t(c * n + i)];
  return true;
}

}  // namespace

void InputHessian::add(const float* x, int64_t T, ThreadPool* pool) {
  if (T <= 0) return;
  const int64_t n = n_, nb = (n + kRowBlock - 1) / kRowBlock;
  // Row blocks b and nb-1-b together, so each chunk of pairs has about the same share of the triangle. A
  // block's rows of Σ x xᵀ (j >= i) gather in f32 over this call's rows, one contiguous AXPY per (row, i),
  // then go into the double sum.
  over(pool, (nb + 1) / 2, 1, [&](int, int64_t p0, int64_t p1) {
    std::vector<float> g(static_cast<size_t>(kRowBlock * n));
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t b : {p, nb - 1 - p}) {
        const int64_t i0 = b * kRowBlock, i1 = std::min(n, i0 + kRowBlock);
        std::fill(g.begin(), g.end(), 0.0f);
        for (int64_t t = 0; t < T; ++t) {
          const float* xt = x + t * n;
          for (int64_t i = i0; i < i1; ++i) {
            const float a = xt[i];
            float* gi = g.data() + (i - i0) * n;
            for (int64_t j = i; j < n; ++j) gi[j] += a * xt[j];
          }
        }
        for (int64_t i = i0; i < i1; ++i) {
          const float* gi = g.data() + (i - i0) * n;
          double* s = sum_.data() + i * n;
          for (int64_t j = i; j < n; ++j) s[j] += double(gi[j]);
        }
        if (b == nb - 1 - b) break;  // the middle block of an odd count: once
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
  ARBOR_CHECK(inverse_cholesky_upper(hd, in, r, pool), "ldlq: '{}': the input Hessian is not positive definite with damping {} (raise --damp)",
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
