// ChatTemplate loading rules (named list form, chat_template.jinja precedence, AddedToken special tokens)
// and the engine's non-deterministic global strftime_now, which golden files cannot cover.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>

#include "text/jinja/chat_template.h"

using ojson = nlohmann::ordered_json;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/arbor_jinja_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::remove((path + "/tokenizer_config.json").c_str());
    std::remove((path + "/chat_template.jinja").c_str());
    rmdir(path.c_str());
  }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path + "/" + name) << text; }
};

const ojson kMessages = ojson::parse(R"([{"role": "user", "content": "hi"}])");

}  // namespace

TEST(ChatTemplate, NamedListFormPicksDefaultAndOthersByName) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"chat_template": [
      {"name": "default", "template": "D{{ messages[0].content }}{{ bos_token }}"},
      {"name": "tool_use", "template": "T{{ tools|length }}{{ eos_token }}"}],
    "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>"})");
  auto def = arbor::ChatTemplate::from_model_dir(d.path);
  EXPECT_EQ(def.render(kMessages, nullptr, true, ojson::object()), "Dhi<s>");
  EXPECT_EQ(def.available(), (std::vector<std::string>{"default", "tool_use"}));
  auto tool = arbor::ChatTemplate::from_model_dir(d.path, "tool_use");
  EXPECT_EQ(tool.render(kMessages, ojson::parse("[1, 2]"), true, ojson::object()), "T2</s>");
  EXPECT_THROW(arbor::ChatTemplate::from_model_dir(d.path, "rag"), arbor::Error);
}

TEST(ChatTemplate, JinjaFileWinsAndKwargsOverrideSpecialTokens) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"chat_template": "from config", "bos_token": "<s>"})");
  d.write("chat_template.jinja", "{{ bos_token }}|{{ add_generation_prompt }}|{{ enable_thinking }}|{{ tools is none }}|{{ documents is none }}\n");
  auto ct = arbor::ChatTemplate::from_model_dir(d.path);
  EXPECT_EQ(ct.render(kMessages, nullptr, false, ojson::parse(R"({"enable_thinking": false})")), "<s>|False|False|True|True");
  EXPECT_EQ(ct.render(kMessages, nullptr, true, ojson::parse(R"({"bos_token": "B"})")), "B|True||True|True");
}

TEST(ChatTemplate, MissingTemplateAndBadInputsAreErrors) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_THROW(arbor::ChatTemplate::from_model_dir(d.path), arbor::Error);
  auto ct = arbor::ChatTemplate::from_source("{{ messages|length }}");
  EXPECT_EQ(ct.render(kMessages, nullptr, true, nullptr), "1");
  EXPECT_THROW(ct.render(ojson::object(), nullptr, true, nullptr), arbor::Error);
  EXPECT_THROW(arbor::ChatTemplate::from_source("{% if %}"), arbor::Error);
}

TEST(ChatTemplate, KeyOrderOfTheCallersJsonIsWhatTojsonPrints) {
  auto ct = arbor::ChatTemplate::from_source("{{ tools[0]|tojson }}");
  EXPECT_EQ(ct.render(kMessages, ojson::parse(R"([{"z": 1, "a": 2}])"), true, nullptr), R"({"z": 1, "a": 2})");
  // arbor::json (std::map) sorts keys before the template sees them.
  EXPECT_EQ(ct.render(arbor::json(kMessages), arbor::json::parse(R"([{"z": 1, "a": 2}])"), true, arbor::json()), R"({"a": 2, "z": 1})");
}

TEST(Jinja, StrftimeNowFormatsTheCurrentLocalTime) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char want[64];
  std::strftime(want, sizeof want, "%Y-%m", &tm);
  auto t = arbor::jinja::Template::parse("{{ strftime_now('%Y-%m') }}|{{ strftime_now('%d %B %Y')|length > 8 }}");
  EXPECT_EQ(t.render(ojson::object()), std::string(want) + "|True");
}

TEST(Jinja, ATemplateRendersManyTimesIndependently) {
  auto t = arbor::jinja::Template::parse("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}");
  EXPECT_EQ(t.render(ojson::parse(R"({"xs": [1, 2, 3]})")), "6");
  EXPECT_EQ(t.render(ojson::parse(R"({"xs": [10]})")), "10");
  EXPECT_EQ(t.render(ojson::parse(R"({"xs": []})")), "0");
}
