// Blocked causal attention for the CPU backend on AVX-512: a run of up to 16 consecutive query tokens
// of one sequence x the query heads of one kv head, against keys 16 at a time (the block transposed
// once, shared by every query row), online softmax with a vector exp, p·V accumulated per row. The
// prefill path of CpuBackend::attention (the scalar-per-key loop it replaces cost a third of a
// 2048-token prefill); decode rows take it too when they can.
#pragma once
#include <cstdint>

namespace arbor::cpu {

struct AttnBlockArgs {
  const float* q;   // [T, n_heads * hd]
  float* out;       // [T, n_heads * hd]
  const float* K;   // this layer's key pool [n_blocks, bs, n_kv_heads, hd]
  const float* V;   // value pool, same layout
  int64_t n_heads = 0, n_kv_heads = 0, hd = 0, bs = 16;
  float scale = 1.0f;
  int64_t window = 0;  // 0 = full causal, else the last `window` positions (the token's own included)
};

// Whether attention_block can run: an AVX-512 CPU and attention_block_shape_ok.
bool attention_block_applies(int64_t hd, int64_t group, float softcap);

// What the blocked kernels (this one and attention_bf16.h's) take: no softcap, hd a multiple of 16 up to
// 256 (a row's hd/16 accumulators live in registers), 1 to 8 query heads per kv head.
bool attention_block_shape_ok(int64_t hd, int64_t group, float softcap);

// Calls kernel.template operator()<NC>() with NC = hd / 16 as a constant (hd a multiple of 16 up to 256).
template <int NC = 16, class Kernel>
void attention_block_by_width(int64_t hd, Kernel&& kernel) {
  if constexpr (NC > 1) {
    if (hd / 16 < NC) return attention_block_by_width<NC - 1>(hd, kernel);
  }
  kernel.template operator()<NC>();
}

// A blocked kernel's argument check (`who` names it; `applies` its *_applies for this shape; runs of at
// most max_run tokens): an error naming the call when it cannot run.
void check_attention_block_call(const char* who, bool applies, const AttnBlockArgs& a, int64_t nt, int64_t max_run, int64_t g,
                                int64_t pos0);

// The blocked kernels' last step: out row of (token t0 + r / G, head g·G + r % G) = O[r] / L[r] for the
// R = nt·G rows of kv head g (O [R][hd], L [R]).
void attention_block_store(const AttnBlockArgs& a, int64_t t0, int64_t R, int64_t g, const float* O, const float* L);

// Rows t0 .. t0 + nt - 1 (nt <= 16; one sequence, positions pos0 .. pos0 + nt - 1, its block table
// `table`) for kv head g and its query heads. `scratch`: attention_block_scratch_floats(hd, group)
// floats, 64-byte aligned.
void attention_block(const AttnBlockArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table, int64_t g,
                     float* scratch);
int64_t attention_block_scratch_floats(int64_t hd, int64_t group);
// A decode token (nt = 1) through the kernel that takes its query rows four at a time (1, the default), or through
// the per-row one (0); -1: back to ARBOR_CPU_ATTN_DECODE (unset: 1). Tests and A/B runs.
void set_attention_block_decode(int on);

}  // namespace arbor::cpu
