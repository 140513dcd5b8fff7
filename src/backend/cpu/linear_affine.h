// CPU linear layers on MLX affine weights (formats.md §2): the reference kernel. Codes stay packed; each
// output row is dequantized once per call (w = scale * code + bias in f32) and dotted with every activation row.
#pragma once
#include <cstdint>

#include "core/thread_pool.h"

namespace arbor::cpu {

// Row n of W dequantized into out[K]: out[j] = scales[n, j/G] * code + biases[n, j/G] (f32 multiply, then add).
void affine_dequantize_row(const uint32_t* packed, const float* scales, const float* biases, int bits, int group_size, int64_t K,
                           int64_t n, float* out);

// y[T, N] = x[T, K] · W[N, K]^T (+ bias[N] if not null), W as packed codes [N, K*bits/32] with f32 scales and
// biases [N, K/group_size]. bits 2..8, K a multiple of group_size and K*bits a multiple of 32. Rows of W are
// spread over the pool; f32 accumulation. Throws arbor::Error on a bad shape or a null pointer.
void linear_affine(ThreadPool& pool, const float* x, int64_t T, int64_t K, const uint32_t* packed, const float* scales,
                   const float* biases, int bits, int group_size, int64_t N, const float* bias, float* y);

}  // namespace arbor::cpu
