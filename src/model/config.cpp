// config.json -> ModelConfig, for both the Hub layout and the transformers-5 layout.
#include "model/config.h"

#include <cmath>

#include "core/error.h"

namespace arbor {

namespace {

// Field readers that name the file and the field when a value has the wrong type.
struct Reader {
  const json& j;
  const std::string& where;

  bool present(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t integer(const char* k, int64_t def) const {
    if (!present(k)) return def;
    const json& v = j[k];
    if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>();
    if (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())) return int64_t(v.get<double>());
    fail("config: {}: field '{}' must be an integer, got {}", where, k, v.dump());
  }
  int64_t required(const char* k) const {
    if (!present(k)) fail("config: {}: required field '{}' is missing", where, k);
    return integer(k, 0);
  }
  double number(const char* k, double def) const {
    if (!present(k)) return def;
    const json& v = j[k];
    if (!v.is_number()) fail("config: {}: field '{}' must be a number, got {}", where, k, v.dump());
    return v.get<double>();
  }
  bool boolean(const char* k, bool def) const {
    if (!present(k)) return def;
    if (!j[k].is_boolean()) fail("config: {}: field '{}' must be true or false, got {}", where, k, j[k].dump());
    return j[k].get<bool>();
  }
  std::string string(const char* k, const std::string& def) const {
    if (!present(k)) return def;
    if (!j[k].is_string()) fail("config: {}: field '{}' must be a string, got {}", where, k, j[k].dump());
    return j[k].get<std::string>();
  }
  std::vector<double> numbers(const char* k) const {
    std::vector<double> out;
    if (!present(k)) return out;
    if (!j[k].is_array()) fail("config: {}: field '{}' must be a list of numbers", where, k);
    for (const auto& v : j[k]) {
      if (!v.is_number()) fail("config: {}: field '{}' must be a list of numbers, found {}", where, k, v.dump());
      out.push_back(v.get<double>());
    }
    return out;
  }
  std::vector<int64_t> ids(const char* k) const {
    std::vector<int64_t> out;
    if (!present(k)) return out;
    if (j[k].is_array()) {
      for (const auto& v : j[k])
        if (v.is_number_integer()) out.push_back(v.get<int64_t>());
    } else if (j[k].is_number_integer()) {
      out.push_back(j[k].get<int64_t>());
    }
    return out;
  }
};

RopeKind parse_rope_kind(const std::string& s, const std::string& where) {
  if (s == "default" || s.empty()) return RopeKind::Default;
  if (s == "linear") return RopeKind::Linear;
  if (s == "dynamic") return RopeKind::Dynamic;
  if (s == "llama3") return RopeKind::Llama3;
  if (s == "yarn") return RopeKind::Yarn;
  if (s == "longrope" || s == "su") return RopeKind::LongRope;
  fail("config: {}: unsupported rope type '{}' (supported: default, linear, dynamic, llama3, yarn, longrope)", where, s);
}

// Reads one rope block: {rope_type|type, factor, rope_theta?, ...}. `theta` is the fallback base.
RopeConfig parse_rope(const json& block, double theta, int64_t original_max, const std::string& where) {
  RopeConfig r;
  r.theta = theta;
  r.original_max_position = original_max;
  if (block.is_null()) return r;
  if (!block.is_object()) fail("config: {}: rope_scaling / rope_parameters must be an object, got {}", where, block.dump());
  Reader rd{block, where};
  std::string type = rd.string("rope_type", rd.string("type", "default"));
  r.kind = parse_rope_kind(type, where);
  r.theta = rd.number("rope_theta", theta);
  r.factor = rd.number("factor", 1.0);
  r.low_freq_factor = rd.number("low_freq_factor", 1.0);
  r.high_freq_factor = rd.number("high_freq_factor", 4.0);
  r.original_max_position = rd.integer("original_max_position_embeddings", original_max);
  r.beta_fast = rd.number("beta_fast", 32.0);
  r.beta_slow = rd.number("beta_slow", 1.0);
  r.mscale = rd.number("mscale", 1.0);
  r.mscale_all_dim = rd.number("mscale_all_dim", 0.0);
  r.truncate = rd.boolean("truncate", true);
  r.attention_factor = rd.number("attention_factor", -1.0);
  r.short_factor = rd.numbers("short_factor");
  r.long_factor = rd.numbers("long_factor");
  if (r.kind == RopeKind::LongRope && (r.short_factor.empty() || r.long_factor.empty()))
    fail("config: {}: longrope needs short_factor and long_factor", where);
  if (r.kind != RopeKind::Default && r.kind != RopeKind::LongRope && !(r.factor > 0))
    fail("config: {}: rope factor must be > 0, got {}", where, r.factor);
  return r;
}

}  // namespace

std::string_view rope_kind_name(RopeKind k) {
  switch (k) {
    case RopeKind::None: return "none";
    case RopeKind::Default: return "default";
    case RopeKind::Linear: return "linear";
    case RopeKind::Dynamic: return "dynamic";
    case RopeKind::Llama3: return "llama3";
    case RopeKind::Yarn: return "yarn";
    case RopeKind::LongRope: return "longrope";
  }
  return "?";
}

int64_t ModelConfig::rotary_dim() const {
  int64_t d = int64_t(double(head_dim) * partial_rotary_factor);
  return d - d % 2;
}

std::string ModelConfig::summary() const {
  return fmt::format("{} layers={} hidden={} heads={}/{} head_dim={} ffn={} vocab={} rope={}(theta={})", model_type, n_layers,
                     hidden_size, n_heads, n_kv_heads, head_dim, intermediate_size, vocab_size, rope_kind_name(rope.kind),
                     rope.theta);
}

ModelConfig parse_model_config(const json& j, const std::string& where) {
  if (!j.is_object()) fail("config: {}: expected a JSON object", where);
  // Multimodal wrappers keep the language model's fields in text_config.
  if (j.contains("text_config") && j["text_config"].is_object() && !j.contains("num_hidden_layers")) {
    json merged = j["text_config"];
    if (!merged.contains("model_type") && j.contains("model_type")) merged["model_type"] = j["model_type"];
    return parse_model_config(merged, where + " (text_config)");
  }
  Reader rd{j, where};
  ModelConfig c;
  c.model_type = rd.string("model_type", "");
  if (c.model_type.empty()) fail("config: {}: field 'model_type' is missing", where);
  if (rd.present("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    c.architecture = j["architectures"][0].get<std::string>();
  c.vocab_size = rd.required("vocab_size");
  c.hidden_size = rd.required("hidden_size");
  c.intermediate_size = rd.integer("intermediate_size", 4 * c.hidden_size);
  c.n_layers = rd.required("num_hidden_layers");
  c.n_heads = rd.required("num_attention_heads");
  c.n_kv_heads = rd.integer("num_key_value_heads", c.n_heads);
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) fail("config: {}: '{}' must be positive, got {}", where, name, v);
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("intermediate_size", c.intermediate_size);
  positive("num_hidden_layers", c.n_layers);
  positive("num_attention_heads", c.n_heads);
  positive("num_key_value_heads", c.n_kv_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    fail("config: {}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where, c.n_heads, c.n_kv_heads);
  c.head_dim = rd.integer("head_dim", 0);
  if (c.head_dim == 0) {
    if (c.hidden_size % c.n_heads != 0)
      fail("config: {}: hidden_size {} is not divisible by num_attention_heads {} and head_dim is not given", where,
           c.hidden_size, c.n_heads);
    c.head_dim = c.hidden_size / c.n_heads;
  }
  positive("head_dim", c.head_dim);
  c.max_position = rd.integer("max_position_embeddings", 4096);
  c.norm_eps = rd.number("rms_norm_eps", rd.number("layer_norm_eps", rd.number("norm_epsilon", rd.number("layer_norm_epsilon", 1e-6))));
  c.tie_given = rd.present("tie_word_embeddings");
  c.tie_word_embeddings = rd.boolean("tie_word_embeddings", false);
  c.hidden_act = rd.string("hidden_activation", rd.string("hidden_act", ""));
  c.attention_bias = rd.boolean("attention_bias", rd.boolean("use_bias", false));
  c.mlp_bias = rd.boolean("mlp_bias", rd.boolean("use_bias", false));

  // Rope: transformers 5 writes rope_parameters (possibly one block per layer type); Hub files use
  // rope_theta + rope_scaling. partial_rotary_factor lives at the top level or inside the block.
  double theta = rd.number("rope_theta", 10000.0);
  int64_t orig_max = rd.integer("original_max_position_embeddings", 0);
  c.partial_rotary_factor = rd.number("partial_rotary_factor", 1.0);
  json rope_full = nullptr, rope_local = nullptr;
  if (rd.present("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    if (rp.is_object() && (rp.contains("full_attention") || rp.contains("sliding_attention"))) {
      rope_full = rp.value("full_attention", json(nullptr));
      rope_local = rp.value("sliding_attention", json(nullptr));
    } else {
      rope_full = rp;
    }
  } else if (rd.present("rope_scaling")) {
    rope_full = j["rope_scaling"];
  }
  c.rope = parse_rope(rope_full, theta, orig_max, where);
  if (rope_full.is_object() && rope_full.contains("partial_rotary_factor") && rope_full["partial_rotary_factor"].is_number())
    c.partial_rotary_factor = rope_full["partial_rotary_factor"].get<double>();
  if (!rope_local.is_null()) {
    c.rope_local = parse_rope(rope_local, theta, orig_max, where);
  } else if (rd.present("rope_local_base_freq")) {
    c.rope_local = RopeConfig{};
    c.rope_local.theta = rd.number("rope_local_base_freq", theta);
  } else {
    c.rope_local = c.rope;
  }
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    fail("config: {}: partial_rotary_factor must be in (0, 1], got {}", where, c.partial_rotary_factor);
  if (c.rope.kind == RopeKind::LongRope && c.rope.original_max_position <= 0)
    fail("config: {}: longrope needs original_max_position_embeddings", where);

  c.sliding_window = rd.integer("sliding_window", 0);
  if (rd.present("use_sliding_window") && !rd.boolean("use_sliding_window", true)) c.sliding_window = 0;
  if (c.sliding_window < 0) fail("config: {}: sliding_window must be >= 0, got {}", where, c.sliding_window);
  c.sliding_window_pattern = rd.integer("sliding_window_pattern", rd.integer("_sliding_window_pattern", 0));
  if (rd.present("layer_types")) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || int64_t(lt.size()) != c.n_layers)
      fail("config: {}: layer_types must list {} layer types", where, c.n_layers);
    for (const auto& t : lt) {
      std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s == "full_attention") c.layer_types.push_back(LayerAttention::Full);
      else if (s == "sliding_attention") c.layer_types.push_back(LayerAttention::Sliding);
      else fail("config: {}: layer_types: unknown layer type {}", where, t.dump());
    }
  }
  if (rd.present("no_rope_layers")) {
    const json& nr = j["no_rope_layers"];
    if (!nr.is_array() || int64_t(nr.size()) != c.n_layers)
      fail("config: {}: no_rope_layers must list {} entries", where, c.n_layers);
    for (const auto& v : nr) c.layer_uses_rope.push_back(v.is_number() ? v.get<double>() != 0 : v.get<bool>());
  } else if (rd.present("no_rope_layer_interval")) {
    int64_t every = rd.integer("no_rope_layer_interval", 4);
    if (every <= 0) fail("config: {}: no_rope_layer_interval must be positive", where);
    for (int64_t i = 0; i < c.n_layers; ++i) c.layer_uses_rope.push_back((i + 1) % every != 0);
  }

  c.attn_logit_softcap = rd.number("attn_logit_softcapping", 0.0);
  c.final_logit_softcap = rd.number("final_logit_softcapping", 0.0);
  c.query_pre_attn_scalar = rd.number("query_pre_attn_scalar", 0.0);
  c.embedding_multiplier = rd.number("embedding_multiplier", 1.0);
  c.residual_multiplier = rd.number("residual_multiplier", 1.0);
  c.attention_multiplier = rd.number("attention_multiplier", 0.0);
  c.logits_scaling = rd.number("logits_scaling", 1.0);
  if (c.logits_scaling == 0) fail("config: {}: logits_scaling must not be 0", where);
  c.bos_token_ids = rd.ids("bos_token_id");
  c.eos_token_ids = rd.ids("eos_token_id");
  return c;
}

ModelConfig load_model_config(const std::string& path) { return parse_model_config(read_json_file(path), path); }

}  // namespace arbor
