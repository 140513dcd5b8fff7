// The shipped default model (models/arbor-tiny-sotu): it loads with the ordinary loader, its
// tokenizer and chat template give the prompt ids transformers saw, and greedy generation reproduces
// transformers' float32 continuation recorded by tools/default_model (golden_greedy.json).
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "core/json.h"
#include "engine/generate.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

using namespace arbor;

namespace {

const std::string kDir = std::string(ARBOR_SOURCE_DIR) + "/models/arbor-tiny-sotu";

TEST(DefaultModel, TokenizerAndTemplateGiveTheGoldenPromptIds) {
  json g = read_json_file(kDir + "/golden_greedy.json");
  Tokenizer tok = Tokenizer::from_file(kDir);
  ChatTemplate tmpl = ChatTemplate::from_model_dir(kDir);
  for (const auto& c : g["cases"]) {
    std::vector<int32_t> want = c["prompt_ids"].get<std::vector<int32_t>>();
    std::string text;
    if (c.contains("messages")) {
      text = tmpl.render(nlohmann::ordered_json::parse(c["messages"].dump()), nullptr, true, nlohmann::ordered_json::object());
      EXPECT_EQ(text, c["prompt_text"].get<std::string>());
    } else {
      text = c["prompt"].get<std::string>();
    }
    EXPECT_EQ(tok.encode(text, c["add_special_tokens"].get<bool>()), want) << c["name"];
  }
}

TEST(DefaultModel, GreedyIdsMatchTransformers) {
  json g = read_json_file(kDir + "/golden_greedy.json");
  CpuBackend be(2, WeightPlacement::Mapped);
  LoadOptions opt;
  opt.model_dir = kDir;
  Model m(opt, be);
  EXPECT_EQ(m.config().model_type, "llama");
  EXPECT_LE(m.weight_bytes(), uint64_t(12) << 20);
  BlockPool pool(be.kv_layout().n_blocks, be.kv_layout().block_size);
  for (const auto& c : g["cases"]) {
    GenerateRequest req;
    req.prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    req.max_tokens = int64_t(c["greedy_ids"].size());
    GenerateResult r = generate(m, pool, req);
    EXPECT_EQ(r.tokens, c["greedy_ids"].get<std::vector<int32_t>>()) << c["name"];
  }
}

}  // namespace
