// Weight slots: the tensors a model of a given config and descriptor needs (names, shapes), bound
// from a checkpoint (with the audit: nothing missing, nothing left over), generated for
// --dummy-weights, or written by `arbor synth`.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/archs.h"
#include "model/config.h"
#include "quant/affine.h"

namespace arbor {

class ThreadPool;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

struct LayerWeights {
  Tensor attn_norm, attn_norm_b;       // [hidden] (PreNorm, Sandwich)
  Tensor post_attn_norm;               // [hidden] (Sandwich, PostNorm)
  Tensor mlp_norm, mlp_norm_b;         // [hidden] pre-MLP norm (PreNorm: mlp_norm, Sandwich: pre_mlp_norm)
  Tensor post_mlp_norm;                // [hidden] (Sandwich, PostNorm)
  Tensor q_norm, k_norm;               // [head_dim] per head, or [q_dim]/[kv_dim] over all heads
  Linear q, k, v, o;                   // q [q_dim, hidden], k/v [kv_dim, hidden], o [hidden, q_dim]
  Linear gate, up, down;               // gate/up [ffn, hidden], down [hidden, ffn]; gate empty for plain MLPs
};

struct ModelWeights {
  Linear embed;                        // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm, final_norm_b;     // [hidden]
  Linear lm_head;                      // [vocab, hidden] (the embedding when tied)
};

// One entry of the weight walk: a matrix (a linear layer or the embedding table) or a vector (a norm's
// weight or bias, a per-head norm).
struct WeightSlot {
  enum class Kind : uint8_t { Matrix, Vector };
  Kind kind = Kind::Vector;
  // Matrix: the module path ("model.layers.0.self_attn.q_proj"); its tensors are name + ".weight" and,
  // with `bias`, name + ".bias". Vector: the tensor's name.
  std::string name;
  int64_t rows = 0, cols = 0;  // Matrix: [rows, cols]; Vector: rows elements, cols 0
  bool bias = false;           // Matrix: has name + ".bias" [rows]
  // Where the slot binds when the walk is given a ModelWeights (else empty / null). A matrix splits
  // into parts by rows, in order (fused qkv_proj / gate_up_proj: several; else one); a vector binds
  // to `vec`, or is read and dropped when `vec` is null (a LayerNorm bias the decoder does not use).
  std::vector<std::pair<Linear*, int64_t>> parts;  // (destination, rows)
  Tensor* vec = nullptr;
};

// The one walk over a model's weights, in a stable order (embedding, layers, final norm, head; the
// head only when untied). With `m` (its layers already sized to the config's n_layers, or empty: the
// walk sizes them), each slot says where it binds. Specs, binding, dummy weights and synth all derive
// from it.
void for_each_weight(const ModelConfig& c, const ArchDescriptor& a, ModelWeights* m, const std::function<void(const WeightSlot&)>& fn);

// Every tensor the checkpoint must hold, in the walk's order (a matrix: .weight, then .bias).
std::vector<TensorSpec> expected_tensors(const ModelConfig& c, const ArchDescriptor& a);

// What tells a checkpoint's MLX affine matrices from dense ones (formats.md §2): a matrix is affine when
// `has(module + ".scales")` (as mlx-lm decides); its bits and group size are the config's for that module path.
// `affine` is config.json's quantization block (null when it has none); `has` null means no matrix is affine.
// Trellis matrices (formats.md §3) are those whose module the block makes trellis (AffineQuantConfig::trellis_for):
// .weight U32 and .scales F16, no .biases; `shape(name)` gives a stored tensor's shape (the k = 3 axis-0
// weight may be interleaved, 3-D); null: the plain layout.
struct QuantizedSource {
  const quant::AffineQuantConfig* affine = nullptr;
  std::function<bool(const std::string&)> has;
  std::function<std::vector<int64_t>(const std::string&)> shape;
};

// Binds named host tensors to slots. `get(spec)` returns the host tensor for a spec (the checkpoint's,
// or generated); each matrix becomes a host Linear, then `backend.load_linear` turns it into the
// backend's (vectors: `backend.load_weight`). Fused tensors (Phi-3 qkv_proj, gate_up_proj) are split
// into row ranges here, so the decoder sees one layout. A tied head is the embedding. An affine matrix (see
// QuantizedSource) is read as .weight U32 [rows, cols*bits/32], .scales and .biases F32/F16/BF16 [rows, cols/group];
// errors name the tensor (a missing .biases, a wrong dtype, a group that does not divide the row, a module the
// config keeps dense). `get` must accept U32 tensors for that; dtypes are checked here.
ModelWeights bind_weights(const ModelConfig& c, const ArchDescriptor& a, const std::function<Tensor(const TensorSpec&)>& get,
                          Backend& backend, const QuantizedSource& quantized = {});

// Deterministic pseudo-random weights for a spec: matrices ~ U(-a, a) with a = 1/sqrt(fan_in), norm
// weights near their identity value (1, or 0 for (1 + w) norms), biases small. Never zero. Value i
// depends only on (tensor name, i), so `pool` (optional) may fill large tensors in parallel.
void fill_dummy(const TensorSpec& s, const ArchDescriptor& a, DType dtype, void* out, ThreadPool* pool = nullptr);

}  // namespace arbor
