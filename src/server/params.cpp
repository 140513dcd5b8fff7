// Field validation for request bodies; chat message normalisation and prompt rendering.
#include "server/params.h"

#include <cmath>

#include "server/api_error.h"
#include "server/json_body.h"
#include "text/tokenizer/token_bytes.h"

namespace arbor::server {
namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    default: return "an unsupported value";
  }
}

const json* get(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

json parse_body(const std::string& body) {
  if (body.empty()) throw ApiError(400, "the request body is empty; expected a JSON object");
  JsonReadError err;
  std::optional<json> parsed = read_json<json>(body, &err);
  if (!parsed) {
    switch (err.kind) {
      case JsonReadError::Kind::Syntax: throw ApiError(400, fmt::format("the request body is not valid JSON: {}", err.message));
      case JsonReadError::Kind::TooDeep: throw ApiError(400, "the request body " + err.message, err.where.substr(0, err.where.find_first_of(".[")));
      case JsonReadError::Kind::NumberOverflow: throw ApiError(400, err.message, err.where);
    }
  }
  json& j = *parsed;
  if (!j.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", type_name(j)));
  return j;
}

std::optional<double> opt_number(const json& j, const char* name, double lo, double hi) {
  const json* v = get(j, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_request(name, "must be a number, got {}", type_name(*v));
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) bad_request(name, "must be between {} and {}, got {}", lo, hi, d);
  return d;
}

std::optional<int64_t> opt_int(const json& j, const char* name, int64_t lo, int64_t hi) {
  const json* v = get(j, name);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(hi) || (lo > 0 && u < uint64_t(lo))) bad_request(name, "must be between {} and {}, got {}", lo, hi, u);
    return int64_t(u);
  }
  if (v->is_number_integer()) {
    int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) bad_request(name, "must be between {} and {}, got {}", lo, hi, i);
    return i;
  }
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= double(lo) && d <= double(hi)) return int64_t(d);
    bad_request(name, "must be an integer between {} and {}, got {}", lo, hi, d);
  }
  bad_request(name, "must be an integer, got {}", type_name(*v));
}

std::optional<bool> opt_bool(const json& j, const char* name) {
  const json* v = get(j, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_request(name, "must be a boolean, got {}", type_name(*v));
  return v->get<bool>();
}

std::optional<std::string> opt_string(const json& j, const char* name) {
  const json* v = get(j, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_request(name, "must be a string, got {}", type_name(*v));
  return v->get<std::string>();
}

GenParams parse_sampling(const json& b, const ServerContext& ctx) {
  GenParams p;
  const SamplingDefaults& d = ctx.defaults;
  p.sampling.temperature = float(opt_number(b, "temperature", 0, 2).value_or(d.temperature));
  p.sampling.top_p = float(opt_number(b, "top_p", 0, 1).value_or(d.top_p));
  if (p.sampling.top_p <= 0) bad_request("top_p", "must be greater than 0, got {}", p.sampling.top_p);
  int64_t top_k = opt_int(b, "top_k", -1, int64_t(1) << 31).value_or(d.top_k);
  p.sampling.top_k = top_k < 0 ? 0 : top_k;  // -1 = off, as vLLM
  p.sampling.min_p = float(opt_number(b, "min_p", 0, 1).value_or(d.min_p));
  if (auto s = opt_int(b, "seed", INT64_MIN, INT64_MAX)) {
    p.seed_given = true;
    p.sampling.seed = uint64_t(*s);
  }
  p.processing.presence_penalty = float(opt_number(b, "presence_penalty", -2, 2).value_or(0));
  p.processing.frequency_penalty = float(opt_number(b, "frequency_penalty", -2, 2).value_or(0));
  p.processing.repetition_penalty = float(opt_number(b, "repetition_penalty", 0, 10).value_or(d.repetition_penalty));
  if (p.processing.repetition_penalty <= 0) bad_request("repetition_penalty", "must be greater than 0, got {}", p.processing.repetition_penalty);
  if (const json* lb = get(b, "logit_bias")) {
    if (!lb->is_object()) bad_request("logit_bias", "must be an object mapping token ids to biases, got {}", type_name(*lb));
    if (lb->size() > 1024) bad_request("logit_bias", "has {} entries; at most 1024 are allowed", lb->size());
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& k = it.key();
      char* end = nullptr;
      long long id = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || id < 0 || id >= ctx.vocab_size)
        bad_request("logit_bias", "key '{}' is not a token id in 0..{}", k.substr(0, 40), ctx.vocab_size - 1);
      if (!it.value().is_number()) bad_request("logit_bias", "value for token {} must be a number, got {}", id, type_name(it.value()));
      double v = it.value().get<double>();
      if (!std::isfinite(v) || v < -100 || v > 100) bad_request("logit_bias", "value for token {} must be between -100 and 100, got {}", id, v);
      p.processing.logit_bias[int32_t(id)] = float(v);
    }
  }
  if (const json* st = get(b, "stop")) {
    if (st->is_string()) {
      p.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 16) bad_request("stop", "has {} entries; at most 16 are allowed", st->size());
      for (size_t i = 0; i < st->size(); ++i) {
        if (!(*st)[i].is_string()) bad_request("stop", "entry {} must be a string, got {}", i, type_name((*st)[i]));
        p.stop.push_back((*st)[i].get<std::string>());
      }
    } else {
      bad_request("stop", "must be a string or an array of strings, got {}", type_name(*st));
    }
    for (const auto& s : p.stop)
      if (s.size() > 1024) bad_request("stop", "entries must be at most 1024 bytes, got {}", s.size());
  }
  p.n = opt_int(b, "n", 1, 16).value_or(1);
  p.ignore_eos = opt_bool(b, "ignore_eos").value_or(false);
  auto mt = opt_int(b, "max_tokens", 1, INT64_MAX);
  auto mct = opt_int(b, "max_completion_tokens", 1, INT64_MAX);
  p.max_tokens = mct ? *mct : mt ? *mt : -1;  // max_completion_tokens wins
  return p;
}

std::optional<JsonConstraint> parse_response_format(ServerContext& ctx, const json& rf, const std::string& field, bool flat) {
  if (rf.is_null()) return std::nullopt;
  if (!rf.is_object()) bad_request(field, "must be an object, got {}", type_name(rf));
  auto t = rf.find("type");
  if (t == rf.end() || !t->is_string()) bad_request(field + ".type", "is required and must be a string");
  const std::string type = t->get<std::string>();
  std::shared_ptr<const JsonSchema> schema;
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    schema = JsonSchema::any_of_type(JsonSchema::Object);
  } else if (type == "json_schema") {
    const json* js = &rf;
    std::string where = field;
    if (!flat) {
      where += ".json_schema";
      auto it = rf.find("json_schema");
      if (it == rf.end() || it->is_null()) bad_request(where, "is required when type is 'json_schema'");
      if (!it->is_object()) bad_request(where, "must be an object, got {}", type_name(*it));
      js = &*it;
    }
    opt_string(*js, "name");  // type checks only: neither changes what is enforced
    opt_bool(*js, "strict");
    auto sc = js->find("schema");
    if (sc == js->end() || sc->is_null()) bad_request(where + ".schema", "is required");
    if (!sc->is_object()) bad_request(where + ".schema", "must be a JSON Schema object, got {}", type_name(*sc));
    try {
      schema = JsonSchema::compile(*sc);
    } catch (const JsonSchemaError& e) {
      bad_request(e.path.empty() ? where + ".schema" : where + ".schema." + e.path, "{}", e.what());
    }
  } else {
    bad_request(field + ".type", "must be 'text', 'json_object' or 'json_schema', got '{}'", type.substr(0, 40));
  }
  std::call_once(ctx.json_table_once, [&] { ctx.json_table = std::make_shared<JsonTokenTable>(token_bytes(*ctx.tok), ctx.eos_ids); });
  return JsonConstraint(ctx.json_table, schema);
}

nlohmann::ordered_json normalize_messages(const json& msgs) {
  using ojson = nlohmann::ordered_json;
  if (!msgs.is_array()) bad_request("messages", "must be an array of messages, got {}", type_name(msgs));
  if (msgs.empty()) bad_request("messages", "must contain at least one message");
  ojson out = ojson::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_request(where, "must be an object, got {}", type_name(m));
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) bad_request(where + ".role", "is required and must be a string");
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad_request(where + ".role", "must be one of system, developer, user, assistant, tool; got '{}'", role.substr(0, 40));
    ojson o;
    o["role"] = role;
    std::string content;
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) {
      if (role != "assistant") bad_request(where + ".content", "is required for role '{}'", role);
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        std::string pw = fmt::format("{}.content[{}]", where, k);
        if (!part.is_object()) bad_request(pw, "must be an object, got {}", type_name(part));
        auto t = part.find("type");
        if (t == part.end() || !t->is_string()) bad_request(pw + ".type", "is required and must be a string");
        std::string type = t->get<std::string>();
        if (type == "text") {
          auto tx = part.find("text");
          if (tx == part.end() || !tx->is_string()) bad_request(pw + ".text", "is required and must be a string");
          content += tx->get<std::string>();
        } else if (type == "image_url" || type == "input_image" || type == "image") {
          bad_request(pw, "is an image; the served model is text-only");
        } else {
          bad_request(pw + ".type", "must be 'text', got '{}'", type.substr(0, 40));
        }
      }
    } else {
      bad_request(where + ".content", "must be a string or an array of content parts, got {}", type_name(*c));
    }
    o["content"] = content;
    if (role == "assistant") {
      if (auto rc = m.find("reasoning_content"); rc != m.end() && rc->is_string()) o["reasoning_content"] = *rc;
      if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
        if (!tc->is_array()) bad_request(where + ".tool_calls", "must be an array, got {}", type_name(*tc));
        ojson calls = ojson::array();
        for (size_t k = 0; k < tc->size(); ++k) {
          const json& call = (*tc)[k];
          std::string cw = fmt::format("{}.tool_calls[{}]", where, k);
          if (!call.is_object()) bad_request(cw, "must be an object");
          auto fn = call.find("function");
          if (fn == call.end() || !fn->is_object()) bad_request(cw + ".function", "is required and must be an object");
          auto name = fn->find("name");
          if (name == fn->end() || !name->is_string()) bad_request(cw + ".function.name", "is required and must be a string");
          ojson args = ojson::object();
          if (auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
            if (a->is_string()) {
              // Templates expect a mapping (transformers passes dicts); keep the text when it is not an object.
              // The text is JSON inside JSON: its depth is bounded like the body's.
              JsonReadError err;
              std::optional<ojson> parsed = read_json<ojson>(a->get<std::string>(), &err);
              if (!parsed && err.kind == JsonReadError::Kind::TooDeep) bad_request(cw + ".function.arguments", "{}", err.message);
              args = parsed && parsed->is_object() ? std::move(*parsed) : ojson(a->get<std::string>());
            } else if (a->is_object()) {
              args = ojson::parse(a->dump());
            } else {
              bad_request(cw + ".function.arguments", "must be a JSON string or an object, got {}", type_name(*a));
            }
          }
          ojson oc = {{"id", call.value("id", json("")).is_string() ? call.value("id", std::string()) : std::string()},
                      {"type", "function"},
                      {"function", {{"name", name->get<std::string>()}, {"arguments", args}}}};
          calls.push_back(oc);
        }
        if (!calls.empty()) o["tool_calls"] = calls;
      }
    }
    if (role == "tool") {
      if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) o["tool_call_id"] = *id;
      if (auto nm = m.find("name"); nm != m.end() && nm->is_string()) o["name"] = *nm;
    }
    out.push_back(o);
  }
  return out;
}

nlohmann::ordered_json normalize_tools(const nlohmann::ordered_json& otools) {
  using ojson = nlohmann::ordered_json;
  const json tools = json::parse(otools.dump());
  if (!tools.is_array()) bad_request("tools", "must be an array, got {}", type_name(tools));
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    std::string w = fmt::format("tools[{}]", i);
    if (!t.is_object()) bad_request(w, "must be an object, got {}", type_name(t));
    if (t.contains("type") && t["type"] != "function") bad_request(w + ".type", "must be 'function'");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) bad_request(w + ".function", "is required and must be an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
      bad_request(w + ".function.name", "is required and must be a non-empty string");
    if (auto params = fn->find("parameters"); params != fn->end() && !params->is_null() && !params->is_object())
      bad_request(w + ".function.parameters", "must be a JSON Schema object, got {}", type_name(*params));
    out.push_back(otools[i]);
  }
  return out;
}

std::string parse_tool_choice(const json& b) {
  std::string choice = "auto";
  if (auto tc = b.find("tool_choice"); tc != b.end() && !tc->is_null()) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        bad_request("tool_choice", "must be 'none', 'auto', 'required' or an object naming a function; got '{}'", choice.substr(0, 40));
    } else if (!tc->is_object()) {
      bad_request("tool_choice", "must be a string or an object");
    }
  }
  return choice;
}

nlohmann::ordered_json template_kwargs(const json& body, const ServerContext& ctx) {
  nlohmann::ordered_json kw = nlohmann::ordered_json::object();
  if (ctx.thinking == "on") kw["enable_thinking"] = true;
  if (ctx.thinking == "off") kw["enable_thinking"] = false;
  if (auto effort = opt_string(body, "reasoning_effort")) {
    const std::string& e = *effort;
    if (e != "none" && e != "minimal" && e != "low" && e != "medium" && e != "high")
      bad_request("reasoning_effort", "must be one of none, minimal, low, medium, high; got '{}'", e.substr(0, 40));
    kw["enable_thinking"] = e != "none";
    kw["reasoning_effort"] = e;
  }
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad_request("chat_template_kwargs", "must be an object, got {}", type_name(*it));
    for (auto kv = it->begin(); kv != it->end(); ++kv) kw[kv.key()] = nlohmann::ordered_json::parse(kv.value().dump());
  }
  return kw;
}

std::vector<int32_t> render_chat_prompt(const ServerContext& ctx, const nlohmann::ordered_json& messages,
                                        const nlohmann::ordered_json& tools, const nlohmann::ordered_json& kwargs,
                                        bool& opens_reasoning, bool add_generation_prompt) {
  if (!ctx.chat_template) throw ApiError(400, "the served model has no chat template; use /v1/completions", "messages");
  std::string prompt;
  try {
    prompt = ctx.chat_template->render(messages, tools, add_generation_prompt, kwargs);
  } catch (const std::exception& e) {
    // Templates raise for conversations they do not support (e.g. roles out of order).
    throw ApiError(400, fmt::format("the chat template rejected the conversation: {}", e.what()), "messages");
  }
  opens_reasoning = ctx.chat_format.reasoning && prompt_opens_reasoning(prompt);
  return ctx.tok->encode(prompt, false);
}

}  // namespace arbor::server
