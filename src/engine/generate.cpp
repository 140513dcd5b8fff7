// Single-sequence generation over the flattened-batch forward.
#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace arbor {

BatchInfo make_batch(const std::vector<std::vector<int32_t>>& tokens, const std::vector<int64_t>& start,
                     const std::vector<const SequenceKV*>& kv, bool all_logits) {
  BatchInfo b;
  size_t max_blocks = 0;
  for (auto* s : kv) max_blocks = std::max(max_blocks, s->blocks.size());
  b.max_blocks = int32_t(max_blocks);
  b.block_tables.assign(kv.size() * max_blocks, -1);
  for (size_t s = 0; s < tokens.size(); ++s) {
    std::copy(kv[s]->blocks.begin(), kv[s]->blocks.end(), b.block_tables.begin() + int64_t(s * max_blocks));
    for (size_t i = 0; i < tokens[s].size(); ++i) {
      if (all_logits || i + 1 == tokens[s].size()) b.logit_rows.push_back(int32_t(b.tokens.size()));
      b.tokens.push_back(tokens[s][i]);
      b.pos.push_back(int32_t(start[s] + int64_t(i)));
      b.seq.push_back(int32_t(s));
    }
    b.ctx_len.push_back(int32_t(start[s] + int64_t(tokens[s].size())));
  }
  if (std::any_of(kv.begin(), kv.end(), [](const SequenceKV* s) { return s->long_rope; }))
    for (auto* s : kv) b.long_rope.push_back(s->long_rope ? 1 : 0);
  return b;
}

GenerateResult generate(Model& model, BlockPool& pool, const GenerateRequest& req, const std::function<bool(int32_t)>& on_token) {
  const ModelConfig& c = model.config();
  ARBOR_CHECK(!req.prompt.empty(), "generate: the prompt is empty");
  for (size_t i = 0; i < req.prompt.size(); ++i)
    ARBOR_CHECK(req.prompt[i] >= 0 && req.prompt[i] < c.vocab_size, "generate: prompt token {} at index {} is outside the vocabulary ({})",
                req.prompt[i], i, c.vocab_size);
  const int64_t total = int64_t(req.prompt.size()) + std::max<int64_t>(req.max_tokens, 0);
  ARBOR_CHECK(int64_t(req.prompt.size()) < model.ctx_size(), "generate: prompt of {} tokens does not fit the context of {}",
              req.prompt.size(), model.ctx_size());
  const int64_t limit = std::min(total, model.ctx_size());

  GenerateResult res;
  SequenceKV seq;
  struct Release {
    BlockPool& p;
    SequenceKV& s;
    ~Release() { s.release(p); }
  } release{pool, seq};
  seq.long_rope = model.long_rope_for(int64_t(req.prompt.size()));
  ARBOR_CHECK(seq.reserve(pool, limit), "generate: {} tokens need {} KV blocks, the pool has {} free", limit,
              pool.blocks_for(limit), pool.free_blocks());
  Sampler sampler(req.sampling);
  std::vector<float> logits;
  const int64_t V = c.vocab_size;
  using clock = std::chrono::steady_clock;

  // Prefill in chunks of at most max_step_tokens.
  auto t0 = clock::now();
  int32_t next = -1;
  for (int64_t p0 = 0; p0 < int64_t(req.prompt.size()); p0 += model.max_step_tokens()) {
    int64_t n = std::min<int64_t>(model.max_step_tokens(), int64_t(req.prompt.size()) - p0);
    std::vector<int32_t> chunk(req.prompt.begin() + p0, req.prompt.begin() + p0 + n);
    BatchInfo b = make_batch({chunk}, {p0}, {&seq}, req.keep_logits);
    b.set_row_kind(false);
    logits.resize(b.logit_rows.size() * size_t(V));
    model.forward(b, logits.data());
    if (req.keep_logits) res.logits.insert(res.logits.end(), logits.begin(), logits.end());
    seq.length = p0 + n;
    if (p0 + n == int64_t(req.prompt.size())) next = sampler.sample(logits.data() + (b.logit_rows.size() - 1) * size_t(V), V);
  }
  res.prefill_tokens = int64_t(req.prompt.size());
  res.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  const bool device_pick = !req.keep_logits && model.backend().device() != Device::CPU;
  Backend& be = model.backend();
  auto t1 = clock::now();
  // Without --logits-out the backend picks the id where the logits are (GPU argmax or draw), as the
  // server does, and the next step is queued (its token the id still on the device) before this
  // step's id reaches the host, so the GPU never waits for the host. `queued`: a step is queued whose
  // id follows `next`. A draw is a function of (seed, the drawn token's position).
  auto queue_step = [&](int32_t token, int64_t pos) {  // the forward of `token` at pos, then its pick
    BatchInfo b = make_batch({{token}}, {pos}, {&seq}, false);
    b.set_row_kind(true);
    model.forward(b, nullptr);
    if (!(req.sampling.temperature > 0.0f)) return be.argmax_rows_start(model.device_logits(1));
    return be.sample_rows_start(model.device_logits(1), {RowSampling{req.sampling, uint64_t(pos + 1)}});
  };
  bool queued = false;
  struct DropPicks {  // a pick left queued (a stop, an error) is dropped with the sequence
    Backend& be;
    ~DropPicks() {
      try {
        be.drop_picks();
      } catch (...) {  // already unwinding from the error that left it
      }
    }
  } drop_picks{be};
  while (req.max_tokens > 0) {
    res.tokens.push_back(next);
    bool go_on = !on_token || on_token(next);
    bool stop = std::find(req.stop_ids.begin(), req.stop_ids.end(), next) != req.stop_ids.end();
    if (!go_on || stop || int64_t(res.tokens.size()) >= req.max_tokens || seq.length >= limit) break;
    if (device_pick && !queued) {
      queued = queue_step(next, seq.length);
      if (!queued) {  // no pick on this backend: the logits come to the host
        logits.resize(size_t(V));
        be.read_logits(model.device_logits(1), logits.data());
      }
    }
    if (queued) {
      // The step after this one, unless this one's id ends the sequence by length.
      const bool more = int64_t(res.tokens.size()) + 1 < req.max_tokens && seq.length + 1 < limit;
      if (more) queue_step(token_from_last_pick(0), seq.length + 1);
      be.wait_pick(&next);
      seq.length += 1;
      res.decode_steps += 1;
      queued = more;
      continue;
    }
    if (!device_pick) {
      BatchInfo b = make_batch({{next}}, {seq.length}, {&seq}, false);
      b.set_row_kind(true);
      logits.resize(size_t(V));
      model.forward(b, logits.data());
    }
    seq.length += 1;
    res.decode_steps += 1;
    if (req.keep_logits) res.logits.insert(res.logits.end(), logits.begin(), logits.end());
    next = sampler.sample(logits.data(), V);
  }
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

}  // namespace arbor
