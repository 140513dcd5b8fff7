// linear_reference: y = x · W^T (+ bias) with plain loops and double accumulation — the ground truth
// every optimized linear kernel is tested against.
#include <vector>

#include "backend/cpu/linear.h"
#include "core/error.h"

namespace arbor::cpu {

void linear_reference(const float* x, int64_t T, int64_t K, const void* W, DType wtype, int64_t N, const float* bias,
                      float* y) {
  ARBOR_CHECK(T >= 0 && K >= 1 && N >= 1, "linear_reference: bad shape T={} K={} N={}", T, K, N);
  ARBOR_CHECK(wtype == DType::F32 || wtype == DType::F16 || wtype == DType::BF16,
              "linear_reference: weight dtype {} not supported (F32, F16, BF16)", dtype_name(wtype));
  std::vector<double> w(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      size_t i = size_t(n * K + k);
      switch (wtype) {
        case DType::F32: w[k] = static_cast<const float*>(W)[i]; break;
        case DType::F16: w[k] = f16_to_f32(static_cast<const uint16_t*>(W)[i]); break;
        default: w[k] = bf16_to_f32(static_cast<const uint16_t*>(W)[i]); break;
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = x + t * K;
      double s = bias ? double(bias[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += double(xr[k]) * w[k];
      y[t * N + n] = float(s);
    }
  }
}

}  // namespace arbor::cpu
