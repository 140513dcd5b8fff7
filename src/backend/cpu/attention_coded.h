// Blocked attention over a coded KV cache (quant/kv_codec.h) on AVX-512: the coded counterpart of
// attention_blocked.h. A run of up to 16 consecutive query tokens of one sequence x the query heads of a
// range of kv heads, against keys 16 at a time: the 16 key rows dequantized straight from their codes into a
// transposed float tile (shared by every query row), the 16 value rows into a row tile, online softmax
// with a vector exp, p·V accumulated per row. TurboQuant values stay in the rotated domain until the
// end (each output row is rotated back once). Softcap is taken. The decode and prefill path of
// CpuBackend::attention for coded layers; attention_kv.cpp is the fallback (AVX2, scalar, wide groups).
#pragma once
#include <cstdint>

#include "quant/kv_codec.h"

namespace arbor::cpu {

struct AttnCodedArgs {
  const float* q;      // [T, n_heads * hd]
  float* out;          // [T, n_heads * hd]
  const uint8_t* K;    // this layer's key pool: [n_blocks, bs, n_kv_heads] rows of kb bytes
  const uint8_t* V;    // value pool: rows of vb bytes
  KVCodec kc, vc;      // both coded
  int64_t kb = 0, vb = 0;
  int64_t n_heads = 0, n_kv_heads = 0, hd = 0, bs = 16;
  float scale = 1.0f, softcap = 0.0f;
  int64_t window = 0;  // 0 = full causal, else the last `window` positions (the token's own included)
};

// Whether attention_coded can run: an AVX-512 CPU, both K and V coded, head_dim a multiple of 64 up to
// 512 (every coded head_dim), at most 8 query heads per kv head.
bool attention_coded_applies(const KVCodecPair& c, int64_t hd, int64_t group);

// Rows t0 .. t0 + nt - 1 (nt <= 16; one sequence, positions pos0 .. pos0 + nt - 1, its block table
// `table`) for kv heads g0 .. g1 - 1 and their query heads, each key block read once for all of them
// (g1 - g0 at most attention_coded_max_heads(nt, group)). `scratch`: attention_coded_scratch_floats(hd,
// group) floats, 64-byte aligned. The pools must be readable 16 bytes past their last row (CpuBackend
// pads them).
void attention_coded(const AttnCodedArgs& a, int64_t t0, int64_t nt, int64_t pos0, const int32_t* table, int64_t g0, int64_t g1,
                     float* scratch);
int64_t attention_coded_scratch_floats(int64_t hd, int64_t group);
int64_t attention_coded_max_heads(int64_t nt, int64_t group);

}  // namespace arbor::cpu
