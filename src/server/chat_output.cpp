// Streaming split of chat output into content / reasoning / tool calls (tool-call arguments are checked
// with engine/json_prefix's JsonPrefixScanner).
#include "server/chat_output.h"

#include <random>

#include "core/json.h"
#include "core/log.h"

namespace arbor::server {
namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>", kToolClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]", kMistralCallId = "[CALL_ID]";

// Length of the longest suffix of s that is a proper prefix of marker (text that may still become it).
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

bool all_space(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

std::string lstrip(std::string_view s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  return a == std::string_view::npos ? std::string() : std::string(s.substr(a));
}

// s is a (possibly empty) prefix of marker.
bool prefix_of(std::string_view s, std::string_view marker) { return s.size() <= marker.size() && marker.substr(0, s.size()) == s; }

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.' || c == ':';
}

// A complete JSON string token -> its value; nullopt when it is not one.
std::optional<std::string> json_string(std::string_view token) {
  json j = json::parse(token, nullptr, false);
  if (j.is_discarded() || !j.is_string()) return std::nullopt;
  return j.get<std::string>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// ChatFormat, helpers

std::string OutputDelta::content() const {
  std::string s;
  for (const auto& p : pieces)
    if (p.kind == OutputPiece::Kind::Content) s += p.text;
  return s;
}

std::string OutputDelta::reasoning() const {
  std::string s;
  for (const auto& p : pieces)
    if (p.kind == OutputPiece::Kind::Reasoning) s += p.text;
  return s;
}

ChatFormat ChatFormat::detect(const std::string& src) {
  ChatFormat f;
  if (src.find("<tool_call>") != std::string::npos) f.tools = ToolFormat::Hermes;
  else if (src.find("[TOOL_CALLS]") != std::string::npos) f.tools = ToolFormat::Mistral;
  else if (src.find("<|python_tag|>") != std::string::npos || src.find("ipython") != std::string::npos) f.tools = ToolFormat::Llama3Json;
  f.reasoning = src.find("<think>") != std::string::npos || src.find("</think>") != std::string::npos;
  f.thinking_switch = src.find("enable_thinking") != std::string::npos;
  return f;
}

const char* ChatFormat::tool_format_name() const {
  switch (tools) {
    case ToolFormat::Hermes: return "hermes";
    case ToolFormat::Llama3Json: return "llama3_json";
    case ToolFormat::Mistral: return "mistral";
    case ToolFormat::None: break;
  }
  return "none";
}

bool prompt_opens_reasoning(const std::string& prompt) {
  size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string::npos) return false;
  return prompt.find(kThinkClose, open) == std::string::npos && all_space(std::string_view(prompt).substr(open + kThinkOpen.size()));
}

std::string new_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kAlnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

// ---------------------------------------------------------------------------------------------------
// ChatOutputParser

// The tool-call markup being parsed: a JSON body (Hermes <tool_call> body, Llama 3 output, Mistral v3 list)
// holding call objects, or (Mistral v11) one call's arguments value whose name came before [ARGS].
struct ChatOutputParser::Body {
  enum class Kind { Calls, Args } kind = Kind::Calls;
  enum class State { Open, Failed, Broken, Ended } state = State::Open;
  bool hermes = false;     // ends at </tool_call>
  JsonPrefixScanner scan;
  std::string prefix;      // the markup before the body, given back as content when nothing parses
  std::string text;        // the body bytes accepted so far
  std::vector<JsonPrefixScanner::Event> ev;
  bool committed = false;  // a call of this body went out: no falling back to content any more
  int call_depth = -1;     // depth of call objects (0: a single object, 1: objects in a list)
  // The call object being read.
  bool in_call = false, have_name = false, call_open = false;  // call_open: begun and still streaming
  std::string key, name;
  char args_kind = 0;      // '{' or '"' once the arguments value began
  size_t args_start = std::string::npos, args_end = std::string::npos, sent = 0;
  std::string args_text;   // arguments decoded from a JSON string
  explicit Body(bool multi) : scan(multi) {}
  void reset_call() {
    in_call = have_name = call_open = false;
    key.clear(), name.clear(), args_text.clear();
    args_kind = 0, args_start = args_end = std::string::npos, sent = 0;
  }
};

ChatOutputParser::ChatOutputParser(ChatFormat f, bool starts_in_reasoning, bool parse_tools)
    : f_(f), parse_tools_(parse_tools && f.tools != ToolFormat::None), mode_(starts_in_reasoning ? Mode::Reasoning : Mode::Start) {}

ChatOutputParser::~ChatOutputParser() = default;
ChatOutputParser::ChatOutputParser(ChatOutputParser&&) noexcept = default;
ChatOutputParser& ChatOutputParser::operator=(ChatOutputParser&&) noexcept = default;

OutputDelta ChatOutputParser::push(std::string_view text) {
  OutputDelta d;
  pending_ += text;
  process(d, false);
  return d;
}

OutputDelta ChatOutputParser::finish() {
  OutputDelta d;
  process(d, true);
  return d;
}

void ChatOutputParser::add(OutputDelta& d, OutputPiece::Kind k, std::string_view text) {
  if (text.empty()) return;
  if (!d.pieces.empty() && d.pieces.back().kind == k && k != OutputPiece::Kind::ToolCall) {
    d.pieces.back().text += text;
    return;
  }
  OutputPiece p;
  p.kind = k;
  p.text = std::string(text);
  d.pieces.push_back(std::move(p));
}

void ChatOutputParser::begin_call(OutputDelta& d, const std::string& name) {
  calls_.push_back({new_call_id(), name, ""});
  OutputPiece p;
  p.kind = OutputPiece::Kind::ToolCall;
  p.call = int(calls_.size()) - 1;
  p.begin = true;
  p.id = calls_.back().id;
  p.name = name;
  d.pieces.push_back(std::move(p));
  body_->committed = true;
  body_->call_open = true;
}

void ChatOutputParser::add_args(OutputDelta& d, std::string_view text) {
  if (text.empty()) return;
  calls_.back().arguments += text;
  const int call = int(calls_.size()) - 1;
  if (!d.pieces.empty() && d.pieces.back().kind == OutputPiece::Kind::ToolCall && d.pieces.back().call == call && !d.pieces.back().begin) {
    d.pieces.back().text += text;
    return;
  }
  OutputPiece p;
  p.kind = OutputPiece::Kind::ToolCall;
  p.call = call;
  p.text = std::string(text);
  d.pieces.push_back(std::move(p));
}

// Sends what can be sent of the current call: its beginning once the name is known and the arguments
// started, then the arguments text accepted so far.
void ChatOutputParser::body_stream_args(OutputDelta& d) {
  Body& b = *body_;
  if (!b.in_call || !b.have_name || b.args_kind == 0) return;
  if (b.args_kind == '"') return;  // arguments encoded as a string go out whole, at their end
  if (!b.call_open) {
    begin_call(d, b.name);
    b.sent = b.args_start;
  }
  size_t upto = std::min(b.text.size(), b.args_end);
  if (upto > b.sent) {
    add_args(d, std::string_view(b.text).substr(b.sent, upto - b.sent));
    b.sent = upto;
  }
}

void ChatOutputParser::body_end_call(OutputDelta& d) {
  Body& b = *body_;
  if (!b.have_name) return body_fail(d, "a call object without a string 'name'");
  if (b.args_kind == '"') {
    json parsed = json::parse(b.args_text, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object()) return body_fail(d, "arguments given as a string that is not a JSON object");
    begin_call(d, b.name);
    add_args(d, b.args_text);
  } else if (b.args_kind == 0) {
    begin_call(d, b.name);
    add_args(d, "{}");
  } else {
    body_stream_args(d);
  }
  b.reset_call();
}

void ChatOutputParser::body_fail(OutputDelta& d, const char* why) {
  Body& b = *body_;
  if (!b.committed) {
    b.state = Body::State::Failed;
    return;
  }
  // A call already went out: finish the open one with what it has, closed into valid JSON, and drop the rest.
  if (b.call_open && b.args_kind == '{' && b.args_end == std::string::npos) {
    std::string tail = b.scan.closing(b.kind == Body::Kind::Args ? 0 : b.call_depth + 1);
    add_args(d, tail);
    log_info("server: tool call '{}': malformed markup ({}); its arguments were closed as {}", b.name, why, calls_.back().arguments);
  } else {
    log_info("server: tool-call markup turned malformed after a call was sent ({}); the rest of it is dropped", why);
  }
  b.state = Body::State::Broken;
  b.reset_call();
}

// Reacts to the scanner's events for the byte just accepted (already appended to b.text).
void ChatOutputParser::body_events(OutputDelta& d, char) {
  Body& b = *body_;
  for (const auto& e : b.ev) {
    if (b.state != Body::State::Open) return;
    using K = JsonPrefixScanner::Event::Kind;
    const char first = b.text[e.start];
    if (b.kind == Body::Kind::Args) {
      if (e.depth != 0) continue;
      if (e.kind == K::Begin) {
        if (first != '{') return body_fail(d, "arguments that are not a JSON object");
        b.in_call = true, b.args_kind = '{', b.args_start = e.start;
      } else if (e.kind == K::End) {
        b.args_end = e.end;
        body_stream_args(d);
        b.reset_call();
      }
      continue;
    }
    if (e.kind == K::Begin && e.depth == 0 && b.call_depth < 0) {
      if (first == '{') b.call_depth = 0;
      else if (first == '[') b.call_depth = 1;
      else return body_fail(d, "not an object or a list of calls");
      if (b.call_depth == 1) continue;
    }
    if (e.kind == K::Begin && e.depth == 0 && b.call_depth == 0 && first == '[') return body_fail(d, "mixed call shapes");
    if (e.kind == K::Begin && e.depth == b.call_depth) {
      if (first != '{') return body_fail(d, "a call that is not an object");
      b.reset_call();
      b.in_call = true;
    } else if (e.kind == K::End && e.depth == b.call_depth) {
      body_end_call(d);
    } else if (e.kind == K::Key && e.depth == b.call_depth + 1) {
      b.key = json_string(std::string_view(b.text).substr(e.start, e.end - e.start)).value_or("");
    } else if (e.kind == K::Begin && e.depth == b.call_depth + 1) {
      if ((b.key == "arguments" || b.key == "parameters") && b.args_start == std::string::npos) {
        if (first != '{' && first != '"') return body_fail(d, "arguments that are not a JSON object");
        b.args_kind = first, b.args_start = e.start;
      }
    } else if (e.kind == K::End && e.depth == b.call_depth + 1) {
      std::string_view tok = std::string_view(b.text).substr(e.start, e.end - e.start);
      if (b.key == "name" && !b.have_name) {
        auto n = first == '"' ? json_string(tok) : std::nullopt;
        if (!n || n->empty()) return body_fail(d, "a 'name' that is not a non-empty string");
        b.name = *n, b.have_name = true;
      } else if (e.start == b.args_start) {
        b.args_end = e.end;
        if (b.args_kind == '"') b.args_text = json_string(tok).value_or("");
      }
    }
  }
  body_stream_args(d);
}

// Feeds body bytes; returns how many were consumed. Stops early when the body failed (the byte that
// failed is not consumed) or ended (a complete value followed by text that belongs after it).
size_t ChatOutputParser::feed_body(OutputDelta& d, std::string_view text) {
  Body& b = *body_;
  for (size_t i = 0; i < text.size(); ++i) {
    if (b.state == Body::State::Broken) return text.size();  // dropped up to the body's end
    if (b.state != Body::State::Open) return i;
    const char c = text[i];
    b.ev.clear();
    if (!b.scan.step(c, b.text.size(), b.ev)) {
      if (b.scan.done() && !b.hermes) {  // the JSON part is over; what follows is content
        b.state = Body::State::Ended;
        return i;
      }
      body_fail(d, b.scan.done() ? "text after the JSON" : "invalid JSON");
      if (b.state == Body::State::Failed) return i;
      continue;
    }
    b.text += c;
    body_events(d, c);
    if (b.state == Body::State::Failed) {
      // The byte parsed as JSON but made it a non-call: give it back with the body.
      return i + 1;
    }
    if (b.state == Body::State::Open && b.kind == Body::Kind::Args && b.scan.done()) {
      b.state = Body::State::Ended;
      return i + 1;
    }
  }
  return text.size();
}

// The body ended (its closing tag, the end of output, or the JSON completed). Calls cut short are closed.
void ChatOutputParser::body_finish(OutputDelta& d, bool closed) {
  Body& b = *body_;
  if (b.state == Body::State::Open || b.state == Body::State::Ended) {
    if (!b.scan.done() || b.in_call) {
      body_fail(d, "the markup ended before the JSON did");
    } else if (!b.committed) {
      b.state = Body::State::Failed;  // valid JSON holding no call (e.g. [])
    }
  }
  if (b.state == Body::State::Failed) {
    add(d, OutputPiece::Kind::Content, b.prefix + b.text + (closed ? std::string(kToolClose) : std::string()));
    content_started_ = true;
  }
  body_.reset();
}

void ChatOutputParser::process(OutputDelta& d, bool final) {
  using K = OutputPiece::Kind;
  auto start_body = [&](bool hermes, bool multi, Body::Kind kind, std::string prefix) {
    body_ = std::make_unique<Body>(multi);
    body_->hermes = hermes;
    body_->kind = kind;
    body_->prefix = std::move(prefix);
    mode_ = Mode::Body;
  };
  for (;;) {
    switch (mode_) {
      case Mode::Start: {
        // Leading whitespace is held until we know whether a <think> block or a JSON call begins.
        std::string s = lstrip(pending_);
        if (f_.reasoning && s.rfind(kThinkOpen, 0) == 0) {
          pending_ = s.substr(kThinkOpen.size());
          mode_ = Mode::Reasoning;
          continue;
        }
        const bool llama = parse_tools_ && f_.tools == ToolFormat::Llama3Json;
        if (llama && (s.rfind("{", 0) == 0 || s.rfind("[", 0) == 0 || s.rfind(kPythonTag, 0) == 0)) {
          std::string prefix = pending_.substr(0, pending_.size() - s.size());
          pending_ = s;
          if (s.rfind(kPythonTag, 0) == 0) {
            std::string rest = lstrip(std::string_view(s).substr(kPythonTag.size()));
            if (rest.empty() && !final) return;  // wait for what follows the tag
            prefix += s.substr(0, s.size() - rest.size());
            pending_ = rest;
          }
          start_body(false, true, Body::Kind::Calls, prefix);
          continue;
        }
        bool maybe = s.empty() || (f_.reasoning && prefix_of(s.substr(0, kThinkOpen.size()), kThinkOpen)) ||
                     (llama && prefix_of(s.substr(0, kPythonTag.size()), kPythonTag));
        if (maybe && !final) return;
        mode_ = Mode::Content;
        continue;
      }
      case Mode::Reasoning: {
        size_t e = pending_.find(kThinkClose);
        if (e != std::string::npos) {
          add(d, K::Reasoning, std::string_view(pending_).substr(0, e));
          pending_ = pending_.substr(e + kThinkClose.size());
          strip_leading_ = true;
          mode_ = Mode::Content;
          continue;
        }
        size_t keep = final ? 0 : partial_suffix(pending_, kThinkClose);
        add(d, K::Reasoning, std::string_view(pending_).substr(0, pending_.size() - keep));
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case Mode::Content: {
        if (strip_leading_) {  // whitespace after </think> or a tool call is layout, not content
          if (all_space(pending_)) {
            if (final) pending_.clear();
            return;
          }
          pending_ = lstrip(pending_);
          strip_leading_ = false;
        }
        std::string_view marker = !parse_tools_ ? std::string_view() : f_.tools == ToolFormat::Hermes ? kToolOpen
                                                                   : f_.tools == ToolFormat::Mistral ? kMistralCalls
                                                                                                     : std::string_view();
        if (!marker.empty()) {
          size_t t = pending_.find(marker);
          if (t != std::string::npos) {
            std::string before = pending_.substr(0, t);
            if (!all_space(before)) content_started_ = true;
            add(d, K::Content, before);
            pending_.erase(0, t + marker.size());
            if (f_.tools == ToolFormat::Hermes) start_body(true, false, Body::Kind::Calls, std::string(kToolOpen));
            else mode_ = Mode::MistralHead;
            continue;
          }
        }
        if (parse_tools_ && f_.tools == ToolFormat::Llama3Json && !content_started_) {
          std::string s = lstrip(pending_);
          if (s.rfind("{", 0) == 0 || s.rfind(kPythonTag, 0) == 0) {
            mode_ = Mode::Start;
            continue;
          }
        }
        size_t keep = final || marker.empty() ? 0 : partial_suffix(pending_, marker);
        std::string out = pending_.substr(0, pending_.size() - keep);
        if (!all_space(out)) content_started_ = true;
        add(d, K::Content, out);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case Mode::MistralHead: {
        // After [TOOL_CALLS]: a JSON list of calls (v3), or name[ARGS]{json} / name[CALL_ID]id[ARGS]{json} (v11+).
        std::string s = lstrip(pending_);
        const std::string lead = pending_.substr(0, pending_.size() - s.size());
        if (s.empty() && !final) return;
        if (!s.empty() && (s[0] == '[' || s[0] == '{') && !prefix_of(s.substr(0, kMistralArgs.size()), kMistralArgs)) {
          pending_ = s;
          start_body(false, false, Body::Kind::Calls, std::string(kMistralCalls) + lead);
          continue;
        }
        size_t n = 0;
        while (n < s.size() && is_name_char(s[n])) ++n;
        std::string name = s.substr(0, n), rest = s.substr(n), call_id_part;
        auto fallback = [&] {
          add(d, K::Content, std::string(kMistralCalls) + pending_);
          content_started_ = true;
          pending_.clear();
          mode_ = Mode::Content;
        };
        size_t head = 0;  // bytes of `rest` that are markers and the call id
        bool ready = false;
        if (rest.rfind(kMistralCallId, 0) == 0) {
          size_t a = rest.find(kMistralArgs);
          if (a != std::string::npos) head = a + kMistralArgs.size(), ready = true;
        } else if (rest.rfind(kMistralArgs, 0) == 0) {
          head = kMistralArgs.size(), ready = true;
        } else if (!rest.empty() && rest[0] == '{') {
          ready = true;  // the name runs straight into the arguments
        } else if (!rest.empty() && !prefix_of(rest, kMistralArgs) && !prefix_of(rest, kMistralCallId)) {
          fallback();
          continue;
        }
        if (!ready) {
          if (final || s.size() > 256) {
            fallback();
            continue;
          }
          return;
        }
        if (name.empty()) {
          fallback();
          continue;
        }
        std::string prefix = std::string(kMistralCalls) + lead + s.substr(0, n + head);
        pending_ = rest.substr(head);
        start_body(false, false, Body::Kind::Args, prefix);
        body_->name = name, body_->have_name = true;
        continue;
      }
      case Mode::Body: {
        Body& b = *body_;
        size_t close = std::string::npos, avail = pending_.size();
        if (b.hermes) {
          close = pending_.find(kToolClose);
          avail = close != std::string::npos ? close : final ? pending_.size() : pending_.size() - partial_suffix(pending_, kToolClose);
        }
        size_t used = feed_body(d, std::string_view(pending_).substr(0, avail));
        pending_.erase(0, used);
        if (b.state == Body::State::Failed) {  // not a call after all: the markup is content
          add(d, K::Content, b.prefix + b.text);
          content_started_ = true;
          body_.reset();
          mode_ = Mode::Content;
          continue;
        }
        if (b.state == Body::State::Ended) {
          body_finish(d, false);
          mode_ = Mode::Content;
          strip_leading_ = true;
          continue;
        }
        if (b.hermes && close != std::string::npos) {
          pending_.erase(0, close - used + kToolClose.size());
          bool committed = b.committed;
          body_finish(d, true);
          mode_ = Mode::Content;
          strip_leading_ = committed;
          continue;
        }
        if (final) {
          bool committed = b.committed;
          body_finish(d, false);
          mode_ = Mode::Content;
          strip_leading_ = committed;
          if (pending_.empty()) return;
          continue;
        }
        return;
      }
    }
  }
}

}  // namespace arbor::server
