// Anthropic Messages (/v1/messages): request mapped onto the chat pipeline; response and the exact SSE
// event sequence (message_start, content_block_start/delta/stop per block, message_delta, message_stop).
// Also /v1/messages/count_tokens, which renders the same prompt and counts it.
#include "server/api_error.h"
#include "server/json_body.h"
#include "server/params.h"
#include "server/routes.h"

namespace arbor::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string text_of_blocks(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_request(where, "must be a string or an array of content blocks");
  std::string s;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& b = c[i];
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) bad_request(fmt::format("{}[{}].type", where, i), "is required and must be a string");
    if (b["type"] == "text") {
      if (!b.contains("text") || !b["text"].is_string()) bad_request(fmt::format("{}[{}].text", where, i), "is required and must be a string");
      s += b["text"].get<std::string>();
    } else if (b["type"] == "image" || b["type"] == "document") {
      bad_request(fmt::format("{}[{}]", where, i), "is an {}; the served model is text-only", b["type"].get<std::string>());
    }
  }
  return s;
}

// Anthropic messages + system -> OpenAI-style messages (validated again by normalize_messages).
json to_openai_messages(const json& b) {
  json out = json::array();
  if (auto s = b.find("system"); s != b.end() && !s->is_null()) out.push_back({{"role", "system"}, {"content", text_of_blocks(*s, "system")}});
  auto mit = b.find("messages");
  if (mit == b.end() || mit->is_null()) bad_request("messages", "is required");
  if (!mit->is_array()) bad_request("messages", "must be an array");
  if (mit->empty()) bad_request("messages", "must contain at least one message");
  for (size_t i = 0; i < mit->size(); ++i) {
    const json& m = (*mit)[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_request(where, "must be an object");
    std::string role = m.value("role", json("")).is_string() ? m.value("role", std::string()) : std::string();
    if (role != "user" && role != "assistant") bad_request(where + ".role", "must be 'user' or 'assistant', got '{}'", role.substr(0, 40));
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) bad_request(where + ".content", "is required");
    if (c->is_string()) {
      out.push_back({{"role", role}, {"content", *c}});
      continue;
    }
    if (!c->is_array()) bad_request(where + ".content", "must be a string or an array of content blocks");
    std::string text, thinking;
    json calls = json::array();
    for (size_t k = 0; k < c->size(); ++k) {
      const json& blk = (*c)[k];
      std::string bw = fmt::format("{}.content[{}]", where, k);
      if (!blk.is_object() || !blk.contains("type") || !blk["type"].is_string()) bad_request(bw + ".type", "is required and must be a string");
      std::string type = blk["type"];
      if (type == "text") {
        if (!blk.contains("text") || !blk["text"].is_string()) bad_request(bw + ".text", "is required and must be a string");
        text += blk["text"].get<std::string>();
      } else if (type == "thinking") {
        if (blk.contains("thinking") && blk["thinking"].is_string()) thinking += blk["thinking"].get<std::string>();
      } else if (type == "redacted_thinking") {
      } else if (type == "tool_use") {
        if (role != "assistant") bad_request(bw, "tool_use blocks belong to assistant messages");
        if (!blk.contains("name") || !blk["name"].is_string()) bad_request(bw + ".name", "is required and must be a string");
        json input = blk.contains("input") ? blk["input"] : json::object();
        if (!input.is_object()) bad_request(bw + ".input", "must be an object");
        calls.push_back({{"id", blk.value("id", json("")).is_string() ? blk.value("id", std::string()) : std::string()},
                         {"type", "function"}, {"function", {{"name", blk["name"]}, {"arguments", input.dump()}}}});
      } else if (type == "tool_result") {
        if (role != "user") bad_request(bw, "tool_result blocks belong to user messages");
        std::string content = blk.contains("content") && !blk["content"].is_null() ? text_of_blocks(blk["content"], bw + ".content") : "";
        out.push_back({{"role", "tool"}, {"tool_call_id", blk.value("tool_use_id", json("")).is_string() ? blk.value("tool_use_id", std::string()) : std::string()},
                       {"content", content}});
      } else if (type == "image" || type == "document") {
        bad_request(bw, "is an {}; the served model is text-only", type);
      } else {
        bad_request(bw + ".type", "'{}' is not a supported content block type", type.substr(0, 40));
      }
    }
    if (role == "assistant") {
      json a = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) a["reasoning_content"] = thinking;
      if (!calls.empty()) a["tool_calls"] = calls;
      out.push_back(a);
    } else if (!text.empty() || out.empty() || out.back()["role"] != "tool") {
      out.push_back({{"role", "user"}, {"content", text}});
    }
  }
  return out;
}

std::string stop_reason(const ChoiceResult& r, bool tool_calls) {
  if (tool_calls) return "tool_use";
  if (r.finish_reason == "length") return "max_tokens";
  if (!r.stop_sequence.empty()) return "stop_sequence";
  return "end_turn";
}

std::string tool_use_id(const std::string& call_id) { return "toolu_" + call_id.substr(5); }

// Anthropic's usage: input_tokens counts the prompt tokens that were not read from the cache, so
// input_tokens + cache_read_input_tokens is the whole prompt (nothing is ever "written" to a cache
// that costs anything here: cache_creation_input_tokens is 0).
json usage(const Generation& g) {
  return {{"input_tokens", g.prompt_tokens() - g.cached_tokens()}, {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", g.cached_tokens()}, {"output_tokens", g.completion_tokens()}};
}

// The prompt a Messages request renders to: system + messages, tools (unless tool_choice is "none"),
// and the thinking switch, through the chat template. Shared by /v1/messages and its count_tokens.
struct MessagesPrompt {
  std::vector<int32_t> ids;
  bool parse_tools = false;      // tools were given to the template: parse calls out of the reply
  bool opens_reasoning = false;  // the prompt ends inside a <think> block
};

MessagesPrompt messages_prompt(ServerContext& ctx, const json& b, const std::string& raw_body) {
  MessagesPrompt out;
  ojson messages = normalize_messages(to_openai_messages(b));
  ojson tools = nullptr;
  if (auto t = b.find("tools"); t != b.end() && !t->is_null()) {
    if (!t->is_array()) bad_request("tools", "must be an array");
    const ojson otools = ojson::parse(raw_body)["tools"];  // key order matters to the template's tojson
    ojson list = ojson::array();
    for (size_t i = 0; i < otools.size(); ++i) {
      const ojson& tool = otools[i];
      if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string()) bad_request(fmt::format("tools[{}].name", i), "is required and must be a string");
      ojson fn = {{"name", tool["name"]}};
      if (tool.contains("description")) fn["description"] = tool["description"];
      fn["parameters"] = tool.contains("input_schema") ? tool["input_schema"] : ojson::object();
      list.push_back({{"type", "function"}, {"function", fn}});
    }
    std::string choice = "auto";
    if (auto tc = b.find("tool_choice"); tc != b.end() && tc->is_object() && tc->contains("type") && (*tc)["type"].is_string())
      choice = (*tc)["type"].get<std::string>();
    if (!list.empty() && choice != "none") {
      tools = normalize_tools(list);
      out.parse_tools = true;
    }
  }
  ojson kwargs = template_kwargs(json::object(), ctx);
  if (auto th = b.find("thinking"); th != b.end() && !th->is_null()) {
    if (!th->is_object() || !th->contains("type") || !(*th)["type"].is_string()) bad_request("thinking", "must be an object with a 'type'");
    kwargs["enable_thinking"] = (*th)["type"] == "enabled";
  }
  out.ids = render_chat_prompt(ctx, messages, tools, kwargs, out.opens_reasoning);
  return out;
}

}  // namespace

// POST /v1/messages/count_tokens: the prompt tokens the same body would take in /v1/messages
// ({"input_tokens": N}); max_tokens and the sampling fields are not needed.
void handle_count_tokens(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w) {
  json b = parse_body(req.body);
  send_json(w, 200, {{"input_tokens", messages_prompt(ctx, b, req.body).ids.size()}});
}

void handle_messages(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w) {
  json b = parse_body(req.body);
  auto max_tokens = opt_int(b, "max_tokens", 1, INT64_MAX);
  if (!max_tokens) bad_request("max_tokens", "is required");
  MessagesPrompt mp = messages_prompt(ctx, b, req.body);
  json oai = {{"max_tokens", *max_tokens}};
  for (const char* k : {"temperature", "top_p", "top_k"})
    if (b.contains(k)) oai[k] = b[k];
  if (auto ss = b.find("stop_sequences"); ss != b.end() && !ss->is_null()) {
    if (!ss->is_array()) bad_request("stop_sequences", "must be an array of strings");
    oai["stop"] = *ss;
  }
  GenParams p = parse_sampling(oai, ctx);
  if (mp.parse_tools && ctx.chat_format.markers_are_special()) p.skip_special_tokens = false;
  if (p.sampling.temperature > 1.0f) bad_request("temperature", "must be between 0 and 1, got {}", p.sampling.temperature);
  const bool stream = opt_bool(b, "stream").value_or(false);
  const bool parse_tools = mp.parse_tools;
  Generation g(ctx, std::move(mp.ids), p);
  ChatOutputParser parser(ctx.chat_format, mp.opens_reasoning, parse_tools);
  const std::string id = random_id("msg_");

  if (!stream) {
    std::string text, thinking;
    auto take = [&](const OutputDelta& d) {
      text += d.content();
      thinking += d.reasoning();
    };
    bool completed = g.run([&](int, const std::string& t, const std::vector<TokenEvent>&) { take(parser.push(t)); }, [&] { return w.client_gone(); });
    if (!completed) {
      w.set_keep_alive(false);
      w.send(499, "application/json", http::error_body("client closed the request", "invalid_request_error"));
      return;
    }
    take(parser.finish());
    json content = json::array();
    if (!thinking.empty()) content.push_back({{"type", "thinking"}, {"thinking", thinking}, {"signature", ""}});
    if (!text.empty()) content.push_back({{"type", "text"}, {"text", text}});
    const auto& calls = parser.calls();
    for (const auto& c : calls) {
      // Valid by construction; {} if not, or if the model nested it past the depth a client may send.
      std::optional<json> input = read_json<json>(c.arguments, nullptr);
      content.push_back({{"type", "tool_use"}, {"id", tool_use_id(c.id)}, {"name", c.name},
                         {"input", input && input->is_object() ? std::move(*input) : json::object()}});
    }
    const ChoiceResult& r = g.results()[0];
    send_json(w, 200, {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", ctx.model_id}, {"content", content},
                       {"stop_reason", stop_reason(r, !calls.empty())},
                       {"stop_sequence", r.stop_sequence.empty() ? json(nullptr) : json(r.stop_sequence)},
                       {"usage", usage(g)}});
    return;
  }

  if (!w.begin_stream(200, "text/event-stream")) return;
  w.write_chunk(sse_event("message_start", {{"type", "message_start"},
                                            {"message", {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", ctx.model_id},
                                                         {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                                                         {"usage", {{"input_tokens", g.prompt_tokens()}, {"output_tokens", 0}}}}}}));
  int index = -1;
  std::string open;  // "", "thinking", "text", "tool_use"
  bool any_calls = false;
  auto close = [&](std::string& out) {
    if (open.empty()) return;
    out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
    open.clear();
  };
  // Blocks follow the output's order: a tool_use block opens when a call begins (input {}), its arguments
  // arrive as input_json_delta partial_json pieces, and it closes when anything else follows.
  auto emit = [&](const OutputDelta& d) {
    std::string out;
    auto open_block = [&](const char* kind, json block) {
      close(out);
      open = kind;
      out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", ++index}, {"content_block", std::move(block)}});
    };
    for (const auto& piece : d.pieces) {
      switch (piece.kind) {
        case OutputPiece::Kind::Reasoning:
          if (open != "thinking") open_block("thinking", {{"type", "thinking"}, {"thinking", ""}});
          out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index},
                                                   {"delta", {{"type", "thinking_delta"}, {"thinking", piece.text}}}});
          break;
        case OutputPiece::Kind::Content:
          if (open != "text") open_block("text", {{"type", "text"}, {"text", ""}});
          out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index},
                                                   {"delta", {{"type", "text_delta"}, {"text", piece.text}}}});
          break;
        case OutputPiece::Kind::ToolCall:
          if (piece.begin) {
            any_calls = true;
            open_block("tool_use", {{"type", "tool_use"}, {"id", tool_use_id(piece.id)}, {"name", piece.name}, {"input", json::object()}});
          } else if (open == "tool_use") {
            out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index},
                                                     {"delta", {{"type", "input_json_delta"}, {"partial_json", piece.text}}}});
          }
          break;
      }
    }
    if (!out.empty()) w.write_chunk(out);
  };
  try {
    bool completed = g.run([&](int, const std::string& t, const std::vector<TokenEvent>&) { emit(parser.push(t)); },
                           [&] { return w.failed() || w.client_gone(); });
    if (!completed) return;
    emit(parser.finish());
    std::string tail;
    close(tail);
    const ChoiceResult& r = g.results()[0];
    tail += sse_event("message_delta", {{"type", "message_delta"},
                                        {"delta", {{"stop_reason", stop_reason(r, any_calls)},
                                                   {"stop_sequence", r.stop_sequence.empty() ? json(nullptr) : json(r.stop_sequence)}}},
                                        {"usage", usage(g)}});
    tail += sse_event("message_stop", {{"type", "message_stop"}});
    w.write_chunk(tail);
  } catch (const ApiError& e) {
    w.write_chunk(sse_event("error", {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", e.what()}}}}));
  }
  w.end_stream();
}

}  // namespace arbor::server
