// Added tokens of tokenizer.json and how they cut the input before normalization and pre-tokenization
// (leftmost-longest matching, lstrip/rstrip/single_word), as HF's AddedVocabulary does.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/json.h"

namespace arbor {

class Normalizer;

struct AddedToken {
  int32_t id = -1;
  std::string content;
  std::string piece;  // what the id decodes to: content, normalized when `normalized` (as the reference does)
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = false;
};

// One piece of the input after added-token extraction: either an added token (id >= 0) or text.
struct Segment {
  size_t begin, end;  // byte range in the string that was split
  int32_t added_id;   // -1 for plain text
};

// A byte trie over token contents; finds non-overlapping leftmost-longest matches.
class TokenTrie {
 public:
  void insert(std::string_view s, uint32_t value);
  // Appends (start, end, value) for each match in s.
  struct Match {
    size_t begin, end;
    uint32_t value;
  };
  void find_all(std::string_view s, std::vector<Match>& out) const;
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, uint32_t>> next;  // sorted by byte
    int64_t value = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_byte_{};
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // tokens: tokenizer.json "added_tokens"; normalizer (may be null) normalizes "normalized" contents.
  // Ids follow the reference, not the file's "id" fields: a token whose content is in the model vocab
  // takes that id; others are numbered from model_vocab_size on, in file order (well-formed files agree).
  AddedVocabulary(const json& tokens, const Normalizer* normalizer,
                  const std::function<std::optional<int32_t>(std::string_view)>& model_token_to_id, size_t model_vocab_size);

  // Splits s by the tokens whose "normalized" flag equals `normalized_set`.
  void split(std::string_view s, bool normalized_set, std::vector<Segment>& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find_id(int32_t id) const;
  const AddedToken* find_content(std::string_view content) const;

 private:
  std::vector<AddedToken> tokens_;
  TokenTrie raw_trie_, normalized_trie_;
  std::vector<int32_t> by_id_;  // id -> index into tokens_, -1 when none
  std::unordered_map<std::string, int32_t> by_content_;  // content -> index of its first token
};

}  // namespace arbor
