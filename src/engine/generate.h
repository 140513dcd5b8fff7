// generate(): one sequence through a Model: chunked prefill, then decode until max_tokens or a stop
// id. The scheduler (continuous batching) will drive Model::forward the same way for many sequences.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/sampler.h"
#include "kv/block_pool.h"
#include "model/model.h"

namespace arbor {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
  bool keep_logits = false;       // record logits for every token fed (prompt + generated but the last)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids
  std::vector<float> logits;    // [rows, vocab] when keep_logits
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t prefill_tokens = 0, decode_steps = 0;
};

// on_token(id) is called as each token is sampled; return false to stop early.
GenerateResult generate(Model& model, BlockPool& pool, const GenerateRequest& req,
                        const std::function<bool(int32_t)>& on_token = nullptr);

// Builds the BatchInfo for a set of sequences: tokens[i] fed at positions start[i].., each
// sequence's logits wanted for its last token (or all tokens when all_logits).
BatchInfo make_batch(const std::vector<std::vector<int32_t>>& tokens, const std::vector<int64_t>& start,
                     const std::vector<const SequenceKV*>& kv, bool all_logits);

}  // namespace arbor
