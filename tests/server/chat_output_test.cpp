// ChatOutputParser: reasoning and tool-call splitting per family, fed in every possible chunking.
#include <gtest/gtest.h>

#include "core/json.h"
#include "server/chat_output.h"

namespace arbor::server {
namespace {

struct Collected {
  std::string content, reasoning;
  std::vector<ParsedToolCall> calls;       // from the parser, complete after finish()
  std::vector<std::string> streamed_args;  // per call: its argument pieces joined, as a client would
  std::vector<int> arg_pieces;             // per call: how many argument pieces arrived
  std::vector<OutputPiece> pieces;         // everything, in order
};

// Feeds `text` in pieces of `step` bytes (1 = byte by byte, which splits every marker).
Collected run(const std::string& text, size_t step, ChatFormat f, bool in_reasoning, bool tools) {
  ChatOutputParser p(f, in_reasoning, tools);
  Collected c;
  auto take = [&](const OutputDelta& d) {
    c.content += d.content();
    c.reasoning += d.reasoning();
    for (const auto& piece : d.pieces) {
      c.pieces.push_back(piece);
      if (piece.kind != OutputPiece::Kind::ToolCall) continue;
      if (piece.begin) {
        EXPECT_EQ(piece.call, int(c.streamed_args.size()));
        EXPECT_TRUE(piece.text.empty());
        c.streamed_args.emplace_back();
        c.arg_pieces.push_back(0);
      } else {
        EXPECT_LT(piece.call, int(c.streamed_args.size()));  // never before its beginning
        c.streamed_args[size_t(piece.call)] += piece.text;
        c.arg_pieces[size_t(piece.call)] += 1;
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += step) take(p.push(text.substr(i, step)));
  take(p.finish());
  c.calls = p.calls();
  EXPECT_EQ(p.saw_tool_calls(), !c.calls.empty());
  EXPECT_EQ(c.calls.size(), c.streamed_args.size());
  for (size_t i = 0; i < c.calls.size() && i < c.streamed_args.size(); ++i) {
    EXPECT_EQ(c.calls[i].arguments, c.streamed_args[i]) << "the pieces must join to the final arguments";
    json args = json::parse(c.calls[i].arguments, nullptr, false);
    EXPECT_TRUE(args.is_object()) << c.calls[i].arguments;
  }
  return c;
}

ChatFormat hermes() { return ChatFormat::detect("{{ '<tool_call>' }} <think> enable_thinking"); }
ChatFormat llama3() { return ChatFormat::detect("<|python_tag|> ipython"); }
ChatFormat mistral() { return ChatFormat::detect("{{- '[AVAILABLE_TOOLS]' }} {{- '[TOOL_CALLS]' + name + '[ARGS]' }}"); }

TEST(ChatOutput, DetectsFamilies) {
  EXPECT_EQ(hermes().tools, ToolFormat::Hermes);
  EXPECT_TRUE(hermes().reasoning);
  EXPECT_TRUE(hermes().thinking_switch);
  EXPECT_EQ(llama3().tools, ToolFormat::Llama3Json);
  EXPECT_FALSE(llama3().reasoning);
  EXPECT_EQ(ChatFormat::detect("{{ messages }}").tools, ToolFormat::None);
  EXPECT_EQ(mistral().tools, ToolFormat::Mistral);
  EXPECT_TRUE(mistral().markers_are_special());
  EXPECT_FALSE(hermes().markers_are_special());
  EXPECT_STREQ(mistral().tool_format_name(), "mistral");
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
    EXPECT_EQ(c.calls[0].arguments, "{\"city\": \"Paris\"}");  // the model's own text
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
  // Text after a complete call is content.
  Collected after = run("{\"name\": \"a\", \"parameters\": {\"x\": 1}}\n\nDone.", 1, llama3(), false, true);
  ASSERT_EQ(after.calls.size(), 1u);
  EXPECT_EQ(after.calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(after.content, "Done.");
  // A list of calls at the start.
  Collected list = run("[{\"name\": \"a\", \"parameters\": {}}, {\"name\": \"b\", \"parameters\": {\"y\": [true, null]}}]", 3, llama3(), false, true);
  ASSERT_EQ(list.calls.size(), 2u);
  EXPECT_EQ(list.calls[1].arguments, "{\"y\": [true, null]}");
}

TEST(ChatOutput, ContentStreamsBeforeTheEnd) {
  ChatOutputParser p(hermes(), false, true);
  OutputDelta d = p.push("Hello wor");
  EXPECT_EQ(d.content(), "Hello wor");
  d = p.push("ld <tool_");  // a possible marker is held back
  EXPECT_EQ(d.content(), "ld ");
  d = p.push("x");  // ruled out
  EXPECT_EQ(d.content(), "<tool_x");
}

TEST(ChatOutput, ToolCallArgumentsStreamInPieces) {
  const std::string args = "{\"city\": \"Paris\", \"days\": [1, 2.5e1, -3], \"note\": \"a \\\"q\\\" \\u00e9 \\ud83d\\ude00 \u00e9\"}";
  const std::string out = "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>";
  for (size_t step : {1, 2, 5, 1000}) {
    Collected c = run(out, step, hermes(), false, true);
    ASSERT_EQ(c.calls.size(), 1u) << step;
    EXPECT_EQ(c.content, "Checking.");
    EXPECT_EQ(c.calls[0].arguments, args);
    if (step <= 5) {
      EXPECT_GT(c.arg_pieces[0], 3) << step;
    }
    // Content first, then the call's beginning, then only argument pieces.
    size_t k = 0;
    while (k < c.pieces.size() && c.pieces[k].kind == OutputPiece::Kind::Content) ++k;
    ASSERT_LT(k, c.pieces.size());
    EXPECT_TRUE(c.pieces[k].begin);
    EXPECT_EQ(c.pieces[k].name, "get_weather");
    for (++k; k < c.pieces.size(); ++k) EXPECT_TRUE(c.pieces[k].kind == OutputPiece::Kind::ToolCall && !c.pieces[k].begin);
  }
  // The call begins as soon as the name is known and the arguments opened, before they are complete.
  ChatOutputParser p(hermes(), false, true);
  EXPECT_TRUE(p.push("<tool_call>{\"name\": \"f\", \"argum").empty());
  OutputDelta d = p.push("ents\": {\"a\": ");
  ASSERT_EQ(d.pieces.size(), 2u);
  EXPECT_TRUE(d.pieces[0].begin);
  EXPECT_EQ(d.pieces[0].name, "f");
  EXPECT_EQ(d.pieces[1].text, "{\"a\": ");
  d = p.push("12");
  ASSERT_EQ(d.pieces.size(), 1u);
  EXPECT_EQ(d.pieces[0].text, "12");
  d = p.push("}}</tool_call> after");
  EXPECT_EQ(d.pieces[0].text, "}");
  EXPECT_EQ(d.content(), "after");
  EXPECT_EQ(p.calls()[0].arguments, "{\"a\": 12}");
}

TEST(ChatOutput, ToolCallShapes) {
  // Arguments before the name go out once the name is known; arguments as an encoded string; none at all.
  Collected late = run("<tool_call>{\"arguments\": {\"k\": \"v\"}, \"name\": \"f\"}</tool_call>", 1, hermes(), false, true);
  ASSERT_EQ(late.calls.size(), 1u);
  EXPECT_EQ(late.calls[0].name, "f");
  EXPECT_EQ(late.calls[0].arguments, "{\"k\": \"v\"}");
  Collected str = run("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call>", 2, hermes(), false, true);
  ASSERT_EQ(str.calls.size(), 1u);
  EXPECT_EQ(str.calls[0].arguments, "{\"k\": 1}");
  Collected none = run("<tool_call>{\"name\": \"f\"}</tool_call>", 1, hermes(), false, true);
  ASSERT_EQ(none.calls.size(), 1u);
  EXPECT_EQ(none.calls[0].arguments, "{}");
  // A list inside one <tool_call> is parallel calls.
  Collected list = run("<tool_call>[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"z\": 0}}]</tool_call>", 1, hermes(), false, true);
  ASSERT_EQ(list.calls.size(), 2u);
  EXPECT_EQ(list.calls[1].arguments, "{\"z\": 0}");
}

TEST(ChatOutput, MalformedToolCalls) {
  // Before the call began: every kind of bad markup stays content, verbatim.
  for (const std::string bad : {"<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>", "<tool_call>{\"nam</tool_call>",
                                "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "<tool_call>[]</tool_call>",
                                "<tool_call>{\"name\": \"f\"</tool_call>", "<tool_call>{\"name\": \"f\" x}</tool_call>",
                                "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>"}) {
    for (size_t step : {1, 3, 1000}) {
      Collected c = run("a" + bad + "b", step, hermes(), false, true);
      EXPECT_TRUE(c.calls.empty()) << bad;
      EXPECT_EQ(c.content, "a" + bad + "b") << bad << " step " << step;
    }
  }
  // After the call began: it is finished with what it has, closed into valid JSON; the rest is dropped.
  struct Case {
    std::string body, args;
  } cases[] = {
      {"{\"name\": \"f\", \"arguments\": {\"a\": [1, 2", "{\"a\": [1, 2]}"},
      {"{\"name\": \"f\", \"arguments\": {\"a\": tr", "{\"a\": true}"},
      {"{\"name\": \"f\", \"arguments\": {\"a\": \"x\\", "{\"a\": \"x\\\\\"}"},
      {"{\"name\": \"f\", \"arguments\": {\"a\": 1 x}}", "{\"a\": 1 }"},
      {"{\"name\": \"f\", \"arguments\": {\"a\"", "{\"a\":null}"},
      {"{\"name\": \"f\", \"arguments\": {\"a\": -", "{\"a\": -0}"},
      {"{\"name\": \"f\", \"arguments\": {\"a\": 1, ", "{\"a\": 1, \"\":null}"},
      {"{\"name\": \"f\", \"arguments\": {\"a\": \"\\ud83d", "{\"a\": \"\\ud83d\\udc00\"}"},
  };
  for (const auto& k : cases) {
    for (size_t step : {1, 1000}) {
      Collected c = run("<tool_call>" + k.body + "</tool_call>tail", step, hermes(), false, true);
      ASSERT_EQ(c.calls.size(), 1u) << k.body;
      EXPECT_EQ(c.calls[0].arguments, k.args) << k.body;
      EXPECT_EQ(c.content, "tail") << k.body;
      // Cut off by the end of generation instead.
      Collected cut = run("<tool_call>" + k.body, step, hermes(), false, true);
      ASSERT_EQ(cut.calls.size(), 1u) << k.body;
      EXPECT_EQ(cut.calls[0].arguments, k.args) << k.body;
    }
  }
}

TEST(ChatOutput, MistralToolCalls) {
  // v3: a JSON list after [TOOL_CALLS].
  const std::string v3 = "Sure. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {}}]";
  for (size_t step : {1, 4, 1000}) {
    Collected c = run(v3, step, mistral(), false, true);
    ASSERT_EQ(c.calls.size(), 2u) << step;
    EXPECT_EQ(c.content, "Sure. ");
    EXPECT_EQ(c.calls[0].name, "get_weather");
    EXPECT_EQ(c.calls[0].arguments, "{\"city\": \"Paris\"}");
    EXPECT_EQ(c.calls[1].name, "get_time");
  }
  // v11+: name[ARGS]{json}, one [TOOL_CALLS] per call; [CALL_ID] is skipped.
  const std::string v11 = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{\"tz\": \"UTC\"}";
  for (size_t step : {1, 3, 1000}) {
    Collected c = run(v11, step, mistral(), false, true);
    ASSERT_EQ(c.calls.size(), 2u) << step;
    EXPECT_EQ(c.content, "");
    EXPECT_EQ(c.calls[0].name, "get_weather");
    EXPECT_EQ(c.calls[0].arguments, "{\"city\": \"Oslo\"}");
    EXPECT_EQ(c.calls[1].name, "get_time");
    EXPECT_EQ(c.calls[1].arguments, "{\"tz\": \"UTC\"}");
    if (step == 1) {
      EXPECT_GT(c.arg_pieces[0], 3);
    }
  }
  // Markup that does not parse stays content; without tools offered it is never parsed.
  for (const std::string bad : {"[TOOL_CALLS]not a call", "[TOOL_CALLS]f[ARGS][1, 2]", "[TOOL_CALLS][{\"x\": 1}]", "[TOOL_CALLS]"}) {
    Collected c = run(bad, 1, mistral(), false, true);
    EXPECT_TRUE(c.calls.empty()) << bad;
    EXPECT_EQ(c.content, bad);
  }
  EXPECT_EQ(run(v11, 1, mistral(), false, false).content, v11);
}

// The scanner accepts exactly the prefixes of valid JSON, and closing() completes any of them.
TEST(JsonPrefixScanner, RejectsAtTheFirstBadByte) {
  for (auto [text, bad] : std::vector<std::pair<std::string, size_t>>{
           {"{\"a\": 1 x}", 8}, {"[1 2]", 3}, {"{\"a\": 1]", 7}, {"[1}", 2}, {"{\"a\" 1}", 5}, {"[01]", 2}, {"\"a\\u12g\"", 6}}) {
    JsonPrefixScanner s;
    std::vector<JsonPrefixScanner::Event> ev;
    size_t i = 0;
    while (i < text.size() && s.step(text[i], i, ev)) ++i;
    EXPECT_EQ(i, bad) << text;
  }
}

TEST(JsonPrefixScanner, AgreesWithAFullParser) {
  const std::vector<std::string> texts = {
      "{}", "[]", "{\"a\": 1}", "[1, -2.5e-3, 0, 0.1, 1E+9, true, false, null]", "{\"a\": {\"b\": [{}, []]}, \"c\": \"\\n\\t\\\"\\/\"}",
      "\"\\ud83d\\ude00\"", "\"caf\u00e9 \u65e5\u672c \U0001F600\"", "  {\"k\" :\t[ 1 , 2 ] }  ", "-0", "12",
      // invalid
      "{,}", "[1,]", "{\"a\" 1}", "{\"a\":}", "01", "1.", "-", "1e", "tru", "nul", "\"\\x\"", "\"\\ud83d\"", "\"\\ude00\"",
      "\"\\ud83d\\u0041\"", "\"a\nb\"", "{\"a\": 1}}", "[1] [2]", "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "{'a': 1}", "[1 2]",
      "{\"a\": 1,}", "[\"a\":1]", "{\"a\"}", "nulls", "+1", ".5", "[-]", "\"abc"};
  for (const auto& t : texts) {
    JsonPrefixScanner s;
    std::vector<JsonPrefixScanner::Event> ev;
    bool ok = true;
    size_t i = 0;
    for (; i < t.size() && ok; ++i) ok = s.step(t[i], i, ev);
    // A bare top-level number ends only at the end of the text: a trailing space ends it.
    if (ok) ok = s.step(' ', t.size(), ev);
    bool valid = !json::parse(t, nullptr, false).is_discarded();
    EXPECT_EQ(ok && s.done(), valid) << t;
    // Every accepted prefix of a valid text is completed by closing() into valid JSON.
    if (valid) {
      JsonPrefixScanner q;
      std::string text;
      for (size_t k = 0; k < t.size(); ++k) {
        ASSERT_TRUE(q.step(t[k], k, ev)) << t;
        text += t[k];
        if (q.depth() == 0 && !q.done()) continue;  // inside a top-level scalar
        std::string whole = text + q.closing(0);
        EXPECT_FALSE(json::parse(whole, nullptr, false).is_discarded()) << t << " prefix " << text << " -> " << whole;
      }
    }
  }
}

TEST(ChatOutput, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace arbor::server
