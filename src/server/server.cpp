// Routing, auth, /health, /v1/models, /metrics, and the response helpers.
#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/log.h"
#include "server/api_error.h"
#include "server/routes.h"
#include "server/webui.h"

namespace arbor::server {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(http::ResponseWriter& w, int status, const json& j) { w.send(status, "application/json", dump(j)); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

std::string sse_event(const std::string& name, const json& j) { return "event: " + name + "\ndata: " + dump(j) + "\n\n"; }

std::string token_text(const ServerContext& ctx, int32_t id) { return ctx.tok->decode(std::span<const int32_t>(&id, 1), false); }

json token_logprob_json(const ServerContext& ctx, const TokenLogprob& t, bool with_top, const std::vector<TokenLogprob>& top) {
  auto one = [&](const TokenLogprob& x) {
    std::string s = token_text(ctx, x.id);
    json bytes = json::array();
    for (unsigned char c : s) bytes.push_back(int(c));
    return json{{"token", s}, {"logprob", x.logprob}, {"bytes", bytes}};
  };
  json j = one(t);
  if (with_top) {
    json alts = json::array();
    for (const auto& a : top) alts.push_back(one(a));
    j["top_logprobs"] = alts;
  }
  return j;
}

std::string random_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kAlnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void handle_models(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w) {
  json m = {{"id", ctx.model_id}, {"object", "model"}, {"created", ctx.created}, {"owned_by", "arbor"},
            {"context_window", ctx.ctx_size}, {"max_model_len", ctx.ctx_size},
            {"reasoning", ctx.chat_format.reasoning}, {"vision", false}};
  const std::string prefix = "/v1/models/";
  if (req.path.rfind(prefix, 0) == 0) {
    std::string id = req.path.substr(prefix.size());
    if (id != ctx.model_id) throw ApiError(404, fmt::format("model '{}' not found; this server serves '{}'", id.substr(0, 200), ctx.model_id),
                                           "model", "model_not_found");
    send_json(w, 200, m);
    return;
  }
  send_json(w, 200, {{"object", "list"}, {"data", json::array({m})}});
}

void handle_metrics(ServerContext& ctx, const http::Request&, http::ResponseWriter& w) {
  SchedulerStats s = ctx.scheduler->stats();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  out += "# HELP arbor_http_requests_total HTTP requests by route and status.\n# TYPE arbor_http_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lk(ctx.metrics.mu);
    for (const auto& [k, n] : ctx.metrics.requests)
      out += fmt::format("arbor_http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, n);
  }
  metric("arbor_requests_running", "gauge", "Sequences in the running batch.", double(s.running));
  metric("arbor_requests_waiting", "gauge", "Sequences waiting for a batch slot or KV blocks (queue depth).", double(s.waiting));
  metric("arbor_kv_blocks_total", "gauge", "KV cache blocks in the pool.", double(s.kv_blocks_total));
  metric("arbor_kv_blocks_used", "gauge", "KV cache blocks held by sequences.", double(s.kv_blocks_used));
  metric("arbor_kv_blocks_cached", "gauge", "KV blocks kept for the prefix cache (unused, evictable).", double(s.kv_blocks_cached));
  metric("arbor_kv_usage_ratio", "gauge", "Fraction of KV blocks in use.",
         s.kv_blocks_total ? double(s.kv_blocks_used) / double(s.kv_blocks_total) : 0.0);
  metric("arbor_kv_capacity_tokens", "gauge", "Tokens the KV pool holds (blocks * block size).", double(ctx.kv_capacity_tokens));
  metric("arbor_kv_bytes_per_token", "gauge", "KV cache bytes per token (every layer's K and V, in the --kv-cache codec).",
         double(ctx.kv_bytes_per_token));
  metric("arbor_sequences_admitted_total", "counter", "Sequences admitted to the batch.", double(s.requests_admitted));
  metric("arbor_sequences_finished_total", "counter", "Sequences finished (any reason).", double(s.requests_finished));
  metric("arbor_sequences_cancelled_total", "counter", "Sequences cancelled (stop string, client gone, shutdown).", double(s.requests_cancelled));
  metric("arbor_sequences_rejected_total", "counter", "Sequences refused at admission (too large, queue full).", double(s.requests_rejected));
  metric("arbor_prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(s.prompt_tokens));
  metric("arbor_generation_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
  metric("arbor_engine_steps_total", "counter", "Forward steps run.", double(s.steps));
  metric("arbor_engine_steps_queued_ahead_total", "counter", "Decode steps queued before the previous step's ids reached the host.",
         double(s.steps_queued_ahead));
  metric("arbor_engine_busy_seconds_total", "counter", "Seconds spent in forward and sampling.", s.busy_seconds);
  metric("arbor_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.", double(ctx.metrics.cached_tokens.load()));
  metric("arbor_client_disconnects_total", "counter", "Requests cancelled because the client went away.", double(ctx.metrics.cancelled_by_client.load()));
  int64_t tc = ctx.metrics.ttft_count.load();
  metric("arbor_time_to_first_token_seconds_sum", "counter", "Sum of time to first token.", double(ctx.metrics.ttft_us_sum.load()) * 1e-6);
  metric("arbor_time_to_first_token_seconds_count", "counter", "Requests with a first token.", double(tc));
  w.send(200, "text/plain; version=0.0.4; charset=utf-8", out);
}

// "server: POST /v1/chat/completions 200 0.412 s; prompt 25 tokens (16 cached), 40 generated, first after
// 0.031 s, 103.5 tok/s after it" (the generation part only where one ran). A generation the client
// stopped or disconnected from says so before its figures: "200 0.412 s; cancelled: the client went away;
// prompt ..." (200 for a stream already under way, 499 for an answer not yet sent).
static void log_request(const http::Request& req, const http::ResponseWriter& w, std::chrono::steady_clock::time_point started) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::string line = fmt::format("server: {} {} {} {:.3f} s", req.method.substr(0, 16), req.path.substr(0, 200), w.started() ? w.status() : 0, secs);
  const RequestStats& st = this_thread_request_stats();
  if (st.cancelled) line += "; cancelled: the client went away";
  if (st.generated) {
    line += fmt::format("; prompt {} tokens ({} cached), {} generated", st.prompt, st.cached, st.completion);
    const int64_t after_first = st.completion - st.choices;
    if (st.ttft_s > 0) line += fmt::format(", first after {:.3f} s", st.ttft_s);
    if (st.ttft_s > 0 && after_first > 0 && st.total_s > st.ttft_s)
      line += fmt::format(", {:.1f} tok/s after it", double(after_first) / (st.total_s - st.ttft_s));
  }
  log_line(line);
}

// 'Authorization: Bearer KEY' (the scheme in any case, RFC 9110 11.1) or 'x-api-key: KEY' (Anthropic's),
// compared in time that does not depend on where the first difference is.
static bool has_api_key(const http::Request& req, const std::string& key) {
  auto same = [&](std::string_view given) {
    unsigned diff = given.size() != key.size();
    for (size_t i = 0; i < given.size(); ++i) diff |= unsigned(given[i] ^ key[i % std::max<size_t>(key.size(), 1)]);
    return diff == 0;
  };
  const std::string auth = req.header("authorization");
  const size_t sp = auth.find(' ');
  std::string scheme = auth.substr(0, sp);
  for (auto& c : scheme) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (scheme == "bearer" && sp != std::string::npos) {
    std::string_view token = std::string_view(auth).substr(sp);
    token.remove_prefix(std::min(token.find_first_not_of(' '), token.size()));
    if (same(token)) return true;
  }
  const std::string xkey = req.header("x-api-key");
  return !xkey.empty() && same(xkey);
}

ApiServer::ApiServer(ServerContext& ctx, http::ServerOptions opt)
    : ctx_(ctx), http_(std::move(opt), [this](const http::Request& r, http::ResponseWriter& w) { handle(r, w); }) {}

void ApiServer::handle(const http::Request& req, http::ResponseWriter& w) {
  // CORS, for clients in a browser: an allowed Origin gets Access-Control-Allow-Origin on every answer,
  // and a preflight (OPTIONS) is answered here, before the API key check (browsers send no credentials
  // with it).
  const std::string origin = req.header("origin");
  const auto& allowed = ctx_.allowed_origins;
  const bool any_origin = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
  const bool cors = !origin.empty() && (any_origin || std::find(allowed.begin(), allowed.end(), origin) != allowed.end());
  if (cors) {
    w.add_header("Access-Control-Allow-Origin", any_origin ? "*" : origin);
    if (!any_origin) w.add_header("Vary", "Origin");
  }
  if (req.method == "OPTIONS") {
    std::vector<std::pair<std::string, std::string>> h = {{"Allow", "GET, HEAD, POST, OPTIONS"}};
    if (cors) {
      const std::string asked = req.header("access-control-request-headers").substr(0, 1024);
      h.push_back({"Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS"});
      h.push_back({"Access-Control-Allow-Headers", asked.empty() ? "authorization, content-type, x-api-key, anthropic-version" : asked});
      h.push_back({"Access-Control-Max-Age", "86400"});
    }
    w.send(204, "", "", h);
    ctx_.metrics.count("OPTIONS", 204);
    return;
  }
  this_thread_request_stats() = {};
  const auto started = std::chrono::steady_clock::now();
  std::string route = req.path;
  const bool is_post = req.method == "POST", is_get = req.method == "GET" || req.method == "HEAD";
  enum class R { None, Chat, Completions, Messages, CountTokens, Tokenize, Detokenize, Responses, Models, Health, Version, Metrics, Root } r =
      R::None;
  if (req.path == "/v1/chat/completions" || req.path == "/chat/completions") r = R::Chat;
  else if (req.path == "/v1/completions" || req.path == "/completions") r = R::Completions;
  else if (req.path == "/v1/messages") r = R::Messages;
  else if (req.path == "/v1/messages/count_tokens") r = R::CountTokens;
  else if (req.path == "/tokenize" || req.path == "/v1/tokenize") r = R::Tokenize;
  else if (req.path == "/detokenize" || req.path == "/v1/detokenize") r = R::Detokenize;
  else if (req.path == "/version") r = R::Version;
  else if (req.path == "/v1/responses" || req.path == "/responses") r = R::Responses;
  else if (req.path == "/v1/models" || req.path.rfind("/v1/models/", 0) == 0) r = R::Models;
  else if (req.path == "/health" || req.path == "/v1/health") r = R::Health;
  else if (req.path == "/metrics") r = R::Metrics;
  else if (req.path == "/") r = R::Root;
  if (r == R::Models) route = "/v1/models";
  if (r == R::None) route = "other";
  const bool anthropic = r == R::Messages || r == R::CountTokens;
  auto error = [&](const ApiError& e) {
    if (w.started()) {
      // An error after the stream began: one error frame, then the stream ends (api.md).
      if (w.streaming() && !w.ended() && !w.failed()) {
        std::string body = http::error_body(e.what(), e.type, e.param, e.code);
        w.write_chunk(anthropic ? "event: error\ndata: " + body + "\n\n" : "data: " + body + "\n\n");
        w.end_stream();
      }
      return;
    }
    if (anthropic) {
      // Anthropic's shape: {"type":"error","error":{"type","message"}}
      const char* t = e.status == 429 ? "rate_limit_error" : e.status == 404 ? "not_found_error" : e.status == 401 ? "authentication_error"
                      : e.status == 413 ? "request_too_large" : e.status >= 500 ? "api_error" : "invalid_request_error";
      send_json(w, e.status, {{"type", "error"}, {"error", {{"type", t}, {"message", e.what()}}}});
    } else {
      w.send(e.status, "application/json", http::error_body(e.what(), e.type, e.param, e.code));
    }
  };
  try {
    // With --api-key everything needs the key but what a browser or a probe must reach without one:
    // /health, /version and GET / (the chat page, which asks for the key itself).
    const bool open_route = r == R::Health || r == R::Version || r == R::Root;
    if (!ctx_.api_key.empty() && !open_route && !has_api_key(req, ctx_.api_key))
      throw ApiError(401, "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')", "", "invalid_api_key",
                     "authentication_error");
    if (r == R::None) throw ApiError(404, fmt::format("no route for {} {}", req.method.substr(0, 16), req.path.substr(0, 200)), "", "not_found");
    const bool want_post = r == R::Chat || r == R::Completions || r == R::Messages || r == R::CountTokens || r == R::Tokenize ||
                           r == R::Detokenize || r == R::Responses;
    if ((want_post && !is_post) || (!want_post && !is_get))
      throw ApiError(405, fmt::format("{} does not accept {}; use {}", req.path, req.method.substr(0, 16), want_post ? "POST" : "GET"));
    if (!ctx_.ready.load() && r != R::Health && r != R::Version && r != R::Metrics && r != R::Root)
      throw ApiError(503, "the model is still loading", "", "model_loading", "server_error");
    switch (r) {
      case R::Chat: handle_chat_completions(ctx_, req, w); break;
      case R::Completions: handle_completions(ctx_, req, w); break;
      case R::Messages: handle_messages(ctx_, req, w); break;
      case R::CountTokens: handle_count_tokens(ctx_, req, w); break;
      case R::Tokenize: handle_tokenize(ctx_, req, w); break;
      case R::Detokenize: handle_detokenize(ctx_, req, w); break;
      case R::Version: send_json(w, 200, {{"version", ctx_.version}}); break;
      case R::Responses: handle_responses(ctx_, req, w); break;
      case R::Models: handle_models(ctx_, req, w); break;
      case R::Metrics: handle_metrics(ctx_, req, w); break;
      case R::Health:
        if (ctx_.ready.load()) send_json(w, 200, {{"status", "ok"}});
        else send_json(w, 503, {{"status", "loading"}});
        break;
      case R::Root:
        // Browsers get the chat page; curl and friends a status line.
        if (req.header("accept").find("text/html") != std::string::npos)
          w.send(200, "text/html; charset=utf-8", webui_page(),
                 {{"Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'"},
                  {"X-Content-Type-Options", "nosniff"}});
        else
          w.send(200, "text/plain; charset=utf-8", fmt::format("arbor is serving {} (OpenAI API at /v1, Anthropic at /v1/messages)\n", ctx_.model_id));
        break;
      case R::None: break;
    }
  } catch (const ApiError& e) {
    if (e.status >= 500) log_info("server: {} {}: {} {}", req.method, req.path, e.status, e.what());
    error(e);
  } catch (const std::exception& e) {
    // The cause goes to the log only: an exception's text is the server's internals, not the client's business.
    log_info("server: {} {}: internal error: {}", req.method.substr(0, 16), req.path.substr(0, 200), e.what());
    error(ApiError(500, "internal error; the server log has the details", "", "internal_error", "server_error"));
  }
  ctx_.metrics.count(route, w.started() ? w.status() : 0);
  if (ctx_.log_requests && r != R::Health && r != R::Metrics) log_request(req, w, started);
}

}  // namespace arbor::server
