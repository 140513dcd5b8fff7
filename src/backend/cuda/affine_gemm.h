// Host-side launcher of the tensor-core affine GEMM (affine_gemm.cu), for CudaBackend's affine linear at
// 9+ rows of activations. Activations bf16 (uint16_t*), accumulation f32; checks the launch, never
// synchronises.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/affine.h"
#include "core/dtype.h"

namespace arbor::cuda {

// y [T, rows] = x [T, cols] · Wᵀ (+ bias f32 [rows]) for MLX affine weights (affine.h): tensor cores
// (mma.sync bf16, f32 accumulation) on tiles of codes dequantized to bf16 in shared memory inside the
// main loop (no bf16 copy of the weight). Any T >= 1 (meant for T > 8, where the GEMV stops), any rows,
// cols a multiple of the group size; y bf16 or f32. When the tiles do not fill the GPU, K is split over
// blocks whose f32 partials go to scratch (affine_gemm_scratch_floats floats; null scratch: no split)
// and a second kernel sums them in a fixed order (deterministic). Fails naming the unsupported value.
int64_t affine_gemm_scratch_floats(const AffineWeights& w, int64_t T, int n_sms);
void launch_affine_gemm(const AffineWeights& w, const uint16_t* x, const float* bias, void* y, DType y_dtype, int64_t T,
                        float* scratch, int n_sms, cudaStream_t s);
// Rows [row0, row0 + n) of W dequantized to bf16 [n, cols] at out (16-byte aligned), with the GEMM's
// arithmetic (bf16(float(scale) * q + float(bias))): for many activation rows, dequantizing once and running
// cuBLASLt beats dequantizing every tile inside the GEMM (CudaBackend picks by T).
void launch_affine_dequant(const AffineWeights& w, int64_t row0, int64_t n, uint16_t* out, int n_sms, cudaStream_t s);
// Forces the K split (benchmarks, tests; 0: chosen by shape, the default).
void set_affine_gemm_splits(int splits);
// The kernel for T > 64 (A/B runs): 0 the plain one (the default), 1 the pipelined one, 2 the plain one with
// 256 activation rows per block (affine_gemm.cu).
void set_affine_gemm_variant(int v);

}  // namespace arbor::cuda
