// token_bytes: the exact bytes each token id adds to generated text (for constrained decoding, which
// must judge tokens byte by byte, including byte-level pieces that are part of a UTF-8 character).
#pragma once
#include <string>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace arbor {

// One entry per id in [0, tok.vocab_size()). Empty for special tokens and ids the tokenizer does not know.
// Byte fallback pieces (<0xAB>) give their byte; byte-level pieces that are not whole UTF-8 characters
// give their raw bytes; every other token gives what decode() appends after a plain one-letter token (so
// SentencePiece's word-start space is kept).
std::vector<std::string> token_bytes(const Tokenizer& tok);

}  // namespace arbor
