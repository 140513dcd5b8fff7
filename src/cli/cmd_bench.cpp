// `arbor bench`: prefill and decode speed of a model (usually --dummy-weights with a real config),
// with the hardware ceiling measured in the same run (CPU: read bandwidth) and decode's fraction of it.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "backend/cpu/bandwidth.h"
#include "backend/cpu/cpu_backend.h"
#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "engine/generate.h"

namespace arbor::cli {
namespace {


int cmd_bench(const std::vector<std::string>& args) {
  auto vf = model_value_flags();
  vf.insert({"prompt-tokens", "decode-tokens", "chunk", "reps"});
  Args a(args, vf, model_bool_flags());
  const int64_t prompt = a.get_int("prompt-tokens", 128);
  const int64_t decode = a.get_int("decode-tokens", 32);
  const int64_t chunk = a.get_int("chunk", 128);
  const int reps = int(a.get_int("reps", 3));
  if (prompt < 1 || decode < 1 || chunk < 1 || reps < 1) fail("arguments: --prompt-tokens, --decode-tokens, --chunk, --reps must be >= 1");

  LoadedModel lm = load_model_from_args(a, chunk);
  Model& m = *lm.model;
  const ModelConfig& c = m.config();
  if (prompt + decode > m.ctx_size()) fail("bench: {} + {} tokens exceed the context {} (--ctx-size)", prompt, decode, m.ctx_size());
  std::printf("model      %s\n", c.summary().c_str());
  std::printf("backend    %s\n", lm.backend->name().c_str());
  std::printf("weights    %.3f GB (%s), loaded in %.2f s\n", double(m.weight_bytes()) * 1e-9, m.weight_dtypes().c_str(), lm.load_seconds);

  // The ceiling, measured now (the machine is shared: a figure from another run means little).
  double bw = 0;
  if (auto* cpu = dynamic_cast<CpuBackend*>(lm.backend.get())) bw = cpu::measure_read_bandwidth(cpu->pool());
  if (bw > 0) std::printf("read bw    %.2f GB/s (measured now, %d threads)\n", bw * 1e-9, dynamic_cast<CpuBackend*>(lm.backend.get())->pool().size());

  BlockPool pool(lm.backend->kv_layout().n_blocks, lm.backend->kv_layout().block_size);
  std::vector<int32_t> ids(static_cast<size_t>(prompt));
  for (int64_t i = 0; i < prompt; ++i) ids[size_t(i)] = int32_t((i * 7919 + 13) % c.vocab_size);
  double best_prefill = 1e30, best_decode = 1e30;
  for (int r = 0; r < reps; ++r) {
    GenerateRequest req;
    req.prompt = ids;
    req.max_tokens = decode + 1;  // decode steps = decode
    GenerateResult res = generate(m, pool, req);
    best_prefill = std::min(best_prefill, res.prefill_seconds);
    if (res.decode_steps > 0) best_decode = std::min(best_decode, res.decode_seconds / double(res.decode_steps));
  }
  // Bytes one decode step must read: every weight except the embedding table (one row is gathered;
  // when tied, the table is read in full as the LM head), plus the KV cache of the context.
  const uint64_t embed_bytes = uint64_t(c.vocab_size * c.hidden_size) * (m.weight_bytes() / std::max<uint64_t>(1, m.parameter_count()));
  uint64_t step_bytes = m.weight_bytes() - (c.tie_word_embeddings ? 0 : embed_bytes);
  const int64_t mid_ctx = prompt + decode / 2;
  const uint64_t kv_bytes = uint64_t(lm.backend->kv_layout().bytes_per_token(lm.backend->kv_dtype()) * mid_ctx);
  double decode_tps = 1.0 / best_decode;
  std::printf("prefill    %lld tokens: %.1f tok/s (chunks of %lld)\n", (long long)prompt, double(prompt) / best_prefill, (long long)chunk);
  std::printf("decode     %.2f tok/s at context %lld; %.1f MB/step (weights %.1f + KV %.1f)\n", decode_tps, (long long)mid_ctx,
              double(step_bytes + kv_bytes) * 1e-6, double(step_bytes) * 1e-6, double(kv_bytes) * 1e-6);
  if (bw > 0) {
    double achieved = double(step_bytes + kv_bytes) * decode_tps;
    std::printf("decode bw  %.2f GB/s = %.1f%% of measured read bandwidth (roofline %.2f tok/s)\n", achieved * 1e-9,
                100.0 * achieved / bw, bw / double(step_bytes + kv_bytes));
  }
  return 0;
}

ARBOR_VERB("bench", "prefill/decode speed vs the measured hardware limit (--config FILE --dummy-weights)", cmd_bench);

}  // namespace
}  // namespace arbor::cli
