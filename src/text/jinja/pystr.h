// Python string semantics on UTF-8 strings: code-point indexing, whitespace, strip/split/splitlines,
// case mapping (ASCII and Latin-1/Greek/Cyrillic basics), repr quoting and float formatting as str().
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace arbor::jinja::py {

// Decodes UTF-8 into code points; invalid bytes become U+FFFD-free "raw byte" code points 0xDC80+b
// (Python's surrogateescape) so that encode(decode(s)) == s for any bytes.
std::vector<uint32_t> decode(std::string_view s);
std::string encode(const std::vector<uint32_t>& cps);
void append_utf8(std::string& out, uint32_t cp);
size_t length(std::string_view s);  // in code points
bool is_ascii(std::string_view s);

bool is_space(uint32_t cp);  // str.isspace()
bool is_alpha(uint32_t cp);
bool is_digit(uint32_t cp);
bool is_upper(uint32_t cp);
bool is_lower(uint32_t cp);
uint32_t to_upper(uint32_t cp);
uint32_t to_lower(uint32_t cp);
bool is_linebreak(uint32_t cp);  // str.splitlines() boundaries

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // first upper, rest lower
std::string title(std::string_view s);       // str.title()

// chars: nullopt = whitespace; otherwise the set of code points to strip.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// sep: nullopt = runs of whitespace. maxsplit < 0 = no limit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
int64_t count(std::string_view s, std::string_view sub);
// Byte offset -> code point offset.
int64_t cp_index(std::string_view s, size_t byte_off);

std::string repr_string(std::string_view s);  // 'abc' with Python's quote choice and escapes
std::string float_str(double d);              // repr(float): 1.0, 1e-05, 1e+16, inf, nan
// Parses a Python int literal as int() does (whitespace, sign, underscores); nullopt when invalid.
std::optional<int64_t> parse_int(std::string_view s, int base);
std::optional<double> parse_float(std::string_view s);

}  // namespace arbor::jinja::py
