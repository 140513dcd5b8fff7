// CPU linear layers: y[T, N] = x[T, K] · W[N, K]^T (+ bias) with f32, f16 or bf16 weights and f32
// accumulation. GEMV kernels for decode (T <= kLinearGemvMaxT), blocked GEMM kernels for prefill, one
// variant per ISA level (scalar, AVX2, AVX-512, AVX-512 BF16), chosen at run time.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace arbor::cpu {

// y[T, N] = x[T, K] · W[N, K]^T (+ bias[N] if not null). x and y are f32 row-major with row strides
// K and N; W is row-major [N, K] (the HF nn.Linear layout) in F32, F16 or BF16. f32 accumulation; x
// is never rounded below ~16 mantissa bits (the bf16 GEMM splits it into two bf16 halves).
// y must not overlap x. Calls on one pool must not overlap (the pool runs one job at a time). Scratch
// is per thread and grows once: packed weight panels (16 KiB) and, for the bf16 GEMM, the split x
// (T*K*4 bytes, kept by the calling thread for reuse). Throws arbor::Error on a bad shape, a null
// pointer or an unsupported weight dtype.
void linear(ThreadPool& pool, const float* x, int64_t T, int64_t K, const void* W, DType wtype, int64_t N,
            const float* bias, float* y);

// The same product with plain loops and double accumulation: the ground truth for tests.
void linear_reference(const float* x, int64_t T, int64_t K, const void* W, DType wtype, int64_t N, const float* bias,
                      float* y);

// Which kernel linear() runs for this weight dtype and token count: "avx512bf16-gemm", "avx512-gemv", ...
std::string linear_kernel_name(DType wtype, int64_t T);

// Token counts up to this use the GEMV kernels (every weight byte read once per call, all T rows
// processed per weight load); larger ones use the blocked GEMM.
inline constexpr int64_t kLinearGemvMaxT = 8;

// ---- Variant-level access, for tests and benchmarks -------------------------------------------------
enum class LinearIsa { Scalar, Avx2, Avx512, Avx512Bf16 };
std::string_view linear_isa_name(LinearIsa isa);  // "scalar", "avx2", "avx512", "avx512bf16"
// Every variant compiled in that this CPU can run, lowest first; the last is what linear() uses.
std::vector<LinearIsa> linear_isas_supported();
// linear() forced onto one variant; throws arbor::Error if this CPU cannot run it.
void linear_with_isa(LinearIsa isa, ThreadPool& pool, const float* x, int64_t T, int64_t K, const void* W,
                     DType wtype, int64_t N, const float* bias, float* y);
std::string linear_kernel_name(LinearIsa isa, DType wtype, int64_t T);

// ---- Internal: the per-ISA kernels (src/backend/cpu/linear_<isa>.cpp) and their shared arguments ----
namespace linear_detail {

struct Args {
  const float* x;     // [T, K]
  int64_t T, K;
  const void* W;      // [N, K] in wtype
  DType wtype;
  int64_t N;
  const float* bias;  // [N] or null
  float* y;           // [T, N]
  // Only for the AVX-512 BF16 GEMM: x split into bf16 halves, x ≈ x_hi + x_lo, as 32-bit words
  // [T, Kp] with Kp = K rounded up to even: for element pair p of row t, word t*Kp + 2p holds the two
  // x_hi values and word t*Kp + 2p + 1 the two x_lo values (zero past K).
  const uint32_t* x_split = nullptr;
  int64_t Kp = 0;
};

// A GEMV computes output columns [n0, n1) of y for all T (<= kLinearGemvMaxT) tokens.
// A GEMM does the same for any T, using `scratch` (gemm_scratch_floats() floats, 64-byte aligned,
// private to the calling thread) for packed weight panels.
void gemv_scalar(const Args& a, int64_t n0, int64_t n1);
void gemv_avx2(const Args& a, int64_t n0, int64_t n1);
void gemv_avx512(const Args& a, int64_t n0, int64_t n1);
void gemm_avx2(const Args& a, int64_t n0, int64_t n1, float* scratch);
void gemm_avx512(const Args& a, int64_t n0, int64_t n1, float* scratch);
void gemm_avx512bf16(const Args& a, int64_t n0, int64_t n1, float* scratch);
// The f32 GEMM with the weight panels supplied by the caller (the affine GEMM dequantizes them):
// pack(ctx, nb, nw, kb, kc, P) fills P[kk][j] (kk < kc, j < kGemmPanelN, row stride kGemmPanelN) with
// W[nb + j][kb + kk] (zero for j >= nw); kc <= kGemmPanelK, kb a multiple of kGemmPanelK. a.W and
// a.wtype are not read.
using PanelPacker = void (*)(const void* ctx, int64_t nb, int64_t nw, int64_t kb, int64_t kc, float* P);
void gemm_avx2_panels(const Args& a, int64_t n0, int64_t n1, float* scratch, PanelPacker pack, const void* ctx);
void gemm_avx512_panels(const Args& a, int64_t n0, int64_t n1, float* scratch, PanelPacker pack, const void* ctx);
// Rows [t0, t1) of x [T, K] -> x_split [T, Kp] (layout above; x_hi = bf16 round-to-nearest-even of x,
// x_lo = bf16(x - x_hi)).
void split_bf16_avx512bf16(const float* x, int64_t K, int64_t Kp, int64_t t0, int64_t t1, uint32_t* x_split);

// Output columns per packed GEMM panel (the unit of the thread split), and the packed-panel scratch
// every GEMM needs per thread (32 columns x 128 k of f32 or 128 k-pairs of bf16: 16 KiB, L1-resident).
inline constexpr int64_t kGemmPanelN = 32;
inline constexpr int64_t kGemmPanelK = 128;  // k per packed f32 panel (the AVX2 and AVX-512 GEMMs)
inline constexpr int64_t kGemmScratchFloats = kGemmPanelN * kGemmPanelK;
// Cache blocking around the panels: a block of kGemmBlockT tokens x kGemmGroupN columns is finished
// one k block at a time, so the x slice of a k block (256 tokens x 128 k, 128-256 KiB) and the y block
// (256 KiB) stay in L2 while every panel of the group reuses them. Without it x streamed from L3 for
// every panel and the GEMM ran at half speed for K = 8192.
inline constexpr int64_t kGemmBlockT = 256;
inline constexpr int64_t kGemmGroupN = 256;

}  // namespace linear_detail
}  // namespace arbor::cpu
