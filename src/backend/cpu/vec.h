// Small f32 vector primitives for the non-linear ops (attention's q·k and p·V), in an AVX-512, an
// AVX2+FMA and a plain version chosen once at run time (the build targets baseline x86-64).
#pragma once
#include <cstdint>

namespace arbor::cpu {

struct VecOps {
  float (*dot)(const float* a, const float* b, int64_t n);          // sum a[i] * b[i]
  void (*axpy)(float* y, float a, const float* x, int64_t n);       // y[i] += a * x[i]
  const char* name;
};

const VecOps& vec_ops();          // the best this CPU runs
const VecOps& vec_ops_scalar();   // the reference
}  // namespace arbor::cpu
