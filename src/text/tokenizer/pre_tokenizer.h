// Pre-tokenizers of tokenizer.json: ByteLevel, Split, Metaspace, Digits, Punctuation, Whitespace,
// WhitespaceSplit, BertPreTokenizer, Sequence. They cut normalized text into the words the model sees.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"

namespace arbor {

struct PreToken {
  std::string text;
  bool at_start = false;  // begins at offset 0 of the original input (Metaspace prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their pre-tokenization; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;

  // For FastPreTokenizer: appends this pre-tokenizer's stages when it is a chain of Isolated, non-inverted
  // regex splits optionally ending in ByteLevel's byte mapping (no prefix space); false otherwise.
  virtual bool fast_stages(std::vector<const class Regex*>& splits, bool& map_bytes) const { return false; }
};

// The common shape of byte-level tokenizers (GPT-2, Llama 3, Qwen, DeepSeek): regex splits that keep
// every piece, then bytes mapped to the GPT-2 alphabet. Runs it without building PreToken vectors or
// per-piece strings; pre_tokenize() of the same pre-tokenizer is its reference.
class FastPreTokenizer {
 public:
  // nullptr when `p` does not have the supported shape.
  static std::unique_ptr<FastPreTokenizer> from(const PreTokenizer& p);
  // Calls emit(piece) for every pre-token of text, in order (piece is only valid during the call).
  void for_each_piece(std::string_view text, const std::function<void(std::string_view)>& emit) const;

 private:
  void run(size_t stage, std::string_view s, std::vector<std::vector<std::pair<size_t, size_t>>>& matches, std::string& scratch,
           const std::function<void(std::string_view)>& emit) const;
  std::vector<const Regex*> splits_;
  bool map_bytes_ = false;
};

// Null json gives nullptr. Throws arbor::Error naming an unknown "type".
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j);

// The GPT-2 byte <-> unicode alphabet of ByteLevel: printable bytes map to themselves, the rest to
// U+0100 + n in byte order. byte_to_utf8(b) is that character's UTF-8; utf8_to_byte returns -1 for
// characters outside the alphabet.
const std::string& byte_to_utf8(unsigned char b);
int utf8_char_to_byte(char32_t c);

}  // namespace arbor
