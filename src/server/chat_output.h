// ChatOutputParser: splits a model's streamed chat output into content, reasoning (thinking) text and
// tool calls, per model family: <think>…</think> reasoning, Hermes/Qwen <tool_call>{json}</tool_call>,
// Llama 3.x JSON calls ({"name": …, "parameters": …}, optionally after <|python_tag|>), and Mistral
// [TOOL_CALLS] (v3: a JSON list of calls; v11+: name[ARGS]{json}). Text before the markup streams live; a
// possible marker prefix is held back; markup that does not parse stays content. Tool calls stream too: a
// call begins (id + name) once its name is known and its arguments have started, then its arguments text
// follows piece by piece, exactly as the model wrote it, each piece checked to keep the text a valid JSON
// prefix. A call whose JSON turns malformed after it began is closed into valid JSON and logged; before
// that point the whole markup falls back to content.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/json_prefix.h"

namespace arbor::server {

enum class ToolFormat { None, Hermes, Llama3Json, Mistral };

struct ChatFormat {
  ToolFormat tools = ToolFormat::None;
  bool reasoning = false;  // the family marks thinking with <think>…</think>
  bool thinking_switch = false;  // the template reads enable_thinking
  // Guesses the family from a chat template's source text.
  static ChatFormat detect(const std::string& template_source);
  const char* tool_format_name() const;
  // The family's tool markers are special tokens that detokenizing with skip_special_tokens would drop
  // (Mistral's [TOOL_CALLS] and [ARGS]): decode with special tokens kept when tools are parsed.
  bool markers_are_special() const { return tools == ToolFormat::Mistral; }
};

struct ParsedToolCall {
  std::string id;         // "call_…"
  std::string name;
  std::string arguments;  // a JSON object as text: the concatenation of the call's argument pieces
};

// One piece of parsed output, in the order the model produced it.
struct OutputPiece {
  enum class Kind { Reasoning, Content, ToolCall };
  Kind kind = Kind::Content;
  std::string text;      // reasoning/content text, or the next piece of a call's arguments
  int call = -1;         // ToolCall: the call's index in this output (0, 1, …)
  bool begin = false;    // ToolCall: the call's first piece; id and name are set, text is ""
  std::string id, name;  // ToolCall with begin
};

struct OutputDelta {
  std::vector<OutputPiece> pieces;
  bool empty() const { return pieces.empty(); }
  std::string content() const;    // all content pieces joined
  std::string reasoning() const;  // all reasoning pieces joined
};

class ChatOutputParser {
 public:
  // starts_in_reasoning: the prompt already opened a <think> block (the output begins inside it).
  // parse_tools: tools were offered with the request (markup is parsed only then).
  ChatOutputParser(ChatFormat f, bool starts_in_reasoning, bool parse_tools);
  ~ChatOutputParser();
  ChatOutputParser(ChatOutputParser&&) noexcept;
  ChatOutputParser& operator=(ChatOutputParser&&) noexcept;
  OutputDelta push(std::string_view text);
  OutputDelta finish();  // end of generation: flushes held text, closes open blocks and calls
  bool saw_tool_calls() const { return !calls_.empty(); }
  // Every call begun so far, arguments as sent so far (complete after finish()).
  const std::vector<ParsedToolCall>& calls() const { return calls_; }

 private:
  enum class Mode { Start, Reasoning, Content, Body, MistralHead };
  struct Body;
  void process(OutputDelta& d, bool final);
  size_t feed_body(OutputDelta& d, std::string_view text);
  void body_events(OutputDelta& d, char c);
  void body_fail(OutputDelta& d, const char* why);
  void body_end_call(OutputDelta& d);
  void body_stream_args(OutputDelta& d);
  void body_finish(OutputDelta& d, bool closed);
  void begin_call(OutputDelta& d, const std::string& name);
  void add_args(OutputDelta& d, std::string_view text);
  static void add(OutputDelta& d, OutputPiece::Kind k, std::string_view text);

  ChatFormat f_;
  bool parse_tools_;
  Mode mode_;
  std::string pending_;
  bool strip_leading_ = false;    // drop whitespace before the next content (after </think>, </tool_call>)
  bool content_started_ = false;  // non-whitespace content was emitted (JSON calls must start the message)
  std::vector<ParsedToolCall> calls_;
  std::unique_ptr<Body> body_;  // the tool-call markup being parsed (Mode::Body)
};

// Whether the rendered prompt leaves the model inside an open <think> block.
bool prompt_opens_reasoning(const std::string& prompt);

// "call_" + 24 random alphanumerics.
std::string new_call_id();


}  // namespace arbor::server
