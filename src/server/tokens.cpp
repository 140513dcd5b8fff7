// POST /tokenize and /detokenize, in the shapes vLLM's and llama.cpp's servers answer, so clients of
// either work: text ("prompt", vLLM; "content", llama.cpp) or chat "messages" (rendered with the chat
// template, as /v1/chat/completions would) to ids, and ids back to text.
#include "server/api_error.h"
#include "server/params.h"
#include "server/routes.h"

namespace arbor::server {

using ojson = nlohmann::ordered_json;

// Request: exactly one of "prompt" (special tokens added unless add_special_tokens is false), "content"
// (added only if add_special is true), "messages" (+ "tools", "chat_template_kwargs",
// "add_generation_prompt", default true). "with_pieces": each token as {"id", "piece"}.
// Response: {"tokens", "count", "max_model_len"}.
void handle_tokenize(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w) {
  json b = parse_body(req.body);
  const auto prompt = opt_string(b, "prompt"), content = opt_string(b, "content");
  const bool chat = b.contains("messages") && !b["messages"].is_null();
  if (int(prompt.has_value()) + int(content.has_value()) + int(chat) != 1)
    bad_request("prompt", "give exactly one of 'prompt' (text), 'content' (text) or 'messages' (a chat)");
  std::vector<int32_t> ids;
  if (chat) {
    ojson messages = normalize_messages(b["messages"]);
    ojson tools = nullptr;
    if (auto t = b.find("tools"); t != b.end() && !t->is_null()) tools = normalize_tools(ojson::parse(req.body)["tools"]);
    bool opens_reasoning = false;
    ids = render_chat_prompt(ctx, messages, tools, template_kwargs(b, ctx), opens_reasoning,
                             opt_bool(b, "add_generation_prompt").value_or(true));
  } else {
    const bool special = prompt ? opt_bool(b, "add_special_tokens").value_or(true) : opt_bool(b, "add_special").value_or(false);
    ids = ctx.tok->encode(prompt ? *prompt : *content, special);
  }
  json tokens = json::array();
  if (opt_bool(b, "with_pieces").value_or(false)) {
    for (int32_t id : ids) tokens.push_back({{"id", id}, {"piece", token_text(ctx, id)}});
  } else {
    tokens = ids;
  }
  send_json(w, 200, {{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", ctx.ctx_size}});
}

// Request: {"tokens": [ids]}. Response: the text, special tokens included, as both "prompt" (vLLM)
// and "content" (llama.cpp).
void handle_detokenize(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w) {
  json b = parse_body(req.body);
  auto t = b.find("tokens");
  if (t == b.end() || t->is_null()) bad_request("tokens", "is required");
  if (!t->is_array()) bad_request("tokens", "must be an array of token ids");
  const int64_t vocab = int64_t(ctx.tok->vocab_size());
  std::vector<int32_t> ids;
  ids.reserve(t->size());
  for (size_t i = 0; i < t->size(); ++i) {
    const json& v = (*t)[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
      bad_request(fmt::format("tokens[{}]", i), "must be a token id (0..{}), got {}", vocab - 1, v.dump().substr(0, 40));
    ids.push_back(v.get<int32_t>());
  }
  const std::string text = ctx.tok->decode(ids, false);
  send_json(w, 200, {{"prompt", text}, {"content", text}});
}

}  // namespace arbor::server
