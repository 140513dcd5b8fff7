// StreamDecoder decodes a sliding window of ids and emits the growth of its text (the approach of HF's
// DecodeStream); StopMatcher holds back possible stop-string prefixes.
#include "text/tokenizer/stream_decoder.h"

#include <algorithm>

namespace arbor {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  if (stops_.empty()) {
    std::string out;
    out.swap(held_);
    return out;
  }
  // The occurrence that completes first: smallest end, then smallest start.
  size_t best_end = std::string::npos, best_start = 0;
  for (size_t k = 0; k < stops_.size(); ++k) {
    size_t p = held_.find(stops_[k]);
    if (p == std::string::npos) continue;
    size_t e = p + stops_[k].size();
    if (e < best_end || (e == best_end && p < best_start)) {
      best_end = e;
      best_start = p;
      which_ = k;
    }
  }
  if (best_end != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, best_start);
    held_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens, std::vector<std::string> stop_strings)
    : tok_(&tok), skip_special_(skip_special_tokens), stop_(std::move(stop_strings)) {}

namespace {
bool ends_with_replacement(const std::string& s) { return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0; }
}  // namespace

std::string StreamDecoder::emit(std::string text) { return stop_.push(text); }

std::string StreamDecoder::push(int32_t id) {
  if (stop_.stopped()) return {};
  window_.push_back(id);
  if (!tok_->incremental_decode()) return {};  // text may still be rewritten: everything waits for flush()
  std::string text = tok_->decode(window_, skip_special_);
  // Wait while the text has not grown, has been rewritten (a byte run became valid or invalid), or ends in
  // U+FFFD (an incomplete character that later bytes may complete).
  if (text.size() <= prefix_text_.size() || text.compare(0, prefix_text_.size(), prefix_text_) != 0 ||
      ends_with_replacement(text))
    return {};
  std::string fresh = text.substr(prefix_text_.size());
  // The ids that produced `fresh` become the new window; their text is re-decoded on its own so that
  // later windows start from the same context (SentencePiece strips the window's first space).
  window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(prefix_ids_));
  prefix_ids_ = window_.size();
  prefix_text_ = tok_->decode(window_, skip_special_);
  return emit(std::move(fresh));
}

std::string StreamDecoder::flush() {
  std::string out;
  if (!stop_.stopped() && !window_.empty()) {
    std::string text = tok_->decode(window_, skip_special_);
    size_t common = 0;
    while (common < text.size() && common < prefix_text_.size() && text[common] == prefix_text_[common]) ++common;
    // Back up to a character boundary so a partial character is never emitted.
    while (common > 0 && common < text.size() && (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) --common;
    out = emit(text.substr(common));
  }
  window_.clear();
  prefix_ids_ = 0;
  prefix_text_.clear();
  out += stop_.flush();
  return out;
}

}  // namespace arbor
