// Small f32 vector primitives for the non-linear ops (attention's q·k and p·V, the SiLU of the MLP), in an
// AVX-512, an AVX2+FMA and a plain version chosen once at run time (the build targets baseline x86-64).
#pragma once
#include <cstdint>

namespace arbor::cpu {

struct VecOps {
  float (*dot)(const float* a, const float* b, int64_t n);          // sum a[i] * b[i]
  void (*axpy)(float* y, float a, const float* x, int64_t n);       // y[i] += a * x[i]
  // o[i] = silu(g[i]) * u[i] (u null: silu(g[i])), silu(x) = x / (1 + e^-x); the AVX-512 form within
  // 4 ulp of the scalar one (its exp is a degree-7 polynomial after range reduction).
  void (*silu_mul)(const float* g, const float* u, float* o, int64_t n);
  const char* name;
};

const VecOps& vec_ops();          // the best this CPU runs
const VecOps& vec_ops_scalar();   // the reference
}  // namespace arbor::cpu
