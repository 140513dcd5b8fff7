// Test driver shared by the parity and batch tests: feeds several token streams through one Model in
// mixed steps — each stream cut into prefill chunks by its own schedule, all streams' chunks in the same
// forward call — and hands every row's logits to `check(stream, position, row)`.
#pragma once
#include <algorithm>
#include <functional>
#include <vector>

#include "core/error.h"
#include "engine/generate.h"

namespace arbor::test {

// Returns the number of rows checked. schedules[s] lists stream s's chunk sizes (the last repeats).
// long_rope[s] (when given): stream s takes longrope's long regime (SequenceKV::long_rope).
inline int64_t run_mixed_batches(Model& m, BlockPool& pool, const std::vector<std::vector<int32_t>>& streams,
                                 const std::vector<std::vector<int64_t>>& schedules,
                                 const std::function<void(int, int64_t, const float*)>& check,
                                 const std::vector<bool>& long_rope = {}) {
  const size_t S = streams.size();
  const int64_t V = m.config().vocab_size;
  std::vector<SequenceKV> kv(S);
  std::vector<int64_t> done(S, 0), step(S, 0);
  for (size_t s = 0; s < S; ++s) {
    if (!kv[s].reserve(pool, int64_t(streams[s].size()))) throw Error("mixed batches: KV pool too small");
    kv[s].long_rope = s < long_rope.size() && long_rope[s];
  }
  int64_t rows_checked = 0;
  for (;;) {
    std::vector<std::vector<int32_t>> toks;
    std::vector<int64_t> start;
    std::vector<const SequenceKV*> views;
    std::vector<int> who;
    for (size_t s = 0; s < S; ++s) {
      const int64_t len = int64_t(streams[s].size());
      if (done[s] >= len) continue;
      const auto& sched = schedules[s];
      const int64_t n = std::min(sched[std::min<size_t>(size_t(step[s]), sched.size() - 1)], len - done[s]);
      toks.emplace_back(streams[s].begin() + done[s], streams[s].begin() + done[s] + n);
      start.push_back(done[s]);
      views.push_back(&kv[s]);
      who.push_back(int(s));
    }
    if (toks.empty()) break;
    BatchInfo b = make_batch(toks, start, views, true);
    std::vector<float> logits(b.logit_rows.size() * size_t(V));
    m.forward(b, logits.data());
    size_t row = 0;
    for (size_t i = 0; i < toks.size(); ++i) {
      for (size_t j = 0; j < toks[i].size(); ++j, ++row, ++rows_checked)
        check(who[i], start[i] + int64_t(j), logits.data() + row * size_t(V));
      done[size_t(who[i])] += int64_t(toks[i].size());
      step[size_t(who[i])] += 1;
    }
  }
  for (auto& s : kv) s.release(pool);
  return rows_checked;
}

}  // namespace arbor::test
