// Raw bytes per token id, from the tokenizer's pieces and decoder.
#include "text/tokenizer/token_bytes.h"

#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/unicode.h"

namespace arbor {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The bytes of a byte-level piece (every character in the byte alphabet), or nullopt.
std::optional<std::string> byte_level(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    int b = utf8_char_to_byte(unicode::next_cp(piece, i));
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
  }
  return out;
}

}  // namespace

std::vector<std::string> token_bytes(const Tokenizer& tok) {
  const size_t V = tok.vocab_size();
  std::vector<std::string> out(V);
  // A reference token decoded first, so a decoder's start-of-text rules (Metaspace dropping the first
  // word-start space, Strip) do not touch the token under test.
  std::optional<int32_t> ref;
  for (const char* letter : {"a", "\xE2\x96\x81" "a", "\xC4\xA0" "a", "x"}) {
    auto id = tok.token_to_id(letter);
    if (id && !tok.is_special(*id) && !tok.decode(std::vector<int32_t>{*id}).empty()) {
      ref = id;
      break;
    }
  }
  const std::string ref_text = ref ? tok.decode(std::vector<int32_t>{*ref}) : std::string();
  for (size_t i = 0; i < V; ++i) {
    const auto id = int32_t(i);
    if (tok.is_special(id)) continue;
    std::string piece;
    try {
      piece = tok.id_to_piece(id);
    } catch (const std::exception&) {
      continue;  // a hole in the id space
    }
    if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>' && hex_digit(piece[3]) >= 0 &&
        hex_digit(piece[4]) >= 0) {
      out[i] = std::string(1, static_cast<char>(hex_digit(piece[3]) * 16 + hex_digit(piece[4])));
      continue;
    }
    std::string text;
    if (ref) {
      text = tok.decode(std::vector<int32_t>{*ref, id});
      text = text.compare(0, ref_text.size(), ref_text) == 0 ? text.substr(ref_text.size()) : tok.decode(std::vector<int32_t>{id});
    } else {
      text = tok.decode(std::vector<int32_t>{id});
    }
    // U+FFFD from a piece that holds part of a UTF-8 character: take the raw bytes instead.
    if (text.find("\xEF\xBF\xBD") != std::string::npos)
      if (auto raw = byte_level(piece); raw && raw->find("\xEF\xBF\xBD") == std::string::npos && !unicode::is_valid_utf8(*raw))
        text = *raw;
    out[i] = std::move(text);
  }
  return out;
}

}  // namespace arbor
