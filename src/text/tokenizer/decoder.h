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
};

// Null json gives nullptr. Throws arbor::Error naming an unknown "type".
std::unique_ptr<Decoder> make_decoder(const json& j);

}  // namespace arbor
