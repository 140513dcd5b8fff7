// arbor::ChatTemplate: loading a model's chat template and rendering conversations with it.
#include "text/jinja/chat_template.h"

#include "core/error.h"

namespace arbor {

using ojson = nlohmann::ordered_json;

namespace {

// DIR/tokenizer_config.json, or an empty object when there is none.
ojson tokenizer_config(const std::string& dir) {
  const std::string cfg_path = dir + "/tokenizer_config.json";
  ojson cfg = ojson::object();
  if (!file_exists(cfg_path)) return cfg;
  try {
    cfg = ojson::parse(read_text_file(cfg_path));
  } catch (const ojson::parse_error& e) {
    fail("chat template: {}: {}", cfg_path, e.what());
  }
  if (!cfg.is_object()) fail("chat template: {}: expected a JSON object", cfg_path);
  return cfg;
}

// The special tokens a template sees: strings or AddedToken objects {"content": ...}; null means not set.
std::map<std::string, std::string> special_tokens_of(const ojson& cfg) {
  std::map<std::string, std::string> out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!cfg.contains(key)) continue;
    const ojson& v = cfg[key];
    if (v.is_string()) out[key] = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v["content"].is_string()) out[key] = v["content"].get<std::string>();
  }
  return out;
}

}  // namespace

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir, const std::string& name) {
  ChatTemplate ct;
  const std::string cfg_path = dir + "/tokenizer_config.json";
  const std::string jinja_path = dir + "/chat_template.jinja";
  const ojson cfg = tokenizer_config(dir);
  std::string origin;
  if (file_exists(jinja_path)) {
    ct.source_ = read_text_file(jinja_path);
    origin = jinja_path;
  } else if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
    const ojson& t = cfg["chat_template"];
    origin = cfg_path;
    if (t.is_string()) {
      ct.source_ = t.get<std::string>();
    } else if (t.is_array()) {
      bool found = false;
      for (const auto& entry : t) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
            !entry["template"].is_string())
          fail("chat template: {}: chat_template list entries need string 'name' and 'template'", cfg_path);
        std::string n = entry["name"].get<std::string>();
        ct.available_.push_back(n);
        if (n == name) ct.source_ = entry["template"].get<std::string>(), found = true;
      }
      if (!found) {
        std::string names;
        for (const auto& n : ct.available_) names += (names.empty() ? "" : ", ") + n;
        fail("chat template: {}: no template named '{}' (has: {})", cfg_path, name, names);
      }
    } else {
      fail("chat template: {}: chat_template must be a string or a list of {{name, template}}", cfg_path);
    }
  } else {
    fail("chat template: {} has no chat_template.jinja and no chat_template in tokenizer_config.json", dir);
  }
  ct.special_tokens_ = special_tokens_of(cfg);
  ct.template_ = jinja::Template::parse(ct.source_, origin);
  return ct;
}

ChatTemplate ChatTemplate::from_source_for_dir(const std::string& source, const std::string& dir) {
  ChatTemplate ct = from_source(source);
  ct.special_tokens_ = special_tokens_of(tokenizer_config(dir));
  return ct;
}

std::optional<std::string> ChatTemplate::builtin(const std::string& name) {
  if (name == "chatml")
    return "{%- for message in messages -%}\n"
           "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
           "{%- endfor -%}\n"
           "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";
  return std::nullopt;
}

ChatTemplate ChatTemplate::from_source(const std::string& source) {
  ChatTemplate ct;
  ct.source_ = source;
  ct.template_ = jinja::Template::parse(source, "chat_template");
  return ct;
}

std::string ChatTemplate::render(const ojson& messages, const ojson& tools, bool add_generation_prompt, const ojson& kwargs) const {
  if (!messages.is_array()) fail("chat template: messages must be a JSON list, got {}", messages.type_name());
  if (!tools.is_null() && !tools.is_array()) fail("chat template: tools must be a JSON list or null, got {}", tools.type_name());
  if (!kwargs.is_null() && !kwargs.is_object()) fail("chat template: kwargs must be a JSON object, got {}", kwargs.type_name());
  // The variables apply_chat_template passes: messages, tools, documents, add_generation_prompt,
  // then the tokenizer's special tokens, then the caller's keyword arguments.
  std::vector<std::pair<std::string, jinja::Value>> vars;
  vars.emplace_back("messages", jinja::from_json(messages));
  vars.emplace_back("tools", jinja::from_json(tools));
  vars.emplace_back("documents", jinja::Value::none());
  vars.emplace_back("add_generation_prompt", jinja::Value(add_generation_prompt));
  auto put = [&](const std::string& k, jinja::Value v) {
    for (auto& [name, x] : vars)
      if (name == k) {
        x = std::move(v);
        return;
      }
    vars.emplace_back(k, std::move(v));
  };
  for (const auto& [k, v] : special_tokens_) put(k, jinja::Value(v));
  if (kwargs.is_object())
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) put(it.key(), jinja::from_json(it.value()));
  return template_->render(vars);
}

std::string ChatTemplate::render(const json& messages, const json& tools, bool add_generation_prompt, const json& kwargs) const {
  return render(ojson(messages), ojson(tools), add_generation_prompt, ojson(kwargs));
}

}  // namespace arbor
