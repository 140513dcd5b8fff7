// Fast loading of tokenizer.json: a small JSON scanner reads the big model.vocab and model.merges
// straight into vectors (a DOM of gemma3's 33 MB file takes seconds); every other field goes to
// nlohmann::json as usual.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/json.h"

namespace arbor {

struct TokenizerJson {
  json rest;  // the whole document, except model.vocab and model.merges
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // both "a b" and ["a", "b"] forms
  bool has_vocab = false, has_merges = false;
};

// Parses tokenizer.json text; `source` names the file in errors (which also give the byte offset).
TokenizerJson scan_tokenizer_json(std::string_view text, const std::string& source);

// The same split for an already-parsed document (slow path, used for JSON built in memory).
TokenizerJson split_tokenizer_json(const json& j, const std::string& source);

}  // namespace arbor
