// Decoders of tokenizer.json: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence.
// Each rewrites the list of token strings (HF's decode_chain); the final text is their concatenation.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"

namespace arbor {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // True when the text of a prefix of the ids never changes as more ids follow (beyond completing a
  // character), so it can be streamed. Replace with a multi-character pattern and Strip of trailing
  // characters rewrite text that came earlier, so they are not.
  virtual bool incremental() const { return true; }
};

// Null json gives nullptr. Throws arbor::Error naming an unknown "type".
std::unique_ptr<Decoder> make_decoder(const json& j);

}  // namespace arbor
