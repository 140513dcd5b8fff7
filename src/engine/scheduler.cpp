// Continuous batching: admission by KV blocks, decode-first steps with chunked prefill, per-request sampling.
#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace arbor {

Scheduler::Scheduler(Model& model, BlockPool& pool, SchedulerOptions opt) : model_(model), pool_(pool), opt_(opt) {
  ARBOR_CHECK(opt_.max_batch >= 1, "scheduler: max_batch must be >= 1, got {}", opt_.max_batch);
  ARBOR_CHECK(opt_.max_queue >= 0, "scheduler: max_queue must be >= 0, got {}", opt_.max_queue);
  ARBOR_CHECK(opt_.max_batch <= model_.max_step_tokens(), "scheduler: max_batch {} exceeds the model's step budget of {} tokens",
              opt_.max_batch, model_.max_step_tokens());
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(); }

AdmissionResult Scheduler::submit(const std::shared_ptr<Request>& r) {
  AdmissionResult res;
  const int64_t V = model_.config().vocab_size, ctx = model_.ctx_size();
  const int64_t P = int64_t(r->prompt.size());
  auto reject = [&](Admission a, std::string msg) {
    rejected_ += 1;
    res.status = a;
    res.message = std::move(msg);
    return res;
  };
  if (P == 0) return reject(Admission::BadRequest, "the prompt is empty (0 tokens)");
  for (int64_t i = 0; i < P; ++i)
    if (r->prompt[size_t(i)] < 0 || r->prompt[size_t(i)] >= V)
      return reject(Admission::BadRequest, fmt::format("prompt token {} at index {} is outside the vocabulary (0..{})", r->prompt[size_t(i)], i, V - 1));
  if (P >= ctx) {
    res.context_exceeded = true;
    return reject(Admission::NeverFits,
                  fmt::format("the prompt has {} tokens; the context window is {} tokens, which leaves no room to generate", P, ctx));
  }
  r->max_tokens = std::clamp<int64_t>(r->max_tokens, 0, ctx - P);
  if (r->max_tokens == 0) {  // nothing to generate: done without touching the model
    r->submitted_at = std::chrono::steady_clock::now();
    r->finish(FinishReason::Length);
    return res;
  }
  const int64_t need = pool_.blocks_for(P + r->max_tokens);
  if (need > pool_.n_blocks())
    return reject(Admission::NeverFits,
                  fmt::format("the request needs {} KV blocks ({} prompt + {} max tokens, {} tokens per block); the server has {} in all",
                              need, P, r->max_tokens, pool_.block_size(), pool_.n_blocks()));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return reject(Admission::ShuttingDown, "the server is shutting down");
    // A request waits only when every batch slot is taken or the KV pool is short; the queue bounds how many.
    if (int64_t(waiting_.size()) >= opt_.max_queue && (n_running_.load() >= opt_.max_batch || !waiting_.empty()))
      return reject(Admission::QueueFull,
                    fmt::format("the server is full: {} requests running (max {}), {} waiting (max {})", n_running_.load(),
                                opt_.max_batch, waiting_.size(), opt_.max_queue));
    r->submitted_at = std::chrono::steady_clock::now();
    waiting_.push_back(r);
  }
  cv_.notify_all();
  return res;
}

void Scheduler::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> lk(join_mu_);  // shutdown() may race from several threads; one joins
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.waiting = int64_t(waiting_.size());
  }
  s.running = n_running_.load();
  s.kv_blocks_total = pool_.n_blocks();
  s.kv_blocks_used = kv_used_.load();
  s.kv_blocks_cached = kv_cached_.load();
  s.cached_tokens = cached_tokens_.load();
  s.requests_admitted = admitted_.load();
  s.requests_finished = finished_.load();
  s.requests_cancelled = cancelled_.load();
  s.requests_rejected = rejected_.load();
  s.prompt_tokens = prompt_tokens_.load();
  s.generated_tokens = generated_tokens_.load();
  s.steps = steps_.load();
  s.steps_queued_ahead = steps_ahead_.load();
  s.busy_seconds = double(busy_us_.load()) * 1e-6;
  return s;
}

void Scheduler::update_kv_stats() {
  kv_used_.store(pool_.used_blocks());
  kv_cached_.store(pool_.cached_blocks());
}

// Moves waiting requests into the batch, oldest first, while a slot and their KV blocks are free. With the
// prefix cache, the request's cached prefix blocks are taken first and only the rest is allocated (cached
// blocks nobody holds count as free: allocate() evicts them).
void Scheduler::admit_locked() {
  while (!waiting_.empty() && int64_t(running_.size()) < opt_.max_batch) {
    auto& r = waiting_.front();
    if (r->cancelled()) {
      r->finish(FinishReason::Cancelled);
      cancelled_ += 1;
      waiting_.pop_front();
      continue;
    }
    const int64_t P = int64_t(r->prompt.size());
    const int64_t limit = P + r->max_tokens;
    auto a = std::make_shared<Active>(Active{r, SequenceKV{}, Sampler(r->sampling), limit, 0, {}, -1, false});
    a->kv.long_rope = model_.long_rope_for(P);  // before the prefix match: the regimes' blocks hash apart
    // The last prompt token is always computed: its logits give the first generated token.
    const int64_t cached = opt_.prefix_cache && r->prompt_logprobs < 0 ? a->kv.match_prefix(pool_, r->prompt, P - 1) : 0;
    if (!a->kv.reserve(pool_, limit)) {  // head of line waits for blocks (FIFO keeps it fair)
      a->kv.release(pool_);
      break;
    }
    a->prefilled = cached;
    r->set_cached_tokens(cached);
    cached_tokens_ += cached;
    prompt_tokens_ += P;
    admitted_ += 1;
    running_.push_back(std::move(a));
    waiting_.pop_front();
  }
  n_running_.store(int64_t(running_.size()));
  update_kv_stats();
}

void Scheduler::retire(Active& a, FinishReason r, const std::string& error) {
  a.kv.release(pool_);  // published blocks stay cached
  update_kv_stats();  // before finish(): a waiter may read stats next
  a.done = true;
  if (r == FinishReason::Cancelled) cancelled_ += 1;
  finished_ += 1;
  a.req->finish(r, error);
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !running_.empty() || !waiting_.empty() || inflight_; });
      if (stopping_) {
        if (inflight_) {  // the device finishes the queued step before its requests' blocks go back
          try {
            model_.backend().drop_picks();
          } catch (const std::exception& e) {
            log_info("scheduler: dropping the queued step at shutdown: {}", e.what());
          }
          inflight_.reset();
        }
        for (auto& a : running_) retire(*a, FinishReason::Cancelled);
        running_.clear();
        for (auto& r : waiting_) {
          r->finish(FinishReason::Cancelled);
          cancelled_ += 1;
        }
        waiting_.clear();
        n_running_.store(0);
        update_kv_stats();
        return;
      }
      // Cancelled requests leave before admission so their blocks go to whoever waits.
      for (auto& a : running_)
        if (a->req->cancelled()) retire(*a, FinishReason::Cancelled);
      running_.erase(std::remove_if(running_.begin(), running_.end(), [](auto& a) { return a->done; }), running_.end());
      admit_locked();
      if (running_.empty() && !inflight_) continue;
    }
    step();
  }
}

void Scheduler::step() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  if (!inflight_) {
    auto parts = plan_parts();
    if (parts.empty()) return;
    inflight_ = launch(std::move(parts), false);
  }
  std::optional<Launched> successor;
  if (can_queue_successor(*inflight_)) {
    std::vector<Part> next;
    for (auto& p : inflight_->parts) next.push_back({p.a, p.a->kv.length + 1, 1, true, true});
    successor = launch(std::move(next), true);
    steps_ahead_ += 1;
  }
  finish(*inflight_);
  inflight_ = std::move(successor);
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](auto& a) { return a->done; }), running_.end());
  n_running_.store(int64_t(running_.size()));
  update_kv_stats();
  busy_us_ += std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count();
}

// Decode tokens first (one per running request), then prefill chunks in admission order.
std::vector<Scheduler::Part> Scheduler::plan_parts() {
  std::vector<Part> parts;
  int64_t budget = model_.max_step_tokens();
  for (auto& a : running_)
    if (!a->done && a->next >= 0) {
      parts.push_back({a, a->kv.length, 1, true, true});
      budget -= 1;
    }
  for (auto& a : running_) {
    if (a->done || a->next >= 0 || budget <= 0) continue;
    const int64_t n = std::min<int64_t>(budget, int64_t(a->req->prompt.size()) - a->prefilled);
    parts.push_back({a, a->prefilled, n, a->prefilled + n == int64_t(a->req->prompt.size()), false});
    budget -= n;
  }
  return parts;
}

// Queues the step's forward. Every row with nothing to apply to its logits (no penalties, bias,
// logprobs): the backend may pick the ids where the logits are (a GPU: greedy, or drawn there) without
// waiting for them; otherwise the [rows, vocab] logits come to the host (into logits_) and the
// requests' samplers draw. from_last_pick: every part is a decode whose token is the id the previous
// queued step picks for the same row.
Scheduler::Launched Scheduler::launch(std::vector<Part> parts, bool from_last_pick) {
  Launched l;
  l.parts = std::move(parts);
  BatchInfo b;
  size_t max_blocks = 0;
  for (auto& p : l.parts) max_blocks = std::max(max_blocks, p.a->kv.blocks.size());
  b.max_blocks = int32_t(max_blocks);
  b.block_tables.assign(l.parts.size() * max_blocks, -1);
  for (size_t s = 0; s < l.parts.size(); ++s) {
    const Part& p = l.parts[s];
    std::copy(p.a->kv.blocks.begin(), p.a->kv.blocks.end(), b.block_tables.begin() + int64_t(s * max_blocks));
    const int64_t first_logit_row = p.n - p.logit_rows();
    for (int64_t i = 0; i < p.n; ++i) {
      const int64_t pos = p.start + i;
      if (i >= first_logit_row) b.logit_rows.push_back(int32_t(b.tokens.size()));
      b.tokens.push_back(from_last_pick ? token_from_last_pick(int64_t(s)) : p.decode ? p.a->next : p.a->req->prompt[size_t(pos)]);
      b.pos.push_back(int32_t(pos));
      b.seq.push_back(int32_t(s));
      b.decode_rows.push_back(p.decode ? 1 : 0);
    }
    b.ctx_len.push_back(int32_t(p.start + p.n));
  }
  for (size_t s = 0; s < l.parts.size() && b.long_rope.empty(); ++s)
    if (l.parts[s].a->kv.long_rope)
      for (auto& p : l.parts) b.long_rope.push_back(p.a->kv.long_rope ? 1 : 0);
  const int64_t R = l.rows = int64_t(b.logit_rows.size());
  // Rows with nothing to apply to their logits (no penalties, bias, JSON mask, logprobs) are drawn
  // where the logits are: greedy, or sampled with (the request's seed, the drawn token's position).
  bool device_pick = R > 0 && R <= model_.logit_capacity() && (model_.backend().device() != Device::CPU || opt_.queue_ahead == 1);
  bool all_greedy = true;
  draws_.clear();
  for (auto& p : l.parts) {
    if (p.scores_prompt()) device_pick = false;  // every row's logits go to the host
    if (!p.wants_logits) continue;
    const SamplingParams& sp = p.a->sampler.params();
    if (p.a->req->processing.active() || p.a->req->logprobs) device_pick = false;
    all_greedy = all_greedy && !(sp.temperature > 0.0f);
    draws_.push_back({sp, uint64_t(p.start + p.n)});
  }
  try {
    ARBOR_CHECK(!from_last_pick || device_pick, "scheduler: a step queued on picked ids must pick them on the device");
    if (device_pick) {
      model_.forward(b, nullptr);
      Backend& be = model_.backend();
      l.picked = all_greedy ? be.argmax_rows_start(model_.device_logits(R)) : be.sample_rows_start(model_.device_logits(R), draws_);
      if (!l.picked) {
        logits_.resize(size_t(R) * size_t(model_.config().vocab_size));
        be.read_logits(model_.device_logits(R), logits_.data());
      }
    } else {
      logits_.resize(size_t(R) * size_t(model_.config().vocab_size));
      model_.forward(b, logits_.data());
    }
    steps_ += 1;
  } catch (const std::exception& e) {
    fail_step(l, e.what());
  }
  return l;
}

// A step whose forward or pick threw: its requests end with the error.
void Scheduler::fail_step(Launched& l, const char* what) {
  log_info("scheduler: forward failed: {}", what);
  l.failed = true;
  for (auto& p : l.parts)
    if (!p.a->done) retire(*p.a, FinishReason::Error, fmt::format("internal error in the forward pass: {}", what));
}

// Whether the step after `l` can be queued before l's ids reach the host: l picks its ids on the
// device and is all decode, none of its requests can end by length with l's token (a stop id may still
// end one: that request's queued token is then discarded, its KV row written past the request's end),
// and no other request is running or could be admitted now (it would wait a step for its prefill).
bool Scheduler::can_queue_successor(const Launched& l) {
  const bool on = opt_.queue_ahead == 1 || (opt_.queue_ahead == -1 && model_.backend().device() != Device::CPU);
  if (!on || !l.picked || l.failed) return false;
  for (auto& p : l.parts) {
    const Active& a = *p.a;
    if (!p.decode || a.done || a.req->cancelled()) return false;
    if (int64_t(a.generated.size()) + 1 >= a.req->max_tokens || a.kv.length + 1 >= a.limit) return false;
  }
  int64_t live = 0;
  for (auto& a : running_) live += !a->done;
  if (live != int64_t(l.parts.size())) return false;
  std::lock_guard<std::mutex> lk(mu_);
  return !stopping_ && (waiting_.empty() || int64_t(running_.size()) >= opt_.max_batch);
}

// The step's tokens: sampled (or picked) per row, pushed to their requests, which end at a stop id,
// at max_tokens, or when the cache holds all the tokens they may.
void Scheduler::finish(Launched& l) {
  if (l.failed) return;
  const int64_t V = model_.config().vocab_size;
  if (l.picked) {
    picked_ids_.resize(size_t(l.rows));
    try {
      model_.backend().wait_pick(picked_ids_.data());
    } catch (const std::exception& e) {
      fail_step(l, e.what());
      return;
    }
  }
  size_t row = 0;
  for (auto& p : l.parts) {
    Active& a = *p.a;
    if (a.done) {  // retired while the step ran (a stop id in the step before, a cancel): nothing to keep
      row += size_t(p.logit_rows());
      continue;
    }
    if (p.scores_prompt()) {  // row i predicts prompt token start + i + 1; the last row of the last chunk samples
      const Request& r = *a.req;
      const int64_t scored = p.wants_logits ? p.n - 1 : p.n;
      for (int64_t i = 0; i < scored; ++i) {
        TokenEvent ev;
        ev.id = r.prompt[size_t(p.start + i + 1)];
        compute_logprobs(logits_.data() + row++ * size_t(V), V, ev.id, r.prompt_logprobs, ev.logprob, ev.top);
        a.prompt_scores.push_back(std::move(ev));
      }
      if (p.wants_logits) a.req->set_prompt_scores(std::move(a.prompt_scores));
    }
    if (p.decode) {
      a.kv.length += 1;
    } else {
      a.prefilled += p.n;
      a.kv.length = a.prefilled;
    }
    // The step computed these positions' KV: full blocks among them can now serve other requests.
    if (opt_.prefix_cache) a.kv.publish(pool_, a.req->prompt, a.generated);
    if (!p.wants_logits) continue;
    Request& r = *a.req;
    TokenEvent ev;
    if (l.picked) {
      ev.id = picked_ids_[row++];
    } else {
      const float* lr = logits_.data() + row++ * size_t(V);
      const float* sample_row = lr;
      if (r.processing.active()) {
        scratch_.assign(lr, lr + V);
        apply_logit_processing(r.processing, r.prompt, a.generated, scratch_.data(), V);
        if (r.processing.json && r.processing.json->mask(scratch_.data(), V) == 0) {
          retire(a, FinishReason::Error, "response_format: no token of the vocabulary can continue the JSON");
          continue;
        }
        sample_row = scratch_.data();
      }
      ev.id = a.sampler.sample(sample_row, V);
      if (r.processing.json && !r.processing.json->advance(ev.id)) {  // cannot happen after mask(); checked anyway
        retire(a, FinishReason::Error, fmt::format("response_format: sampled token {} does not continue the JSON", ev.id));
        continue;
      }
      if (r.logprobs) compute_logprobs(lr, V, ev.id, r.top_logprobs, ev.logprob, ev.top);
    }
    a.generated.push_back(ev.id);
    a.next = ev.id;
    generated_tokens_ += 1;
    // A JSON response ends with its value (the mask allows EOS only then, and only whitespace may follow).
    const bool stop = std::find(r.stop_ids.begin(), r.stop_ids.end(), ev.id) != r.stop_ids.end() ||
                      (r.processing.json && r.processing.json->complete());
    r.push(std::move(ev));
    // As generate(): the token is reported, then the request ends at a stop id, at max_tokens, or when the
    // cache holds all the tokens it may (the last sampled token is never fed).
    if (stop) retire(a, FinishReason::Stop);
    else if (int64_t(a.generated.size()) >= r.max_tokens || a.kv.length >= a.limit) retire(a, FinishReason::Length);
  }
}

}  // namespace arbor
