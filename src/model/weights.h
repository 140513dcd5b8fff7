// Weight slots: the tensors a model of a given config and descriptor needs (names, shapes), bound
// from a checkpoint (with the audit: nothing missing, nothing left over), generated for
// --dummy-weights, or written by `arbor synth`.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/archs.h"
#include "model/config.h"

namespace arbor {

class ThreadPool;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor the checkpoint must hold, in a stable order (embeddings, layers, final norm, head).
std::vector<TensorSpec> expected_tensors(const ModelConfig& c, const ArchDescriptor& a);

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
  Tensor embed;                        // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm, final_norm_b;     // [hidden]
  Linear lm_head;                      // [vocab, hidden] (the embedding when tied)
};

// Binds named host tensors to slots. `get(name, shape)` returns the host tensor for a spec (the
// checkpoint's, or generated); `upload` turns it into the backend's copy. Fused tensors (Phi-3
// qkv_proj, gate_up_proj) are split into row ranges here, so the decoder sees one layout.
ModelWeights bind_weights(const ModelConfig& c, const ArchDescriptor& a, const std::function<Tensor(const TensorSpec&)>& get,
                          Backend& backend);

// Deterministic pseudo-random weights for a spec: matrices ~ U(-a, a) with a = 1/sqrt(fan_in), norm
// weights near their identity value (1, or 0 for (1 + w) norms), biases small. Never zero. Value i
// depends only on (tensor name, i), so `pool` (optional) may fill large tensors in parallel.
void fill_dummy(const TensorSpec& s, const ArchDescriptor& a, DType dtype, void* out, ThreadPool* pool = nullptr);

}  // namespace arbor
