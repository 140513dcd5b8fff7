// Model: config + descriptor + weights on a backend + the one decoder forward, written once.
// forward() takes a flattened batch (prefill chunks and decode tokens of many sequences mixed) and
// returns logits only for the rows the batch asks for.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/archs.h"
#include "model/config.h"
#include "model/rope.h"
#include "model/weights.h"

namespace arbor {

class Checkpoint;

// The format --dummy-weights makes the matrices in. Dense: dummy_dtype. A quantized format generates what its
// synthetic checkpoint (`arbor synth`) would hold, without writing it, and stays packed in memory as that
// checkpoint would load; tensors it does not quantize (norms, matrices whose rows do not divide) are dense.
struct DummyQuant {
  WeightFormat format = WeightFormat::Dense;
  quant::AffineParams affine;  // Affine: bits and group size; the matrices mlx-lm's default predicate quantizes
                               // (every linear, the embedding and an untied head, when the rows divide into groups)
  // Trellis: k (2, 3, 4) and the down projection's axis; the matrices `arbor synth --format trellis` codes
  // (trellis_arch_recipe: the layers' linears whose coded length is a multiple of 256), with its words and scales.
  int trellis_bits = 2, trellis_down_axis = 0, trellis_axis = 1;  // trellis_axis: the linears other than down
  std::string describe() const;  // "dense", "affine 4-bit g64", "trellis 2-bit"
};

struct LoadOptions {
  std::string model_dir;     // holds config.json (+ safetensors unless dummy_weights)
  std::string config_path;   // overrides model_dir/config.json
  bool dummy_weights = false;
  DType dummy_dtype = DType::BF16;  // dense dummy tensors, and a quantized format's scales/biases
  DummyQuant dummy_quant;           // with dummy_weights: the matrices' format
  int64_t ctx_size = 0;      // positions the rope tables and KV plan cover; 0 = min(max_position, 4096)
  int64_t max_step_tokens = 256;  // tokens one forward may carry (activation buffers are sized for it)
  int64_t kv_blocks = 0;     // 0 = enough for one ctx_size sequence (+1 block)
  int64_t block_size = 16;
  std::string kv_cache = "bf16";  // KV codec per layer (quant/kv_codec.h resolve_kv_cache_spec): "k8v3,0:bf16,-1:bf16"
  bool show_progress = true;
};

class Model {
 public:
  Model(const LoadOptions& opt, Backend& backend);  // throws arbor::Error naming what failed
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ArchDescriptor& arch() const { return *arch_; }
  Backend& backend() { return backend_; }
  int64_t ctx_size() const { return ctx_size_; }
  int64_t max_step_tokens() const { return max_step_tokens_; }
  uint64_t weight_bytes() const { return weight_bytes_; }      // as stored: packed codes, scales and biases count as they are
  uint64_t embed_bytes() const { return embed_bytes_; }        // the embedding table's share of weight_bytes()
  uint64_t parameter_count() const { return param_count_; }    // weights (a quantized matrix: rows x cols, not packed words)
  std::string weight_dtypes() const { return weight_dtypes_; }  // "BF16" or "BF16, F32" ("BF16, U32": affine codes)
  // The matrices' formats with their counts, most frequent first: "affine 4-bit g64 x22, dense BF16 x1".
  std::string weight_formats() const { return weight_formats_; }
  // Every matrix as bound, with its module path (a fused checkpoint matrix gives one entry per part): what
  // calibration (`arbor quantize --calib`) keys the linears' inputs by.
  std::vector<std::pair<std::string, const Linear*>> matrix_modules() const;

  // Runs the batch; writes logits [b.logit_rows.size(), vocab] (float32, row-major) to logits_out.
  // With logits_out null the logits stay on the backend (device_logits), for sampling there; the
  // batch may then ask for at most logit_capacity() rows.
  void forward(const BatchInfo& b, float* logits_out);
  Tensor device_logits(int64_t rows) const;  // the last forward's logits [rows, vocab] f32
  int64_t logit_capacity() const { return logit_cap_; }
  // Whether a sequence whose prompt has prompt_tokens tokens takes longrope's long regime (the long
  // factors at every position, as transformers rotates a first forward longer than
  // original_max_position_embeddings): the caller sets SequenceKV::long_rope, hence BatchInfo::long_rope.
  // Always false for the other ropes.
  bool long_rope_for(int64_t prompt_tokens) const;

 private:
  void plan_buffers();
  int64_t graph_bucket(int64_t T) const;     // 0: no graph for T tokens
  bool make_graph_batch(const BatchInfo& b);  // fills graph_batch_ when b is a graphable decode step
  const BatchInfo& with_rope_rows(const BatchInfo& b);
  // The layer stack; with final_norm, every row's final norm too (into rows_normed_: the logits path
  // when row i is logit row i, the last residual add fused with that norm).
  void run_layers(int64_t T, bool final_norm = false);
  void run_logits(int64_t n, bool normed = false);  // normed: run_layers left the rows normed

  ModelConfig cfg_;
  const ArchDescriptor* arch_ = nullptr;
  Backend& backend_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::vector<std::unique_ptr<uint8_t[]>> dummy_;  // host memory behind dummy weights
  ModelWeights w_;
  int64_t ctx_size_ = 0, max_step_tokens_ = 0;
  uint64_t weight_bytes_ = 0, embed_bytes_ = 0, param_count_ = 0;
  std::string weight_dtypes_, weight_formats_;

  NormOp norm_op_{};
  ActOp act_op_{};
  float embed_scale_ = 1.0f;
  AttentionParams attn_full_, attn_sliding_;
  RopeTable rope_full_, rope_local_;
  Tensor cos_full_, sin_full_, cos_local_, sin_local_;  // [ctx, rot/2] on the device ([2 ctx, rot/2] with a long regime)
  bool has_long_rope_ = false;
  BatchInfo rope_batch_;                      // a batch with long-regime sequences, with its rope_rows

  static constexpr int64_t kLogitChunk = 16;  // logit rows per lm_head call (at least)
  int64_t logit_cap_ = kLogitChunk;           // rows of the logits buffer
  int64_t graph_max_ = 0;                     // most tokens of a graph-replayed decode step (0: none)
  BatchInfo graph_batch_;                     // the padded decode step
  Tensor x_, h_, q_, k_, v_, attn_, o_, gate_, up_, act_, rows_, rows_normed_, logits_;
};

}  // namespace arbor
