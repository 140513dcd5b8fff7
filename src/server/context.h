// ServerContext: what every route handler shares (scheduler, tokenizer, chat template, defaults, metrics),
// and Generation: one API request's n sequences through the scheduler, detokenized with stop strings.
#pragma once
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/scheduler.h"
#include "server/chat_output.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace arbor::server {

// Sampling defaults: server flags, overridden by the model's generation_config.json, overridden per request.
struct SamplingDefaults {
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f, repetition_penalty = 1.0f;  // OpenAI's defaults
  int64_t top_k = 0;
  int64_t max_tokens = -1;  // -1 = up to the context
};

struct Metrics {
  std::mutex mu;
  std::map<std::pair<std::string, int>, int64_t> requests;  // (route, status) -> count
  std::atomic<int64_t> prompt_tokens{0}, completion_tokens{0}, cached_tokens{0}, cancelled_by_client{0};
  std::atomic<int64_t> ttft_us_sum{0}, ttft_count{0};
  void count(const std::string& route, int status) {
    std::lock_guard<std::mutex> lk(mu);
    requests[{route, status}] += 1;
  }
};

// What one request's generation did, for the request log line (server.cpp): filled by Generation::run
// on the thread that handles the request, also when the client went away mid-generation (cancelled).
struct RequestStats {
  bool generated = false, cancelled = false;
  int64_t prompt = 0, cached = 0, completion = 0, choices = 0;
  double ttft_s = 0, total_s = 0;  // from submission to the first token, and to the last
};
RequestStats& this_thread_request_stats();

struct ServerContext {
  Scheduler* scheduler = nullptr;
  const Tokenizer* tok = nullptr;
  std::optional<ChatTemplate> chat_template;
  ChatFormat chat_format;
  std::string model_id;
  int64_t ctx_size = 0, vocab_size = 0;
  int64_t kv_capacity_tokens = 0;  // KV pool blocks * block size: one sequence can never hold more
  int64_t kv_bytes_per_token = 0;  // every layer's K and V of one token, in the KV codec (--kv-cache)
  std::vector<int32_t> eos_ids;  // generation ends at any of these
  SamplingDefaults defaults;
  std::string thinking;  // "" = template default, "on", "off"
  std::string api_key;   // "" = no check
  std::string version;   // GET /version: the build's commit
  // Browser origins answered with CORS headers: "*" (any, the default) or exact origins; empty: none.
  std::vector<std::string> allowed_origins = {"*"};
  bool log_requests = true;  // one line per API request on stderr (not /health, /metrics, preflights)
  int64_t created = 0;   // unix seconds, for /v1/models
  std::atomic<bool> ready{false};
  Metrics metrics;
  // Token bytes for response_format (constrained JSON), built on the first request that asks for it.
  std::once_flag json_table_once;
  std::shared_ptr<const JsonTokenTable> json_table;
};

struct GenParams {
  int64_t max_tokens = -1;  // -1 = defaults / the context
  SamplingParams sampling;
  bool seed_given = false;
  LogitProcessing processing;
  std::vector<std::string> stop;
  int64_t n = 1;
  bool logprobs = false;
  int64_t top_logprobs = 0;
  bool skip_special_tokens = true;
  bool ignore_eos = false;  // vLLM's extension, for benchmarks: run to max_tokens
  int64_t prompt_logprobs = -1;  // >= 0: score the prompt too, with this many alternatives (completions' echo)
};

struct ChoiceResult {
  std::string finish_reason;  // "stop" | "length" (the caller turns "stop" into "tool_calls" when it parsed calls)
  std::string stop_sequence;  // the stop string that matched, if any
  int64_t completion_tokens = 0;
};

class Generation {
 public:
  // Submits n requests; throws ApiError (400 context_length_exceeded / 429 / 503) when one is not admitted
  // (and cancels those already submitted).
  Generation(ServerContext& ctx, std::vector<int32_t> prompt, const GenParams& p);
  // Several prompts (/v1/completions' batch form): n requests each, prompt k's choice j at index k * n + j.
  Generation(ServerContext& ctx, const std::vector<std::vector<int32_t>>& prompts, const GenParams& p);
  ~Generation();  // cancels whatever has not finished (client gone, exception)
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  using DeltaFn = std::function<void(int choice, const std::string& text, const std::vector<TokenEvent>& tokens)>;
  // Drives every choice to its end: on_delta gets final text (whole UTF-8, stop strings removed) with the
  // tokens that produced it. gone() is polled between waits; when it says true everything is cancelled and
  // run() returns false. Throws ApiError 500 when the engine failed.
  bool run(const DeltaFn& on_delta, const std::function<bool()>& gone);

  const std::vector<ChoiceResult>& results() const { return results_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }  // over all prompts, each counted once
  // With GenParams::prompt_logprobs, after run(): prompt tokens 1..P-1 scored (the first choice's request
  // scores them; every choice shares the prompt).
  std::vector<TokenEvent> prompt_scores(size_t prompt = 0) const {
    return prompt * size_t(params_.n) < reqs_.size() ? reqs_[prompt * size_t(params_.n)]->prompt_scores() : std::vector<TokenEvent>{};
  }
  int64_t cached_tokens() const;
  int64_t completion_tokens() const;

 private:
  ServerContext& ctx_;
  std::vector<std::shared_ptr<Request>> reqs_;
  std::vector<ChoiceResult> results_;
  GenParams params_;
  int64_t prompt_tokens_ = 0;
};

// Resolves the request's token budget: max_tokens if given, else the server default, else the context.
int64_t resolve_max_tokens(const ServerContext& ctx, int64_t requested, int64_t prompt_tokens);

}  // namespace arbor::server
