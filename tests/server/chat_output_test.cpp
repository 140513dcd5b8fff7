// ChatOutputParser: reasoning and tool-call splitting per family, fed in every possible chunking.
#include <gtest/gtest.h>

#include "core/json.h"
#include "server/chat_output.h"

namespace arbor::server {
namespace {

struct Collected {
  std::string content, reasoning;
  std::vector<ParsedToolCall> calls;
};

// Feeds `text` in pieces of `step` bytes (1 = byte by byte, which splits every marker).
Collected run(const std::string& text, size_t step, ChatFormat f, bool in_reasoning, bool tools) {
  ChatOutputParser p(f, in_reasoning, tools);
  Collected c;
  auto take = [&](const OutputDelta& d) {
    c.content += d.content;
    c.reasoning += d.reasoning;
    c.calls.insert(c.calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  for (size_t i = 0; i < text.size(); i += step) take(p.push(text.substr(i, step)));
  take(p.finish());
  EXPECT_EQ(p.saw_tool_calls(), !c.calls.empty());
  return c;
}

ChatFormat hermes() { return ChatFormat::detect("{{ '<tool_call>' }} <think> enable_thinking"); }
ChatFormat llama3() { return ChatFormat::detect("<|python_tag|> ipython"); }

TEST(ChatOutput, DetectsFamilies) {
  EXPECT_EQ(hermes().tools, ToolFormat::Hermes);
  EXPECT_TRUE(hermes().reasoning);
  EXPECT_TRUE(hermes().thinking_switch);
  EXPECT_EQ(llama3().tools, ToolFormat::Llama3Json);
  EXPECT_FALSE(llama3().reasoning);
  EXPECT_EQ(ChatFormat::detect("{{ messages }}").tools, ToolFormat::None);
}

TEST(ChatOutput, ReasoningThenContentAnyChunking) {
  const std::string out = "<think>\nLet me think: 2+2.\n</think>\n\nThe answer is 4 < 5.";
  for (size_t step : {1, 2, 3, 7, 100}) {
    Collected c = run(out, step, hermes(), false, false);
    EXPECT_EQ(c.reasoning, "\nLet me think: 2+2.\n") << step;
    EXPECT_EQ(c.content, "The answer is 4 < 5.") << step;
  }
  // The prompt opened the block: output starts inside it.
  Collected c = run("hmm</think>ok", 1, hermes(), true, false);
  EXPECT_EQ(c.reasoning, "hmm");
  EXPECT_EQ(c.content, "ok");
  // Unterminated thinking stays reasoning.
  EXPECT_EQ(run("<think>still going", 2, hermes(), false, false).reasoning, "still going");
  // Without the family's markers, text that looks like them is content.
  EXPECT_EQ(run("<think>x</think>y", 1, llama3(), false, false).content, "<think>x</think>y");
}

TEST(ChatOutput, HermesToolCalls) {
  const std::string out =
      "I will check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  for (size_t step : {1, 4, 1000}) {
    Collected c = run(out, step, hermes(), false, true);
    ASSERT_EQ(c.calls.size(), 2u) << step;
    EXPECT_EQ(c.content, "I will check.");
    EXPECT_EQ(c.calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(c.calls[0].arguments), json({{"city", "Paris"}}));
    EXPECT_EQ(c.calls[1].name, "get_time");
    EXPECT_EQ(c.calls[1].arguments, "{}");
    EXPECT_EQ(c.calls[0].id.rfind("call_", 0), 0u);
    EXPECT_NE(c.calls[0].id, c.calls[1].id);
  }
  // Thinking, then a call, and a call closed by the end of generation.
  Collected c = run("<think>need tool</think><tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}", 3, hermes(), false, true);
  EXPECT_EQ(c.reasoning, "need tool");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(json::parse(c.calls[0].arguments), json({{"a", {1, 2}}}));
  // Markup that does not parse stays content; without tools offered it is never parsed.
  Collected bad = run("x<tool_call>{not json}</tool_call>y", 1, hermes(), false, true);
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "x<tool_call>{not json}</tool_call>y");
  const std::string good = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  EXPECT_EQ(run(good, 1, hermes(), false, false).content, good);
}

TEST(ChatOutput, Llama3JsonCalls) {
  for (size_t step : {1, 5}) {
    Collected c = run("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", step, llama3(), false, true);
    ASSERT_EQ(c.calls.size(), 1u);
    EXPECT_EQ(c.calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(c.calls[0].arguments), json({{"city", "Oslo"}}));
    EXPECT_EQ(c.content, "");
  }
  Collected two = run("<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}", 2, llama3(), false, true);
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[1].name, "b");
  // Ordinary text streams as content; JSON that is not a call stays content.
  EXPECT_EQ(run("Hello {there}", 1, llama3(), false, true).content, "Hello {there}");
  Collected notcall = run("{\"foo\": 1}", 1, llama3(), false, true);
  EXPECT_TRUE(notcall.calls.empty());
  EXPECT_EQ(notcall.content, "{\"foo\": 1}");
}

TEST(ChatOutput, ContentStreamsBeforeTheEnd) {
  ChatOutputParser p(hermes(), false, true);
  OutputDelta d = p.push("Hello wor");
  EXPECT_EQ(d.content, "Hello wor");
  d = p.push("ld <tool_");  // a possible marker is held back
  EXPECT_EQ(d.content, "ld ");
  d = p.push("x");  // ruled out
  EXPECT_EQ(d.content, "<tool_x");
}

TEST(ChatOutput, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace arbor::server
