// CPU linear layers on MLX affine weights (formats.md §2). Codes stay packed as stored (one little-endian
// bit stream per row); scales and biases are read in their stored dtype (F32, F16 or BF16).
//   T <= kLinearGemvMaxT: a fused dequantize-and-dot GEMV that reads each packed byte once per call and
//     computes, per group, s·Σ(x·q) + b·Σx, with Σx per group computed once per call
//     (linear_affine_avx2.cpp, linear_affine_avx512.cpp).
//   T > kLinearGemvMaxT: the blocked f32 GEMM of linear_avx2/avx512.cpp with each 32 x 128 weight panel
//     dequantized once (w = s·q + b in f32) and reused across every token row of the chunk; in GemmMode::Bf16
//     on an AVX-512 BF16 CPU, gemm_bf16's kernel with panels dequantized and rounded to bf16 (x rounded to
//     bf16 once per call, as for dense bf16 weights in that mode).
//   T <= kLinearGemvMaxT in GemmMode::Bf16 (the fast mode), 2, 4 or 8 bits (and 3, 5, 6 with VBMI): the int8-activation GEMV:
//     x quantized once per call per 32 columns to int8 with d = max|x|/127 (round to nearest even), codes
//     times int8 x summed exactly in integers, then per 32 columns f32 d·s_group, plus Σ_g b_g·Σx_g with the
//     exact f32 Σx. Its error against the exact product is at most Σ_j |s_g·q_j|·d_j/2 (x's rounding).
//     On AVX-512 levels of a CPU with AVX512_VNNI: vpdpbusd on 64-byte spans (linear_affine_q8_avx512.cpp);
//     else on AVX2 (and AVX-512 without VNNI): vpmaddubsw on 32-byte spans (8 bits: vpmaddwd on s16;
//     linear_affine_q8_avx2.cpp). Both compute the same product (linear_affine_q8_reference) up to f32
//     summation order. 3, 5 and 6 bits on AVX-512 levels with VNNI and VBMI: 64 codes a span (8·bits bytes)
//     brought to u8 in column order by vpermb + vpmultishiftqb + and, x int8 in column order (same file); without
//     VBMI they run the exact GEMV in that mode.
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
// `mode` matters for T > kLinearGemvMaxT on an AVX-512 BF16 CPU and for T <= kLinearGemvMaxT with 2, 4 or
// 8 bits on an AVX2 CPU (see above; linear_affine_q8_applies).
void linear_affine(ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w, const float* bias, float* y,
                   GemmMode mode = GemmMode::Exact);
// The same forced onto one ISA level (tests, bench-linear); throws if this CPU cannot run it.
void linear_affine_with_isa(LinearIsa isa, ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w,
                            const float* bias, float* y, GemmMode mode = GemmMode::Exact);
// Several matrices over the same x (q/k/v, gate/up): y_i = x · W_iᵀ (+ bias_i). Where the q8 GEMV runs for
// all of them at one K, bits and group size (linear_affine_multi_fuses: GemmMode::Bf16, T <= kLinearGemvMaxT,
// 2/4/8 bits, 3/5/6 with VBMI, at most 8 matrices), x is quantized once and the rows of all the matrices are split over the
// pool in one pass (the same numbers as one call each); otherwise one linear_affine each.
struct AffineOut {
  AffineMatrix w;
  const float* bias = nullptr;  // [w.N] or null
  float* y = nullptr;           // [T, w.N]
};
bool linear_affine_multi_fuses(const AffineMatrix* ws, int n, int64_t T, GemmMode mode);
void linear_affine_multi(ThreadPool& pool, const float* x, int64_t T, const AffineOut* outs, int n, GemmMode mode);
// Whether GemmMode::Bf16 decode rows (T <= kLinearGemvMaxT) of `bits`-bit weights run the int8-activation
// GEMV at this ISA level (any level from AVX2 up for bits 2, 4, 8; AVX-512 with VNNI and VBMI for 3, 5, 6); the
// second form at the best level here.
bool linear_affine_q8_applies(LinearIsa isa, int bits);
bool linear_affine_q8_applies(int bits);
// "avx2-affine-gemv", "avx2-affine-gemv-q8", "avx512vnni-affine-gemv-q8", "avx512-affine-gemm",
// "avx512bf16-affine-gemm-bf16",
// "scalar-affine-reference", ...
// `bits` only matters in GemmMode::Bf16 at T <= kLinearGemvMaxT (0: a width the q8 GEMV does not take).
std::string linear_affine_kernel_name(LinearIsa isa, int64_t T, GemmMode mode = GemmMode::Exact, int bits = 0);
std::string linear_affine_kernel_name(int64_t T, GemmMode mode = GemmMode::Exact, int bits = 0);

// The reference: per output row, dequantize the row once in f32 (affine_dequantize_row), then dot it with each
// activation row (f32, 8 partial sums). Rows of W spread over the pool. What the fast kernels are tested against.
void linear_affine_reference(ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w, const float* bias, float* y);

// The int8-activation product the q8 GEMV computes, in plain scalar code (double sums): per token row t and
// 32-column block b, d = max|x|/127 and q_j = nearbyint(x_j · (127/max|x|)) (all in f32, as the kernel); then
// y[t, n] = Σ_g s_g · Σ_{b in g} d_b · Σ_{j in b} code_j·q_j + Σ_g b_g·Σ_{j in g} x_j (+ bias[n]). Any bits.
void linear_affine_q8_reference(ThreadPool& pool, const float* x, int64_t T, const AffineMatrix& w, const float* bias, float* y);

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

// The GEMVs read each weight row's codes with a software prefetch kPrefetchBytes ahead; a row's scales and
// biases (one short row each) are left to this: called at the start of row n with the row that prefetch has
// reached (n + rows_ahead), it prefetches that row's scales and biases. Left to the hardware prefetcher their
// loads missed at the start and end of every row (on Zen 5, a q8 GEMV of 2048-column rows went from 51-59 to
// 60-65 GB/s with this and plain stores for the converted scales).
struct RowParamsPrefetch {
  const char* scales;
  const char* biases;
  int64_t row_bytes, rows_ahead, N;  // of one scale (or bias) row; rows the codes' prefetch runs ahead
  RowParamsPrefetch(const void* s, const void* b, DType t, int64_t K, int64_t G, int bits, int64_t N_, int64_t prefetch_bytes)
      : scales(static_cast<const char*>(s)), biases(static_cast<const char*>(b)), row_bytes(K / G * int64_t(dtype_size(t))),
        rows_ahead(prefetch_bytes / (K * bits / 8) + 1), N(N_) {}
  void operator()(int64_t n) const {
    const int64_t ahead = n + rows_ahead;
    if (ahead >= N) return;
    for (int64_t b = 0; b < row_bytes; b += 64) {
      __builtin_prefetch(scales + ahead * row_bytes + b, 0, 3);
      __builtin_prefetch(biases + ahead * row_bytes + b, 0, 3);
    }
  }
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

// The int8-activation GEMV, 2, 4 and 8 bits. AVX2 (linear_affine_q8_avx2.cpp): a span is 32 bytes of a row's
// codes, S = q8_span_codes(bits) codes (128, 64, 32), 8 s32 lanes. AVX-512 VNNI (linear_affine_q8_avx512.cpp):
// 64 bytes, S = q8_span_codes_avx512(bits) (256, 128, 64), 16 lanes. x rows are padded to Kp = K rounded up to S.
int64_t q8_span_codes(int bits);
int64_t q8_span_codes_avx512(int bits);
struct Q8Args {
  const void* xq;   // [T, Kp] quantized x in decode order: int8 (AVX2 at 2, 4 bits; VNNI at all) or int16
                    // (AVX2 at 8 bits); 32-byte aligned (AVX2), 64 (VNNI)
  const float* xd;  // [T, Kp/S, lanes] per span, each s32 lane's d (its 32-column block's scale)
  const float* sx;  // [T, K/G] exact Σx per group
  int64_t T, K, N;
  const uint8_t* codes;
  const void* scales;
  const void* biases;
  DType sdtype;
  int bits, G;
  const float* bias;
  float* y;
};
// Columns [c0, c1) of one row xr of x (c0 a multiple of 1024, c1 = min(K, c0 + 1024)) into the row's xq, xd and sx.
void q8_prepare_avx2(const float* xr, int64_t K, int64_t G, int bits, int64_t c0, int64_t c1, void* xq, float* xd, float* sx);
void q8_gemv_avx2(const Q8Args& a, int64_t n0, int64_t n1);
// The same for the VNNI kernel (xq int8 in its decode order, xd 16 lanes per span).
void q8_prepare_avx512(const float* xr, int64_t K, int64_t G, int bits, int64_t c0, int64_t c1, void* xq, float* xd, float* sx);
void q8_gemv_avx512vnni(const Q8Args& a, int64_t n0, int64_t n1);

}  // namespace affine_detail
}  // namespace arbor::cpu
