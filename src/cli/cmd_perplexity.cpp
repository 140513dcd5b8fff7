// `arbor perplexity`: perplexity of a text over non-overlapping windows, and the KL divergence of this run's
// distributions against a saved base run (--save-logits / --kl-base). Semantics: docs/perplexity.md.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/json.h"
#include "engine/perplexity.h"
#include "text/tokenizer/tokenizer.h"

namespace arbor::cli {
namespace {

int cmd_perplexity(const std::vector<std::string>& args) {
  auto vf = model_value_flags();
  vf.insert({"file", "ctx", "save-logits", "kl-base", "kl-top-k", "batch-tokens"});
  auto bf = model_bool_flags();
  bf.insert({"json"});
  Args a(args, vf, bf);
  if (!a.positional().empty()) fail("arguments: unexpected argument '{}' (the text goes in --file)", a.positional()[0]);
  auto file = a.get("file");
  if (!file) fail("arguments: --file TEXT is required (the text to measure)");
  const int64_t ctx = a.get_int("ctx", 512);
  if (ctx < 2) fail("arguments: --ctx must be at least 2, got {}", ctx);
  const int64_t top_k = a.get_int("kl-top-k", 256);
  if (top_k < 1 || top_k > 65536) fail("arguments: --kl-top-k must be in 1..65536, got {}", top_k);
  const std::string device = a.get_or("device", "cpu");
  const int64_t step = a.get_int("batch-tokens", device == "cuda" ? 2048 : 512);
  if (step < 1) fail("arguments: --batch-tokens must be at least 1, got {}", step);
  const bool json_out = a.has("json");

  LoadOptions opt = load_options_from_args(a);
  if (opt.model_dir.empty()) fail("arguments: perplexity needs a model directory with tokenizer.json (--model DIR)");
  const std::string text = read_text_file(*file);
  Tokenizer tok = Tokenizer::from_file(opt.model_dir);
  const std::vector<int32_t> ids = tok.encode(text, true);  // as `arbor tokenize` (special tokens added)

  // Positions: a window feeds ctx - 1 ids. KV: the windows one step carries, plus one being finished.
  if (opt.ctx_size == 0) opt.ctx_size = std::max<int64_t>(ctx - 1, 1);
  if (opt.ctx_size < ctx - 1) fail("arguments: --ctx-size {} is smaller than --ctx {} needs ({})", opt.ctx_size, ctx, ctx - 1);
  if (opt.kv_blocks == 0) opt.kv_blocks = perplexity_kv_blocks(ctx, step, opt.block_size);
  opt.max_step_tokens = step;
  LoadedModel lm;
  lm.backend = make_backend_from_args(a);
  lm.model = std::make_unique<Model>(opt, *lm.backend);
  Model& m = *lm.model;
  BlockPool pool(lm.backend->kv_layout().n_blocks, lm.backend->kv_layout().block_size);

  PerplexityOptions po;
  po.ctx = ctx;
  po.step_tokens = step;
  po.host_threads = int(a.get_int("threads", 0));
  po.top_k = int(top_k);
  po.save_logits = a.get_or("save-logits", "");
  po.kl_base = a.get_or("kl-base", "");
  po.meta = json{{"model", opt.model_dir}, {"file", *file}, {"device", device}, {"ctx", ctx}, {"backend", lm.backend->name()}}.dump();
  const bool tty = ::isatty(2);
  auto last = std::chrono::steady_clock::now();
  const auto start = last;
  po.progress = [&](int64_t done, int64_t total) {
    if (!tty) return;
    auto now = std::chrono::steady_clock::now();
    if (done < total && now - last < std::chrono::milliseconds(100)) return;
    last = now;
    const double secs = std::chrono::duration<double>(now - start).count();
    const int width = 30, fill = total ? int(width * done / total) : width;
    std::fprintf(stderr, "\rperplexity [%s%s] %3d%% %lld/%lld %.0f tok/s  ", std::string(size_t(fill), '#').c_str(),
                 std::string(size_t(width - fill), '.').c_str(), total ? int(100 * done / total) : 100, (long long)done, (long long)total,
                 secs > 0 ? double(done) / secs : 0.0);
    if (done >= total) std::fputs("\n", stderr);
    std::fflush(stderr);
  };
  PerplexityResult r = run_perplexity(m, pool, ids, po);
  const double tps = r.seconds > 0 ? double(r.ppl.tokens) / r.seconds : 0.0;

  if (json_out) {
    json o = {{"perplexity", r.ppl.perplexity},
              {"perplexity_stderr", r.ppl.perplexity_stderr},
              {"tokens", r.ppl.tokens},
              {"nll_sum", r.ppl.nll_sum},
              {"mean_nll", r.ppl.mean_nll},
              {"ids", r.n_ids},
              {"ids_hash", fmt::format("{:016x}", r.ids_hash)},
              {"windows", r.windows},
              {"ctx", ctx},
              {"seconds", r.seconds},
              {"tokens_per_second", tps},
              {"model", opt.model_dir},
              {"file", *file},
              {"device", device}};
    if (r.has_kl) {
      o["kl_mean"] = r.kl_mean;
      o["kl_p99"] = r.kl_p99;
      o["kl_max"] = r.kl_max;
      o["top1_agreement"] = r.top1_agreement;
      o["ppl_base"] = r.ppl_base;
      o["ppl_delta"] = r.ppl.perplexity - r.ppl_base;
      o["base_rest_mass_mean"] = r.base_rest_mass_mean;
      o["kl_base"] = po.kl_base;
      o["kl_top_k"] = r.base_top_k;
    }
    if (!po.save_logits.empty()) o["saved_logits"] = po.save_logits;
    std::printf("%s\n", o.dump().c_str());
    return 0;
  }
  std::printf("perplexity %.4f ± %.4f over %lld predicted ids (%lld windows of up to %lld; %lld ids, hash %016llx); %.1f tok/s\n",
              r.ppl.perplexity, r.ppl.perplexity_stderr, (long long)r.ppl.tokens, (long long)r.windows, (long long)ctx, (long long)r.n_ids,
              (unsigned long long)r.ids_hash, tps);
  if (r.has_kl) {
    std::printf("KL(base || this) over the base's top-%d + rest: mean %.6g, p99 %.6g, max %.6g nats; top-1 agreement %.3f %%\n",
                r.base_top_k, r.kl_mean, r.kl_p99, r.kl_max, 100.0 * r.top1_agreement);
    std::printf("perplexity vs base: %.4f -> %.4f (%+.4f, %+.3f %%); base tail mass outside its top-K: mean %.3g\n", r.ppl_base,
                r.ppl.perplexity, r.ppl.perplexity - r.ppl_base, 100.0 * (r.ppl.perplexity / r.ppl_base - 1.0), r.base_rest_mass_mean);
  }
  if (!po.save_logits.empty()) std::printf("saved the top-%lld distributions to %s\n", (long long)top_k, po.save_logits.c_str());
  return 0;
}

ARBOR_VERB("perplexity", "perplexity of a text over windows of --ctx ids; KL against a saved base run (--save-logits, --kl-base)",
           "[--model DIR] --file TEXT [--ctx N] [flags]",
           ARBOR_MODEL_FLAGS_HELP
           "  --file TEXT           the text, tokenized whole with the tokenizer's special tokens\n"
           "  --ctx N               window size in ids (default 512); windows do not overlap, each predicts its\n"
           "                        ids after the first; a last shorter window counts if it has 2 ids or more\n"
           "  --batch-tokens N      ids per forward step, several windows batched (default 512 cpu, 2048 cuda)\n"
           "  --json                one JSON object on the last line (perplexity, tokens, ... and KL fields)\n"
           "  --save-logits FILE    store each predicted id's top-K log-probabilities and tail mass (a base run)\n"
           "  --kl-top-k K          K of --save-logits (default 256; 8 K + 8 bytes per predicted id)\n"
           "  --kl-base FILE        a --save-logits file of the same text and --ctx: report KL(base || this),\n"
           "                        its 99th percentile and maximum, top-1 agreement and the perplexity change\n",
           cmd_perplexity);

}  // namespace
}  // namespace arbor::cli
