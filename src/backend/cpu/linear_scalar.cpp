// Portable linear kernel for x86-64 CPUs without AVX2 (and any other target): f32 accumulation in
// four independent partial sums per dot product so the compiler can keep several FMAs/adds in flight.
#include "backend/cpu/linear.h"

namespace arbor::cpu::linear_detail {

namespace {

template <typename Load>
void rows_scalar(const Args& a, int64_t n0, int64_t n1, Load load) {
  const int64_t K = a.K;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t row = n * K;
    for (int64_t t = 0; t < a.T; ++t) {
      const float* xr = a.x + t * K;
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t k = 0;
      for (; k + 4 <= K; k += 4) {
        s0 += xr[k] * load(row + k);
        s1 += xr[k + 1] * load(row + k + 1);
        s2 += xr[k + 2] * load(row + k + 2);
        s3 += xr[k + 3] * load(row + k + 3);
      }
      for (; k < K; ++k) s0 += xr[k] * load(row + k);
      float s = (s0 + s1) + (s2 + s3);
      a.y[t * a.N + n] = a.bias ? s + a.bias[n] : s;
    }
  }
}

}  // namespace

// Handles any T (the scalar level has no separate GEMM).
void gemv_scalar(const Args& a, int64_t n0, int64_t n1) {
  switch (a.wtype) {
    case DType::F32: {
      const float* w = static_cast<const float*>(a.W);
      rows_scalar(a, n0, n1, [w](int64_t i) { return w[i]; });
      break;
    }
    case DType::F16: {
      const uint16_t* w = static_cast<const uint16_t*>(a.W);
      rows_scalar(a, n0, n1, [w](int64_t i) { return f16_to_f32(w[i]); });
      break;
    }
    default: {
      const uint16_t* w = static_cast<const uint16_t*>(a.W);
      rows_scalar(a, n0, n1, [w](int64_t i) { return bf16_to_f32(w[i]); });
      break;
    }
  }
}

}  // namespace arbor::cpu::linear_detail
