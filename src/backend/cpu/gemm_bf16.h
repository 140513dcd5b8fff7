// The bf16-activation prefill GEMM (--cpu-gemm bf16): y[T, N] = bf16(x)[T, K] · W[N, K]^T (+ bias) for
// bf16 weights on CPUs with AVX-512 BF16 (f16 weights are rounded to bf16 as their panels are packed, as
// transformers loading an f16 checkpoint in bf16 rounds them). x is rounded to bf16 (round to nearest even) once per call,
// so every pair of products is one vdpbf16ps (the split "exact" GEMM of linear_avx512bf16.cpp spends
// two), with f32 accumulation: what transformers computes in bf16, at the core's bf16 dot rate.
// Also: the per-CPU dot-product peak it is measured against (bench).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace arbor::cpu {

// How the CPU backend runs prefill linears (rows > kLinearGemvMaxT; decode GEMVs are always exact):
//   Exact: linear() (x kept at ~16 mantissa bits; the parity tests' 1e-3 against transformers f32)
//   Bf16:  gemm_bf16() where it applies (gemm_bf16_applies: bf16 or f16 weights), else linear(), which is
//          then already the fastest path there: f32 weights and CPUs without AVX-512 BF16 convert the
//          weights to f32 once per packed panel and use f32 FMA, which a bf16 x would not speed up.
// Bf16Prompt is not a user's choice but how the CPU backend runs the prompt rows of a step in Bf16 mode
// when it knows the kind of each row (BatchInfo::decode_rows): the bf16 GEMM at any row count, so that a
// prompt token's result does not depend on how many prompt rows share its step.
enum class GemmMode : uint8_t { Exact, Bf16, Bf16Prompt };
std::string_view gemm_mode_name(GemmMode m);  // "exact", "bf16", "bf16-prompt"
// "exact" | "bf16"; throws arbor::Error naming `what` (e.g. "--cpu-gemm") otherwise.
GemmMode parse_gemm_mode(std::string_view s, const char* what);

// Whether gemm_bf16() can run for this weight dtype here: bf16 or f16 weights and an AVX-512 BF16 CPU
// (respecting ARBOR_CPU_MAX_ISA).
bool gemm_bf16_applies(DType wtype);

// y = bf16(x) · W^T (+ bias). Shapes and aliasing as cpu::linear(); any T >= 0 (it is meant for
// prompt chunks). Scratch per thread grows once: the bf16 x (T * ceil(K/2) * 4 bytes, calling thread)
// and a 32 KiB packed weight panel per worker. Throws arbor::Error if !gemm_bf16_applies(wtype) or on
// a bad shape or null pointer.
void gemm_bf16(ThreadPool& pool, const float* x, int64_t T, int64_t K, const void* W, DType wtype, int64_t N,
               const float* bias, float* y);

// gemm_bf16 with the weight panels supplied by the caller (the affine GEMM dequantizes them):
// pack(ctx, nb, nw, pb, kcp, P) fills P[p][j] (p < kcp, j < 32, row stride 32 words) with the bf16 pair of
// columns 2(pb+p), 2(pb+p)+1 of W's row nb + j as one 32-bit word (the lower column in the low half), zero
// for j >= nw. pb is a multiple of kGemmBf16PanelPairs and kcp <= it. Needs an AVX-512 BF16 CPU.
using Bf16PanelPacker = void (*)(const void* ctx, int64_t nb, int64_t nw, int64_t pb, int64_t kcp, uint32_t* P);
inline constexpr int64_t kGemmBf16PanelPairs = 256;
void gemm_bf16_panels(ThreadPool& pool, const float* x, int64_t T, int64_t K, int64_t N, const float* bias, float* y,
                      Bf16PanelPacker pack, const void* ctx);

// The ground truth for tests: x rounded to bf16 exactly as gemm_bf16 does, then plain loops with
// double accumulation (bf16 weights; for f16 ones, round them to bf16 first, as gemm_bf16 does).
void gemm_bf16_reference(const float* x, int64_t T, int64_t K, const void* W, int64_t N, const float* bias, float* y);

// The CPU's dot-product peak on every thread of `pool` at once, measured now with a tight loop of
// independent multiply-accumulates: vdpbf16ps (AVX-512 BF16, 64 FLOP per instruction), else f32 FMA
// (vfmadd231ps zmm or ymm). `seconds` is about how long it runs.
struct DotPeak {
  double flops = 0;        // FLOP/s, all threads together
  std::string what;        // "vdpbf16ps zmm", "vfmadd231ps zmm", "vfmadd231ps ymm", "scalar"
  int threads = 0;
};
DotPeak measure_dot_peak(ThreadPool& pool, double seconds = 0.3);

}  // namespace arbor::cpu
