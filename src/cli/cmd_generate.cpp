// `arbor generate`: prompt ids in, generated ids out (and optionally every fed token's logits).
#include <fmt/format.h>

#include <cstdio>

#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "engine/generate.h"

namespace arbor::cli {
namespace {

int cmd_generate(const std::vector<std::string>& args) {
  auto vf = model_value_flags();
  vf.insert({"prompt-ids", "max-tokens", "temperature", "top-k", "top-p", "min-p", "seed", "logits-out"});
  Args a(args, vf, model_bool_flags());
  auto ids = a.get("prompt-ids");
  if (!ids) fail("arguments: --prompt-ids 1,2,3 is required");
  GenerateRequest req;
  req.prompt = parse_id_list(*ids, "prompt-ids");
  req.max_tokens = a.get_int("max-tokens", 16);
  if (req.max_tokens < 0) fail("arguments: --max-tokens must be >= 0, got {}", req.max_tokens);
  req.sampling.temperature = float(a.get_double("temperature", 0.0));
  req.sampling.top_k = a.get_int("top-k", 0);
  req.sampling.top_p = float(a.get_double("top-p", 1.0));
  req.sampling.min_p = float(a.get_double("min-p", 0.0));
  req.sampling.seed = uint64_t(a.get_int("seed", 0));
  if (req.sampling.temperature < 0) fail("arguments: --temperature must be >= 0");
  if (!(req.sampling.top_p > 0 && req.sampling.top_p <= 1)) fail("arguments: --top-p must be in (0, 1]");
  auto logits_out = a.get("logits-out");
  req.keep_logits = logits_out.has_value();

  LoadedModel lm = load_model_from_args(a);
  Model& m = *lm.model;
  BlockPool pool(lm.backend->kv_layout().n_blocks, lm.backend->kv_layout().block_size);
  GenerateResult r = generate(m, pool, req);

  std::printf("%s\n", fmt::format("{}", fmt::join(r.tokens, ",")).c_str());
  std::printf("prefill: %lld tokens, %.1f tok/s; decode: %lld tokens, %.1f tok/s\n", (long long)r.prefill_tokens,
              r.prefill_seconds > 0 ? double(r.prefill_tokens) / r.prefill_seconds : 0.0, (long long)r.decode_steps,
              r.decode_seconds > 0 ? double(r.decode_steps) / r.decode_seconds : 0.0);
  if (logits_out) {
    FILE* f = std::fopen(logits_out->c_str(), "wb");
    if (!f) fail("generate: cannot write {}", *logits_out);
    size_t n = std::fwrite(r.logits.data(), sizeof(float), r.logits.size(), f);
    std::fclose(f);
    if (n != r.logits.size()) fail("generate: short write to {}", *logits_out);
  }
  return 0;
}

ARBOR_VERB("generate", "generate token ids from prompt ids (--model DIR --prompt-ids 1,2,3 --max-tokens N)", cmd_generate);

}  // namespace
}  // namespace arbor::cli
