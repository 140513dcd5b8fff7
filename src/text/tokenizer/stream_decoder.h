// Streaming detokenization: token ids in, text out as soon as it is final. Emits whole UTF-8 characters
// only, gets SentencePiece's leading space and byte-fallback runs right (the text of a prefix is not the
// concatenation of per-token pieces), and holds back any tail that could still become a stop string.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace arbor {

// Finds stop strings in streamed text. A stop "matches" at the first occurrence that completes (the
// earliest end; among those the earliest start); everything before it is emitted, it and everything
// after are not. Text that could still be the start of a stop string is held back until ruled out.
class StopMatcher {
 public:
  StopMatcher() = default;
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  // Feeds text; returns what is now safe to emit. After a match, returns "" forever.
  std::string push(std::string_view text);
  // End of stream: returns the held-back tail (nothing after a match).
  std::string flush();

  bool stopped() const { return stopped_; }
  // The stop string that matched, when stopped().
  const std::string& matched() const { return stops_[which_]; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  size_t which_ = 0;
};

// Detokenizes a stream of ids with the tokenizer's decoder. The concatenation of everything push() and
// flush() return equals tok.decode(all ids, skip_special_tokens), cut before a matched stop string.
// (One exception, inherited from the decoders: when an invalid byte-fallback run follows bytes that were
// already valid and emitted, decode() turns the whole run into U+FFFD while the stream cannot take back
// what it emitted.) For a tokenizer whose decoder rewrites earlier text (Tokenizer::incremental_decode()
// is false), nothing is emitted before flush().
class StreamDecoder {
 public:
  // `tok` must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false, std::vector<std::string> stop_strings = {});

  // Feeds one id; returns the text that became final (often "", e.g. mid-character).
  std::string push(int32_t id);
  // End of generation: returns whatever is still held back.
  std::string flush();

  bool stopped() const { return stop_.stopped(); }
  const std::string& matched_stop() const { return stop_.matched(); }

 private:
  std::string emit(std::string text);

  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> window_;  // ids since the start of the last emitted text
  size_t prefix_ids_ = 0;        // how many of window_ produced prefix_text_
  std::string prefix_text_;      // decode(window_[0, prefix_ids_)), already emitted
  StopMatcher stop_;
};

}  // namespace arbor
