// Bounded JSON reading and parse_body: depth limit at and past kMaxJsonDepth (and a 100,000-deep body read
// without recursion), numbers that overflow a double named by their path, syntax errors in plain words.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/json_body.h"
#include "server/params.h"

namespace arbor::server {
namespace {

std::string nested(const std::string& key, int depth) {
  std::string s = "{\"" + key + "\":";
  for (int i = 0; i < depth; ++i) s += i % 2 ? "{\"a\":" : "[";
  s += "1";
  for (int i = depth - 1; i >= 0; --i) s += i % 2 ? "}" : "]";
  return s + "}";
}

TEST(JsonBody, DepthLimit) {
  // The wrapping object is one level: kMaxJsonDepth - 1 inside it is the deepest accepted.
  EXPECT_TRUE(read_json<json>(nested("metadata", kMaxJsonDepth - 1), nullptr).has_value());
  JsonReadError err;
  EXPECT_FALSE(read_json<json>(nested("metadata", kMaxJsonDepth), &err).has_value());
  EXPECT_EQ(err.kind, JsonReadError::Kind::TooDeep);
  EXPECT_EQ(err.where.rfind("metadata[0].a[0]", 0), 0u) << err.where;
  EXPECT_NE(err.message.find(std::to_string(kMaxJsonDepth)), std::string::npos) << err.message;
  // Far deeper than any stack could recurse through: refused, not crashed.
  EXPECT_FALSE(read_json<nlohmann::ordered_json>(nested("x", 100000), &err).has_value());
  EXPECT_EQ(err.kind, JsonReadError::Kind::TooDeep);
  try {
    parse_body(std::string(200000, '[') + std::string(200000, ']'));
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("more than 128 levels"), std::string::npos) << e.what();
  }
}

TEST(JsonBody, NumberOverflowNamesTheField) {
  JsonReadError err;
  EXPECT_FALSE(read_json<json>(R"({"temperature": 1e400})", &err).has_value());
  EXPECT_EQ(err.kind, JsonReadError::Kind::NumberOverflow);
  EXPECT_EQ(err.where, "temperature");
  EXPECT_FALSE(read_json<json>(R"({"messages": [{"role": "user"}, {"x": [1, 2, -1e999]}]})", &err).has_value());
  EXPECT_EQ(err.where, "messages[1].x[2]");
  EXPECT_NE(err.message.find("'messages[1].x[2]' is a number too large for a double: '-1e999'"), std::string::npos) << err.message;
  try {
    parse_body(R"({"unknown_field": {"deep": 1e400}})");
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "unknown_field.deep");
  }
  // Large but finite numbers are fine; so are huge integers that fit a double.
  auto ok = read_json<json>(R"({"a": 1e300, "b": 123456789012345678901234567890})", nullptr);
  ASSERT_TRUE(ok.has_value());
  EXPECT_DOUBLE_EQ((*ok)["a"].get<double>(), 1e300);
}

TEST(JsonBody, SyntaxErrorsAndValues) {
  JsonReadError err;
  EXPECT_FALSE(read_json<json>(R"({"a": tru})", &err).has_value());
  EXPECT_EQ(err.kind, JsonReadError::Kind::Syntax);
  EXPECT_EQ(err.message.find("[json.exception"), std::string::npos) << err.message;
  EXPECT_NE(err.message.find("line 1"), std::string::npos) << err.message;
  EXPECT_FALSE(read_json<json>(R"({"a": 1} x)", &err).has_value());  // trailing bytes
  // What parses is what json::parse gives, key order kept for ordered_json.
  const std::string text = R"({"z": [1, -2, 3.5, "s", null, true, {"k": {}}], "a": {"b": []}})";
  EXPECT_EQ(*read_json<json>(text, nullptr), json::parse(text));
  EXPECT_EQ(read_json<nlohmann::ordered_json>(text, nullptr)->dump(), nlohmann::ordered_json::parse(text).dump());
}

TEST(JsonBody, ToolCallArgumentsTextIsBoundedToo) {
  // Arguments given as JSON text inside the body: parsed into an object for the template, so their depth
  // counts as well.
  json msgs = json::array({{{"role", "user"}, {"content", "hi"}},
                           {{"role", "assistant"}, {"content", ""},
                            {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                                         {"function", {{"name", "f"}, {"arguments", nested("a", 5000)}}}}})}}});
  try {
    normalize_messages(msgs);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages[1].tool_calls[0].function.arguments");
  }
  msgs[1]["tool_calls"][0]["function"]["arguments"] = R"({"x": 1})";
  EXPECT_EQ(normalize_messages(msgs)[1]["tool_calls"][0]["function"]["arguments"]["x"], 1);
}

}  // namespace
}  // namespace arbor::server
