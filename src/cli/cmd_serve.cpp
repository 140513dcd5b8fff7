// `arbor serve` (also a bare `arbor`): load a model and serve the OpenAI- and Anthropic-compatible HTTP API.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/build_info.h"
#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/generation_config.h"
#include "model/config.h"
#include "server/routes.h"
#include "server/server.h"

namespace arbor::cli {
namespace {

namespace fs = std::filesystem;

// KV blocks when --kv-blocks is not given: room for max_batch full-context sequences, within --kv-memory-gb.
int64_t default_kv_blocks(const Args& a, int64_t max_batch, bool cuda) {
  std::string cfg_path = a.get_or("config", "");
  if (cfg_path.empty()) cfg_path = (fs::path(a.get_or("model", ".")) / "config.json").string();
  ModelConfig c = load_model_config(cfg_path);
  const int64_t block = 16;
  int64_t ctx = a.get_int("ctx-size", 0);
  if (ctx <= 0) ctx = std::min<int64_t>(c.max_position, 4096);
  const int64_t per_seq = (ctx + block - 1) / block;
  // The codec's real bytes per token (--kv-cache; plain rows are bf16 on CUDA, f32 on the CPU).
  KVLayout kv;
  kv.n_layers = c.n_layers, kv.n_kv_heads = c.n_kv_heads, kv.head_dim = c.head_dim;
  const std::string spec = a.get_or("kv-cache", "bf16");
  if (spec != "bf16") kv.codecs = resolve_kv_cache_spec(spec, c.n_layers, c.head_dim);
  const int64_t bytes_per_block = kv.bytes_per_token(cuda ? DType::BF16 : DType::F32) * block;
  const double budget = a.get_double("kv-memory-gb", 4.0) * 1e9;
  int64_t by_budget = int64_t(budget / double(std::max<int64_t>(bytes_per_block, 1)));
  return std::max(per_seq + 1, std::min(max_batch * per_seq + 1, by_budget));
}

// --allowed-origins: "*" or origins as browsers send them (scheme://host[:port], no path), comma-separated;
// a trailing slash is dropped. Empty: no CORS headers at all.
std::vector<std::string> parse_origins(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string o = list.substr(pos, end - pos);
    o.erase(0, o.find_first_not_of(" \t"));
    o.erase(o.find_last_not_of(" \t") + 1);
    if (!o.empty() && o.back() == '/') o.pop_back();
    pos = end + 1;
    if (o.empty()) continue;
    const size_t scheme = o.find("://");
    if (o != "*" && (scheme == std::string::npos || (o.compare(0, scheme, "http") != 0 && o.compare(0, scheme, "https") != 0) ||
                     o.find('/', scheme + 3) != std::string::npos || scheme + 3 == o.size()))
      fail("arguments: --allowed-origins: '{}' is not * or an origin such as http://localhost:3000", o);
    out.push_back(o);
  }
  return out;
}

// End-of-sequence ids: config.json and generation_config.json (engine/generation_config), plus the
// tokenizer's eos token.
std::vector<int32_t> eos_ids(const ModelConfig& c, const Tokenizer& tok, const std::string& model_dir) {
  std::vector<int32_t> ids = read_generation_defaults(model_dir, c).eos_ids;
  if (auto e = tok.eos_id()) ids.push_back(*e);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

int cmd_serve(const std::vector<std::string>& args_in) {
  // Signals go to one waiting thread (blocked everywhere else, inherited by every thread made below).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto vf = model_value_flags();
  vf.insert({"host", "port", "max-batch", "max-queue", "temperature", "top-p", "top-k", "min-p", "max-tokens", "thinking",
             "chat-template", "api-key", "kv-memory-gb", "tokenizer", "served-model-name", "max-body-mb", "max-step-tokens", "allowed-origins",
             "header-timeout", "body-timeout", "max-connections", "max-client-connections"});
  auto bf = model_bool_flags();
  bf.insert({"no-prefix-cache", "no-request-log"});
  Args a(args_in, vf, bf);
  const int64_t max_batch = a.get_int("max-batch", 8);
  const int64_t max_queue = a.get_int("max-queue", 64);
  const int64_t port = a.get_int("port", 8080);
  const int64_t step_tokens = a.get_int("max-step-tokens", 256);
  if (max_batch < 1 || max_batch > 1024) fail("arguments: --max-batch must be in 1..1024, got {}", max_batch);
  if (max_queue < 0) fail("arguments: --max-queue must be >= 0, got {}", max_queue);
  if (port < 0 || port > 65535) fail("arguments: --port must be in 0..65535, got {}", port);
  if (step_tokens < max_batch) fail("arguments: --max-step-tokens ({}) must be at least --max-batch ({})", step_tokens, max_batch);
  std::string thinking = a.get_or("thinking", "");
  if (thinking != "" && thinking != "on" && thinking != "off") fail("arguments: --thinking must be 'on' or 'off', got '{}'", thinking);

  std::vector<std::string> args = args_in;
  // No --model (and no --config): the default model (see default_model_dir); a repo id: its snapshot in
  // the Hugging Face cache. Named explicitly from here on (a later --model wins).
  std::string repo_id;
  std::string model_dir = resolve_model_dir(a.get_or("model", ""), &repo_id);
  if (model_dir.empty() && !a.has("config")) model_dir = default_model_dir();
  if (model_dir != a.get_or("model", "")) {
    args.push_back("--model");
    args.push_back(model_dir);
  }
  Args ma(args, vf, bf);
  if (!a.has("kv-blocks")) {
    args.push_back("--kv-blocks");
    args.push_back(std::to_string(default_kv_blocks(ma, max_batch, a.get_or("device", "cpu") == "cuda")));
  }
  Args la(args, vf, bf);

  const std::string tok_dir = a.get_or("tokenizer", model_dir);
  if (tok_dir.empty()) fail("arguments: --tokenizer DIR is required when there is no --model directory");
  Tokenizer tok = Tokenizer::from_file(tok_dir);

  server::ServerContext ctx;
  if (a.has("chat-template")) {
    ctx.chat_template = chat_template_from_args(a, tok_dir);
  } else {
    try {
      ctx.chat_template = ChatTemplate::from_model_dir(tok_dir);
    } catch (const std::exception& e) {
      log_info("serve: no chat template ({}); /v1/chat/completions and /v1/messages will answer 400", e.what());
    }
  }
  if (ctx.chat_template) ctx.chat_format = server::ChatFormat::detect(ctx.chat_template->source());

  LoadedModel lm = load_model_from_args(la, step_tokens);
  Model& m = *lm.model;
  if (int64_t(tok.vocab_size()) > m.config().vocab_size)
    fail("serve: the tokenizer has {} ids but the model's vocabulary is {}", tok.vocab_size(), m.config().vocab_size);
  BlockPool pool(lm.backend->kv_layout().n_blocks, lm.backend->kv_layout().block_size);
  const bool prefix_cache = !a.has("no-prefix-cache");
  Scheduler sched(m, pool, {max_batch, max_queue, prefix_cache});

  ctx.scheduler = &sched;
  ctx.tok = &tok;
  ctx.model_id = a.get_or("served-model-name", !repo_id.empty()   ? repo_id
                                                : model_dir.empty() ? "arbor"
                                                                    : fs::path(model_dir).lexically_normal().filename().string());
  if (ctx.model_id.empty()) ctx.model_id = fs::path(model_dir).lexically_normal().parent_path().filename().string();
  ctx.ctx_size = m.ctx_size();
  ctx.vocab_size = m.config().vocab_size;
  ctx.kv_capacity_tokens = pool.n_blocks() * pool.block_size();
  ctx.kv_bytes_per_token = lm.backend->kv_layout().bytes_per_token(lm.backend->kv_dtype());
  ctx.eos_ids = eos_ids(m.config(), tok, model_dir);
  ctx.thinking = thinking;
  ctx.api_key = a.get_or("api-key", "");
  ctx.version = build_commit();
  ctx.allowed_origins = parse_origins(a.get_or("allowed-origins", "*"));
  ctx.log_requests = !a.has("no-request-log");
  ctx.created = server::unix_now();
  // Defaults: built-in < generation_config.json < explicit flags.
  fs::path gc = fs::path(model_dir) / "generation_config.json";
  if (!model_dir.empty() && fs::exists(gc)) {
    json g = read_json_file(gc.string());
    auto num = [&](const char* k, auto& dst) {
      if (auto it = g.find(k); it != g.end() && it->is_number()) dst = it->get<std::decay_t<decltype(dst)>>();
    };
    num("temperature", ctx.defaults.temperature);
    num("top_p", ctx.defaults.top_p);
    num("top_k", ctx.defaults.top_k);
    num("min_p", ctx.defaults.min_p);
    num("repetition_penalty", ctx.defaults.repetition_penalty);
    if (g.value("do_sample", true) == false) ctx.defaults.temperature = 0.0f;
  }
  ctx.defaults.temperature = float(a.get_double("temperature", ctx.defaults.temperature));
  ctx.defaults.top_p = float(a.get_double("top-p", ctx.defaults.top_p));
  ctx.defaults.top_k = a.get_int("top-k", ctx.defaults.top_k);
  ctx.defaults.min_p = float(a.get_double("min-p", ctx.defaults.min_p));
  ctx.defaults.max_tokens = a.get_int("max-tokens", -1);

  http::ServerOptions ho;
  ho.host = a.get_or("host", "127.0.0.1");
  ho.port = int(port);
  ho.max_body_bytes = size_t(a.get_double("max-body-mb", 8.0) * 1024 * 1024);
  // Every request the scheduler can hold (running and queued) plus room for /health, /metrics and errors.
  ho.max_active_requests = int(max_batch + max_queue + 64);
  auto seconds_flag = [&](const char* name, double def) {
    const double v = a.get_double(name, def);
    if (!(v >= 0.05 && v <= 3600)) fail("arguments: --{} must be between 0.05 and 3600 seconds, got {}", name, v);
    return int(v * 1000);
  };
  ho.header_timeout_ms = seconds_flag("header-timeout", 10);
  ho.body_timeout_ms = seconds_flag("body-timeout", 30);
  // One client may use the whole capacity (a load test from another host); the total leaves room beyond it.
  ho.max_connections = int(a.get_int("max-connections", std::max(1024, 2 * ho.max_active_requests)));
  ho.max_connections_per_client = int(a.get_int("max-client-connections", ho.max_active_requests));
  if (ho.max_connections < 1 || ho.max_connections > 1000000) fail("arguments: --max-connections must be in 1..1000000, got {}", ho.max_connections);
  if (ho.max_connections_per_client < 1) fail("arguments: --max-client-connections must be at least 1, got {}", ho.max_connections_per_client);
  server::ApiServer api(ctx, ho);
  api.listen();
  ctx.ready.store(true);
  log_info("serve: arbor {} ({})", build_commit(), build_config());
  log_info("serve: {} ({}) on http://{}:{}/v1 — ctx {}, max batch {}, queue {}, {} KV blocks of {} tokens, prefix cache {}, tools {}, reasoning {}",
           ctx.model_id, m.config().summary(), ho.host, api.port(), ctx.ctx_size, max_batch, max_queue, pool.n_blocks(),
           pool.block_size(), prefix_cache ? "on" : "off", ctx.chat_format.tool_format_name(), ctx.chat_format.reasoning ? "<think>" : "none");
  log_info("serve: KV cache {}: {} bytes per token, capacity {} tokens ({:.2f} GB)", lm.backend->kv_layout().codec_summary(lm.backend->kv_dtype()),
           ctx.kv_bytes_per_token, ctx.kv_capacity_tokens, double(ctx.kv_bytes_per_token) * double(ctx.kv_capacity_tokens) * 1e-9);
  std::fflush(stdout);

  std::thread sig_thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig == 0) return;
    log_info("serve: {} received; no new connections, cancelling what is in flight", sig == SIGINT ? "SIGINT" : "SIGTERM");
    api.stop();
    sched.shutdown();  // in-flight requests end (finish reason cancelled) so their handlers return
  });
  api.run();
  sched.shutdown();
  // If run() ended without a signal (it does not today), wake the signal thread so it can be joined.
  if (sig_thread.joinable()) {
    pthread_kill(sig_thread.native_handle(), SIGTERM);
    sig_thread.join();
  }
  log_info("serve: stopped");
  return 0;
}

ARBOR_VERB("serve", "serve the OpenAI/Anthropic HTTP API (--model DIR [--host 127.0.0.1 --port 8080 --max-batch 8 --no-prefix-cache])",
           "[--model DIR] [flags]   (also a bare `arbor`)",
           ARBOR_MODEL_FLAGS_HELP
           "  --host ADDR           address to listen on (default 127.0.0.1)\n"
           "  --port N              port to listen on (default 8080; 0 picks a free one, logged at start)\n"
           "  --api-key KEY         require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route\n"
           "                        (the API, /tokenize, /detokenize, /metrics) except /health, /version and\n"
           "                        the chat page at / (which asks for the key)\n"
           "  --served-model-name NAME\n"
           "                        the model id in /v1/models and in replies (default: the model directory's name)\n"
           "  --tokenizer DIR       where tokenizer.json and tokenizer_config.json are (default: --model)\n"
           "  --chat-template FILE  a Jinja chat template to use instead of the model's, or the name of a\n"
           "                        built-in one: chatml\n"
           "  --thinking on|off     pass enable_thinking to the chat template (default: the template's own)\n"
           "  --max-batch N         sequences decoded together (1..1024, default 8)\n"
           "  --max-queue N         requests that may wait for a place beyond those; more get 429 (default 64)\n"
           "  --max-step-tokens N   tokens one forward step may take, prompt chunks and decode rows together\n"
           "                        (default 256, at least --max-batch)\n"
           "  --kv-memory-gb G      memory for the KV cache when --kv-blocks is not given (default 4)\n"
           "  --no-prefix-cache     do not reuse the KV blocks of earlier requests' shared prompt prefixes\n"
           "  --temperature T       default sampling for requests that do not set it; these four start from\n"
           "                        the model's generation_config.json\n"
           "  --top-p P             likewise\n"
           "  --top-k K             likewise\n"
           "  --min-p P             likewise\n"
           "  --max-tokens N        default completion length for requests without one (default: what the\n"
           "                        context leaves)\n"
           "  --max-body-mb M       largest request body accepted (default 8); headers: at most 64 KiB; JSON\n"
           "                        nested at most 128 levels deep (deeper: 400)\n"
           "  --header-timeout S    a request's headers must arrive within S seconds of its first byte, else\n"
           "                        408 (default 10)\n"
           "  --body-timeout S      its body within S seconds of the headers, else 408 (default 30)\n"
           "                        (a connection with no request closes after 5 s)\n"
           "  --max-connections N   open connections, idle and half-read ones included (default 1024, or\n"
           "                        twice the requests below if more); they cost no thread until a whole\n"
           "                        request has arrived. At the cap a new one replaces the stalest idle or\n"
           "                        unfinished one. Requests answered at once: max batch + max queue + 64\n"
           "  --max-client-connections N\n"
           "                        open connections from one address (default: max batch + max queue + 64;\n"
           "                        more get 429); loopback clients, such as a reverse proxy on this host,\n"
           "                        are not limited\n"
           "  --allowed-origins L   browser origins answered with CORS headers, comma-separated: * (any,\n"
           "                        the default), e.g. http://localhost:3000, or '' for none\n"
           "  --no-request-log      no line per request on stderr (method, path, status, time, tokens, speed)\n",
           cmd_serve);

}  // namespace
}  // namespace arbor::cli
