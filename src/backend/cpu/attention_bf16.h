// Prefill attention in the bf16 GEMM modes (--cpu-gemm bf16) on AVX-512 BF16: q, k, v and the softmax
// weights p rounded to bf16 (round to nearest even), Q·Kᵀ and P·V as vdpbf16ps with f32 accumulation,
// online softmax in f32; what transformers computes in bf16, at the core's bf16 dot rate. The prompt
// rows' counterpart of attention_blocked.h (same arguments and masking): a run of up to
// kAttnBf16MaxRun consecutive tokens of one sequence x the query heads of one kv head, against keys 32
// at a time, each 32-key block packed once (k as dim pairs x keys, v as key pairs x dims: the layouts
// vdpbf16ps takes) and shared by every query row of the run. A row's arithmetic depends only on its own
// q and the keys it sees, not on the run it is in.
#pragma once
#include <cstdint>

#include "backend/cpu/attention_blocked.h"

namespace arbor::cpu {

inline constexpr int64_t kAttnBf16MaxRun = 32;

// Whether attention_bf16 can run: an AVX-512 BF16 CPU (respecting ARBOR_CPU_MAX_ISA), no softcap, hd a
// multiple of 16 up to 256, at most 8 query heads per kv head.
bool attention_bf16_applies(int64_t hd, int64_t group, float softcap);

// Rows t0 .. t0 + nt - 1 (nt <= kAttnBf16MaxRun; one sequence, positions pos0 .. pos0 + nt - 1, its
// block table `table`) for kv head g and its query heads. `scratch`: attention_bf16_scratch_floats(hd,
// group) floats, 64-byte aligned.
void attention_bf16(const AttnBlockArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table, int64_t g,
                    float* scratch);
int64_t attention_bf16_scratch_floats(int64_t hd, int64_t group);

}  // namespace arbor::cpu
