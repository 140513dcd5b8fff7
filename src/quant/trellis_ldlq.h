// Hessian-aware rounding for the trellis encoder (LDLQ; issue 20 item 5's optional part): a linear's
// inputs x over calibration text give H = E[x xᵀ], and the coded weights Ŵ then minimise the proxy loss
// tr((W − Ŵ) H (W − Ŵ)ᵀ) (the output error E‖(W − Ŵ) x‖²) instead of ‖W − Ŵ‖². The coding runs along
// the input dimension in order; each coded step's error is fed forward into the inputs not yet coded
// through the Cholesky factor of H⁻¹ (QuIP's LDLQ, the same update as GPTQ's):
//   axis 0 (stored [in, out], each stored row one input): one input at a time, exactly.
//   axis 1 (stored [out, in], blocks of 256 inputs along a row): 256 inputs at a time (block LDLQ), each
//     block's Viterbi minimising plain squared error inside the block, as QTIP's BlockLDLQ does.
// The file format is unchanged: these are ordinary trellis codes and row scales.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "quant/trellis_encode.h"

namespace arbor::quant {

// Σ x xᵀ over the input rows a linear saw (double; rows accumulated in f32 a call, then added).
class InputHessian {
 public:
  explicit InputHessian(int64_t n = 0) : n_(n), sum_(size_t(n * n), 0.0) {}
  int64_t n() const { return n_; }
  uint64_t rows() const { return rows_; }
  // Adds the T rows of x [T, n] (row stride n). Threads over the pool when given.
  void add(const float* x, int64_t T, ThreadPool* pool = nullptr);
  // E[x xᵀ] = Σ x xᵀ / rows, [n, n] row-major, symmetric. Fails when no rows were added.
  std::vector<double> mean() const;
  // The same, made in place of the sum and moved out (no second n x n copy); the object is left empty.
  std::vector<double> take_mean();

 private:
  int64_t n_ = 0;
  uint64_t rows_ = 0;
  std::vector<double> sum_;  // upper triangle (j >= i) accumulated; mean() mirrors it
};

// Which kernels InputHessian::add's tiles and the factor's dot products use: "avx512", "avx2", "plain" (the reference
// loops), or "" for the best this CPU has (the default). False when this CPU lacks it. Tests.
bool set_ldlq_isa(const std::string& isa);

// The upper triangular R with H⁻¹ = Rᵀ R (positive diagonal) of the symmetric positive definite h [n, n], without
// forming H⁻¹ (LDLQ's factor; its columns on the pool). False when h is not positive definite.
bool ldlq_inverse_factor(const std::vector<double>& h, int64_t n, std::vector<double>& r, ThreadPool* pool = nullptr);

struct LdlqOptions {
  // H + damp · mean(diag H) · I before factoring (GPTQ's percdamp): keeps H invertible where the
  // calibration rows do not span the inputs, and limits how far an error is pushed.
  double damp = 0.01;
  // Axis 0: code the inputs in decreasing E[x_i²] (GPTQ's act order). The stored layout is unchanged (each
  // input's codes and scale sit in its own row), so the order costs nothing at inference.
  bool act_order = true;
};

// Encodes w [out, in] at k bits on `axis` as trellis_encode_linear does, but with LDLQ against h (n = in).
// Row scales: axis 1 from each original row (as without LDLQ); axis 0 from each input's updated targets.
// Threads over `pool`; opt.block_viterbi, when set, takes the Viterbi paths. Fails naming `name` on a
// shape mismatch, a non-finite weight, or an H that is not positive definite even after damping.
TrellisEncoded trellis_encode_linear_ldlq(const std::string& name, const float* w, int64_t out, int64_t in, int k, int axis,
                                          const std::vector<double>& h, ThreadPool* pool, const TrellisEncodeOptions& opt = {},
                                          const LdlqOptions& lopt = {});

// tr((W − Ŵ) H (W − Ŵ)ᵀ) / out: the mean output-error energy per row that LDLQ minimises (tests, reports).
double hessian_proxy_loss(const float* w, const float* w_hat, int64_t out, int64_t in, const std::vector<double>& h);

}  // namespace arbor::quant
