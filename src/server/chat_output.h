// ChatOutputParser: splits a model's streamed chat output into content, reasoning (thinking) text and
// tool calls, per model family: <think>…</think> reasoning, Hermes/Qwen <tool_call>{json}</tool_call>,
// and Llama 3.x JSON calls ({"name": …, "parameters": …}, optionally after <|python_tag|>). Text before
// the markup streams live; a possible marker prefix is held back; markup that does not parse stays content.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace arbor::server {

enum class ToolFormat { None, Hermes, Llama3Json };

struct ChatFormat {
  ToolFormat tools = ToolFormat::None;
  bool reasoning = false;  // the family marks thinking with <think>…</think>
  bool thinking_switch = false;  // the template reads enable_thinking
  // Guesses the family from a chat template's source text.
  static ChatFormat detect(const std::string& template_source);
  const char* tool_format_name() const;
};

struct ParsedToolCall {
  std::string id;         // "call_…"
  std::string name;
  std::string arguments;  // a JSON object as text
};

struct OutputDelta {
  std::string content, reasoning;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  // starts_in_reasoning: the prompt already opened a <think> block (the output begins inside it).
  // parse_tools: tools were offered with the request (markup is parsed only then).
  ChatOutputParser(ChatFormat f, bool starts_in_reasoning, bool parse_tools);
  OutputDelta push(std::string_view text);
  OutputDelta finish();  // end of generation: flushes held text, closes open blocks
  bool saw_tool_calls() const { return n_calls_ > 0; }

 private:
  enum class Mode { Start, Reasoning, Content, InTool, JsonCandidate };
  void process(OutputDelta& d, bool final);
  bool parse_call(const std::string& body, bool llama, std::vector<ParsedToolCall>& out);

  ChatFormat f_;
  bool parse_tools_;
  Mode mode_;
  std::string pending_;
  bool strip_leading_ = false;    // drop whitespace before the next content (after </think>, </tool_call>)
  bool content_started_ = false;  // non-whitespace content was emitted (JSON calls must start the message)
  int n_calls_ = 0;
};

// Whether the rendered prompt leaves the model inside an open <think> block.
bool prompt_opens_reasoning(const std::string& prompt);

// "call_" + 24 random alphanumerics.
std::string new_call_id();

}  // namespace arbor::server
