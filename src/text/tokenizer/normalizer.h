// Normalizers of tokenizer.json (NFC, NFKC, NFD, NFKD, Lowercase, Prepend, Replace, Strip, Sequence, ...).
#pragma once
#include <memory>
#include <string>

#include "core/json.h"

namespace arbor {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites s (valid UTF-8) in place.
  virtual void normalize(std::string& s) const = 0;
};

// Builds the normalizer described by j (a tokenizer.json "normalizer" object); null json gives nullptr.
// Throws arbor::Error naming an unknown "type".
std::unique_ptr<Normalizer> make_normalizer(const json& j);

}  // namespace arbor
