// arbor::Tokenizer: a Hugging Face tokenizer.json (BPE model, normalizer, pre-tokenizer, post-processor,
// decoder, added tokens) with encode/decode that match the reference (HF tokenizers) id for id.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "text/tokenizer/added_tokens.h"

namespace arbor {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a model directory holding one. When tokenizer_config.json sits
  // beside it, its bos_token / eos_token name the bos_id() / eos_id().
  static Tokenizer from_file(const std::string& path);
  // `source` names the input in error messages.
  static Tokenizer from_json(const json& j, const std::string& source = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Bytes that are not valid UTF-8 are first replaced by U+FFFD per maximal invalid subsequence (as a
  // JS/Python caller of the reference would see them). Special-token strings in the text are always
  // recognised; add_special_tokens only controls the post-processor (BOS/EOS templates).
  // Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Unknown ids are skipped, as the reference skips them.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The vocab string of an id (added tokens first, then the model); throws arbor::Error for an id in neither.
  std::string id_to_piece(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // One past the largest id of the model vocab and the added tokens (the embedding rows needed).
  size_t vocab_size() const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  // Whether decode() of a growing id sequence only ever appends text (see Decoder::incremental); true for
  // every real tokenizer we know. StreamDecoder holds all text until flush() when it is false.
  bool incremental_decode() const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbor
