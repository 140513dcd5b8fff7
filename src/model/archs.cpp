// The architecture table: one descriptor row per supported model family.
#include "model/archs.h"

#include <algorithm>

#include "core/error.h"

namespace arbor {

namespace {

std::vector<ArchDescriptor> make_table() {
  std::vector<ArchDescriptor> t;
  auto row = [&](const char* type) -> ArchDescriptor& {
    t.emplace_back();
    t.back().model_type = type;
    return t.back();
  };
  row("llama").aliases = {"LlamaForCausalLM"};
  {
    auto& r = row("mistral");
    r.aliases = {"MistralForCausalLM"};
    r.sliding = SlidingPattern::AllLayers;
  }
  {
    auto& r = row("qwen2");
    r.aliases = {"Qwen2ForCausalLM"};
    r.qkv_bias = true;
  }
  {
    auto& r = row("qwen3");
    r.aliases = {"Qwen3ForCausalLM"};
    r.qk_norm = QKNormKind::PerHead;
  }
  auto gemma_like = [](ArchDescriptor& r) {
    r.norm = NormKind::RMSPlusOne;
    r.default_act = Activation::GeLUTanh;
    r.scale_embeddings = true;
    r.tie_default = true;
  };
  {
    auto& r = row("gemma");
    r.aliases = {"GemmaForCausalLM"};
    gemma_like(r);
  }
  auto sandwich = [](ArchDescriptor& r) {
    r.block = BlockKind::Sandwich;
    r.names.mlp_norm = "";
    r.names.post_attn_norm = "post_attention_layernorm";
    r.names.pre_mlp_norm = "pre_feedforward_layernorm";
    r.names.post_mlp_norm = "post_feedforward_layernorm";
  };
  {
    auto& r = row("gemma2");
    r.aliases = {"Gemma2ForCausalLM"};
    gemma_like(r);
    sandwich(r);
    r.sliding = SlidingPattern::EvenLayers;
  }
  {
    auto& r = row("gemma3_text");
    r.aliases = {"gemma3", "Gemma3ForCausalLM"};
    gemma_like(r);
    sandwich(r);
    r.qk_norm = QKNormKind::PerHead;
    r.sliding = SlidingPattern::EveryNthFull;
    r.default_sliding_every = 6;
  }
  {
    auto& r = row("phi3");
    r.aliases = {"Phi3ForCausalLM"};
    r.names.qkv = "self_attn.qkv_proj";
    r.names.gate_up = "mlp.gate_up_proj";
    r.sliding = SlidingPattern::AllLayers;
  }
  row("granite").aliases = {"GraniteForCausalLM"};
  {
    auto& r = row("olmo2");
    r.aliases = {"Olmo2ForCausalLM"};
    r.block = BlockKind::PostNorm;
    r.qk_norm = QKNormKind::Full;
    r.names.attn_norm = "";
    r.names.mlp_norm = "";
    r.names.post_attn_norm = "post_attention_layernorm";
    r.names.post_mlp_norm = "post_feedforward_layernorm";
  }
  {
    auto& r = row("starcoder2");
    r.aliases = {"Starcoder2ForCausalLM"};
    r.norm = NormKind::LayerNorm;
    r.mlp = MlpKind::Plain;
    r.default_act = Activation::GeLUTanh;
    r.tie_default = true;
    r.sliding = SlidingPattern::AllLayers;
    r.names.gate = "";
    r.names.up = "mlp.c_fc";
    r.names.down = "mlp.c_proj";
  }
  {
    auto& r = row("smollm3");
    r.aliases = {"SmolLM3ForCausalLM"};
    r.tie_default = true;
  }
  return t;
}

const std::vector<ArchDescriptor>& table() {
  static const std::vector<ArchDescriptor> t = make_table();
  return t;
}

}  // namespace

std::vector<std::string> supported_archs() {
  std::vector<std::string> v;
  for (const auto& a : table()) v.push_back(a.model_type);
  return v;
}

const ArchDescriptor& find_arch(const ModelConfig& c) {
  for (const auto& a : table()) {
    if (a.model_type == c.model_type) return a;
    if (std::find(a.aliases.begin(), a.aliases.end(), c.model_type) != a.aliases.end()) return a;
  }
  for (const auto& a : table())
    if (!c.architecture.empty() && std::find(a.aliases.begin(), a.aliases.end(), c.architecture) != a.aliases.end()) return a;
  std::string list;
  for (const auto& n : supported_archs()) list += (list.empty() ? "" : ", ") + n;
  fail("model: unsupported architecture '{}'{}; supported: {}", c.model_type,
       c.architecture.empty() ? "" : fmt::format(" ({})", c.architecture), list);
}

Activation parse_activation(const std::string& s, Activation def, const std::string& where) {
  if (s.empty()) return def;
  if (s == "silu" || s == "swish") return Activation::SiLU;
  if (s == "gelu") return Activation::GeLU;
  if (s == "gelu_pytorch_tanh" || s == "gelu_new" || s == "gelu_fast" || s == "gelu_tanh") return Activation::GeLUTanh;
  fail("config: {}: unsupported activation '{}' (supported: silu, gelu, gelu_pytorch_tanh)", where, s);
}

void apply_arch_defaults(ModelConfig& c, const ArchDescriptor& a) {
  if (!c.tie_given) c.tie_word_embeddings = a.tie_default;
  if (c.layer_types.empty()) {
    for (int64_t i = 0; i < c.n_layers; ++i) {
      bool sliding = false;
      switch (a.sliding) {
        case SlidingPattern::None: break;
        case SlidingPattern::AllLayers: sliding = true; break;
        case SlidingPattern::EvenLayers: sliding = i % 2 == 0; break;
        case SlidingPattern::EveryNthFull: {
          int64_t n = c.sliding_window_pattern > 0 ? c.sliding_window_pattern : a.default_sliding_every;
          sliding = (i + 1) % n != 0;
          break;
        }
      }
      c.layer_types.push_back(sliding ? LayerAttention::Sliding : LayerAttention::Full);
    }
  }
  if (c.sliding_window <= 0) std::fill(c.layer_types.begin(), c.layer_types.end(), LayerAttention::Full);
  if (c.layer_uses_rope.empty()) c.layer_uses_rope.assign(size_t(c.n_layers), true);
}

}  // namespace arbor
