// Verb `bench-tokenizer`: single-threaded encode throughput over the lines of a text file
// (bench/tokenizer/run.sh runs it beside npm tokenizers on the same text).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/model_args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/json.h"
#include "text/tokenizer/tokenizer.h"

namespace {

int cmd_bench_tokenizer(const std::vector<std::string>& args) {
  arbor::cli::Args a(args, {"model", "file", "passes"}, {"no-special"});
  auto model = a.get("model");
  if (model) model = arbor::cli::resolve_model_dir(*model);
  auto file = a.get("file");
  if (!model || !file) arbor::fail("bench-tokenizer: needs --model DIR and --file TEXT (one input per line)");
  const int passes = static_cast<int>(a.get_int("passes", 3));
  if (passes < 1) arbor::fail("bench-tokenizer: --passes must be >= 1, got {}", passes);

  auto t0 = std::chrono::steady_clock::now();
  arbor::Tokenizer tok = arbor::Tokenizer::from_file(*model);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::string text = arbor::read_text_file(*file);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\n') {
      if (i > start) lines.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  size_t bytes = 0;
  for (auto& l : lines) bytes += l.size();
  const bool special = !a.has("no-special");

  // Pass 1 starts with an empty word cache ("cold"); later passes reuse it ("warm"), as a server does.
  for (int p = 0; p < passes; ++p) {
    size_t tokens = 0;
    uint32_t checksum = 0;  // over all ids in order; tools/tokenizer/bench.js prints the same sum
    auto t = std::chrono::steady_clock::now();
    for (auto& l : lines) {
      std::vector<int32_t> ids = tok.encode(l, special);
      tokens += ids.size();
      for (int32_t id : ids) checksum = checksum * 31u + static_cast<uint32_t>(id);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    std::printf("arbor  pass %d (%s): %zu lines, %.2f MB, %zu tokens (ids checksum %08x), %.3f s: %.2f MB/s, %.0f tokens/s\n",
                p + 1, p == 0 ? "cold cache" : "warm cache", lines.size(), bytes / 1e6, tokens, checksum, s, bytes / 1e6 / s,
                tokens / s);
  }
  std::printf("arbor  load tokenizer.json: %.3f s\n", load_s);
  return 0;
}

}  // namespace

ARBOR_VERB("bench-tokenizer", "encode throughput: bench-tokenizer --model DIR --file TEXT [--passes N]", "--model DIR --file TEXT [flags]",
           "  --model DIR           directory with tokenizer.json, the file itself, or a cached repo id\n"
           "  --file TEXT           inputs, one per line\n"
           "  --passes N            passes over the file, the first with a cold word cache (default 3)\n"
           "  --no-special          do not add the tokenizer's special tokens (BOS ...)\n",
           cmd_bench_tokenizer);
