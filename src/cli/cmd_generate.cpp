// `arbor generate`: ids in and ids out (--prompt-ids, for exact comparisons), or text in and text
// streamed out (--prompt "text", with --chat to wrap it in the model's chat template).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "engine/generate.h"
#include "engine/generation_config.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/stream_decoder.h"
#include "text/tokenizer/tokenizer.h"

namespace arbor::cli {
namespace {

int cmd_generate(const std::vector<std::string>& args) {
  auto vf = model_value_flags();
  vf.insert({"prompt-ids", "prompt", "system", "max-tokens", "temperature", "top-k", "top-p", "min-p", "seed", "logits-out", "chat-template"});
  auto bf = model_bool_flags();
  bf.insert({"chat", "ignore-eos"});
  Args a(args, vf, bf);
  auto ids = a.get("prompt-ids");
  auto text = a.get("prompt");
  if (!ids && !text && !a.positional().empty()) text = a.positional()[0];
  if (!ids == !text) fail("arguments: give either --prompt-ids 1,2,3 or --prompt \"text\"");
  if (a.has("chat") && !text) fail("arguments: --chat needs --prompt \"text\"");
  if (a.has("chat-template") && !a.has("chat")) fail("arguments: --chat-template applies with --chat only");

  LoadedModel lm = load_model_from_args(a);
  Model& m = *lm.model;
  const std::string model_dir = load_options_from_args(a).model_dir;
  GenerationDefaults defaults = read_generation_defaults(model_dir, m.config());

  GenerateRequest req;
  std::unique_ptr<Tokenizer> tok;
  if (ids) {
    req.prompt = parse_id_list(*ids, "prompt-ids");
  } else {
    if (model_dir.empty()) fail("arguments: --prompt needs a model directory with tokenizer.json (--model DIR)");
    tok = std::make_unique<Tokenizer>(Tokenizer::from_file(model_dir));
    if (a.has("chat")) {
      ChatTemplate tmpl = chat_template_from_args(a, model_dir);
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (auto sys = a.get("system")) messages.push_back({{"role", "system"}, {"content", *sys}});
      messages.push_back({{"role", "user"}, {"content", *text}});
      // As transformers' apply_chat_template: the template writes its own special tokens.
      req.prompt = tok->encode(tmpl.render(messages, nullptr, true, nlohmann::ordered_json::object()), false);
    } else {
      req.prompt = tok->encode(*text, true);
    }
    // Text mode samples as the model's generation_config.json says, and stops at end of sequence.
    req.sampling = defaults.sampling;
    if (!a.has("ignore-eos")) req.stop_ids = defaults.eos_ids;
    if (auto e = tok->eos_id(); e && !a.has("ignore-eos")) req.stop_ids.push_back(*e);
  }
  req.max_tokens = a.get_int("max-tokens", ids ? 16 : 256);
  if (req.max_tokens < 0) fail("arguments: --max-tokens must be >= 0, got {}", req.max_tokens);
  req.sampling.temperature = float(a.get_double("temperature", req.sampling.temperature));
  req.sampling.top_k = a.get_int("top-k", req.sampling.top_k);
  req.sampling.top_p = float(a.get_double("top-p", req.sampling.top_p));
  req.sampling.min_p = float(a.get_double("min-p", req.sampling.min_p));
  req.sampling.seed = uint64_t(a.get_int("seed", 0));
  if (req.sampling.temperature < 0) fail("arguments: --temperature must be >= 0");
  if (!(req.sampling.top_p > 0 && req.sampling.top_p <= 1)) fail("arguments: --top-p must be in (0, 1]");
  auto logits_out = a.get("logits-out");
  req.keep_logits = logits_out.has_value();

  BlockPool pool(lm.backend->kv_layout().n_blocks, lm.backend->kv_layout().block_size);
  GenerateResult r;
  if (tok) {
    StreamDecoder stream(*tok, true);
    r = generate(m, pool, req, [&](int32_t id) {
      bool stop = std::find(req.stop_ids.begin(), req.stop_ids.end(), id) != req.stop_ids.end();
      if (!stop) std::fputs(stream.push(id).c_str(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputs(stream.flush().c_str(), stdout);
    std::fputs("\n", stdout);
    std::fprintf(stderr, "prefill: %lld tokens, %.1f tok/s; decode: %lld tokens, %.1f tok/s\n", (long long)r.prefill_tokens,
                 r.prefill_seconds > 0 ? double(r.prefill_tokens) / r.prefill_seconds : 0.0, (long long)r.decode_steps,
                 r.decode_seconds > 0 ? double(r.decode_steps) / r.decode_seconds : 0.0);
  } else {
    r = generate(m, pool, req);
    std::printf("%s\n", fmt::format("{}", fmt::join(r.tokens, ",")).c_str());
    std::printf("prefill: %lld tokens, %.1f tok/s; decode: %lld tokens, %.1f tok/s\n", (long long)r.prefill_tokens,
                r.prefill_seconds > 0 ? double(r.prefill_tokens) / r.prefill_seconds : 0.0, (long long)r.decode_steps,
                r.decode_seconds > 0 ? double(r.decode_steps) / r.decode_seconds : 0.0);
  }
  if (logits_out) {
    FILE* f = std::fopen(logits_out->c_str(), "wb");
    if (!f) fail("generate: cannot write {}", *logits_out);
    size_t n = std::fwrite(r.logits.data(), sizeof(float), r.logits.size(), f);
    std::fclose(f);
    if (n != r.logits.size()) fail("generate: short write to {}", *logits_out);
  }
  return 0;
}

ARBOR_VERB("generate", "generate from --prompt-ids 1,2,3 (ids out) or --prompt \"text\" [--chat] (text out, streamed)",
           "[--model DIR] (--prompt-ids 1,2,3 | --prompt \"text\" | \"text\") [flags]",
           ARBOR_MODEL_FLAGS_HELP
           "  --prompt-ids IDS      token ids in (comma-separated), ids out; greedy and no stop unless asked\n"
           "  --prompt TEXT         text in, text streamed out, sampled as generation_config.json says\n"
           "  --chat                wrap --prompt in the model's chat template as one user turn\n"
           "  --system TEXT         with --chat: a system message before it\n"
           "  --chat-template FILE  with --chat: a Jinja chat template instead of the model's, or chatml\n"
           "  --max-tokens N        tokens to generate (default 16 with --prompt-ids, 256 with --prompt)\n"
           "  --ignore-eos          with --prompt: do not stop at end of sequence\n"
           "  --temperature T       0 is greedy\n"
           "  --top-k K             keep the K most likely tokens (0: all)\n"
           "  --top-p P             keep the most likely tokens up to mass P (1: all)\n"
           "  --min-p P             drop tokens below P times the most likely one's probability (0: none)\n"
           "  --seed N              seed of the draws (default 0)\n"
           "  --logits-out FILE     write every fed token's logits, raw little-endian f32, one row each\n",
           cmd_generate);

}  // namespace
}  // namespace arbor::cli
