// Trellis linear layers: the reference kernel and the choice of GEMV / tiled kernel by ISA and rows.
#include "backend/cpu/linear_trellis.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear.h"
#include "core/error.h"
#include "quant/trellis.h"

namespace arbor::cpu {

const char* trellis_kernel_name(TrellisKernel k) {
  switch (k) {
    case TrellisKernel::Reference: return "reference";
    case TrellisKernel::Avx2: return "avx2";
    case TrellisKernel::Avx512: return "avx512";
    case TrellisKernel::Avx512Vbmi: return "avx512vbmi";
  }
  return "?";
}

bool trellis_kernel_supported(TrellisKernel k) {
  const CpuFeatures& f = cpu_features();
  switch (k) {
    case TrellisKernel::Reference: return true;
    case TrellisKernel::Avx2: return f.avx2;
    case TrellisKernel::Avx512: return f.avx512;
    case TrellisKernel::Avx512Vbmi: return f.avx512 && f.avx512_vbmi && f.avx512_vnni;
  }
  return false;
}

TrellisKernel trellis_best_kernel() {
  return trellis_kernel_supported(TrellisKernel::Avx512Vbmi) ? TrellisKernel::Avx512Vbmi
         : trellis_kernel_supported(TrellisKernel::Avx512)   ? TrellisKernel::Avx512
         : trellis_kernel_supported(TrellisKernel::Avx2) ? TrellisKernel::Avx2
                                                          : TrellisKernel::Reference;
}

std::string trellis_kernel_label(TrellisKernel kernel, int64_t T) {
  if (kernel == TrellisKernel::Reference) return "reference";
  return fmt::format("{}-{}", trellis_kernel_name(kernel), T <= kLinearGemvMaxT ? "gemv" : "tiled");
}

namespace {

// Each coded row decoded by quant::trellis_decode_row (the format's reference decode), products summed in
// double. Axis 1 spreads output rows over the pool; axis 0 adds every coded row into [T, N] (one thread).
void reference(ThreadPool& pool, const trellis_detail::Args& a) {
  const TrellisWeights& w = a.w;
  const quant::TrellisParams p{w.k, 12, 256};
  const int64_t coded = w.axis == 1 ? w.K : w.N, rows = w.axis == 1 ? w.N : w.K;
  const int64_t wpr = coded / p.T * p.words_per_block();
  if (w.axis == 1) {
    pool.parallel_for(rows, 8, [&](int, int64_t n0, int64_t n1) {
      std::vector<float> row(static_cast<size_t>(coded));
      for (int64_t n = n0; n < n1; ++n) {
        quant::trellis_decode_row(w.words + n * wpr, coded, p, w.scales[n], row.data());
        for (int64_t t = 0; t < a.T; ++t) {
          double s = 0;
          for (int64_t j = 0; j < coded; ++j) s += double(row[size_t(j)]) * double(a.x[t * w.K + j]);
          a.y[t * w.N + n] = float(s + (a.bias ? double(a.bias[n]) : 0.0));
        }
      }
    });
    return;
  }
  std::vector<double> acc(size_t(a.T * w.N), 0.0);
  std::vector<float> row(static_cast<size_t>(coded));
  for (int64_t r = 0; r < rows; ++r) {
    quant::trellis_decode_row(w.words + r * wpr, coded, p, w.scales[r], row.data());
    for (int64_t t = 0; t < a.T; ++t) {
      const double xv = a.x[t * w.K + r];
      for (int64_t o = 0; o < coded; ++o) acc[size_t(t * w.N + o)] += xv * double(row[size_t(o)]);
    }
  }
  for (int64_t t = 0; t < a.T; ++t)
    for (int64_t o = 0; o < w.N; ++o) a.y[t * w.N + o] = float(acc[size_t(t * w.N + o)] + (a.bias ? double(a.bias[o]) : 0.0));
}

}  // namespace

void linear_trellis(ThreadPool& pool, const float* x, int64_t T, const TrellisWeights& w, const float* bias, float* y,
                    TrellisKernel kernel, bool force_tiled) {
  ARBOR_CHECK(x && w.words && w.scales && y, "linear_trellis: null pointer");
  ARBOR_CHECK(w.k >= 2 && w.k <= 4, "linear_trellis: k = {} (supported: 2, 3, 4)", w.k);
  ARBOR_CHECK(w.axis == 0 || w.axis == 1, "linear_trellis: axis {} (0 or 1)", w.axis);
  ARBOR_CHECK(T >= 0 && w.N > 0 && w.K > 0, "linear_trellis: bad shape T {} N {} K {}", T, w.N, w.K);
  const int64_t coded = w.axis == 1 ? w.K : w.N;
  ARBOR_CHECK(coded % 256 == 0, "linear_trellis: axis {}: the coded dimension ({}) is not a multiple of 256", w.axis, coded);
  ARBOR_CHECK(trellis_kernel_supported(kernel), "linear_trellis: this CPU cannot run the {} kernel ({})", trellis_kernel_name(kernel),
              cpu_features().summary());
  if (T == 0) return;
  const trellis_detail::Args a{x, T, w, bias, y};
  const bool gemv = T <= kLinearGemvMaxT && !force_tiled;
  switch (kernel) {
    case TrellisKernel::Reference: return reference(pool, a);
    case TrellisKernel::Avx2: return gemv ? trellis_detail::avx2::gemv(pool, a) : trellis_detail::avx2::tiled(pool, a);
    case TrellisKernel::Avx512: return gemv ? trellis_detail::avx512::gemv(pool, a) : trellis_detail::avx512::tiled(pool, a);
    case TrellisKernel::Avx512Vbmi:
      return gemv ? trellis_detail::avx512vbmi::gemv(pool, a) : trellis_detail::avx512vbmi::tiled(pool, a);
  }
}

}  // namespace arbor::cpu
