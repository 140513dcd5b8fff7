// Request-body validation shared by the OpenAI and Anthropic routes: typed field readers whose errors
// name the field, the sampling fields, and chat messages normalised for the chat template.
#pragma once
#include <string>

#include "core/json.h"
#include "server/context.h"

namespace arbor::server {

// Parses a request body; 400 naming the problem for malformed JSON, invalid UTF-8, or a non-object.
json parse_body(const std::string& body);

// Typed optional fields: nullopt when absent or null; 400 naming `name` for a wrong type or range.
std::optional<double> opt_number(const json& j, const char* name, double lo, double hi);
std::optional<int64_t> opt_int(const json& j, const char* name, int64_t lo, int64_t hi);
std::optional<bool> opt_bool(const json& j, const char* name);
std::optional<std::string> opt_string(const json& j, const char* name);

// Sampling fields common to chat and completions (temperature, top_p, top_k, min_p, seed, penalties,
// logit_bias, stop, n, max_tokens / max_completion_tokens) with the server defaults applied.
GenParams parse_sampling(const json& body, const ServerContext& ctx);

// response_format (chat: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
// "strict"}}) or the Responses API's text.format (flat: {"type": "json_schema", "name", "schema", "strict"}):
// the JSON constraint to decode with, nullopt for plain text. `field` names the member in 400 errors.
std::optional<JsonConstraint> parse_response_format(ServerContext& ctx, const json& rf, const std::string& field, bool flat);

// The request's chat messages as the template expects them: content parts joined into one string, the
// developer role mapped to system, tool-call arguments given as JSON text turned into objects. 400 for an
// empty list, an unknown role, a wrong type, or an image part (the served model is text-only).
nlohmann::ordered_json normalize_messages(const json& messages);
// OpenAI tools list, validated ({type: "function", function: {name, ...}}). Ordered: the template's tojson
// prints the client's key order, as transformers does.
nlohmann::ordered_json normalize_tools(const nlohmann::ordered_json& tools);

// tool_choice: "none", "auto" (also when absent), "required", or "auto" for an object naming a function
// (the call is not forced); 400 for anything else.
std::string parse_tool_choice(const json& body);

// Template kwargs from chat_template_kwargs, reasoning_effort and the server's --thinking default.
nlohmann::ordered_json template_kwargs(const json& body, const ServerContext& ctx);

// Renders and tokenizes a chat prompt. Also reports whether the prompt opens a <think> block.
std::vector<int32_t> render_chat_prompt(const ServerContext& ctx, const nlohmann::ordered_json& messages,
                                        const nlohmann::ordered_json& tools, const nlohmann::ordered_json& kwargs,
                                        bool& opens_reasoning, bool add_generation_prompt = true);

}  // namespace arbor::server
