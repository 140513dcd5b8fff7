// Host-side launchers of the CUDA kernels (defined in the .cu files beside this), called by
// CudaBackend. Activations are bf16 (passed as uint16_t*), accumulation f32; every launcher checks
// the launch (ARBOR_LAUNCH_CHECK) and never synchronises.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"

namespace arbor::cuda {

// ---- elementwise.cu -------------------------------------------------------------------------------
// out[t] = table[tokens[t]] * scale; table [V, C] bf16 or f16, out [T, C] bf16. A token < 0 is
// picked[-1 - token] (the ids the last argmax wrote: token_from_last_pick).
void launch_embed(const void* table, DType table_dtype, const int32_t* tokens, const int32_t* picked, int64_t T, int64_t C, float scale,
                  uint16_t* out, cudaStream_t s);
// Rows of x [R, C] bf16 normalised; w, b f32 [C] (b may be null); out may alias x.
void launch_norm(NormOp op, const uint16_t* x, const float* w, const float* b, float eps, int64_t R, int64_t C, uint16_t* out,
                 cudaStream_t s);
// Rotates the first rot_dim dims of each head (halves [0, rot/2) and [rot/2, rot)); cos/sin [n_rows, rot/2]
// f32, token t at row rows[t] (its position, or BatchInfo::rope_rows).
void launch_rope(uint16_t* x, const int32_t* rows, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
                 const float* cos, const float* sin, cudaStream_t s);
// k, v [T, row] into the pools [n_blocks, block_size, row] at each token's slot (row = n_kv_heads*head_dim).
void launch_kv_write(const uint16_t* k, const uint16_t* v, const int32_t* pos, const int32_t* seq,
                     const int32_t* block_tables, int32_t max_blocks, int64_t T, int64_t row, int64_t block_size,
                     uint16_t* k_pool, uint16_t* v_pool, cudaStream_t s);
// One side's (K or V) KV-cache codec as the kernels see it (quant/kv_codec.h): kind is a KVCodecKind
// (0: plain bf16 rows), row_bytes the bytes of one head row.
struct KVCodecDev {
  int kind = 0, bits = 0, group = 0, row_bytes = 0;
};
inline KVCodecDev kv_codec_dev(const KVCodec& c, int64_t head_dim) {
  return {int(c.kind), c.bits, c.group, int(c.row_bytes(head_dim, 2))};
}
// Per-head q/k norms (RMS or RMS(1 + w)), rope and the KV write in one kernel (CudaBackend::qk_prep_kv_write).
// With coded pools (kc / vc not plain) the key and value rows are encoded as they are written.
struct QKPrepArgs {
  uint16_t* q = nullptr;        // [T, n_heads * head_dim], in place
  uint16_t* k = nullptr;        // [T, n_kv_heads * head_dim], in place
  const uint16_t* v = nullptr;  // [T, n_kv_heads * head_dim]
  const float* q_norm = nullptr;  // [head_dim] or null (no norm)
  const float* k_norm = nullptr;
  bool plus_one = false;        // weights are (1 + w) (Gemma)
  float eps = 0;
  const float* cos = nullptr;   // [n_rows, half] or null (no rope)
  const float* sin = nullptr;
  int half = 0;                 // rot_dim / 2
  const int32_t* pos = nullptr;
  const int32_t* rope_rows = nullptr;  // [T] the cos/sin row of each token (BatchInfo::rope_rows, or pos)
  const int32_t* seq = nullptr;
  const int32_t* tables = nullptr;
  int32_t max_blocks = 0, block_size = 16;
  uint16_t* k_pool = nullptr;  // bf16 rows, or coded rows (bytes) when kc / vc say so
  uint16_t* v_pool = nullptr;
  int T = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  KVCodecDev kc, vc;
};
void launch_qk_prep(const QKPrepArgs& a, cudaStream_t s);
// out = act(gate) * up, or act(up) when gate is null; n elements, bf16.
void launch_activation(ActOp op, const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out, cudaStream_t s);
// y += x * scale (bf16).
void launch_add_scaled(uint16_t* y, const uint16_t* x, int64_t n, float scale, cudaStream_t s);
// x += o * scale (stored bf16), then out = norm(x) * w (+ b), rows of C; one kernel (add, then norm).
void launch_add_norm(NormOp op, uint16_t* x, const uint16_t* o, float scale, const float* w, const float* b, float eps, int64_t R,
                     int64_t C, uint16_t* out, cudaStream_t s);
// x = x * scale, then cap * tanh(x / cap) when cap > 0; x is f32 or bf16.
void launch_scale_softcap(void* x, DType dtype, int64_t n, float scale, float cap, cudaStream_t s);
// out[i] = x[rows[i]], rows of row_bytes bytes (a multiple of 2).
void launch_gather_rows(const void* x, int64_t row_bytes, const int32_t* rows, int64_t R, void* out, cudaStream_t s);
// y [T, N] (bf16 or f32) += bias [N] f32.
void launch_add_bias(void* y, DType y_dtype, const float* bias, int64_t T, int64_t N, cudaStream_t s);
// y [T, N] = src [T, N] f32 (+ bias), converted to y_dtype (bf16 or f32).
void launch_finish_f32(const float* src, const float* bias, int64_t T, int64_t N, void* y, DType y_dtype, cudaStream_t s);
// bf16 -> f16 (f16 weights' GEMM needs f16 activations).
void launch_bf16_to_f16(const uint16_t* x, int64_t n, uint16_t* out, cudaStream_t s);
// Deterministic pseudo-random bf16 in [-1, 1) (ceiling measurements: never time on zeros).
void launch_fill_random_bf16(uint16_t* p, int64_t n, uint64_t seed, cudaStream_t s);

// ---- gemv.cu --------------------------------------------------------------------------------------
// y [T, N] = x [T, K] · w[N, K]ᵀ (+ bias f32 [N]) for T in 1..8; w bf16 or f16, x bf16, y bf16 or f32.
void launch_gemv(const void* w, DType w_dtype, const uint16_t* x, const float* bias, void* y, DType y_dtype, int64_t T,
                 int64_t N, int64_t K, int n_sms, cudaStream_t s);
constexpr int64_t kGemvMaxRows = kGemvMaxRowsCap;
// Several matrices over the same x [T, K] in one launch: y_i [T, N_i] = x · w_iᵀ (+ bias_i).
struct GemvOut {
  const void* w;
  const float* bias;  // may be null
  void* y;
  int64_t N;
};
constexpr int kGemvMaxSegments = 3;
void launch_gemv_multi(const GemvOut* outs, int n, DType w_dtype, const uint16_t* x, DType y_dtype, int64_t T, int64_t K, int n_sms,
                       cudaStream_t s);
// Gated MLP input in one launch: y [T, N] = act(x · gateᵀ + b) * (x · upᵀ + b), both rounded to bf16
// before the product (the numbers linear + activation give).
void launch_gemv_gated(const GemvOut& gate, const GemvOut& up, ActOp act, DType w_dtype, const uint16_t* x, uint16_t* y, int64_t T,
                       int64_t K, int n_sms, cudaStream_t s);
// The kernel's view of them: matrix i owns row pairs [pair0[i], pair0[i + 1]).
struct GemvSegments {
  const uint16_t* w[kGemvMaxSegments];
  const float* bias[kGemvMaxSegments];
  void* y[kGemvMaxSegments];
  int64_t N[kGemvMaxSegments];
  int64_t pair0[kGemvMaxSegments];
  int n;
};
// Target warps per SM when splitting K across warps for small N (default 32; bench sweeps it).
void set_gemv_warps_per_sm(int w);
// The streaming kernel for 1-2 rows with K % 256 == 0 (default on; off: the register kernel for all).
void set_gemv_stream(bool on);
// The tensor-core kernel for 3-8 rows with bf16 weights and K % 512 == 0 (default on; off, or
// ARBOR_CUDA_GEMV_MMA=0: cuBLASLt takes those rows), and whether a shape would take it.
void set_gemv_mma(bool on);
bool gemv_mma_takes(int64_t T, int64_t K, DType w_dtype);

// ---- attention_*.cu -------------------------------------------------------------------------------
#ifdef __CUDACC__
// The gated activations (ActOp order: SiLU, GeLU, GeLUTanh), shared by the activation and GEMV kernels.
__device__ __forceinline__ float act_value(int op, float x) {
  if (op == 0) return x / (1.0f + __expf(-x));
  if (op == 1) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
#endif

struct AttnArgs {
  const uint16_t* q = nullptr;       // [T, n_heads*head_dim] bf16
  const uint16_t* k_pool = nullptr;  // [n_blocks, block_size, n_kv_heads, head_dim] bf16
  const uint16_t* v_pool = nullptr;
  uint16_t* out = nullptr;           // [T, n_heads*head_dim] bf16
  const int32_t* pos = nullptr;      // [T]
  const int32_t* seq = nullptr;      // [T]
  const int32_t* block_tables = nullptr;  // [S, max_blocks]
  int32_t max_blocks = 0, block_size = 16;
  int32_t block_shift = -1;  // log2(block_size) when it is a power of two (a shift, not a division)
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f, softcap = 0.0f;
  int32_t window = 0;  // 0: full causal
};
#ifdef __CUDACC__
// Cache slot of key position kp of the sequence whose block table row is `table`.
__device__ __forceinline__ int64_t kv_slot(const AttnArgs& a, const int32_t* table, int32_t kp) {
  if (a.block_shift >= 0) return (int64_t(table[kp >> a.block_shift]) << a.block_shift) + (kp & (a.block_size - 1));
  return int64_t(table[kp / a.block_size]) * a.block_size + kp % a.block_size;
}
#endif
// Split-K flash-decoding: grid (n_splits, kv heads x head chunks, T); every query token attends to
// [lo, pos] of its sequence, cut into n_splits equal ranges (per token, in the kernel); partial
// results (o, m, l) go to scratch [T, n_heads, n_splits, head_dim + 2] f32; with counters [T * n_kv_heads
// * head chunks] (zero before the launch, left zero) the last block of each (token, head chunk) merges
// them, without (null) a second kernel does; with cluster (sm_90: the caller checks the device) the
// splits of a (token, head chunk) are one thread-block cluster that merges in shared memory, and
// neither scratch nor counters are used. A range may be empty (m = -inf), which the merge skips.
// n_splits <= kDecodeMaxSplits (kDecodeMaxCluster with cluster).
constexpr int kDecodeMaxSplits = 512;
constexpr int kDecodeMaxCluster = 16;
// With prep (QKPrepArgs of this layer; each sequence one token in the batch): the q/k prep and KV write
// of launch_qk_prep happen inside, on q/k/v straight from the projections (q and k are left unchanged).
// wide: 8 warps per block instead of 4 where a block holds up to 4 query heads.
void launch_attention_decode(const AttnArgs& a, int64_t T, int n_splits, float* scratch, unsigned* counters, cudaStream_t s,
                             const QKPrepArgs* prep = nullptr, bool cluster = false, bool wide = false);
// Flash attention over tiles of query rows (tokens x the GQA group's heads) with tensor cores
// (wgmma or mma.sync, bf16 in, f32 accumulators) and online softmax. tiles [n_tiles, 8] int32:
// {first token, n tokens, seq, min pos, max pos, 0, 0, 0}; each tile has at most kPrefillRows / group tokens.
void launch_attention_prefill(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s);
constexpr int kPrefillRows = 128;  // query rows (token x head) per prefill tile
// Which prefill kernel runs (process-wide, for A/B runs and tests): Wgmma (attention_prefill_wgmma.cu,
// where prefill_wgmma_supported), Mma32 (mma.sync, 32 rows per warp, head_dim <= 128), Mma16
// (mma.sync, 16 rows per warp, any head_dim). Auto, and a choice a shape cannot take, falls back
// down that list. parse_prefill_kernel reads "auto", "wgmma", "mma32", "mma16" (others fail).
enum class PrefillKernel { Auto, Wgmma, Mma32, Mma16 };
void set_prefill_kernel(PrefillKernel k);
PrefillKernel parse_prefill_kernel(const char* name);
// The kernel a prefill at this head_dim runs on this device under the current choice, and its name.
PrefillKernel prefill_kernel_for(int head_dim);
const char* prefill_kernel_name(PrefillKernel k);
// The wgmma kernel runs on this device (sm_90) at this head_dim (64, 128).
bool prefill_wgmma_supported(int head_dim);
void launch_attention_prefill_wgmma(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s);

// Any head_dim up to kGenericMaxHeadDim (attention_generic.cu): one warp per (token, query head), for
// the head_dims the kernels above do not take (attention_tuned_head_dim), prefill and decode alike.
constexpr int kGenericMaxHeadDim = 512;
void launch_attention_generic(const AttnArgs& a, int64_t T, cudaStream_t s);
// Whether the decode kernel (decode true: 32, 64, 128, 256) or the prefill kernels (32, 64, 96, 128,
// 256) take this head_dim.
bool attention_tuned_head_dim(int head_dim, bool decode);

// ---- attention_kv.cu: coded KV pools (quant/kv_codec.h, docs/kv-cache.md) -------------------------
// k, v [T, n_kv_heads * head_dim] bf16 encoded into the coded pools [n_blocks, block_size, n_kv_heads,
// row bytes] at each token's slot (a plain side is copied as bf16). head_dim 64, 128, 256.
void launch_kv_write_coded(const uint16_t* k, const uint16_t* v, const int32_t* pos, const int32_t* seq, const int32_t* block_tables,
                           int32_t max_blocks, int64_t T, int n_kv_heads, int head_dim, int64_t block_size, KVCodecDev kc, KVCodecDev vc,
                           uint8_t* k_pool, uint8_t* v_pool, cudaStream_t s);
// Split-K decode attention reading codes (a.k_pool / a.v_pool hold coded rows): keys and values
// dequantized in registers; TurboQuant values accumulated in the rotated domain. Partials always go
// to scratch [T, n_heads, n_splits, head_dim + 2] and a merge kernel combines them, applying the
// inverse FWHT and sign flip once per output head for TurboQuant values. head_dim 64, 128, 256.
void launch_attention_decode_coded(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int n_splits, float* scratch,
                                   cudaStream_t s);
// Dequantizes whole blocks of a coded pool pair into bf16 pools: block src_blocks[i] of the coded pools
// into block i of k_out / v_out ([n, block_size, n_kv_heads, head_dim] bf16). TurboQuant values are
// rotated back.
void launch_kv_dequant_blocks(const uint8_t* k_pool, const uint8_t* v_pool, KVCodecDev kc, KVCodecDev vc, const int32_t* src_blocks,
                              int64_t n, int64_t block_size, int n_kv_heads, int head_dim, uint16_t* k_out, uint16_t* v_out,
                              cudaStream_t s);

// ---- sampling.cu ----------------------------------------------------------------------------------
// ids[r] = argmax of logits row r (ties: lowest id, as torch.argmax; NaN never wins, a row of NaNs
// gives 0); logits [rows, vocab] f32, rows <= 65535. Each row is cut over argmax_blocks(vocab) blocks:
// part holds rows x that many keys and counters rows zeros (left zero) when that is more than one.
// host_ids, when not null, is host-mapped memory that receives the ids too (no copy to wait for).
int64_t argmax_blocks(int64_t vocab);
void launch_argmax(const float* logits, int64_t rows, int64_t vocab, uint64_t* part, unsigned* counters, int32_t* ids, int32_t* host_ids,
                   cudaStream_t s);
// Seeded sampling per row in transformers' order: temperature (<= 0: that row greedy), top-k, top-p,
// min-p, each row its own parameters (params: device memory, one per row). The random draw of a row is
// a hash of (seed, step), so the same pair always gives the same id.
struct SampleRow {
  float temperature;
  int32_t top_k;  // 0 = off
  float top_p;    // 1 = off
  float min_p;    // 0 = off
  uint64_t seed, step;
};
// Each row is one thread-block cluster of up to kSampleMaxCluster blocks on sm_90 (fewer when rows x
// blocks would exceed n_sms), one block elsewhere.
constexpr int kSampleMaxCluster = 16;
int sample_max_cluster();       // the largest cluster this device launches the kernel in (1: none)
void set_sample_cluster(int c);  // tests: at most c blocks per row whatever the rows (0: by rows, the default)
void launch_sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* ids, int32_t* host_ids,
                   int n_sms, cudaStream_t s);

}  // namespace arbor::cuda
