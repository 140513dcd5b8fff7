// OpenAI wire format: /v1/chat/completions and /v1/completions, non-stream and SSE stream.
#include <chrono>

#include "server/api_error.h"
#include "server/params.h"
#include "server/routes.h"

namespace arbor::server {
namespace {

using ojson = nlohmann::ordered_json;

json usage_json(const Generation& g) {
  return {{"prompt_tokens", g.prompt_tokens()},
          {"completion_tokens", g.completion_tokens()},
          {"total_tokens", g.prompt_tokens() + g.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", g.cached_tokens()}}}};
}

json tool_call_json(const ParsedToolCall& c) {
  return {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

struct ChatChoice {
  ChatOutputParser parser;
  std::string content, reasoning;
  json logprobs = json::array();  // entries not yet sent (stream) or all entries (non-stream)
};

}  // namespace

void handle_chat_completions(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w) {
  json b = parse_body(req.body);
  auto mit = b.find("messages");
  if (mit == b.end() || mit->is_null()) bad_request("messages", "is required");
  ojson messages = normalize_messages(*mit);
  ojson tools = nullptr;
  bool parse_tools = false;
  if (auto t = b.find("tools"); t != b.end() && !t->is_null()) {
    ojson list = normalize_tools(ojson::parse(req.body)["tools"]);  // the body parsed again, keeping key order
    const std::string choice = parse_tool_choice(b);
    if (!list.empty() && choice != "none") {
      tools = list;
      parse_tools = true;
    }
  }
  ojson kwargs = template_kwargs(b, ctx);
  GenParams p = parse_sampling(b, ctx);
  if (auto rf = b.find("response_format"); rf != b.end()) p.processing.json = parse_response_format(ctx, *rf, "response_format", false);
  if (parse_tools && ctx.chat_format.markers_are_special()) p.skip_special_tokens = false;
  p.logprobs = opt_bool(b, "logprobs").value_or(false);
  p.top_logprobs = opt_int(b, "top_logprobs", 0, 20).value_or(0);
  if (p.top_logprobs > 0 && !p.logprobs) bad_request("top_logprobs", "requires 'logprobs': true");
  const bool stream = opt_bool(b, "stream").value_or(false);
  bool include_usage = false;
  if (auto so = b.find("stream_options"); so != b.end() && !so->is_null()) {
    if (!so->is_object()) bad_request("stream_options", "must be an object");
    include_usage = opt_bool(*so, "include_usage").value_or(false);
  }
  bool opens_reasoning = false;
  std::vector<int32_t> prompt = render_chat_prompt(ctx, messages, tools, kwargs, opens_reasoning);

  Generation g(ctx, std::move(prompt), p);
  const std::string id = random_id("chatcmpl-");
  const int64_t created = unix_now();
  std::vector<ChatChoice> choices;
  // A JSON response is content from its first token: no reasoning block, no tool-call markup.
  const bool json_out = p.processing.json.has_value();
  for (int64_t i = 0; i < p.n; ++i)
    choices.push_back({ChatOutputParser(ctx.chat_format, opens_reasoning && !json_out, parse_tools && !json_out), {}, {}, json::array()});

  auto chunk = [&](int index, json delta, json finish, json logprobs) {
    json c = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", ctx.model_id},
              {"system_fingerprint", "arbor"},
              {"choices", json::array({{{"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)},
                                        {"finish_reason", std::move(finish)}}})}};
    if (include_usage) c["usage"] = nullptr;
    return sse(c);
  };
  auto take_logprobs = [&](ChatChoice& c) -> json {
    if (!p.logprobs) return nullptr;
    json lp = {{"content", c.logprobs}};
    c.logprobs = json::array();
    return lp;
  };

  auto on_tokens = [&](ChatChoice& c, const std::vector<TokenEvent>& toks) {
    if (!p.logprobs) return;
    for (const auto& t : toks) c.logprobs.push_back(token_logprob_json(ctx, t.logprob, true, t.top));
  };
  // Builds the stream chunks for one parsed delta, piece by piece in output order. A tool call's first
  // chunk carries index, id, type and name with empty arguments; the next ones carry argument pieces.
  auto delta_chunks = [&](int i, const OutputDelta& d, bool force_logprobs) {
    ChatChoice& c = choices[size_t(i)];
    std::string out;
    bool sent_content = false;
    for (const auto& piece : d.pieces) {
      switch (piece.kind) {
        case OutputPiece::Kind::Reasoning: out += chunk(i, {{"reasoning_content", piece.text}}, nullptr, nullptr); break;
        case OutputPiece::Kind::Content:
          out += chunk(i, {{"content", piece.text}}, nullptr, take_logprobs(c));
          sent_content = true;
          break;
        case OutputPiece::Kind::ToolCall: {
          json call = piece.begin ? json{{"index", piece.call}, {"id", piece.id}, {"type", "function"},
                                         {"function", {{"name", piece.name}, {"arguments", ""}}}}
                                  : json{{"index", piece.call}, {"function", {{"arguments", piece.text}}}};
          out += chunk(i, {{"tool_calls", json::array({call})}}, nullptr, nullptr);
          break;
        }
      }
    }
    if (force_logprobs && !sent_content && !c.logprobs.empty() && !c.parser.saw_tool_calls())
      out += chunk(i, {{"content", ""}}, nullptr, take_logprobs(c));
    return out;
  };

  if (!stream) {
    bool completed = g.run(
        [&](int i, const std::string& text, const std::vector<TokenEvent>& toks) {
          ChatChoice& c = choices[size_t(i)];
          on_tokens(c, toks);
          OutputDelta d = c.parser.push(text);
          c.content += d.content();
          c.reasoning += d.reasoning();
        },
        [&] { return w.client_gone(); });
    if (!completed) {
      w.set_keep_alive(false);
      w.send(499, "application/json", http::error_body("client closed the request", "invalid_request_error"));
      return;
    }
    json out_choices = json::array();
    for (size_t i = 0; i < choices.size(); ++i) {
      ChatChoice& c = choices[i];
      OutputDelta d = c.parser.finish();
      c.content += d.content();
      c.reasoning += d.reasoning();
      const auto& parsed = c.parser.calls();
      json msg = {{"role", "assistant"}, {"content", parsed.empty() || !c.content.empty() ? json(c.content) : json(nullptr)}};
      if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
      if (!parsed.empty()) {
        json calls = json::array();
        for (const auto& call : parsed) calls.push_back(tool_call_json(call));
        msg["tool_calls"] = calls;
      }
      std::string fr = g.results()[i].finish_reason;
      if (fr == "stop" && !parsed.empty()) fr = "tool_calls";
      out_choices.push_back({{"index", i}, {"message", msg}, {"logprobs", p.logprobs ? json{{"content", c.logprobs}} : json(nullptr)},
                             {"finish_reason", fr}});
    }
    send_json(w, 200, {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", ctx.model_id},
                       {"system_fingerprint", "arbor"}, {"choices", out_choices}, {"usage", usage_json(g)}});
    return;
  }

  if (!w.begin_stream(200, "text/event-stream")) return;
  std::string first;
  for (int64_t i = 0; i < p.n; ++i) first += chunk(int(i), {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
  w.write_chunk(first);
  try {
    bool completed = g.run(
        [&](int i, const std::string& text, const std::vector<TokenEvent>& toks) {
          ChatChoice& c = choices[size_t(i)];
          on_tokens(c, toks);
          w.write_chunk(delta_chunks(i, c.parser.push(text), false));
        },
        [&] { return w.failed() || w.client_gone(); });
    if (!completed) return;
    std::string tail;
    for (size_t i = 0; i < choices.size(); ++i) {
      ChatChoice& c = choices[i];
      tail += delta_chunks(int(i), c.parser.finish(), true);
      std::string fr = g.results()[i].finish_reason;
      if (fr == "stop" && c.parser.saw_tool_calls()) fr = "tool_calls";
      tail += chunk(int(i), json::object(), fr, take_logprobs(c));
    }
    if (include_usage)
      tail += sse({{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", ctx.model_id},
                   {"system_fingerprint", "arbor"}, {"choices", json::array()}, {"usage", usage_json(g)}});
    tail += "data: [DONE]\n\n";
    w.write_chunk(tail);
  } catch (const ApiError& e) {
    w.write_chunk(sse(json::parse(http::error_body(e.what(), e.type, e.param, e.code))));
  }
  w.end_stream();
}

void handle_completions(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w) {
  json b = parse_body(req.body);
  auto pit = b.find("prompt");
  if (pit == b.end() || pit->is_null()) bad_request("prompt", "is required");
  // One prompt (a string or token ids) or several (an array of them: choices prompt-major, as OpenAI).
  auto one_prompt = [&](const json& pr, const std::string& where) {
    std::vector<int32_t> prompt;
    if (pr.is_string()) {
      prompt = ctx.tok->encode(pr.get<std::string>(), true);
    } else if (pr.is_array()) {
      if (pr.empty()) bad_request(where, "must not be empty");
      for (size_t i = 0; i < pr.size(); ++i) {
        const json& t = pr[i];
        if (!t.is_number_integer() && !t.is_number_unsigned()) bad_request(where, "entry {} must be a token id (integer)", i);
        int64_t id = t.get<int64_t>();
        if (id < 0 || id >= ctx.vocab_size) bad_request(where, "entry {} ({}) is not a token id in 0..{}", i, id, ctx.vocab_size - 1);
        prompt.push_back(int32_t(id));
      }
    } else {
      bad_request(where, "must be a string or an array of token ids");
    }
    if (prompt.empty()) bad_request(where, "encodes to no tokens");
    return prompt;
  };
  std::vector<std::vector<int32_t>> prompts;
  std::vector<const json*> given;  // each prompt as the request gave it
  const json& pr = *pit;
  if (pr.is_array() && !pr.empty() && (pr[0].is_string() || pr[0].is_array())) {
    for (size_t k = 0; k < pr.size(); ++k) {
      if (!pr[k].is_string() && !pr[k].is_array()) bad_request(fmt::format("prompt[{}]", k), "must be a string or an array of token ids, as the first prompt is");
      prompts.push_back(one_prompt(pr[k], fmt::format("prompt[{}]", k)));
      given.push_back(&pr[k]);
    }
  } else {
    prompts.push_back(one_prompt(pr, "prompt"));
    given.push_back(&pr);
  }
  GenParams p = parse_sampling(b, ctx);
  if (auto lp = opt_int(b, "logprobs", 0, 20)) {
    p.logprobs = true;
    p.top_logprobs = *lp;
  }
  const bool echo = opt_bool(b, "echo").value_or(false);
  // vLLM's extension: logprob tokens as "token_id:N" (exact ids, for clients that need them).
  const bool ids_as_tokens = opt_bool(b, "return_tokens_as_token_ids").value_or(false);
  auto piece_of = [&](int32_t tid) { return ids_as_tokens ? fmt::format("token_id:{}", tid) : token_text(ctx, tid); };
  const bool stream = opt_bool(b, "stream").value_or(false);
  bool include_usage = false;
  if (auto so = b.find("stream_options"); so != b.end() && !so->is_null()) {
    if (!so->is_object()) bad_request("stream_options", "must be an object");
    include_usage = opt_bool(*so, "include_usage").value_or(false);
  }
  // Per prompt: a text prompt as given (as OpenAI and vLLM echo it), token ids decoded.
  std::vector<std::string> echo_text(prompts.size());
  if (echo)
    for (size_t k = 0; k < prompts.size(); ++k)
      echo_text[k] = given[k]->is_string() ? given[k]->get<std::string>() : ctx.tok->decode(prompts[k], false);
  // echo + logprobs scores the prompt as well (what lm-evaluation-harness asks for a loglikelihood):
  // its tokens lead the logprobs, the first with null logprob and alternatives.
  if (echo && p.logprobs) {
    if (stream) bad_request("echo", "with logprobs is answered without streaming only; send 'stream': false");
    p.prompt_logprobs = p.top_logprobs;
  }

  Generation g(ctx, prompts, p);
  const size_t per_prompt = size_t(p.n);
  const std::string id = random_id("cmpl-");
  const int64_t created = unix_now();
  struct Choice {
    std::string text;
    json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
    size_t offset = 0;
  };
  std::vector<Choice> choices(prompts.size() * per_prompt);
  auto add_logprobs = [&](Choice& c, const std::vector<TokenEvent>& toks) {
    if (!p.logprobs) return;
    for (const auto& t : toks) {
      std::string piece = piece_of(t.id);
      c.tokens.push_back(piece);
      c.token_logprobs.push_back(t.logprob.logprob);
      json alt = json::object();
      for (const auto& a : t.top) alt[piece_of(a.id)] = a.logprob;
      c.top.push_back(alt);
      c.offsets.push_back(c.offset);
      c.offset += piece.size();
    }
  };
  // Prompt k's token 0 (nothing before it to score it by), then its scored tokens, into c.
  auto add_prompt_scores = [&](Choice& c, size_t k) {
    std::string piece = piece_of(prompts[k][0]);
    c.tokens.push_back(piece);
    c.token_logprobs.push_back(nullptr);
    c.top.push_back(nullptr);
    c.offsets.push_back(c.offset);
    c.offset += piece.size();
    add_logprobs(c, g.prompt_scores(k));
  };
  auto logprobs_json = [&](Choice& c, bool reset) -> json {
    if (!p.logprobs) return nullptr;
    json j = {{"tokens", c.tokens}, {"token_logprobs", c.token_logprobs}, {"top_logprobs", c.top}, {"text_offset", c.offsets}};
    if (reset) c.tokens = c.token_logprobs = c.top = c.offsets = json::array();
    return j;
  };
  auto usage = [&] { return json{{"prompt_tokens", g.prompt_tokens()}, {"completion_tokens", g.completion_tokens()},
                                 {"total_tokens", g.prompt_tokens() + g.completion_tokens()},
                                 {"prompt_tokens_details", {{"cached_tokens", g.cached_tokens()}}}}; };

  if (!stream) {
    std::vector<std::vector<TokenEvent>> generated(choices.size());  // logprobs are built at the end, after any prompt scores
    bool completed = g.run(
        [&](int i, const std::string& text, const std::vector<TokenEvent>& toks) {
          choices[size_t(i)].text += text;
          generated[size_t(i)].insert(generated[size_t(i)].end(), toks.begin(), toks.end());
        },
        [&] { return w.client_gone(); });
    if (!completed) {
      w.set_keep_alive(false);
      w.send(499, "application/json", http::error_body("client closed the request", "invalid_request_error"));
      return;
    }
    // A scored prompt leads its choices' logprobs (its scores are complete: every request has finished).
    for (size_t i = 0; i < choices.size(); ++i) {
      if (p.prompt_logprobs >= 0) add_prompt_scores(choices[i], i / per_prompt);
      add_logprobs(choices[i], generated[i]);
    }
    json out = json::array();
    for (size_t i = 0; i < choices.size(); ++i)
      out.push_back({{"index", i}, {"text", echo_text[i / per_prompt] + choices[i].text}, {"logprobs", logprobs_json(choices[i], false)},
                     {"finish_reason", g.results()[i].finish_reason}});
    send_json(w, 200, {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", ctx.model_id},
                       {"system_fingerprint", "arbor"}, {"choices", out}, {"usage", usage()}});
    return;
  }
  auto chunk = [&](int index, const std::string& text, json logprobs, json finish) {
    json c = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", ctx.model_id},
              {"system_fingerprint", "arbor"},
              {"choices", json::array({{{"index", index}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}}})}};
    if (include_usage) c["usage"] = nullptr;
    return sse(c);
  };
  if (!w.begin_stream(200, "text/event-stream")) return;
  if (echo)
    for (size_t i = 0; i < choices.size(); ++i) w.write_chunk(chunk(int(i), echo_text[i / per_prompt], nullptr, nullptr));
  try {
    bool completed = g.run(
        [&](int i, const std::string& text, const std::vector<TokenEvent>& toks) {
          add_logprobs(choices[size_t(i)], toks);
          if (!text.empty()) w.write_chunk(chunk(i, text, logprobs_json(choices[size_t(i)], true), nullptr));
        },
        [&] { return w.failed() || w.client_gone(); });
    if (!completed) return;
    std::string tail;
    for (size_t i = 0; i < choices.size(); ++i)
      tail += chunk(int(i), "", logprobs_json(choices[i], true), g.results()[i].finish_reason);
    if (include_usage)
      tail += sse({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", ctx.model_id}, {"choices", json::array()},
                   {"usage", usage()}});
    tail += "data: [DONE]\n\n";
    w.write_chunk(tail);
  } catch (const ApiError& e) {
    w.write_chunk(sse(json::parse(http::error_body(e.what(), e.type, e.param, e.code))));
  }
  w.end_stream();
}

}  // namespace arbor::server
