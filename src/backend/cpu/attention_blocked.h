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

// Whether attention_block can run: an AVX-512 CPU, no softcap, hd a multiple of 16 up to 256, at most
// 8 query heads per kv head.
bool attention_block_applies(int64_t hd, int64_t group, float softcap);

// Rows t0 .. t0 + nt - 1 (nt <= 16; one sequence, positions pos0 .. pos0 + nt - 1, its block table
// `table`) for kv head g and its query heads. `scratch`: attention_block_scratch_floats(hd, group)
// floats, 64-byte aligned.
void attention_block(const AttnBlockArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table, int64_t g,
                     float* scratch);
int64_t attention_block_scratch_floats(int64_t hd, int64_t group);

}  // namespace arbor::cpu
