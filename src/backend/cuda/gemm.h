// cuBLASLt GEMM for prefill and batched decode: y [T, N] = x [T, K] · W[N, K]ᵀ, f32 accumulation.
// One matmul plan (descriptors + heuristic algorithm) per shape and dtype combination, cached.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace arbor::cuda {

// w and x share a dtype (BF16 or F16); y is BF16, F16 or F32. workspace: 32 MiB is plenty. ldy: elements
// between rows of y (0: N), so N columns can land inside a wider y (a slice of W's rows).
void lt_gemm(cublasLtHandle_t lt, const void* w, const void* x, DType ab_dtype, void* y, DType y_dtype, int64_t T, int64_t N,
             int64_t K, void* workspace, size_t workspace_bytes, cudaStream_t s, int64_t ldy = 0);

}  // namespace arbor::cuda
