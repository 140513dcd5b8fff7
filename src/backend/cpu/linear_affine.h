// CPU linear layers on MLX affine weights (formats.md §2). Codes stay packed as stored (one little-endian
// bit stream per row); scales and biases are read in their stored dtype (F32, F16 or BF16).
//   T <= kLinearGemvMaxT: a fused dequantize-and-dot GEMV that reads each packed byte once per call and
//     computes, per group, s·Σ(x·q) + b·Σx, with Σx per group computed once per call
//     (linear_affine_avx2.cpp, linear_affine_avx512.cpp).
//   T > kLinearGemvMaxT: the blocked f32 GEMM of linear_avx2/avx512.cpp with each 32 x 128 weight panel
//     dequantized once (w = s·q + b in f32) and reused across every token row of the chunk; in GemmMode::Bf16
//     on an AVX-512 BF16 CPU, gemm_bf16's kernel with panels dequantized and rounded to bf16 (x rounded to
//     bf16 once per call, as for dense bf16 weights in that mode).
//   Scalar CPUs: the reference kernel.
// Both fast paths read x with each 32-column unit permuted into the order the codes are decoded in (a copy
// of x made once per call), so no code is ever shuffled back into column order.
#pragma once
#include <cstdint>
#include <string>

#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/linear.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace arbor::cpu {

// W [N, K] as stored: packed codes [N, K*bits/32] words, scales and biases [N, K/group_size] in sdtype.
struct AffineMatrix {
  const uint32_t* packed = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  DType sdtype = DType::F32;  // of scales and biases: F32, F16 or BF16
  int bits = 4;               // 2, 3, 4, 5, 6 or 8
  int group_size = 64;        // 32, 64 or 128
  int64_t N = 0, K = 0;
};

// Row n of W dequantized into out[K]: out[j] = float(scale) * code + float(bias) (f32 multiply, then add).
void affine_dequantize_row(const AffineMatrix& w, int64_t n, float* out);

// y[T, N] = x[T, K] · W^T (+ bias[N] if not null), x and y f32 row-major. Throws arbor::Error on a bad
// shape, bits or group size, scale dtype, or a null pointer. Calls on one pool must not overlap; per-thread
// scratch grows once (the permuted x and Σx: (T*K + T*K/group_size) floats on the calling thread).
// `mode` matters only for T > kLinearGemvMaxT on an AVX-512 BF16 CPU (see above).
void linear_affine(ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w, const float* bias, float* y,
                   GemmMode mode = GemmMode::Exact);
// The same forced onto one ISA level (tests, bench-linear); throws if this CPU cannot run it.
void linear_affine_with_isa(LinearIsa isa, ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w,
                            const float* bias, float* y, GemmMode mode = GemmMode::Exact);
// "avx2-affine-gemv", "avx512-affine-gemm", "avx512bf16-affine-gemm-bf16", "scalar-affine-reference", ...
std::string linear_affine_kernel_name(LinearIsa isa, int64_t T, GemmMode mode = GemmMode::Exact);
std::string linear_affine_kernel_name(int64_t T, GemmMode mode = GemmMode::Exact);

// The reference: per output row, dequantize the row once in f32 (affine_dequantize_row), then dot it with each
// activation row (f32, 8 partial sums). Rows of W spread over the pool. What the fast kernels are tested against.
void linear_affine_reference(ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w, const float* bias, float* y);

// ---- Internal: the per-ISA kernels and their shared arguments ----------------------------------------
namespace affine_detail {

// Codes of a 32-code unit as each ISA decodes them: vector k, lane i holds code c*i + k, with
// lanes = 8 (AVX2, c = 4) or 16 (AVX-512, c = 2). xp holds x in the same order per unit:
// xp[u*32 + lanes*k + i] = x[u*32 + c*i + k].
struct Args {
  const float* xp;       // [T, K] permuted x
  const float* sx;       // [T, K/G] Σx per group (8 partial f32 sums)
  int64_t T, K, N;
  const uint8_t* codes;  // [N, K*bits/8]
  const void* scales;    // [N, K/G] in sdtype
  const void* biases;
  DType sdtype;
  int bits, G;
  const float* bias;     // [N] or null
  float* y;              // [T, N]
};

// GEMV: output rows [n0, n1) of y for all T (1..kLinearGemvMaxT).
void gemv_avx2(const Args& a, int64_t n0, int64_t n1);
void gemv_avx512(const Args& a, int64_t n0, int64_t n1);
// linear_detail::PanelPacker for the f32 GEMMs (ctx: const Args*): P[kk][j] = w[nb + j] at permuted column
// kb + kk, dequantized in f32.
void pack_panel_avx2(const void* ctx, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P);
void pack_panel_avx512(const void* ctx, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P);
// Bf16PanelPacker for gemm_bf16_panels (ctx: const Args*; x in natural order, xp not read).
void pack_panel_bf16_avx512bf16(const void* ctx, int64_t nb, int64_t nw, int64_t pb, int64_t kcp, uint32_t* P);

}  // namespace affine_detail
}  // namespace arbor::cpu
