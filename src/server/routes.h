// Route handlers (one function per endpoint family) and the small response helpers they share.
#pragma once
#include <string>

#include "core/json.h"
#include "server/context.h"
#include "server/http.h"

namespace arbor::server {

void handle_chat_completions(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w);
void handle_completions(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w);
void handle_messages(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w);  // Anthropic
void handle_count_tokens(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w);  // Anthropic
void handle_tokenize(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w);    // vLLM / llama.cpp shapes
void handle_detokenize(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w);
void handle_responses(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w);  // OpenAI Responses
void handle_models(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w);
void handle_metrics(ServerContext& ctx, const http::Request& req, http::ResponseWriter& w);

// JSON text with invalid UTF-8 replaced (model text is whole characters, but token pieces may not be).
std::string dump(const json& j);
void send_json(http::ResponseWriter& w, int status, const json& j);
// "data: {json}\n\n"
std::string sse(const json& j);
// "event: NAME\ndata: {json}\n\n" (Anthropic framing)
std::string sse_event(const std::string& name, const json& j);

// A token's text for logprobs (may be a partial UTF-8 sequence) and its raw bytes.
json token_logprob_json(const ServerContext& ctx, const TokenLogprob& t, bool with_top, const std::vector<TokenLogprob>& top);
std::string token_text(const ServerContext& ctx, int32_t id);

std::string random_id(const std::string& prefix);
int64_t unix_now();

}  // namespace arbor::server
