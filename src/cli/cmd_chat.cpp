// `arbor chat`: an interactive chat in the terminal (line editing and history through libedit), or
// one turn per input line when stdin is not a terminal. /reset clears the conversation, /exit leaves.
#include <editline/readline.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

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

// One line of user input; nullopt at end of input.
std::optional<std::string> read_turn(bool tty) {
  if (tty) {
    char* line = readline("> ");
    if (!line) return std::nullopt;
    std::string s(line);
    std::free(line);
    if (!s.empty()) add_history(s.c_str());
    return s;
  }
  std::string s;
  if (!std::getline(std::cin, s)) return std::nullopt;
  return s;
}

int cmd_chat(const std::vector<std::string>& args) {
  auto vf = model_value_flags();
  vf.insert({"system", "max-tokens", "temperature", "top-k", "top-p", "seed", "chat-template"});
  Args a(args, vf, model_bool_flags());
  LoadedModel lm = load_model_from_args(a);
  Model& m = *lm.model;
  const std::string dir = load_options_from_args(a).model_dir;
  Tokenizer tok = Tokenizer::from_file(dir);
  ChatTemplate tmpl = chat_template_from_args(a, dir);
  GenerationDefaults defaults = read_generation_defaults(dir, m.config());
  SamplingParams sampling = defaults.sampling;
  sampling.temperature = float(a.get_double("temperature", sampling.temperature));
  sampling.top_k = a.get_int("top-k", sampling.top_k);
  sampling.top_p = float(a.get_double("top-p", sampling.top_p));
  sampling.seed = uint64_t(a.get_int("seed", 0));
  const int64_t max_tokens = a.get_int("max-tokens", 512);
  std::vector<int32_t> stops = defaults.eos_ids;
  if (auto e = tok.eos_id()) stops.push_back(*e);

  const bool tty = ::isatty(0);
  if (tty) std::fprintf(stderr, "arbor chat: %s (%s). /reset clears, /exit or Ctrl-D leaves.\n", dir.c_str(), lm.backend->name().c_str());
  BlockPool pool(lm.backend->kv_layout().n_blocks, lm.backend->kv_layout().block_size);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (auto sys = a.get("system")) messages.push_back({{"role", "system"}, {"content", *sys}});
  const size_t base = messages.size();
  uint64_t turn = 0;
  while (auto line = read_turn(tty)) {
    if (*line == "/exit" || *line == "/quit") break;
    if (*line == "/reset") {
      messages.erase(messages.begin() + int64_t(base), messages.end());
      continue;
    }
    if (line->empty()) continue;
    messages.push_back({{"role", "user"}, {"content", *line}});
    GenerateRequest req;
    req.prompt = tok.encode(tmpl.render(messages, nullptr, true, nlohmann::ordered_json::object()), false);
    // Keep the newest turns when the conversation outgrows the context.
    while (int64_t(req.prompt.size()) + 8 > m.ctx_size() && messages.size() > base + 1) {
      messages.erase(messages.begin() + int64_t(base));
      req.prompt = tok.encode(tmpl.render(messages, nullptr, true, nlohmann::ordered_json::object()), false);
    }
    req.max_tokens = std::min<int64_t>(max_tokens, m.ctx_size() - int64_t(req.prompt.size()));
    req.sampling = sampling;
    req.sampling.seed = sampling.seed + turn++;
    req.stop_ids = stops;
    StreamDecoder stream(tok, true);
    std::string reply;
    generate(m, pool, req, [&](int32_t id) {
      if (std::find(stops.begin(), stops.end(), id) != stops.end()) return false;
      std::string piece = stream.push(id);
      reply += piece;
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::string tail = stream.flush();
    reply += tail;
    std::printf("%s\n", tail.c_str());
    std::fflush(stdout);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

ARBOR_VERB("chat", "interactive chat in the terminal with the model's chat template (default model if no --model)",
           "[--model DIR] [flags]   (one turn per line when stdin is not a terminal; /reset, /exit)",
           ARBOR_MODEL_FLAGS_HELP
           "  --system TEXT         a system message to start the conversation with\n"
           "  --max-tokens N        longest reply (default 512)\n"
           "  --temperature T       0 is greedy; this and the two below default to the model's\n"
           "                        generation_config.json, else greedy and no filter\n"
           "  --top-k K             keep the K most likely tokens (0: all)\n"
           "  --top-p P             keep the most likely tokens up to mass P (1: all)\n"
           "  --seed N              seed of the draws (default 0)\n"
           "  --chat-template FILE  a Jinja chat template to use instead of the model's, or chatml\n",
           cmd_chat);

}  // namespace
}  // namespace arbor::cli
