// Incoherence for weight quantization, folded exactly into the checkpoint (`arbor quantize --rotate`; issue
// 20 item 5's optional part): the residual stream of a pre-norm RMSNorm model is rotated by a random
// orthogonal Q = diag(s)·H/√n (s random signs, H the Walsh–Hadamard matrix, n = hidden_size, a power of
// two). RMSNorm commutes with Q once its weight is folded into the linears that read it (then set to 1), so
// with E' = E·Q, W' = W·diag(g)·Q for the linears reading a normed stream (q/k/v, gate/up, the head) and
// W' = Qᵀ·W (and b' = b·Q) for those writing into it (o, down), the model computes the same logits in real
// arithmetic while every matrix's rows (or columns) are spread by H: no input or output of a linear stands
// out, which suits the trellis code's Gaussian values (QuIP#/QuaRot's incoherence, without runtime
// transforms). A tied embedding is untied (the head carries the final norm's weight). Written in f32.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace arbor {

struct RotateStats {
  int64_t tensors = 0;
  bool untied = false;  // the checkpoint had tied embeddings; the rotated one has lm_head.weight of its own
};

// Reads the dense checkpoint in_dir and writes the rotated one (config.json with tie_word_embeddings false,
// f32 safetensors, the tokenizer files) into out_dir. Fails naming what is not supported: a block other
// than pre-norm, LayerNorm or Gemma's (1 + w) norm, a hidden size that is not a power of two, quantized input.
RotateStats rotate_residual_checkpoint(const std::string& in_dir, const std::string& out_dir, uint64_t seed,
                                       const std::function<void(uint64_t)>& progress = nullptr);

// v[n] <- FWHT(s ∘ v) / √n with s the seed's signs (n a power of two): v·Q for a row vector, Qᵀ·v for a column.
void rotate_vector(float* v, int64_t n, const std::vector<float>& signs);
std::vector<float> rotation_signs(int64_t n, uint64_t seed);

}  // namespace arbor
