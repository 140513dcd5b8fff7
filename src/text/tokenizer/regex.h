// Regex for tokenizer.json patterns: Oniguruma/Rust-regex syntax translated to PCRE2 (UTF + UCP, JIT).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/json.h"

namespace arbor {

class Regex {
 public:
  // Compiles `pattern` (as written in tokenizer.json); throws arbor::Error naming `where` on bad syntax.
  Regex(const std::string& pattern, const std::string& where);
  // A pattern that matches `text` literally, searched without PCRE2 (Split/Replace "String" patterns).
  // An empty literal matches nothing, as in the reference.
  static Regex literal(std::string_view text);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Every non-overlapping match in s (valid UTF-8), left to right, as [start, end) byte offsets.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

  // Pattern text translated to PCRE2 syntax (exposed for tests).
  static std::string translate(const std::string& onig_pattern);

 private:
  struct Impl;
  Regex() = default;
  std::unique_ptr<Impl> impl_;  // null for a literal
  std::string pattern_;         // the literal text, for a literal
};

// Escapes s so that it matches literally (Split with a String pattern).
std::string regex_escape(std::string_view s);

// A tokenizer.json pattern object: {"String": "..."} (literal) or {"Regex": "..."}.
Regex make_pattern_regex(const json& pattern, const std::string& where);

}  // namespace arbor
