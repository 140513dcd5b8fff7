// CPU linear layers on trellis weights (QTIP bitshift trellis, 1MAD code; formats.md §3). The words stay
// packed; every weight is decoded where it is used: its 12-bit state is a window of the block's bit
// stream, its value (byte sum of state*34038481 + 76625530) - 510, times 1/147.8 and the row's scale.
//   - reference: each coded row decoded with quant::trellis_decode_row, double accumulation (the truth);
//   - GEMV (T <= kLinearGemvMaxT, AVX2 / AVX-512 / AVX-512 VBMI+VNNI): 8 or 16 weights decoded at once in
//     registers and used for all T activation rows (the VBMI kernel reads each chunk's windows from one
//     64-bit word with vpmultishiftqb and sums the bytes with vpdpbusd: linear_trellis_avx512vbmi.cpp); axis 1 reduces along each output row, axis 0 (the transposed
//     down projection) scatters each coded row into a per-thread block of 256 outputs;
//   - tiled (T > kLinearGemvMaxT): a tile of weights decoded once to f32 (12 output rows x all inputs
//     on axis 1, 64 inputs x 256 outputs on axis 0) and reused by a register-blocked product over
//     every activation row.
#pragma once
#include <cstdint>
#include <string>

#include "core/thread_pool.h"

namespace arbor::cpu {

// W logically [N out, K in]. axis 1: words [N, K*k/32], scales [N]; axis 0: words [K, N*k/32], scales
// [K]. Scales in f32 (the checkpoint's f16 values). The coded length (K on axis 1, N on axis 0) is a
// multiple of 256.
struct TrellisWeights {
  const uint32_t* words = nullptr;
  const float* scales = nullptr;
  int k = 2, axis = 1;
  int64_t N = 0, K = 0;
};

enum class TrellisKernel { Reference, Avx2, Avx512, Avx512Vbmi };
const char* trellis_kernel_name(TrellisKernel k);
bool trellis_kernel_supported(TrellisKernel k);  // by cpu_features() (ARBOR_CPU_MAX_ISA caps it)
TrellisKernel trellis_best_kernel();

// y[T, N] = x[T, K] · Wᵀ (+ bias[N] when not null), f32. Throws arbor::Error on a bad shape, k or axis,
// or a kernel this CPU cannot run. `kernel` Avx2/Avx512/Avx512Vbmi picks the GEMV for T <= 8 and the tiled path
// above; `force_tiled` sends every T to the tiled path (tests).
void linear_trellis(ThreadPool& pool, const float* x, int64_t T, const TrellisWeights& w, const float* bias, float* y,
                    TrellisKernel kernel, bool force_tiled = false);
inline void linear_trellis(ThreadPool& pool, const float* x, int64_t T, const TrellisWeights& w, const float* bias, float* y) {
  linear_trellis(pool, x, T, w, bias, y, trellis_best_kernel());
}
// "avx2-gemv", "avx512-tiled", "reference": what linear_trellis runs.
std::string trellis_kernel_label(TrellisKernel kernel, int64_t T);

namespace trellis_detail {
struct Args {
  const float* x;
  int64_t T;
  TrellisWeights w;
  const float* bias;
  float* y;
};
namespace avx2 {
void gemv(ThreadPool& pool, const Args& a);
void tiled(ThreadPool& pool, const Args& a);
}  // namespace avx2
namespace avx512 {
void gemv(ThreadPool& pool, const Args& a);
void tiled(ThreadPool& pool, const Args& a);
}  // namespace avx512
namespace avx512vbmi {
void gemv(ThreadPool& pool, const Args& a);
void tiled(ThreadPool& pool, const Args& a);
}  // namespace avx512vbmi
}  // namespace trellis_detail

}  // namespace arbor::cpu
