// Scheduler: continuous batching over one Model. One engine thread owns the model; requests join and
// leave between steps. Each step carries one decode token per running request, then fills the rest of
// the step's token budget (Model::max_step_tokens) with prefill chunks of admitted requests, oldest first.
// Admission reserves a request's KV blocks for its whole length (prompt + max_tokens, clamped to the
// context) up front, so a running request never waits for memory and never needs preemption.
// Prefix cache (on unless SchedulerOptions::prefix_cache is false): an admitted request first takes the
// longest run of cached KV blocks matching its prompt's full blocks (kv/block_pool.h), always leaving at
// least the last prompt token to compute, and prefill starts after them; every full block a step completes
// (prompt or fed generated tokens) is published, so later requests sharing the prefix skip its prefill.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/request.h"
#include "kv/block_pool.h"
#include "model/model.h"

namespace arbor {

struct SchedulerOptions {
  int64_t max_batch = 8;   // requests decoding together at most
  int64_t max_queue = 64;  // requests waiting for a slot or KV blocks at most; beyond that submit says QueueFull
  bool prefix_cache = true;  // reuse computed KV blocks across requests that share a token prefix
  // Queue a decode step before the previous step's ids reach the host (its tokens the ids the backend
  // picked): -1 where the backend runs asynchronously (a GPU), 1 always (the CPU too: tests run the
  // logic there; each token is then handed out a step later), 0 never.
  int queue_ahead = -1;
};

enum class Admission : uint8_t {
  Accepted,
  NeverFits,     // needs more KV blocks than the pool has, or the prompt alone fills the context (message says which)
  BadRequest,    // empty prompt, token outside the vocabulary (message says which)
  QueueFull,     // saturated: retry later
  ShuttingDown,
};

struct AdmissionResult {
  Admission status = Admission::Accepted;
  std::string message;  // for everything but Accepted: what and the numbers
  bool context_exceeded = false;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0;  // used = held by running requests
  int64_t kv_blocks_cached = 0;  // prefix-cache blocks nobody holds (reclaimable, counted free for admission)
  int64_t cached_tokens = 0;     // prompt tokens served from the prefix cache, over all admitted requests
  int64_t requests_admitted = 0, requests_finished = 0, requests_cancelled = 0, requests_rejected = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;
  int64_t steps_queued_ahead = 0;  // steps queued before the previous step's ids reached the host
  double busy_seconds = 0;  // time spent inside forward + sampling
};

class Scheduler {
 public:
  // `model` and `pool` must outlive the scheduler; the pool must match the model's KV layout.
  Scheduler(Model& model, BlockPool& pool, SchedulerOptions opt);
  ~Scheduler();  // shutdown()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the request (its max_tokens is clamped to the context). Thread-safe. On anything but Accepted
  // the request is not queued and nothing will be pushed to it.
  AdmissionResult submit(const std::shared_ptr<Request>& r);
  // Cancels everything queued or running (finish reason Cancelled) and stops the engine thread.
  void shutdown();

  SchedulerStats stats() const;
  int64_t ctx_size() const { return model_.ctx_size(); }
  int64_t vocab_size() const { return model_.config().vocab_size; }
  const SchedulerOptions& options() const { return opt_; }

 private:
  struct Active {
    std::shared_ptr<Request> req;
    SequenceKV kv;
    Sampler sampler;
    int64_t limit = 0;      // tokens the sequence may hold (prompt + max_tokens, clamped to the context)
    int64_t prefilled = 0;  // prompt tokens already in the cache
    std::vector<int32_t> generated;
    int32_t next = -1;      // sampled, not yet fed (-1 while prefilling)
    bool done = false;      // retired; removed from running_ at the end of the pass
    std::vector<TokenEvent> prompt_scores = {};  // with prompt_logprobs: prompt tokens scored so far
  };
  // One request's share of a step: positions [start, start + n).
  struct Part {
    std::shared_ptr<Active> a;  // shared: a queued step may outlive the request's place in running_
    int64_t start, n;
    bool wants_logits;
    bool decode;  // one generated token fed (else a prompt chunk)
    // A prompt chunk of a request that scores its prompt: every row's logits are computed.
    bool scores_prompt() const { return !decode && a->req->prompt_logprobs >= 0; }
    // Logit rows the step computes for this part (its last ones): all when scoring, else the last when wants_logits.
    int64_t logit_rows() const { return scores_prompt() ? n : wants_logits ? 1 : 0; }
  };
  // A step whose forward is queued or done. picked: its ids are being picked on the device (a greedy
  // argmax or a draw per row), else its logits are in logits_ (the forward waited for them) or it failed.
  struct Launched {
    std::vector<Part> parts;
    int64_t rows = 0;
    bool picked = false;
    bool failed = false;
  };

  void loop();
  void admit_locked();
  void step();
  std::vector<Part> plan_parts();
  Launched launch(std::vector<Part> parts, bool from_last_pick);
  bool can_queue_successor(const Launched& l);
  void finish(Launched& l);
  void fail_step(Launched& l, const char* what);
  void retire(Active& a, FinishReason r, const std::string& error = {});
  void update_kv_stats();  // kv_used_ and kv_cached_ from the pool (engine thread)

  Model& model_;
  BlockPool& pool_;
  SchedulerOptions opt_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> waiting_;  // guarded by mu_
  bool stopping_ = false;                         // guarded by mu_
  std::vector<std::shared_ptr<Active>> running_;  // engine thread only
  // A step queued and not yet finished (engine thread only): while the device runs it, the next
  // step of the same decoding requests is queued, its tokens the ids this one picks on the device
  // (Backend::argmax_rows_start), so the device never waits for the host between steps. A request
  // that this step ends (a stop id) has its queued next step's token discarded.
  std::optional<Launched> inflight_;
  std::atomic<int64_t> n_running_{0}, kv_used_{0}, kv_cached_{0}, cached_tokens_{0};
  std::atomic<int64_t> admitted_{0}, finished_{0}, cancelled_{0}, rejected_{0}, prompt_tokens_{0}, generated_tokens_{0}, steps_{0},
      steps_ahead_{0};
  std::atomic<int64_t> busy_us_{0};

  std::vector<float> logits_;   // [rows, vocab]
  std::vector<int32_t> picked_ids_;  // ids picked on the backend
  std::vector<RowSampling> draws_;   // a step's draws for the backend (reused across steps)
  std::vector<float> scratch_;  // [vocab] one processed row
  std::mutex join_mu_;
  std::thread thread_;
};

}  // namespace arbor
