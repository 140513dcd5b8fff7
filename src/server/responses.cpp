// OpenAI Responses API (/v1/responses): input items and instructions mapped onto the chat pipeline; the
// response object with message / function_call / reasoning output items, and the SSE event sequence
// (response.created … response.completed, each event named and numbered).
#include <functional>

#include "server/api_error.h"
#include "server/params.h"
#include "server/routes.h"

namespace arbor::server {
namespace {

using ojson = nlohmann::ordered_json;

// Text of a content value: a string or a list of text parts (input_text, output_text, text).
std::string text_of(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_request(where, "must be a string or an array of content parts");
  std::string s;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& p = c[i];
    std::string pw = fmt::format("{}[{}]", where, i);
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) bad_request(pw + ".type", "is required and must be a string");
    std::string type = p["type"];
    if (type == "input_text" || type == "output_text" || type == "text") {
      if (!p.contains("text") || !p["text"].is_string()) bad_request(pw + ".text", "is required and must be a string");
      s += p["text"].get<std::string>();
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      bad_request(pw, "is an {}; the served model is text-only", type);
    } else if (type != "refusal") {
      bad_request(pw + ".type", "must be 'input_text' or 'output_text', got '{}'", type.substr(0, 40));
    }
  }
  return s;
}

std::string str_field(const json& o, const char* name, const std::string& where, bool required) {
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) {
    if (required) bad_request(where + "." + name, "is required");
    return {};
  }
  if (!it->is_string()) bad_request(where + "." + name, "must be a string");
  return it->get<std::string>();
}

// instructions + input -> chat messages (validated again by normalize_messages).
json to_chat_messages(const json& b) {
  json out = json::array();
  if (auto ins = b.find("instructions"); ins != b.end() && !ins->is_null()) {
    if (!ins->is_string()) bad_request("instructions", "must be a string");
    out.push_back({{"role", "system"}, {"content", *ins}});
  }
  auto in = b.find("input");
  if (in == b.end() || in->is_null()) bad_request("input", "is required");
  if (in->is_string()) {
    out.push_back({{"role", "user"}, {"content", *in}});
    return out;
  }
  if (!in->is_array()) bad_request("input", "must be a string or an array of input items");
  if (in->empty()) bad_request("input", "must contain at least one item");
  for (size_t i = 0; i < in->size(); ++i) {
    const json& it = (*in)[i];
    std::string where = fmt::format("input[{}]", i);
    if (!it.is_object()) bad_request(where, "must be an object");
    std::string type = it.contains("type") ? (it["type"].is_string() ? it["type"].get<std::string>() : std::string("?")) : "message";
    if (type == "message") {
      std::string role = str_field(it, "role", where, true);
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        bad_request(where + ".role", "must be one of user, system, developer, assistant; got '{}'", role.substr(0, 40));
      auto c = it.find("content");
      if (c == it.end() || c->is_null()) bad_request(where + ".content", "is required");
      out.push_back({{"role", role}, {"content", text_of(*c, where + ".content")}});
    } else if (type == "function_call") {
      std::string name = str_field(it, "name", where, true);
      std::string args = str_field(it, "arguments", where, false);
      std::string id = str_field(it, "call_id", where, true);
      json call = {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args.empty() ? "{}" : args}}}};
      // Parallel calls: consecutive function_call items belong to one assistant turn.
      if (!out.empty() && out.back()["role"] == "assistant" && out.back().contains("tool_calls")) out.back()["tool_calls"].push_back(call);
      else if (!out.empty() && out.back()["role"] == "assistant") out.back()["tool_calls"] = json::array({call});
      else out.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}});
    } else if (type == "function_call_output") {
      std::string id = str_field(it, "call_id", where, true);
      auto o = it.find("output");
      if (o == it.end() || o->is_null()) bad_request(where + ".output", "is required");
      out.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", text_of(*o, where + ".output")}});
    } else if (type == "reasoning" || type == "item_reference") {
      // Earlier reasoning is not replayed into the prompt (the templates drop it too); references need storage.
      if (type == "item_reference") bad_request(where + ".type", "'item_reference' needs stored responses, which this server does not keep");
    } else {
      bad_request(where + ".type", "'{}' is not a supported input item type (message, function_call, function_call_output)", type.substr(0, 40));
    }
  }
  return out;
}

// Responses tools ({type: "function", name, description, parameters, strict}) -> chat tools.
ojson to_chat_tools(const ojson& tools) {
  if (!tools.is_array()) bad_request("tools", "must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    std::string w = fmt::format("tools[{}]", i);
    if (!t.is_object()) bad_request(w, "must be an object");
    if (!t.contains("type") || !t["type"].is_string()) bad_request(w + ".type", "is required and must be a string");
    if (t["type"] != "function") bad_request(w + ".type", "'{}' tools are not supported; only 'function'", t["type"].get<std::string>().substr(0, 40));
    if (!t.contains("name") || !t["name"].is_string()) bad_request(w + ".name", "is required and must be a string");
    ojson fn = {{"name", t["name"]}};
    if (t.contains("description") && !t["description"].is_null()) fn["description"] = t["description"];
    fn["parameters"] = t.contains("parameters") && !t["parameters"].is_null() ? t["parameters"] : ojson::object();
    if (t.contains("strict") && !t["strict"].is_null()) fn["strict"] = t["strict"];
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return normalize_tools(out);
}

// Turns parser pieces into output items, in order, and (when streaming) into the matching events.
class OutputItems {
 public:
  explicit OutputItems(std::function<void(const std::string& type, json ev)> emit) : emit_(std::move(emit)) {}

  void take(const OutputDelta& d) {
    for (const auto& p : d.pieces) {
      switch (p.kind) {
        case OutputPiece::Kind::Reasoning:
          if (open_ != "reasoning") {
            close();
            open("reasoning", {{"id", random_id("rs_")}, {"type", "reasoning"}, {"summary", json::array()},
                               {"content", json::array()}, {"status", "in_progress"}});
          }
          text_ += p.text;
          event("response.reasoning_text.delta", {{"item_id", item_["id"]}, {"output_index", index()}, {"content_index", 0}, {"delta", p.text}});
          break;
        case OutputPiece::Kind::Content:
          if (open_ != "message") {
            close();
            open("message", {{"id", random_id("msg_")}, {"type", "message"}, {"status", "in_progress"}, {"role", "assistant"},
                             {"content", json::array()}});
            event("response.content_part.added", {{"item_id", item_["id"]}, {"output_index", index()}, {"content_index", 0},
                                                  {"part", text_part("")}});
          }
          text_ += p.text;
          event("response.output_text.delta", {{"item_id", item_["id"]}, {"output_index", index()}, {"content_index", 0},
                                               {"delta", p.text}, {"logprobs", json::array()}});
          break;
        case OutputPiece::Kind::ToolCall:
          if (p.begin) {
            close();
            open("function_call", {{"id", "fc_" + p.id.substr(5)}, {"type", "function_call"}, {"status", "in_progress"},
                                   {"arguments", ""}, {"call_id", p.id}, {"name", p.name}});
          } else if (open_ == "function_call") {
            text_ += p.text;
            event("response.function_call_arguments.delta", {{"item_id", item_["id"]}, {"output_index", index()}, {"delta", p.text}});
          }
          break;
      }
    }
  }

  // Closes the open item; `status` is what finished items say ("completed", or "incomplete" when cut short).
  void close(const std::string& status = "completed") {
    if (open_.empty()) return;
    json& it = item_;
    if (open_ == "message") {
      event("response.output_text.done", {{"item_id", it["id"]}, {"output_index", index()}, {"content_index", 0}, {"text", text_},
                                          {"logprobs", json::array()}});
      event("response.content_part.done", {{"item_id", it["id"]}, {"output_index", index()}, {"content_index", 0}, {"part", text_part(text_)}});
      it["content"] = json::array({text_part(text_)});
    } else if (open_ == "reasoning") {
      event("response.reasoning_text.done", {{"item_id", it["id"]}, {"output_index", index()}, {"content_index", 0}, {"text", text_}});
      it["content"] = json::array({{{"type", "reasoning_text"}, {"text", text_}}});
    } else {
      event("response.function_call_arguments.done", {{"item_id", it["id"]}, {"output_index", index()}, {"name", it["name"]}, {"arguments", text_}});
      it["arguments"] = text_;
    }
    it["status"] = status;
    event("response.output_item.done", {{"output_index", index()}, {"item", it}});
    items_.push_back(it);
    open_.clear();
    text_.clear();
  }

  const json& items() const { return items_; }
  bool any_calls() const {
    for (const auto& it : items_)
      if (it["type"] == "function_call") return true;
    return false;
  }

 private:
  static json text_part(const std::string& text) { return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}}; }
  int index() const { return int(items_.size()); }
  void open(const char* kind, json item) {
    open_ = kind;
    item_ = std::move(item);
    event("response.output_item.added", {{"output_index", index()}, {"item", item_}});
  }
  void event(const char* type, json ev) {
    if (emit_) emit_(type, std::move(ev));
  }

  std::function<void(const std::string&, json)> emit_;
  json items_ = json::array();
  json item_;
  std::string open_, text_;
};

}  // namespace

void handle_responses(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w) {
  json b = parse_body(req.body);
  if (auto prev = b.find("previous_response_id"); prev != b.end() && !prev->is_null())
    bad_request("previous_response_id", "is not supported: this server does not store responses; send the whole conversation in 'input'");
  ojson messages = normalize_messages(to_chat_messages(b));
  ojson tools = nullptr;
  bool parse_tools = false;
  json tools_echo = json::array();
  std::string choice = "auto";
  if (auto t = b.find("tools"); t != b.end() && !t->is_null()) {
    ojson list = to_chat_tools(ojson::parse(req.body)["tools"]);  // key order matters to the template's tojson
    tools_echo = *t;
    choice = parse_tool_choice(b);
    if (!list.empty() && choice != "none") {
      tools = list;
      parse_tools = true;
    }
  }
  json oai = json::object();
  for (const char* k : {"temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"})
    if (b.contains(k)) oai[k] = b[k];
  if (b.contains("max_output_tokens") && !b["max_output_tokens"].is_null()) {
    opt_int(b, "max_output_tokens", 1, INT64_MAX);  // names the field in the error
    oai["max_tokens"] = b["max_output_tokens"];
  }
  GenParams p = parse_sampling(oai, ctx);
  json text_format = {{"type", "text"}};  // echoed in the response object
  if (auto t = b.find("text"); t != b.end() && !t->is_null()) {
    if (!t->is_object()) bad_request("text", "must be an object");
    if (auto f = t->find("format"); f != t->end() && !f->is_null()) {
      p.processing.json = parse_response_format(ctx, *f, "text.format", true);
      text_format = *f;
    }
  }
  if (parse_tools && ctx.chat_format.markers_are_special()) p.skip_special_tokens = false;
  json kw_src = json::object();
  if (auto r = b.find("reasoning"); r != b.end() && !r->is_null()) {
    if (!r->is_object()) bad_request("reasoning", "must be an object");
    if (auto e = r->find("effort"); e != r->end() && !e->is_null()) kw_src["reasoning_effort"] = *e;
  }
  if (b.contains("chat_template_kwargs")) kw_src["chat_template_kwargs"] = b["chat_template_kwargs"];
  ojson kwargs = template_kwargs(kw_src, ctx);
  const bool stream = opt_bool(b, "stream").value_or(false);
  bool opens_reasoning = false;
  std::vector<int32_t> prompt = render_chat_prompt(ctx, messages, tools, kwargs, opens_reasoning);
  Generation g(ctx, std::move(prompt), p);
  const bool json_out = p.processing.json.has_value();  // JSON is content from its first token
  ChatOutputParser parser(ctx.chat_format, opens_reasoning && !json_out, parse_tools && !json_out);
  const std::string id = random_id("resp_");
  const int64_t created = unix_now();

  auto response_json = [&](const std::string& status, const json& output, bool with_usage) {
    json r = {{"id", id}, {"object", "response"}, {"created_at", created}, {"status", status}, {"error", nullptr},
              {"incomplete_details", status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
              {"instructions", b.value("instructions", json(nullptr))}, {"max_output_tokens", b.value("max_output_tokens", json(nullptr))},
              {"model", ctx.model_id}, {"output", output}, {"parallel_tool_calls", b.value("parallel_tool_calls", json(true))},
              {"previous_response_id", nullptr}, {"reasoning", {{"effort", kw_src.value("reasoning_effort", json(nullptr))}, {"summary", nullptr}}},
              {"store", false}, {"temperature", p.sampling.temperature}, {"text", {{"format", text_format}}},
              {"tool_choice", b.value("tool_choice", json(choice))}, {"tools", tools_echo}, {"top_p", p.sampling.top_p},
              {"truncation", "disabled"}, {"usage", nullptr}, {"user", b.value("user", json(nullptr))},
              {"metadata", b.value("metadata", json::object())}};
    if (with_usage)
      r["usage"] = {{"input_tokens", g.prompt_tokens()}, {"input_tokens_details", {{"cached_tokens", g.cached_tokens()}}},
                    {"output_tokens", g.completion_tokens()}, {"output_tokens_details", {{"reasoning_tokens", 0}}},
                    {"total_tokens", g.prompt_tokens() + g.completion_tokens()}};
    return r;
  };
  auto final_status = [&](const OutputItems& items) {
    return g.results()[0].finish_reason == "length" && !items.any_calls() ? std::string("incomplete") : std::string("completed");
  };

  if (!stream) {
    OutputItems items(nullptr);
    bool completed = g.run([&](int, const std::string& t, const std::vector<TokenEvent>&) { items.take(parser.push(t)); },
                           [&] { return w.client_gone(); });
    if (!completed) {
      w.set_keep_alive(false);
      w.send(499, "application/json", http::error_body("client closed the request", "invalid_request_error"));
      return;
    }
    items.take(parser.finish());
    // Finished first so any_calls() sees every item; a cut-short message says so in its status.
    items.close();
    std::string status = final_status(items);
    json output = items.items();
    if (status == "incomplete")
      for (auto& it : output)
        if (it["type"] == "message") it["status"] = "incomplete";
    send_json(w, 200, response_json(status, output, true));
    return;
  }

  if (!w.begin_stream(200, "text/event-stream")) return;
  int64_t seq = 0;
  std::string buf;
  auto event = [&](const std::string& type, json ev) {
    json e = {{"type", type}, {"sequence_number", seq++}};
    e.update(ev);
    buf += sse_event(type, e);
  };
  auto flush = [&] {
    if (!buf.empty()) w.write_chunk(buf);
    buf.clear();
  };
  OutputItems items(event);
  event("response.created", {{"response", response_json("in_progress", json::array(), false)}});
  event("response.in_progress", {{"response", response_json("in_progress", json::array(), false)}});
  flush();
  try {
    bool completed = g.run(
        [&](int, const std::string& t, const std::vector<TokenEvent>&) {
          items.take(parser.push(t));
          flush();
        },
        [&] { return w.failed() || w.client_gone(); });
    if (!completed) return;
    items.take(parser.finish());
    const bool cut = g.results()[0].finish_reason == "length";
    items.close(cut ? "incomplete" : "completed");
    std::string status = final_status(items);
    event(status == "incomplete" ? "response.incomplete" : "response.completed", {{"response", response_json(status, items.items(), true)}});
    flush();
  } catch (const ApiError& e) {
    buf.clear();
    event("error", {{"code", e.code.empty() ? json(nullptr) : json(e.code)}, {"message", e.what()}, {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                    {"error", {{"message", e.what()}, {"type", e.type}, {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}});
    flush();
  }
  w.end_stream();
}

}  // namespace arbor::server
