// Request: one generation submitted to the Scheduler, and the channel its tokens come back through.
// The scheduler thread fills the channel; one consumer thread (an HTTP handler) drains it.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/json_constraint.h"
#include "engine/sampler.h"

namespace arbor {

// Logit processing applied before the Sampler, in this order: repetition penalty (HF: over prompt and
// generated ids, logit / p when positive, * p when negative), presence and frequency penalties
// (OpenAI: logit -= frequency * count + presence * [count > 0], over generated ids), logit_bias (added).
struct LogitProcessing {
  float repetition_penalty = 1.0f;  // 1 = off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::map<int32_t, float> logit_bias;
  std::optional<JsonConstraint> json;  // this request's own state (copies are independent)
  bool active() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f || !logit_bias.empty() ||
           json.has_value();
  }
};

// Applies `p` to one row of logits [vocab] in place. prompt/generated are the ids seen so far.
void apply_logit_processing(const LogitProcessing& p, const std::vector<int32_t>& prompt,
                            const std::vector<int32_t>& generated, float* logits, int64_t vocab);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// log_softmax of row `logits` [vocab]: the chosen token's logprob and the top `k` alternatives
// (highest first, ties to the lower id).
void compute_logprobs(const float* logits, int64_t vocab, int32_t chosen, int64_t k, TokenLogprob& out_chosen,
                      std::vector<TokenLogprob>& out_top);

enum class FinishReason : uint8_t { None, Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct TokenEvent {
  int32_t id = 0;
  TokenLogprob logprob;            // filled when the request asked for logprobs
  std::vector<TokenLogprob> top;   // top_logprobs alternatives
};

class Request {
 public:
  // --- Inputs (set before submit, then read-only) ---
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;         // generated tokens at most (already clamped to the context by the caller or the scheduler)
  SamplingParams sampling;
  LogitProcessing processing;
  std::vector<int32_t> stop_ids;   // generation ends after emitting one of these (the id is still reported)
  bool logprobs = false;
  int64_t top_logprobs = 0;
  // >= 0: also score the prompt: the logprob of each prompt token after the first given the ones before
  // it, with this many alternatives (OpenAI's echo + logprobs). Such a request takes no prefix-cache
  // blocks (every prompt row's logits are computed).
  int64_t prompt_logprobs = -1;

  // --- Consumer side ---
  // Waits up to `timeout` for events; moves them into `out`. Returns true when the request has finished and
  // every event was handed out (then finish_reason() is final).
  bool wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout);
  // Asks the scheduler to drop the request; its KV blocks are freed at the start of the next step.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  FinishReason finish_reason() const;
  std::string error() const;
  // Prompt tokens whose KV came from the prefix cache (whole blocks; set when the request is admitted).
  int64_t cached_tokens() const { return cached_tokens_.load(); }
  // Seconds from submit to the first generated token (0 until then).
  double ttft_seconds() const;
  // With prompt_logprobs: prompt tokens 1..P-1 scored (id, logprob, alternatives); complete once the
  // first generated token has been reported.
  std::vector<TokenEvent> prompt_scores() const;

  // --- Producer side (the scheduler thread) ---
  void push(TokenEvent ev);
  void finish(FinishReason r, std::string error = {});
  void set_cached_tokens(int64_t n) { cached_tokens_.store(n); }
  void set_prompt_scores(std::vector<TokenEvent> s);
  std::chrono::steady_clock::time_point submitted_at;
  std::chrono::steady_clock::time_point first_token_at;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool finished_ = false;
  FinishReason reason_ = FinishReason::None;
  std::string error_;
  std::vector<TokenEvent> prompt_scores_;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> cached_tokens_{0};
};

}  // namespace arbor
