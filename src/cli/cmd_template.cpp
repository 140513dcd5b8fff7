// `arbor template`: renders a model's chat template for a conversation and prints the prompt exactly.
#include <cstdio>

#include "cli/args.h"
#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/json.h"
#include "text/jinja/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;

ojson parse_json(const std::string& text, const std::string& what) {
  try {
    return ojson::parse(text);
  } catch (const ojson::parse_error& e) {
    arbor::fail("template: {}: {}", what, e.what());
  }
}

int cmd_template(const std::vector<std::string>& argv) {
  arbor::cli::Args args(argv, {"model", "messages", "tools", "kwargs", "template-name"}, {"no-generation-prompt"});
  auto model = args.get("model");
  if (model) model = arbor::cli::resolve_model_dir(*model);
  auto messages_path = args.get("messages");
  if (!model || !messages_path) {
    std::fprintf(stderr,
                 "usage: arbor template --model DIR --messages FILE.json [--tools FILE.json] [--kwargs JSON]\n"
                 "                      [--no-generation-prompt] [--template-name NAME]\n"
                 "DIR needs only tokenizer_config.json or chat_template.jinja. FILE.json holds a list of messages\n"
                 "(or an object with \"messages\" and optionally \"tools\").\n");
    return 2;
  }
  ojson messages = parse_json(arbor::read_text_file(*messages_path), *messages_path);
  ojson tools = nullptr;
  if (messages.is_object()) {  // an OpenAI-style request body
    if (messages.contains("tools")) tools = messages["tools"];
    if (!messages.contains("messages")) arbor::fail("template: {}: object without a \"messages\" list", *messages_path);
    messages = ojson(messages["messages"]);
  }
  if (auto tools_path = args.get("tools")) tools = parse_json(arbor::read_text_file(*tools_path), *tools_path);
  ojson kwargs = ojson::object();
  if (auto k = args.get("kwargs")) kwargs = parse_json(*k, "--kwargs");
  auto ct = arbor::ChatTemplate::from_model_dir(*model, args.get_or("template-name", "default"));
  std::string prompt = ct.render(messages, tools, !args.has("no-generation-prompt"), kwargs);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

ARBOR_VERB("template", "render a model's chat template for a conversation (--model DIR --messages FILE.json)",
           "--model DIR --messages FILE.json [flags]",
           "  --model DIR           tokenizer_config.json or chat_template.jinja is all it needs\n"
           "  --messages FILE.json  a list of messages, or a request body with \"messages\" (and \"tools\")\n"
           "  --tools FILE.json     tool definitions\n"
           "  --kwargs JSON         more template variables, e.g. '{\"enable_thinking\":false}'\n"
           "  --template-name NAME  one of several named templates (default: \"default\")\n"
           "  --no-generation-prompt\n"
           "                        leave out the assistant turn's opening\n",
           cmd_template);
