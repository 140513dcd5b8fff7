// ArchDescriptor: one row per supported architecture. The decoder reads these knobs; it never
// branches on an architecture's name. A new architecture that fits the knobs is one row + a fixture.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace arbor {

enum class NormKind : uint8_t { RMS, RMSPlusOne, LayerNorm };  // RMSPlusOne: Gemma's x*(1+w)
// Where the norms sit in a block:
//  PreNorm:  h += attn(norm1(h)); h += mlp(norm2(h))                        (Llama and most)
//  Sandwich: h += post1(attn(norm1(h))); h += post2(mlp(pre2(h)))           (Gemma 2/3)
//  PostNorm: h += post1(attn(h)); h += post2(mlp(h))                        (OLMo 2)
enum class BlockKind : uint8_t { PreNorm, Sandwich, PostNorm };
enum class QKNormKind : uint8_t { None, PerHead, Full };  // Full: over all heads' q (OLMo 2)
enum class MlpKind : uint8_t { Gated, Plain };             // Gated: down(act(gate)*up); Plain: down(act(up))
enum class Activation : uint8_t { SiLU, GeLU, GeLUTanh };
// Which layers use the sliding window when config.json has no layer_types.
enum class SlidingPattern : uint8_t { None, AllLayers, EvenLayers, EveryNthFull };

struct TensorNames {
  std::string embed = "model.embed_tokens.weight";
  std::string final_norm = "model.norm";   // + ".weight" / ".bias"
  std::string lm_head = "lm_head.weight";
  std::string layer = "model.layers.{}.";  // prefix of every per-layer name
  std::string attn_norm = "input_layernorm", mlp_norm = "post_attention_layernorm";
  std::string post_attn_norm, pre_mlp_norm, post_mlp_norm;  // sandwich / post-norm
  std::string q = "self_attn.q_proj", k = "self_attn.k_proj", v = "self_attn.v_proj", o = "self_attn.o_proj";
  std::string qkv;  // fused q/k/v (Phi-3)
  std::string q_norm = "self_attn.q_norm", k_norm = "self_attn.k_norm";
  std::string gate = "mlp.gate_proj", up = "mlp.up_proj", down = "mlp.down_proj";
  std::string gate_up;  // fused gate/up (Phi-3)
};

struct ArchDescriptor {
  std::string model_type;                 // config.json model_type this row serves
  std::vector<std::string> aliases;       // other model_type / architectures spellings
  NormKind norm = NormKind::RMS;
  BlockKind block = BlockKind::PreNorm;
  QKNormKind qk_norm = QKNormKind::None;
  MlpKind mlp = MlpKind::Gated;
  Activation default_act = Activation::SiLU;  // when config.json names none
  bool qkv_bias = false;                  // q/k/v always carry biases (Qwen 2)
  bool o_bias_with_attention_bias = true; // attention_bias also puts a bias on o_proj
  bool scale_embeddings = false;          // Gemma: embeddings * sqrt(hidden)
  bool tie_default = false;
  SlidingPattern sliding = SlidingPattern::None;
  int64_t default_sliding_every = 0;      // EveryNthFull: default N when config.json has none
  TensorNames names;
};

const ArchDescriptor& find_arch(const ModelConfig& c);  // throws listing the supported ones
std::vector<std::string> supported_archs();
Activation parse_activation(const std::string& s, Activation def, const std::string& where);

// Fills what config.json leaves to the architecture: layer_types, per-layer rope use, tied
// embeddings default. Called once after parse_model_config.
void apply_arch_defaults(ModelConfig& c, const ArchDescriptor& a);

}  // namespace arbor
