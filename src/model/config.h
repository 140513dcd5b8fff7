// ModelConfig: everything the decoder needs from a Hugging Face config.json, in one flat struct.
// Reads both the layout Hub checkpoints use (rope_theta, rope_scaling{type|rope_type},
// sliding_window_pattern, rope_local_base_freq, ...) and the one transformers 5 writes
// (rope_parameters, layer_types).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace arbor {

enum class RopeKind { None, Default, Linear, Dynamic, Llama3, Yarn, LongRope };
std::string_view rope_kind_name(RopeKind k);

// One rotary embedding: every parameter the variants use (those a variant ignores stay defaulted).
struct RopeConfig {
  RopeKind kind = RopeKind::Default;
  double theta = 10000.0;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  // llama3, yarn, longrope, dynamic: the context the model was trained at before scaling
  int64_t original_max_position = 0;
  // yarn
  double beta_fast = 32.0, beta_slow = 1.0, mscale = 1.0, mscale_all_dim = 0.0;
  bool truncate = true;
  // yarn / longrope: scale applied to cos and sin; < 0 means "derive from factor"
  double attention_factor = -1.0;
  std::vector<double> short_factor, long_factor;  // longrope, one per rotated pair
};

enum class LayerAttention : uint8_t { Full, Sliding };

struct ModelConfig {
  std::string model_type;       // "llama", "gemma3_text", ...
  std::string architecture;     // architectures[0], e.g. "LlamaForCausalLM"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position = 0;     // max_position_embeddings
  double norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool tie_given = false;       // config.json said; otherwise the descriptor's default applies
  std::string hidden_act = "silu";
  bool attention_bias = false;  // q/k/v (and o, where the descriptor says) carry biases
  bool mlp_bias = false;

  double partial_rotary_factor = 1.0;
  RopeConfig rope;              // full-attention layers
  RopeConfig rope_local;        // sliding-window layers (Gemma 3: rope_local_base_freq); = rope when absent
  int64_t sliding_window = 0;   // tokens a sliding layer sees, itself included; 0 = none
  int64_t sliding_window_pattern = 0;  // Hub Gemma 3: every Nth layer is full attention
  std::vector<LayerAttention> layer_types;  // per layer; filled by the descriptor when config.json has none
  std::vector<bool> layer_uses_rope;        // per layer (SmolLM3 no_rope_layers)

  double attn_logit_softcap = 0.0;   // 0 = off
  double final_logit_softcap = 0.0;
  double query_pre_attn_scalar = 0.0;  // Gemma 2/3: scale = scalar^-0.5; 0 = head_dim
  // Granite
  double embedding_multiplier = 1.0, residual_multiplier = 1.0, attention_multiplier = 0.0, logits_scaling = 1.0;

  std::vector<int64_t> bos_token_ids, eos_token_ids;

  int64_t rotary_dim() const;   // head_dim * partial_rotary_factor, even
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  std::string summary() const;  // one line for logs
};

// Parses config.json content. `where` names the file in errors. Missing required fields, wrong types and
// inconsistent shapes (heads not dividing, kv heads not dividing heads) are errors naming the field.
ModelConfig parse_model_config(const json& j, const std::string& where);
ModelConfig load_model_config(const std::string& path);

}  // namespace arbor
