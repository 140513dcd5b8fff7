// The CUDA backend: bf16 activations and KV cache, f32 accumulation, weights uploaded once (f32/bf16
// checkpoints as bf16, f16 kept as f16, vectors as f32). Ops run in order on one stream; the only
// host synchronisations are read_logits and the sampling calls that return ids.
// Kernels: elementwise.cu, gemv.cu (T <= 8), gemm.cpp (cuBLASLt), attention_{prefill,decode}.cu, sampling.cu;
// MLX affine weights: affine.h (device layout), affine_gemv.cu (decode GEMV, embedding gather).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

struct CUstream_st;      // cudaStream_t without including the CUDA headers here
struct cublasLtContext;  // cublasLtHandle_t

namespace arbor {
namespace cuda {
struct QKPrepArgs;  // kernels.h
struct AttnArgs;
constexpr int64_t kGemvMaxRowsCap = 8;  // rows the GEMV kernels take (kernels.h: kGemvMaxRows)
}

// True when a CUDA device can be used; otherwise *why says what is missing (no driver, no device).
bool cuda_device_available(std::string* why);
// Creates the backend on device `index`. Throws arbor::Error naming the CUDA call that failed.
std::unique_ptr<Backend> make_cuda_backend(int index = 0);

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override;
  Device device() const override { return Device::CUDA; }
  DType act_dtype() const override { return DType::BF16; }
  DType kv_dtype() const override { return DType::BF16; }

  Tensor alloc(DType t, std::initializer_list<int64_t> shape) override;
  Tensor load_weight(const Tensor& host) override;
  Linear load_linear(const Linear& host) override;
  bool views_host_weights() const override { return false; }
  void alloc_kv(const KVLayout& layout) override;
  const KVLayout& kv_layout() const override { return kv_; }
  void begin_batch(const BatchInfo& b) override;

  void embed(const Linear& table, Tensor out, float scale) override;
  void norm(NormOp op, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor out) override;
  void head_norm(NormOp op, Tensor x, int64_t head_dim, const Tensor& w, float eps) override;
  void linear(const Tensor& x, const Linear& l, Tensor y) override;
  // The linear kernels, by (weight format, rows of activations): the one place that picks one for
  // linear(), linear_multi() and gated_up(). GEMV (the streaming kernels, their tensor-core variant
  // past gemv_max_rows) or cuBLASLt, for dense BF16 or F16 weights; affine (affine.h) up to 8 rows the
  // affine GEMV (affine_gemv.cu), 9 to affine_dequant_min_rows_ - 1 the tensor-core GEMM that dequantizes
  // tiles in its main loop (affine_gemm.cu), from there on W dequantized to bf16 once (in slices of at most
  // dq_slice_bytes_) and cuBLASLt; trellis (trellis.h) up to 8 rows the trellis GEMV (trellis_gemv.cu),
  // beyond it W decoded to bf16 slice by slice (launch_trellis_decode) and cuBLASLt; anything else throws,
  // naming the layer's format and the supported pairs.
  enum class LinearKernel : uint8_t { GemvBf16, GemvF16, LtBf16, LtF16, GemvAffine, GemmAffine, DequantAffineLt, GemvTrellis, DequantTrellisLt };
  LinearKernel pick_linear(const Linear& l, int64_t rows) const;
  void rope(Tensor x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const Tensor& cos, const Tensor& sin) override;
  void kv_write(int64_t layer, const Tensor& k, const Tensor& v) override;
  void attention(int64_t layer, const Tensor& q, const AttentionParams& p, Tensor out) override;
  void activation(ActOp op, const Tensor& gate, const Tensor& up, Tensor out) override;
  void add_scaled(Tensor y, const Tensor& x, float scale) override;
  void scale_softcap(Tensor x, float scale, float cap) override;
  void gather_logit_rows(const Tensor& x, Tensor out) override;
  Tensor upload_table(const std::vector<float>& host, std::initializer_list<int64_t> shape) override;
  void read_logits(const Tensor& logits, float* host) override;

  // Greedy ids and draws on the GPU over device logits [R, vocab] f32 (e.g. the model's logits
  // buffer), queued as picks (Backend).
  bool argmax_rows_start(const Tensor& logits) override;
  bool sample_rows_start(const Tensor& logits, const std::vector<RowSampling>& rows) override;
  void wait_pick(int32_t* host_ids) override;
  void drop_picks() override;

  // Which attention kernel runs: Auto picks decode (split-K) when no sequence has more than
  // kDecodeMaxRun tokens in the batch, else the tensor-core prefill kernel. A head_dim neither takes
  // (other than 32, 64, 96, 128, 256; decode: not 96) runs the generic kernel (attention_generic.cu,
  // any head_dim up to 512) whatever the path. Tests force each; Generic forces the generic kernel.
  enum class AttentionPath : uint8_t { Auto, Prefill, Decode, Generic };
  void set_attention_path(AttentionPath p) { attn_path_ = p; }
  static constexpr int64_t kDecodeMaxRun = 4;

  // Decode steps as CUDA graphs (on by default): the decoder pads decode batches to buckets of up to
  // kGraphMaxTokens tokens; the first step of a shape runs eagerly (any scratch growth happens then),
  // the second is recorded, and every later one replays the recording. A step's shape key: tokens,
  // block-table width, and the longest context rounded up to a power of two (the attention split).
  void set_step_graphs(bool on);
  bool step_graphs() const { return graphs_on_; }
  int64_t graphs_recorded() const;
  static constexpr int64_t kGraphMaxTokens = 64;
  static constexpr int64_t kMaxGraphs = 256;  // recordings kept; more drops them all and starts over
  int64_t max_graph_tokens() const override { return graphs_on_ ? kGraphMaxTokens : 0; }
  bool step_graph_begin() override;
  void step_graph_end() override;
  void linear_multi(const Tensor& x, const LinearOut* outs, int n) override;
  void add_norm(NormOp op, Tensor x, const Tensor& o, float scale, const Tensor& w, const Tensor& b, float eps, Tensor out) override;
  void gated_up(const Tensor& x, const Linear& wg, const Linear& wu, ActOp op, Tensor gate, Tensor up, Tensor out) override;
  void qk_prep_kv_write(int64_t layer, Tensor q, Tensor k, const Tensor& v, const QKPrep& p) override;
  // Batches of one token per sequence on the decode kernel: the q/k prep and KV write inside the
  // attention kernel (one launch fewer per layer; ARBOR_CUDA_FUSED_PREP=0 turns it off).
  void prep_attention(int64_t layer, Tensor q, Tensor k, const Tensor& v, const QKPrep& prep, const AttentionParams& p, Tensor out) override;
  void set_fused_prep(bool on) { fused_prep_ = on; }

  // Linear layers over at most this many rows use the GEMV kernels, larger ones cuBLASLt (default 2:
  // from 4 rows on the GEMV, which reads every activation row from L1 per weight load, is slower than
  // cuBLASLt; docs/cuda-notes.md). ARBOR_CUDA_GEMV_MAX_ROWS overrides it; 0 sends everything to cuBLASLt.
  void set_gemv_max_rows(int64_t n) { gemv_max_rows_ = std::clamp<int64_t>(n, 0, cuda::kGemvMaxRowsCap); }
  // Affine weights at >= min_rows activation rows: dequantized to bf16 in slices of at most slice_bytes,
  // then cuBLASLt (below it, 9+ rows: the in-loop dequantizing GEMM). slice_bytes also bounds trellis
  // prefill's decoded slices (DequantTrellisLt). Tests and A/B runs.
  void set_affine_dequant(int64_t min_rows, size_t slice_bytes) {
    affine_dequant_min_rows_ = std::max<int64_t>(9, min_rows), dq_slice_bytes_ = std::max<size_t>(1, slice_bytes);
  }
  // Decoded slices in flight in decoded_lt: 1 (one stream, the default) or 2. Tests and A/B runs.
  void set_dq_streams(int n) { dq_streams_ = std::clamp(n, 1, 2); }
  int64_t gemv_max_rows() const { return gemv_max_rows_; }
  // GEMVs of 1-2 rows with K % 256 == 0 stream through shared memory (gemv.cu); off: the register
  // kernel for every GEMV. Process-wide; ARBOR_CUDA_GEMV_STREAM=0 turns it off (A/B runs, tests).
  static void set_gemv_stream(bool on);
  // On (the default), 3-8 rows with bf16 weights and K % 512 == 0 take a tensor-core GEMV (gemv.cu)
  // that reads every weight once, instead of cuBLASLt (faster at 4 and 8 rows for the 8B and Qwen3-0.6B:
  // docs/cuda-notes.md, session 9). Process-wide; ARBOR_CUDA_GEMV_MMA=0 turns it off.
  static void set_gemv_mma(bool on);
  static bool gemv_mma_takes(int64_t T, int64_t K, DType w_dtype);
  // The prefill attention kernel by name: "auto" (default: wgmma on sm_90 at head_dim 64/128, else
  // mma32 up to head_dim 128, else mma16), "wgmma", "mma32", "mma16" (a kernel a shape cannot take
  // falls back down that list); process-wide, ARBOR_CUDA_ATTN_PREFILL sets it.
  static void set_prefill_kernel(const char* name);
  // Whether the wgmma prefill kernel runs on this process's device at this head_dim.
  static bool prefill_wgmma_supported(int head_dim);
  // The name of the prefill kernel a head_dim runs under the current choice ("wgmma", "mma32", "mma16",
  // or "generic" for a head_dim the tuned kernels do not take).
  static const char* prefill_kernel(int head_dim);
  // Seeded draws run each row as a thread-block cluster of up to 16 blocks on sm_90 (as many as the
  // rows leave SMs for); tests force at most c blocks per row (0: back to that rule). Process-wide.
  static void set_sample_cluster(int c);
  // Decode attention over KV rows (attention_kv.h): 0 the split-K kernels (ARBOR_CUDA_KV_ATTN=v1), 1 the
  // tensor-core kernel for coded rows (v2, the default), 2 for bf16 rows too (v2all), -1 back to the environment.
  // Process-wide.
  static void set_kv_decode_attention(int mode);

  // Copies for tests and tools (synchronous).
  void upload(const void* host, const Tensor& dev);
  void download(const Tensor& dev, void* host);
  void synchronize();
  // KV pools [n_blocks, block_size, n_kv_heads, head_dim] bf16, for tests; a coded layer's side is
  // [n_blocks, block_size, n_kv_heads, row bytes] U8 (quant/kv_codec.h's rows).
  Tensor k_pool(int64_t layer) const;
  Tensor v_pool(int64_t layer) const;
  int sm_count() const { return n_sms_; }
  CUstream_st* stream() const { return stream_; }

 private:
  struct Alloc;
  struct Staging;
  void* device_alloc(size_t bytes);
  void ensure(void*& buf, size_t& cap, size_t bytes);  // grows a scratch buffer (synchronises when it does)
  void stage_copy(void* dst, const void* src, size_t bytes, bool f32_to_bf16);
  void load_affine(const Linear& host, Linear& l);  // load_linear's affine part (affine.h's layout)
  // load_linear's trellis part (trellis.h's layout).
  void load_trellis(const Linear& host, Linear& l);
  void upload_meta(const std::vector<int32_t>& host, void*& dev, size_t& cap);
  const BatchInfo& batch() const;
  // Host-side checks of the ops against the current batch; the per-token parts run once per batch.
  void check_kv_slots(int64_t layer, const Tensor& k, const Tensor& v);
  void check_rope_positions(int64_t n_pos) const;
  // The fused q/k prep's arguments (qk_prep_kv_write's checks included), and attention with it or without.
  bool prep_args(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const QKPrep& p, cuda::QKPrepArgs* a);
  void attention_impl(int64_t layer, const Tensor& q, const AttentionParams& p, Tensor out, const cuda::QKPrepArgs* prep);
  bool decode_attention_path(int64_t head_dim) const;
  // Prefill over coded pools: this layer's blocks the batch reads, dequantized into bf16 scratch pools
  // (a's pools and block tables pointed at them).
  void dequant_coded_blocks(int64_t layer, cuda::AttnArgs& a);
  void not_capturing(const char* what);  // fails (and drops the recording) when called inside a capture
  float* optional_scratch(int64_t floats);  // scratch a launch can do without; null inside a capture needing growth
  void drop_graphs();                    // after a buffer the recordings point into moved

  int device_ = 0, n_sms_ = 0;
  std::string device_name_;
  CUstream_st* stream_ = nullptr;
  cublasLtContext* lt_ = nullptr;
  std::vector<std::unique_ptr<Alloc>> owned_;
  std::unique_ptr<Staging> staging_;
  KVLayout kv_;
  std::vector<void*> k_pools_, v_pools_;
  AttentionPath attn_path_ = AttentionPath::Auto;
  int64_t gemv_max_rows_ = 2;
  bool fused_ = true;  // fused ops (ARBOR_CUDA_FUSED=0: the op sequences they replace, for comparisons)
  bool fused_prep_ = true;  // prep_attention fuses (ARBOR_CUDA_FUSED_PREP=0: qk_prep_kv_write then attention)
  bool graphs_on_ = true, capturing_ = false;
  uint64_t graph_key_ = 0;  // the current batch's shape key; 0: not a graph batch
  int64_t span_bucket_ = 0;  // longest context of the batch rounded up to a power of two (>= 64)
  int32_t min_pos_ = 0, max_pos_ = -1;  // the batch's position range
  int32_t min_rope_row_ = 0, max_rope_row_ = -1;  // the rope table rows it reads (BatchInfo::rope_rows, else pos)
  bool slots_checked_ = false;          // check_kv_slots has checked this batch's tokens
  struct Graphs;
  std::unique_ptr<Graphs> graphs_;  // executable graphs by shape key

  // The current batch: host view, and its metadata on the device.
  const BatchInfo* batch_ = nullptr;
  uint64_t batch_serial_ = 0;
  int64_t max_run_ = 0;                            // most tokens of one sequence in the batch
  std::vector<int32_t> runs_;                      // [n_runs, 3]: first token, n tokens, seq
  void* meta_ = nullptr;                           // tokens | pos | seq | block_tables | logit_rows [| rope_rows]
  size_t meta_cap_ = 0;
  int32_t* d_tokens_ = nullptr;
  int32_t* d_pos_ = nullptr;
  int32_t* d_seq_ = nullptr;
  int32_t* d_tables_ = nullptr;
  int32_t* d_logit_rows_ = nullptr;
  int32_t* d_rope_rows_ = nullptr;  // the batch's rope_rows, or d_pos_ when it has none
  void* tiles_ = nullptr;                          // prefill tiles [n, 8] int32
  size_t tiles_cap_ = 0;
  uint64_t tiles_serial_ = ~uint64_t(0);
  int64_t tiles_group_ = 0, n_tiles_ = 0;
  void* scratch_ = nullptr;                        // split-K partials, f16-GEMM operands
  size_t scratch_cap_ = 0;
  // Quantized prefill (DequantAffineLt, DequantTrellisLt): a slice of W decoded to bf16, at most
  // dq_slice_bytes_ (ARBOR_CUDA_DQ_SLICE_MIB), then cuBLASLt on it. 128 MiB: 16384 rows of a 4096-column
  // matrix, so q/k/v, o and down are one slice and gate/up two; the scratch is bounded by that, never the
  // model's size in bf16. Session 26 on an H100 (8B, two rounds, docs/benchmarks.md): 16 MiB slices (L2-sized, so
  // the decoded bf16 never reached HBM) gave prefill 512 / 2048 / 8192 at 33.4-33.7 / 63.9-64.0 / 71.1-71.9 % of cuBLAS at 4-bit;
  // 128 MiB 45.5-46.1 / 69.5-71.5 / 70.9-72.0 % (4 runs), 64 MiB 45.0-45.3 / 68.9-69.3 / 70.0-71.6 %, 256-512 MiB no better: fewer, larger GEMMs (at
  // 512 tokens a 2048-row slice is 64 output tiles for 132 SMs) outweigh the decoded slice's trip through HBM.
  size_t dq_slice_bytes_ = size_t(128) << 20;
  void* dq_slice_ = nullptr;
  size_t dq_slice_cap_ = 0;
  // Two slices in flight (dq_streams_ == 2, opt-in: ARBOR_CUDA_DQ_STREAMS=2): odd slices are decoded into
  // dq_slice2_ and multiplied on dq_side_ (its own cuBLASLt workspace), so one slice's decode runs beside the
  // other's GEMM. Measured in session 26 (H100, 8B 4-bit and trellis k=2, two rounds): -3 to +2 % against one stream
  // at 32-256 MiB slices, in no consistent direction; +4.5-6 % only at 512 tokens with 16 MiB slices. An option, not
  // the default.
  int dq_streams_ = 1;
  CUstream_st* dq_side_ = nullptr;
  void* dq_side_workspace_ = nullptr;
  void* dq_slice2_ = nullptr;
  size_t dq_slice2_cap_ = 0;
  void* dq_fork_ = nullptr;  // cudaEvent_t: stream_ -> dq_side_ before the slices
  void* dq_join_ = nullptr;  // cudaEvent_t: dq_side_ -> stream_ after them
  // y = x · Wᵀ (+ bias) for a quantized W through dq_slice_ and cuBLASLt (the Dequant*Lt kernels).
  void decoded_lt(const Tensor& x, const Linear& l, Tensor y, const float* bias, LinearKernel kernel);
  int64_t affine_dequant_min_rows_ = 65;           // ARBOR_CUDA_AFFINE_DEQUANT_ROWS overrides (A/B runs)
  int64_t trellis_gemv_max_rows_ = 0;  // trellis GEMV to here (kTrellisGemvMaxRows), decode + cuBLASLt past; ARBOR_CUDA_TRELLIS_GEMV_ROWS (A/B)
  bool cluster_merge_ok_ = false;  // the device launches thread-block clusters (sm_90)
  int attn_min_waves_ = 2;         // decode attention's split blocks: this many waves over the SMs at least (ARBOR_CUDA_ATTN_WAVES)
  int attn_cluster_max_ = 16;      // splits of a cluster merge, at most (ARBOR_CUDA_ATTN_CLUSTER)
  int attn_warps_ = 0;             // decode attention's warps per block of <= 4 heads: 0 by rule (attention_impl), else ARBOR_CUDA_ATTN_WARPS (4 or 8)
  int attn_merge_ = -1;  // decode attention's split merge: -1 by GQA group and span (attention_impl), 1 by the last block, 0 a second kernel, 2 a cluster (ARBOR_CUDA_ATTN_MERGE)
  void* attn_counters_ = nullptr;                  // decode attention's merge counters (zero between launches)
  size_t attn_counters_cap_ = 0;
  void* dq_pools_ = nullptr;    // prefill over coded pools: bf16 K then V of the batch's blocks (dequant_coded_blocks)
  size_t dq_pools_cap_ = 0;
  void* dq_meta_ = nullptr;     // their source block ids, then the block tables remapped onto them
  size_t dq_meta_cap_ = 0;
  uint64_t dq_serial_ = ~uint64_t(0);
  int64_t dq_blocks_ = 0, dq_table_off_ = 0;
  void* scratch2_ = nullptr;
  size_t scratch2_cap_ = 0;
  void* workspace_ = nullptr;                      // cuBLASLt
  size_t workspace_bytes_ = 0;
  void ensure_ids(int64_t rows, int64_t vocab);
  int begin_pick(const Tensor& logits);
  void end_pick(int slot, int64_t rows);
  void* sample_params_ = nullptr;                  // the queued draw's parameters (cuda::SampleRow per row)
  std::vector<int32_t> sample_words_;              // the same on the host, as int32 words (reused)
  size_t sample_params_cap_ = 0;
  int32_t* d_ids_ = nullptr;                       // sampled ids [max rows]
  size_t ids_cap_ = 0;
  int32_t* host_ids_ = nullptr;                    // the same, host-mapped (written by the kernels), two slots
  int32_t* host_ids_dev_ = nullptr;                //   its device address
  size_t host_ids_cap_ = 0;                        //   rows per slot
  struct Pick {                                    // a queued argmax or draw
    int slot;
    int64_t rows;
  };
  std::vector<Pick> picks_;                        // outstanding, oldest first (at most 2)
  void* pick_done_[2] = {nullptr, nullptr};        // cudaEvent_t per host slot (made with the stream)
  int next_pick_slot_ = 0;
  int64_t last_pick_rows_ = 0;                     // rows of the last queued pick (tokens may refer to them)
  void* argmax_part_ = nullptr;                    // argmax: per-block keys
  size_t argmax_part_cap_ = 0;
  void* argmax_counters_ = nullptr;                // argmax: per-row counters (zero between launches)
  size_t argmax_counters_cap_ = 0;
};

// Hardware ceilings measured now on the device (bench): device-to-device copy bandwidth in bytes/s
// (bytes read + bytes written, median of reps), and the cuBLAS(Lt) bf16 GEMM rate in FLOP/s on random
// n x n x n operands (f32 accumulation, median of reps).
double cuda_measure_copy_bandwidth(uint64_t bytes = uint64_t(2) << 30, int reps = 10);
double cuda_measure_bf16_gemm_rate(int64_t n = 8192, int reps = 10);
// Bytes of the current device's memory in use by every process (total - free, cudaMemGetInfo) and its total.
struct CudaMemory {
  uint64_t used = 0, total = 0;
};
CudaMemory cuda_device_memory();
// Seconds per GEMV y[T, N] = x[T, K]·Wᵀ (bf16 weights, bf16 out), median of reps, rotating over enough
// weight copies (> 256 MiB) that L2 holds none (l2_hot: one copy, read back to back, so L2 may hold
// it); warps_per_sm is the GEMV's K-split target.
double cuda_time_gemv(int64_t N, int64_t K, int64_t T, int warps_per_sm, int reps = 5, bool l2_hot = false);

}  // namespace arbor
