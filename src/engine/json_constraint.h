// Constrained JSON decoding: JsonSchema (the enforced subset of JSON Schema, compiled), JsonRecognizer
// (byte-level state: the text so far is a prefix of a JSON value that fits the schema), JsonTokenTable
// (a trie of every token's bytes, built once per tokenizer) and JsonConstraint (one request's state:
// masks a logits row to the tokens that keep the text a valid prefix, advances by the sampled token).
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "engine/json_prefix.h"

namespace arbor {

// A schema the compiler cannot take; `path` names the offending member (e.g. "properties.age.type",
// "" for the schema itself).
struct JsonSchemaError : std::runtime_error {
  JsonSchemaError(std::string path_, const std::string& msg) : std::runtime_error(msg), path(std::move(path_)) {}
  std::string path;
};

// Enforced keywords: type (a name or a list of names: object, array, string, number, integer, boolean,
// null), properties, required, additionalProperties (false, true or a schema), items (a schema), enum and
// const (strings, numbers, booleans, null: the value must be written exactly as the literal's compact
// JSON). A schema without type but with properties is an object; one with neither (or with anyOf, $ref and
// other keywords, which are not enforced) accepts any JSON value. Objects: keys of a closed object
// (additionalProperties: false) must be listed properties; a listed key may appear once; the object
// closes only once every required key is present. Keys and enum values are matched on their compact JSON
// spelling (json(key).dump()), so an equivalent escape spelling counts as another key.
class JsonSchema {
 public:
  enum TypeBit : uint8_t { Object = 1, Array = 2, String = 4, Number = 8, Integer = 16, Boolean = 32, Null = 64, AnyType = 127 };
  struct Node {
    uint8_t types = AnyType;
    std::vector<std::string> keys;  // property names as the bytes between the quotes of json(name).dump()
    std::vector<int> key_nodes;     // schema of each property
    uint64_t required = 0;          // bit i: keys[i] is required
    bool closed = false;            // additionalProperties: false
    int extra = -1;                 // schema of other properties' values (-1: any)
    int items = -1;                 // schema of array elements (-1: any)
    std::vector<std::string> enum_texts;  // compact JSON of each allowed literal; empty = no enum
  };
  static constexpr int kMaxProperties = 64;
  static constexpr int kMaxDepth = 32;

  // Throws JsonSchemaError.
  static std::shared_ptr<const JsonSchema> compile(const json& schema);
  // Any JSON value whose top-level is of `types` (e.g. Object for json_object mode).
  static std::shared_ptr<const JsonSchema> any_of_type(uint8_t types);

  const Node& node(int i) const { return nodes_[size_t(i)]; }
  const Node& root() const { return nodes_[0]; }

 private:
  int add(const json& s, const std::string& path, int depth);
  std::vector<Node> nodes_;
};

// Byte-level recogniser. feed() leaves the state unspecified when it returns false: copy before feeding
// bytes that may be rejected (JsonConstraint does).
class JsonRecognizer {
 public:
  // Consecutive whitespace bytes allowed outside strings (so a model cannot loop on spaces).
  static constexpr int kMaxWhitespaceRun = 8;
  // `schema` must outlive the recogniser (JsonConstraint holds it).
  explicit JsonRecognizer(const JsonSchema* schema);
  bool feed(char c, std::vector<JsonPrefixScanner::Event>& scratch) { return feed_byte(c, scratch) > 0; }
  bool feed(std::string_view s);
  // A complete top-level value has been read (only whitespace may follow).
  bool complete() const { return sc_.done(); }
  // Inside a string whose bytes nothing tracks (a value without enum, or a key of an object without a
  // schema), with no escape or UTF-8 character half read: a token that stays inside the string and ends
  // in the same plain state is allowed whatever surrounds the string.
  bool free_string() const { return sc_.in_plain_string() && (track_ == Track::None || (track_ == Track::Key && track_node_ < 0)); }

 private:
  enum class Track : uint8_t { None, Key, Enum };
  struct Frame {
    int node;         // -1: any
    bool object;
    uint64_t seen = 0;    // properties present
    int value_node = -1;  // schema of the next value in this container
  };
  friend class JsonConstraint;
  // 1: accepted; 0: rejected, state unchanged; -1: rejected, state changed.
  int feed_byte(char c, std::vector<JsonPrefixScanner::Event>& ev);
  bool on_value_begin(char c, bool& fed);
  bool filter(char c);  // narrows cand_ by byte c at tpos_
  bool exact() const;   // some candidate ends at tpos_
  const std::vector<std::string>& cands() const;

  const JsonSchema* schema_;
  JsonPrefixScanner sc_;
  std::vector<Frame> stack_;
  size_t pos_ = 0;
  int ws_run_ = 0;
  Track track_ = Track::None;
  int track_node_ = -1;  // node whose keys / enum_texts are tracked
  uint64_t cand_ = 0;
  uint32_t tpos_ = 0;
  bool int_only_ = false;  // the open number must be an integer
};

// Every token's bytes in a trie. bytes[id] empty: the token is never allowed (special tokens, ids the
// tokenizer does not know). eos_ids are allowed once the value is complete. Tokens that are plain string
// content (JsonRecognizer::free_string) are also listed apart, with a second trie of all the others, so
// masking inside a string walks only the tokens that can end it or hold escapes.
class JsonTokenTable {
 public:
  JsonTokenTable(const std::vector<std::string>& bytes, std::vector<int32_t> eos_ids);
  int64_t size() const { return n_tokens_; }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  size_t max_len() const { return max_len_; }

  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> kids;  // (byte, node)
    std::vector<int32_t> tokens;                     // tokens whose bytes end here
  };
  struct Trie {
    std::vector<Node> nodes{1};
    void insert(const std::string& bytes, int32_t id);
  };
  const Trie& all() const { return all_; }
  const Trie& not_string_safe() const { return special_; }
  const std::vector<uint8_t>& string_safe() const { return string_safe_; }  // 1 per plain-content token

 private:
  int64_t n_tokens_ = 0;
  size_t max_len_ = 0;
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_ids_;
  Trie all_, special_;
  std::vector<uint8_t> string_safe_;
};

// One request's constraint. Copies are independent (each choice of n has its own).
class JsonConstraint {
 public:
  JsonConstraint(std::shared_ptr<const JsonTokenTable> table, std::shared_ptr<const JsonSchema> schema);
  // Ids (ascending) whose bytes keep the text a valid prefix; EOS ids only when complete().
  std::vector<int32_t> allowed() const;
  // The same as a 0/1 entry per token id.
  const std::vector<uint8_t>& allowed_mask() const;
  // Sets logits[i] = -inf for every i in [0, vocab) not allowed(); returns how many stay.
  int64_t mask(float* logits, int64_t vocab) const;
  // Appends token `id`; false (state unchanged) when its bytes break the JSON or it is not allowed.
  bool advance(int32_t id);
  bool complete() const { return rec_.complete(); }

 private:
  void walk(const JsonTokenTable::Trie& t, uint32_t node, size_t depth) const;

  std::shared_ptr<const JsonTokenTable> table_;
  std::shared_ptr<const JsonSchema> schema_;
  JsonRecognizer rec_;
  // Scratch for walk(): one recogniser per trie depth (assignment reuses their capacity).
  mutable std::vector<JsonRecognizer> level_;
  mutable std::vector<JsonPrefixScanner::Event> ev_;
  mutable std::vector<uint8_t> allow_;
};

}  // namespace arbor
