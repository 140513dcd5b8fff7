// Request channel, logit processing (penalties, bias) and logprobs.
#include "engine/request.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace arbor {

void apply_logit_processing(const LogitProcessing& p, const std::vector<int32_t>& prompt,
                            const std::vector<int32_t>& generated, float* logits, int64_t vocab) {
  auto in_vocab = [&](int32_t id) { return id >= 0 && id < vocab; };
  if (p.repetition_penalty != 1.0f) {
    // Each distinct id is penalised once, however often it occurs (as transformers' gather/scatter does).
    std::vector<int32_t> seen;
    seen.reserve(prompt.size() + generated.size());
    seen.insert(seen.end(), prompt.begin(), prompt.end());
    seen.insert(seen.end(), generated.begin(), generated.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen) {
      if (!in_vocab(id)) continue;
      float& l = logits[id];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int64_t> count;
    for (int32_t id : generated) count[id] += 1;
    for (auto [id, n] : count)
      if (in_vocab(id)) logits[id] -= p.frequency_penalty * float(n) + p.presence_penalty;
  }
  for (auto [id, b] : p.logit_bias)
    if (in_vocab(id)) logits[id] += b;
}

void compute_logprobs(const float* logits, int64_t vocab, int32_t chosen, int64_t k, TokenLogprob& out_chosen,
                      std::vector<TokenLogprob>& out_top) {
  float mx = logits[0];
  for (int64_t i = 1; i < vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i] - mx));
  const double lse = double(mx) + std::log(sum);
  out_chosen = {chosen, float(double(logits[chosen]) - lse)};
  out_top.clear();
  if (k <= 0) return;
  k = std::min(k, vocab);
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) idx[size_t(i)] = int32_t(i);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int64_t i = 0; i < k; ++i) out_top.push_back({idx[size_t(i)], float(double(logits[idx[size_t(i)]]) - lse)});
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
    case FinishReason::None: break;
  }
  return "none";
}

bool Request::wait(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !events_.empty() || finished_; });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return finished_;
}

FinishReason Request::finish_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return reason_;
}

std::string Request::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

std::vector<TokenEvent> Request::prompt_scores() const {
  std::lock_guard<std::mutex> lk(mu_);
  return prompt_scores_;
}

void Request::set_prompt_scores(std::vector<TokenEvent> s) {
  std::lock_guard<std::mutex> lk(mu_);
  prompt_scores_ = std::move(s);
}

double Request::ttft_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (first_token_at.time_since_epoch().count() == 0) return 0;
  return std::chrono::duration<double>(first_token_at - submitted_at).count();
}

void Request::push(TokenEvent ev) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (first_token_at.time_since_epoch().count() == 0) first_token_at = std::chrono::steady_clock::now();
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

void Request::finish(FinishReason r, std::string error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finished_) return;
    finished_ = true;
    reason_ = r;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

}  // namespace arbor
