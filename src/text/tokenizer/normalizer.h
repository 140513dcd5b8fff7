// Normalizers of tokenizer.json (NFC, NFKC, NFD, NFKD, Lowercase, Prepend, Replace, Strip, Sequence, ...).
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "core/json.h"

namespace arbor {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites s (valid UTF-8) in place.
  void normalize(std::string& s) const {
    bool first_kept = true;
    normalize(s, first_kept);
  }
  // The same; clears first_kept when the first character of s was removed, so that the result no longer
  // starts at the original offset 0 (the reference's Metaspace prepend_scheme "first" looks at that).
  virtual void normalize(std::string& s, bool& first_kept) const = 0;
};

// One Unicode normal form of the whole of s by utf8proc (options: UTF8PROC_COMPOSE etc.); the reference
// for the piecewise normalization the NFC/NFD/NFKC/NFKD normalizers do.
std::string utf8proc_form(std::string_view s, int options);

// Builds the normalizer described by j (a tokenizer.json "normalizer" object); null json gives nullptr.
// Throws arbor::Error naming an unknown "type".
std::unique_ptr<Normalizer> make_normalizer(const json& j);

}  // namespace arbor
