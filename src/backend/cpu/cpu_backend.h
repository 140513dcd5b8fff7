// CpuBackend: the op set on the host, f32 activations and KV (or a KV codec's codes, per layer), weights read where they are (a view of
// the mmapped checkpoint) or from an anonymous huge-page copy (WeightPlacement), a private thread pool.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gemm_bf16.h"
#include "core/thread_pool.h"

namespace arbor {

enum class WeightPlacement : uint8_t { Mapped, Copy };  // Copy: anonymous memory, MADV_HUGEPAGE

class CpuBackend : public Backend {
 public:
  CpuBackend(int n_threads, WeightPlacement placement);
  ~CpuBackend() override;

  std::string name() const override;
  Device device() const override { return Device::CPU; }
  DType act_dtype() const override { return DType::F32; }
  DType kv_dtype() const override { return DType::F32; }
  ThreadPool& pool() { return pool_; }
  WeightPlacement placement() const { return placement_; }
  // Prefill linears (rows > kLinearGemvMaxT): exact (the default here, what the parity tests check) or
  // bf16 activations (cpu/gemm_bf16.h; the CLI's default, --cpu-gemm). Decode GEMVs are always exact.
  void set_gemm_mode(cpu::GemmMode m) { gemm_mode_ = m; }
  cpu::GemmMode gemm_mode() const { return gemm_mode_; }
  // Per-phase time accumulators for bench: off by default (then they cost one branch per op).
  struct PhaseTimes {
    double linear_s = 0, attention_s = 0;
    double linear_flops = 0;  // 2 * T * K * N summed over the timed linears
    double linear_bytes = 0;  // the weight bytes they read (codes or values, scales, biases, bias)
  };
  void set_phase_timing(bool on) { phase_timing_ = on; }
  void reset_phase_times() { phases_ = {}; }
  const PhaseTimes& phase_times() const { return phases_; }
  // Calibration (engine/calibration.h): called with every linear's input rows before the linear runs.
  using LinearObserver = std::function<void(const Tensor& x, const Linear& l)>;
  void set_linear_observer(LinearObserver f) { observer_ = std::move(f); }

  Tensor alloc(DType t, std::initializer_list<int64_t> shape) override;
  Tensor load_weight(const Tensor& host) override;
  Linear load_linear(const Linear& host) override;
  bool views_host_weights() const override { return placement_ == WeightPlacement::Mapped; }
  void alloc_kv(const KVLayout& layout) override;
  const KVLayout& kv_layout() const override { return kv_; }
  void begin_batch(const BatchInfo& b) override { batch_ = &b; }

  void embed(const Linear& table, Tensor out, float scale) override;
  void norm(NormOp op, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor out) override;
  void head_norm(NormOp op, Tensor x, int64_t head_dim, const Tensor& w, float eps) override;
  void linear(const Tensor& x, const Linear& l, Tensor y) override;
  // Affine q/k/v or gate/up decode rows in --cpu-gemm bf16 mode: one pass (cpu::linear_affine_multi).
  void linear_multi(const Tensor& x, const LinearOut* outs, int n) override;
  void rope(Tensor x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const Tensor& cos, const Tensor& sin) override;
  void kv_write(int64_t layer, const Tensor& k, const Tensor& v) override;
  void attention(int64_t layer, const Tensor& q, const AttentionParams& p, Tensor out) override;
  void activation(ActOp op, const Tensor& gate, const Tensor& up, Tensor out) override;
  void add_scaled(Tensor y, const Tensor& x, float scale) override;
  void scale_softcap(Tensor x, float scale, float cap) override;
  void gather_logit_rows(const Tensor& x, Tensor out) override;
  Tensor upload_table(const std::vector<float>& host, std::initializer_list<int64_t> shape) override;
  void read_logits(const Tensor& logits, float* host) override;
  // Greedy picks (the ids at once; queued so that a scheduler that queues steps ahead of their ids,
  // SchedulerOptions::queue_ahead, runs the same logic here as on a GPU). Sampled draws stay on the
  // engine's samplers (sample_rows_start: false).
  bool argmax_rows_start(const Tensor& logits) override;
  void wait_pick(int32_t* host_ids) override;
  void drop_picks() override { picks_.clear(); }

  // The linear kernels, by (weight format, rows of activations): the one place that maps a layer to
  // its kernel. pick_linear returns the kernel for l at `rows` rows, or throws arbor::Error naming l's
  // format and the supported (format, rows) pairs.
  using LinearKernel = void (*)(ThreadPool& pool, const Tensor& x, const Linear& l, Tensor y);
  // mode Bf16 sends dense BF16 prompt chunks (rows > kLinearGemvMaxT) to the bf16-activation GEMM where
  // the CPU has AVX-512 BF16; everything else as in Exact.
  static LinearKernel pick_linear(const Linear& l, int64_t rows, cpu::GemmMode mode = cpu::GemmMode::Exact);
  // KV pools for tests: layer's K and V, [n_blocks, block_size, n_kv_heads, head_dim] f32 (plain layers),
  // or [n_blocks, block_size, n_kv_heads, row bytes] of the layer's codec (k_pool_bytes).
  float* k_pool(int64_t layer) const;
  float* v_pool(int64_t layer) const;
  uint8_t* k_pool_bytes(int64_t layer) const { return k_pools_[size_t(layer)]; }
  uint8_t* v_pool_bytes(int64_t layer) const { return v_pools_[size_t(layer)]; }

 private:
  struct Block;  // one owned allocation
  void* own(size_t bytes, bool huge, bool kv = false);  // kv: a KV pool, freed by the next alloc_kv
  [[noreturn]] static float fail_value(const Tensor& t);
  // fn(i0, i1) over [0, n) items of `unit` values each: split over the pool when there are many values
  // (prompt chunks), inline for few (decode).
  void elementwise(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t unit = 1);

  ThreadPool pool_;
  WeightPlacement placement_;
  std::vector<std::unique_ptr<Block>> owned_, kv_owned_;
  KVLayout kv_;
  std::vector<uint8_t*> k_pools_, v_pools_;
  std::vector<int64_t> kv_slots_;  // kv_write's slot per token
  void attention_kv(int64_t layer, const Tensor& q, const AttentionParams& p, Tensor out);
  const BatchInfo* batch_ = nullptr;
  // Bf16 mode: the kind of each of `rows` activation rows (1 decode, 0 prompt) when the batch says and
  // the rows are its tokens or its logit rows; nullptr otherwise (then the row count picks the kernel).
  const uint8_t* row_kinds(int64_t rows);
  void linear_by_kind(const Tensor& x, const Linear& l, Tensor y, const uint8_t* kinds);
  std::vector<uint8_t> kinds_;
  std::vector<float> kind_x_, kind_y_;  // linear_by_kind's gathered rows
  cpu::GemmMode gemm_mode_ = cpu::GemmMode::Exact;
  bool phase_timing_ = false;
  LinearObserver observer_;
  PhaseTimes phases_;
  double* linear_phase(int64_t rows, const Linear& l);  // counts a timed linear's work; its time's accumulator (null: off)
  std::vector<std::vector<int32_t>> picks_;  // queued picks' ids, oldest first
  std::vector<int32_t> last_pick_;           // the last queued pick's ids (token_from_last_pick)
};

}  // namespace arbor
