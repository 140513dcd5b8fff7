// Verbs `tokenize` and `detokenize`: debug prompts against a model's tokenizer.json (no weights needed).
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/json.h"
#include "text/tokenizer/tokenizer.h"

namespace {

std::string model_dir(const arbor::cli::Args& a) {
  auto m = a.get("model");
  if (!m) arbor::fail("--model DIR is required (a directory with tokenizer.json, or the file itself)");
  return arbor::cli::resolve_model_dir(*m);
}

int cmd_tokenize(const std::vector<std::string>& args) {
  arbor::cli::Args a(args, {"model", "file"}, {"json", "no-special"});
  arbor::Tokenizer tok = arbor::Tokenizer::from_file(model_dir(a));
  std::string text;
  if (auto f = a.get("file")) {
    if (!a.positional().empty()) arbor::fail("give the text either as an argument or with --file, not both");
    text = arbor::read_text_file(*f);
  } else {
    if (a.positional().size() != 1) arbor::fail("expected one text argument (quote it), or --file F");
    text = a.positional()[0];
  }
  std::vector<int32_t> ids = tok.encode(text, !a.has("no-special"));
  std::vector<std::string> pieces;
  pieces.reserve(ids.size());
  for (int32_t id : ids) pieces.push_back(tok.id_to_piece(id));
  if (a.has("json")) {
    arbor::json out = {{"ids", ids}, {"pieces", pieces}};
    std::printf("%s\n", out.dump(-1, ' ', false, arbor::json::error_handler_t::replace).c_str());
    return 0;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    // Pieces are JSON-quoted so spaces, newlines and byte-level characters stay visible; beside each, the
    // text the token decodes to on its own (U+FFFD where it holds part of a character).
    auto quote = [](const std::string& s) { return arbor::json(s).dump(-1, ' ', false, arbor::json::error_handler_t::replace); };
    std::string alone = tok.decode(std::span<const int32_t>(&ids[i], 1));
    std::printf("%8d  %-24s %s%s\n", ids[i], quote(pieces[i]).c_str(), quote(alone).c_str(), tok.is_special(ids[i]) ? "  (special)" : "");
  }
  std::printf("%zu tokens\n", ids.size());
  return 0;
}

int cmd_detokenize(const std::vector<std::string>& args) {
  arbor::cli::Args a(args, {"model"}, {"skip-special"});
  arbor::Tokenizer tok = arbor::Tokenizer::from_file(model_dir(a));
  if (a.positional().empty()) arbor::fail("expected ids, e.g. 1,2,3 (commas or spaces)");
  std::vector<int32_t> ids;
  for (const std::string& p : a.positional()) {
    std::string cur;
    auto flush = [&] {
      if (cur.empty()) return;
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(cur, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != cur.size() || v < 0 || v >= static_cast<long long>(tok.vocab_size()))
        arbor::fail("'{}' is not a token id (0..{})", cur, tok.vocab_size() - 1);
      ids.push_back(static_cast<int32_t>(v));
      cur.clear();
    };
    for (char c : p) {
      if (c == ',' || c == ' ' || c == '\n' || c == '\t') flush();
      else cur += c;
    }
    flush();
  }
  std::string text = tok.decode(ids, a.has("skip-special"));
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace

ARBOR_VERB("tokenize", "print token ids and pieces of a text (--model DIR, --file F, --json, --no-special)",
           "--model DIR (\"text\" | --file F) [flags]",
           "  --model DIR           directory with tokenizer.json, the file itself, or a cached repo id\n"
           "  --file F              tokenize this file's text\n"
           "  --json                one JSON object: {\"ids\": [...], \"pieces\": [...]}\n"
           "  --no-special          do not add the tokenizer's special tokens (BOS ...)\n",
           cmd_tokenize);
ARBOR_VERB("detokenize", "print the text of token ids: detokenize --model DIR 1,2,3 [--skip-special]", "--model DIR IDS... [flags]",
           "  --model DIR           directory with tokenizer.json, the file itself, or a cached repo id\n"
           "  --skip-special        leave special tokens out of the text\n",
           cmd_detokenize);
