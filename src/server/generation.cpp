// Generation: submit n sequences, stream their detokenized text, map finish reasons.
#include <algorithm>
#include <chrono>
#include <random>

#include "core/log.h"
#include "server/api_error.h"
#include "server/context.h"
#include "text/tokenizer/stream_decoder.h"

namespace arbor::server {

int64_t resolve_max_tokens(const ServerContext& ctx, int64_t requested, int64_t prompt_tokens) {
  int64_t room = ctx.ctx_size - prompt_tokens;
  // Without an explicit budget, also stay within what the KV pool can hold for one sequence.
  if (requested < 0 && ctx.kv_capacity_tokens > 0) room = std::min(room, std::max<int64_t>(1, ctx.kv_capacity_tokens - prompt_tokens));
  int64_t m = requested >= 0 ? requested : ctx.defaults.max_tokens >= 0 ? ctx.defaults.max_tokens : room;
  return std::max<int64_t>(0, std::min(m, room));  // clamped to what the context leaves
}

RequestStats& this_thread_request_stats() {
  thread_local RequestStats stats;
  return stats;
}

Generation::Generation(ServerContext& ctx, std::vector<int32_t> prompt, const GenParams& p)
    : Generation(ctx, std::vector<std::vector<int32_t>>{std::move(prompt)}, p) {}

Generation::Generation(ServerContext& ctx, const std::vector<std::vector<int32_t>>& prompts, const GenParams& p) : ctx_(ctx), params_(p) {
  for (size_t k = 0; k < prompts.size(); ++k) {
    const int64_t P = int64_t(prompts[k].size());
    if (P >= ctx.ctx_size)
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, your prompt{} has {} tokens, which leaves no "
                                 "room for the completion.",
                                 ctx.ctx_size, prompts.size() > 1 ? fmt::format(" {}", k) : std::string(), P),
                     "messages", "context_length_exceeded");
    prompt_tokens_ += P;
  }
  uint64_t base_seed = p.seed_given ? p.sampling.seed : std::random_device{}() * 0x9E3779B97F4A7C15ull + std::random_device{}();
  try {
    for (size_t k = 0; k < prompts.size(); ++k)
      for (int64_t i = 0; i < p.n; ++i) {
        auto r = std::make_shared<Request>();
        r->prompt = prompts[k];
        r->max_tokens = resolve_max_tokens(ctx, p.max_tokens, int64_t(prompts[k].size()));
        r->sampling = p.sampling;
        r->sampling.seed = base_seed + uint64_t(i);  // choice i of a seeded request is reproducible on its own
        r->processing = p.processing;
        if (!p.ignore_eos) r->stop_ids = ctx.eos_ids;
        r->logprobs = p.logprobs;
        r->top_logprobs = p.top_logprobs;
        if (i == 0) r->prompt_logprobs = p.prompt_logprobs;  // every choice of a prompt shares its scores
        AdmissionResult a = ctx.scheduler->submit(r);
        switch (a.status) {
          case Admission::Accepted: break;
          case Admission::NeverFits:
            throw ApiError(400, a.message, a.context_exceeded ? "messages" : "max_tokens",
                           a.context_exceeded ? "context_length_exceeded" : "kv_capacity_exceeded");
          case Admission::BadRequest: throw ApiError(400, a.message, "prompt");
          case Admission::QueueFull: throw ApiError(429, a.message, "", "server_busy", "rate_limit_error");
          case Admission::ShuttingDown: throw ApiError(503, a.message, "", "shutting_down", "server_error");
        }
        reqs_.push_back(std::move(r));
      }
  } catch (...) {
    for (auto& r : reqs_) r->cancel();  // no destructor runs for a constructor that throws
    throw;
  }
  results_.resize(reqs_.size());
}

Generation::~Generation() {
  for (auto& r : reqs_) r->cancel();
}

// The prefix cache's share of prompt_tokens(): the first choice's of each prompt.
int64_t Generation::cached_tokens() const {
  int64_t n = 0;
  for (size_t i = 0; i < reqs_.size(); i += size_t(params_.n)) n += reqs_[i]->cached_tokens();
  return n;
}

int64_t Generation::completion_tokens() const {
  int64_t n = 0;
  for (const auto& r : results_) n += r.completion_tokens;
  return n;
}

bool Generation::run(const DeltaFn& on_delta, const std::function<bool()>& gone) {
  const size_t n = reqs_.size();
  std::vector<StreamDecoder> dec;
  dec.reserve(n);
  for (size_t i = 0; i < n; ++i) dec.emplace_back(*ctx_.tok, params_.skip_special_tokens, params_.stop);
  std::vector<bool> done(n, false);
  size_t remaining = n;
  std::vector<TokenEvent> evs;
  auto last_probe = std::chrono::steady_clock::now();
  // The request log's figures (server.cpp), for a generation that ran to its end or was cancelled.
  auto record_stats = [&](bool cancelled) {
    RequestStats& st = this_thread_request_stats();
    st.generated = true, st.cancelled = cancelled;
    st.prompt = prompt_tokens_, st.cached = cached_tokens(), st.completion = completion_tokens(), st.choices = int64_t(n);
    st.ttft_s = reqs_[0]->ttft_seconds();
    st.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - reqs_[0]->submitted_at).count();
  };
  while (remaining > 0) {
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      Request& r = *reqs_[i];
      evs.clear();
      bool finished = r.wait(evs, std::chrono::milliseconds(n == 1 ? 50 : 2));
      std::string text;
      size_t used = 0;
      for (const auto& ev : evs) {
        if (dec[i].stopped()) break;
        // The end-of-sequence token ends the text; it is not part of it (it shows when special tokens are kept).
        if (params_.ignore_eos || std::find(ctx_.eos_ids.begin(), ctx_.eos_ids.end(), ev.id) == ctx_.eos_ids.end()) text += dec[i].push(ev.id);
        ++used;
      }
      results_[i].completion_tokens += int64_t(used);
      if (dec[i].stopped()) {
        r.cancel();  // the scheduler frees its blocks at the start of the next step
        results_[i].finish_reason = "stop";
        results_[i].stop_sequence = dec[i].matched_stop();
        evs.resize(used);
        if (!text.empty() || !evs.empty()) on_delta(int(i), text, evs);
        done[i] = true;
        --remaining;
        continue;
      }
      if (finished) {
        text += dec[i].flush();
        FinishReason fr = r.finish_reason();
        if (fr == FinishReason::Error) {
          // The engine's message is for the operator; the client learns only that it failed.
          log_info("server: the engine failed a request: {}", r.error());
          throw ApiError(500, "the engine failed on this request; the server log has the details", "", "internal_error", "server_error");
        }
        // Only the scheduler's shutdown cancels a request we did not cancel ourselves.
        if (fr == FinishReason::Cancelled)
          throw ApiError(503, "the request was cancelled: the server is shutting down", "", "shutting_down", "server_error");
        results_[i].finish_reason = fr == FinishReason::Length ? "length" : fr == FinishReason::Stop ? "stop" : "cancelled";
        done[i] = true;
        --remaining;
      }
      if (!text.empty() || !evs.empty()) on_delta(int(i), text, evs);
    }
    auto now = std::chrono::steady_clock::now();
    if (remaining > 0 && now - last_probe > std::chrono::milliseconds(20)) {
      last_probe = now;
      if (gone && gone()) {
        for (auto& r : reqs_) r->cancel();
        ctx_.metrics.cancelled_by_client += 1;
        record_stats(true);
        return false;
      }
    }
  }
  record_stats(false);
  const double ttft = reqs_[0]->ttft_seconds();
  if (ttft > 0) {
    ctx_.metrics.ttft_us_sum += int64_t(ttft * 1e6);
    ctx_.metrics.ttft_count += 1;
  }
  ctx_.metrics.prompt_tokens += prompt_tokens_;
  ctx_.metrics.cached_tokens += cached_tokens();  // the prefix-cache share of prompt_tokens, as usage reports it
  ctx_.metrics.completion_tokens += completion_tokens();
  return true;
}

}  // namespace arbor::server
