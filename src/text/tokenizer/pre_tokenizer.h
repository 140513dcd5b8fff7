// Pre-tokenizers of tokenizer.json: ByteLevel, Split, Metaspace, Digits, Punctuation, Whitespace,
// WhitespaceSplit, BertPreTokenizer, Sequence. They cut normalized text into the words the model sees.
#pragma once
#include <memory>
#include <string>
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
};

// Null json gives nullptr. Throws arbor::Error naming an unknown "type".
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j);

// The GPT-2 byte <-> unicode alphabet of ByteLevel: printable bytes map to themselves, the rest to
// U+0100 + n in byte order. byte_to_utf8(b) is that character's UTF-8; utf8_to_byte returns -1 for
// characters outside the alphabet.
const std::string& byte_to_utf8(unsigned char b);
int utf8_char_to_byte(char32_t c);

}  // namespace arbor
