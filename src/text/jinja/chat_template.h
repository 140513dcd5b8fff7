// arbor::ChatTemplate: a model's chat template (tokenizer_config.json's chat_template, string or named
// list, or chat_template.jinja) rendered the way transformers' apply_chat_template renders it.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "text/jinja/template.h"

namespace arbor {

class ChatTemplate {
 public:
  // Loads DIR/chat_template.jinja if present (it wins, as in transformers), else tokenizer_config.json's
  // chat_template. `name` picks one of the named templates of the list form ("default", "tool_use", ...).
  // Throws arbor::Error naming the directory when there is no template or it does not parse.
  static ChatTemplate from_model_dir(const std::string& dir, const std::string& name = "default");
  // A template given as source, with no special tokens defined.
  static ChatTemplate from_source(const std::string& source);
  // A template given as source, with the special tokens of DIR/tokenizer_config.json (none without one):
  // what a model's own template would see, for a template that replaces it.
  static ChatTemplate from_source_for_dir(const std::string& source, const std::string& dir);
  // The source of a template built in by name, for models that ship none (llama.cpp's
  // --chat-template NAME): "chatml" (<|im_start|>role\ncontent<|im_end|>). nullopt for other names.
  static std::optional<std::string> builtin(const std::string& name);

  // messages: list of {role, content (string or list of parts), tool_calls, ...}; tools: list or null;
  // kwargs: extra template variables (enable_thinking, ...), which override the special tokens.
  // Objects keep the key order of the ordered_json given (the order `tojson` prints).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& kwargs) const;
  std::string render(const json& messages, const json& tools, bool add_generation_prompt, const json& kwargs) const;

  const std::string& source() const { return source_; }
  // Names of every template in the named list form (empty for a single template).
  const std::vector<std::string>& available() const { return available_; }
  // Special tokens passed to the template (bos_token, eos_token, unk_token, pad_token, ...).
  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }

 private:
  std::string source_;
  std::optional<jinja::Template> template_;
  std::vector<std::string> available_;
  std::map<std::string, std::string> special_tokens_;
};

}  // namespace arbor
