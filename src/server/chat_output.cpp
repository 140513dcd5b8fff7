// Streaming split of chat output into content / reasoning / tool calls.
#include "server/chat_output.h"

#include <random>

#include "core/json.h"

namespace arbor::server {
namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>", kToolClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

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

}  // namespace

ChatFormat ChatFormat::detect(const std::string& src) {
  ChatFormat f;
  if (src.find("<tool_call>") != std::string::npos) f.tools = ToolFormat::Hermes;
  else if (src.find("<|python_tag|>") != std::string::npos || src.find("ipython") != std::string::npos) f.tools = ToolFormat::Llama3Json;
  f.reasoning = src.find("<think>") != std::string::npos || src.find("</think>") != std::string::npos;
  f.thinking_switch = src.find("enable_thinking") != std::string::npos;
  return f;
}

const char* ChatFormat::tool_format_name() const {
  return tools == ToolFormat::Hermes ? "hermes" : tools == ToolFormat::Llama3Json ? "llama3_json" : "none";
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

ChatOutputParser::ChatOutputParser(ChatFormat f, bool starts_in_reasoning, bool parse_tools)
    : f_(f), parse_tools_(parse_tools && f.tools != ToolFormat::None), mode_(starts_in_reasoning ? Mode::Reasoning : Mode::Start) {}

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

bool ChatOutputParser::parse_call(const std::string& body, bool llama, std::vector<ParsedToolCall>& out) {
  auto one = [&](const json& j) -> bool {
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
    json args = key ? j[key] : json::object();
    if (args.is_string()) {  // some models emit arguments as an encoded string
      json parsed = json::parse(args.get<std::string>(), nullptr, false);
      if (parsed.is_discarded()) return false;
      args = parsed;
    }
    if (!args.is_object()) return false;
    out.push_back({new_call_id(), j["name"].get<std::string>(), args.dump(-1, ' ', false, json::error_handler_t::replace)});
    return true;
  };
  std::string s = lstrip(body);
  if (llama && s.rfind(kPythonTag, 0) == 0) s = lstrip(std::string_view(s).substr(kPythonTag.size()));
  json j = json::parse(s, nullptr, false);
  std::vector<ParsedToolCall> calls;
  std::swap(calls, out);
  bool ok = false;
  if (!j.is_discarded()) {
    if (j.is_array() && !j.empty()) {
      ok = true;
      for (const auto& e : j) ok = ok && one(e);
    } else {
      ok = one(j);
    }
  } else if (llama) {  // Llama 3.1 may separate several calls with ';'
    ok = true;
    size_t start = 0;
    int n = 0;
    while (ok && start < s.size()) {
      size_t semi = s.find(';', start);
      std::string part = s.substr(start, semi == std::string::npos ? std::string::npos : semi - start);
      start = semi == std::string::npos ? s.size() : semi + 1;
      if (all_space(part)) continue;
      json p = json::parse(part, nullptr, false);
      ok = !p.is_discarded() && one(p);
      ++n;
    }
    ok = ok && n > 0;
  }
  if (!ok) {
    out = std::move(calls);
    return false;
  }
  calls.insert(calls.end(), out.begin(), out.end());
  out = std::move(calls);
  return true;
}

void ChatOutputParser::process(OutputDelta& d, bool final) {
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
        if (parse_tools_ && f_.tools == ToolFormat::Llama3Json &&
            (s.rfind("{", 0) == 0 || s.rfind("[", 0) == 0 || s.rfind(kPythonTag, 0) == 0)) {
          mode_ = Mode::JsonCandidate;
          continue;
        }
        bool maybe = s.empty() || (f_.reasoning && kThinkOpen.substr(0, std::min(s.size(), kThinkOpen.size())) == s.substr(0, kThinkOpen.size())) ||
                     (parse_tools_ && f_.tools == ToolFormat::Llama3Json && kPythonTag.substr(0, std::min(s.size(), kPythonTag.size())) == s.substr(0, kPythonTag.size()));
        if (maybe && !final) return;
        mode_ = Mode::Content;
        continue;
      }
      case Mode::Reasoning: {
        size_t e = pending_.find(kThinkClose);
        if (e != std::string::npos) {
          d.reasoning += pending_.substr(0, e);
          pending_ = pending_.substr(e + kThinkClose.size());
          strip_leading_ = true;
          mode_ = Mode::Content;
          continue;
        }
        size_t keep = final ? 0 : partial_suffix(pending_, kThinkClose);
        d.reasoning += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case Mode::Content: {
        if (strip_leading_) {  // whitespace after </think> or </tool_call> is layout, not content
          if (all_space(pending_)) {
            if (final) pending_.clear();
            return;
          }
          pending_ = lstrip(pending_);
          strip_leading_ = false;
        }
        if (parse_tools_ && f_.tools == ToolFormat::Hermes) {
          size_t t = pending_.find(kToolOpen);
          if (t != std::string::npos) {
            d.content += pending_.substr(0, t);
            pending_.erase(0, t + kToolOpen.size());
            mode_ = Mode::InTool;
            continue;
          }
        }
        if (parse_tools_ && f_.tools == ToolFormat::Llama3Json && !content_started_) {
          std::string s = lstrip(pending_);
          if (s.rfind("{", 0) == 0 || s.rfind(kPythonTag, 0) == 0) {
            mode_ = Mode::JsonCandidate;
            continue;
          }
        }
        size_t keep = final || !(parse_tools_ && f_.tools == ToolFormat::Hermes) ? 0 : partial_suffix(pending_, kToolOpen);
        std::string out = pending_.substr(0, pending_.size() - keep);
        if (!all_space(out)) content_started_ = true;
        d.content += out;
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case Mode::InTool: {
        size_t e = pending_.find(kToolClose);
        if (e == std::string::npos && !final) return;
        std::string body = pending_.substr(0, e);
        pending_ = e == std::string::npos ? std::string() : pending_.substr(e + kToolClose.size());
        size_t before = d.tool_calls.size();
        if (parse_call(body, false, d.tool_calls)) {
          n_calls_ += int(d.tool_calls.size() - before);
          strip_leading_ = true;
        } else {
          d.content += std::string(kToolOpen) + body + (e == std::string::npos ? "" : std::string(kToolClose));
          content_started_ = true;
        }
        mode_ = Mode::Content;
        if (final && pending_.empty()) return;
        continue;
      }
      case Mode::JsonCandidate: {
        if (!final) return;
        size_t before = d.tool_calls.size();
        if (parse_call(pending_, true, d.tool_calls)) {
          n_calls_ += int(d.tool_calls.size() - before);
        } else {
          d.content += pending_;
        }
        pending_.clear();
        return;
      }
    }
  }
}

}  // namespace arbor::server
