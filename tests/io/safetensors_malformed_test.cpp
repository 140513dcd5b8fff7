// Tests that every malformed safetensors file is rejected with an arbor::Error naming the file, the tensor and
// the numbers; and that unusual but valid layouts are accepted.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace arbor {
namespace {

using test::error_of;
using test::raw_safetensors;
using test::TempDir;

std::string parse_error(const std::string& header, size_t data_size) {
  auto bytes = raw_safetensors(header, data_size);
  return error_of([&] { parse_safetensors(bytes.data(), bytes.size(), "bad.safetensors"); });
}

// Expects parse_safetensors to fail with a message containing every substring (and the file name).
void expect_rejected(const std::string& header, size_t data_size, std::vector<std::string> subs) {
  std::string e = parse_error(header, data_size);
  subs.insert(subs.begin(), "safetensors: bad.safetensors: ");
  for (const auto& s : subs) EXPECT_NE(e.find(s), std::string::npos) << "header: " << header << "\nwant: " << s << "\ngot: " << e;
}

TEST(SafetensorsMalformed, TooShortForTheLengthField) {
  std::vector<uint8_t> b = {1, 2, 3, 4, 5};
  std::string e = error_of([&] { parse_safetensors(b.data(), b.size(), "short.safetensors"); });
  EXPECT_EQ(e, "safetensors: short.safetensors: file is 5 bytes, shorter than the 8-byte header length field");
  e = error_of([&] { parse_safetensors(nullptr, 0, "zero.safetensors"); });
  EXPECT_NE(e.find("file is 0 bytes"), std::string::npos) << e;
}

TEST(SafetensorsMalformed, HeaderLengthThatLies) {
  auto b = raw_safetensors("{}", 40);  // 50 bytes in all
  b[0] = 0xe8, b[1] = 0x03;           // claims 1000 header bytes
  std::string e = error_of([&] { parse_safetensors(b.data(), b.size(), "lie.safetensors"); });
  EXPECT_NE(e.find("lie.safetensors: header length 1000 exceeds the 42 bytes after the length field (file is 50 bytes"),
            std::string::npos)
      << e;
  for (int i = 0; i < 8; ++i) b[i] = 0xff;  // 2^64-1: must not wrap around
  e = error_of([&] { parse_safetensors(b.data(), b.size(), "lie.safetensors"); });
  EXPECT_NE(e.find("header length 18446744073709551615 exceeds the 42 bytes"), std::string::npos) << e;
}

TEST(SafetensorsMalformed, AbsurdHeaderLength) {
  // A file large enough to hold the header it claims, but the claim is past the reference's 100 MB limit. The
  // anonymous mapping is zero pages until written, so this costs no real memory.
  const size_t size = size_t(kSafetensorsMaxHeader) + 64;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* b = static_cast<uint8_t*>(p);
  uint64_t n = kSafetensorsMaxHeader + 1;
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(n >> (8 * i));
  std::string e = error_of([&] { parse_safetensors(b, size, "huge.safetensors"); });
  ::munmap(p, size);
  EXPECT_NE(e.find("huge.safetensors: header length 100000001 is larger than the 100000000-byte limit"), std::string::npos)
      << e;
}

TEST(SafetensorsMalformed, HeaderNotJsonOrNotObject) {
  expect_rejected("{\"a\": ", 0, {"header (6 bytes) is not valid JSON", "parse error"});
  expect_rejected("", 0, {"header (0 bytes) is not valid JSON"});
  expect_rejected("{} trailing", 0, {"not valid JSON"});
  expect_rejected("{\"a\xff\": 1}", 0, {"not valid JSON"});  // invalid UTF-8
  expect_rejected("[1, 2]", 0, {"header is a JSON array, not an object"});
  expect_rejected("  7  ", 0, {"header is a JSON number, not an object"});
  expect_rejected("{\"a\": [[[[[[[[[[[[[[1]]]]]]]]]]]]]]}", 0, {"header nests deeper than 8 levels"});
}

TEST(SafetensorsMalformed, MissingOrWrongTypedFields) {
  // The fuzzer's find: an empty name parsed, then the writer refused it.
  expect_rejected(R"({"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4, {"a tensor has an empty name"});
  expect_rejected(R"({"w": 3})", 0, {"tensor 'w': entry is a JSON number, not an object"});
  expect_rejected(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4, {"tensor 'w': missing 'dtype'"});
  expect_rejected(R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", 4,
                  {"tensor 'w': 'dtype' is a JSON number, not a string"});
  expect_rejected(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, {"tensor 'w': missing 'shape'"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4,
                  {"tensor 'w': 'shape' is a JSON number, not an array"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [1]}})", 4, {"tensor 'w': missing 'data_offsets'"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4,
                  {"tensor 'w': 'data_offsets' is [0], not an array of two integers"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": "0-4"}})", 4,
                  {"tensor 'w': 'data_offsets' is \"0-4\""});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4.0]}})", 4,
                  {"tensor 'w': 'data_offsets' [0,4.0] must hold two integers"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4,
                  {"tensor 'w': 'data_offsets' [-4,0] must hold two integers"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}})", 8,
                  {"tensor 'w': shape dimension 0 is \"2\", not an integer"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 8]}})", 8,
                  {"tensor 'w': shape dimension 0 is 1.5, not an integer"});
}

TEST(SafetensorsMalformed, UnknownDtype) {
  expect_rejected(R"({"w": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 1]}})", 1,
                  {"tensor 'w': unknown dtype 'Q4_K' (supported: F32, F16, BF16,"});
  expect_rejected(R"({"w": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", 4, {"unknown dtype 'f32'"});
}

TEST(SafetensorsMalformed, NegativeOrOverflowingShape) {
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 8]}})", 8,
                  {"tensor 'w': shape dimension 1 is negative (-3)"});
  // 2^62 * 4 elements overflow 2^64; 2^61 F32 elements are 2^63 bytes: both refused before any offset check.
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 8]}})", 8,
                  {"tensor 'w': shape [4611686018427387904, 4] of F32 overflows"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [2305843009213693952], "data_offsets": [0, 8]}})", 8,
                  {"tensor 'w': shape [2305843009213693952] of F32 overflows"});
  expect_rejected(R"({"w": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 8]}})", 8,
                  {"tensor 'w': shape dimension 0 is 18446744073709551615, not an integer in [0, 2^63)"});
  // A zero dimension does not excuse the others: their product would overflow the strides computed from them.
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [0, 9223372036854775807, 9223372036854775807], "data_offsets": [0, 8]}})",
                  8, {"tensor 'w':", "overflows"});
}

TEST(SafetensorsMalformed, OffsetsOutOfRange) {
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", 16,
                  {"tensor 'w': data_offsets [0, 32] end at byte 32 of the data section, which has 16 bytes"});
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 4]}})", 16,
                  {"tensor 'w': data_offsets [8, 4] begin after they end"});
  expect_rejected(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [17, 17]}})", 16,
                  {"tensor 'w': data_offsets [17, 17] end at byte 17 of the data section, which has 16 bytes"});
  expect_rejected(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [9223372036854775807, 9223372036854775808]}})",
                  16, {"tensor 'w': 'data_offsets'", "must hold two integers in [0, 2^63)"});
}

TEST(SafetensorsMalformed, ShapeByteSizeMismatch) {
  expect_rejected(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 16,
                  {"tensor 'w': shape [3] of F32 needs 12 bytes, data_offsets [0, 8] hold 8"});
  expect_rejected(R"({"w": {"dtype": "BF16", "shape": [], "data_offsets": [0, 4]}})", 16,
                  {"tensor 'w': shape [] of BF16 needs 2 bytes, data_offsets [0, 4] hold 4"});
  expect_rejected(R"({"w": {"dtype": "F16", "shape": [2, 0], "data_offsets": [0, 4]}})", 16,
                  {"tensor 'w': shape [2, 0] of F16 needs 0 bytes"});
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  expect_rejected(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                  16, {"tensors 'a' (bytes [0, 8)) and 'b' (bytes [4, 12)) overlap"});
  // One tensor inside another, listed first, and past a non-overlapping third.
  expect_rejected(R"({"inner": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]},
                      "outer": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                      "z": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}})",
                  16, {"tensors 'outer' (bytes [0, 8)) and 'inner' (bytes [3, 5)) overlap"});
  // Behind a short tensor, a long earlier one still covers: [0,12) then [2,4) then [6,8).
  expect_rejected(R"({"long": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]},
                      "s1": {"dtype": "U8", "shape": [2], "data_offsets": [12, 14]},
                      "s2": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]}})",
                  16, {"'long'", "'s2'", "overlap"});
  expect_rejected(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]},
                      "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
                  16, {"tensors 'a' (bytes [4, 8)) and 'b' (bytes [4, 8)) overlap"});
}

TEST(SafetensorsMalformed, DuplicateNames) {
  expect_rejected(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                      "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                  4, {"duplicate tensor name 'a'"});
  expect_rejected(R"({"a": {"dtype": "U8", "shape": [1], "dtype": "F32", "data_offsets": [0, 1]}})", 4,
                  {"tensor 'a': duplicate key 'dtype' in its entry"});
  expect_rejected(R"({"__metadata__": {}, "__metadata__": {}})", 0, {"duplicate tensor name '__metadata__'"});
}

TEST(SafetensorsMalformed, MetadataMustMapStringsToStrings) {
  expect_rejected(R"({"__metadata__": ["pt"]})", 0, {"__metadata__ is a JSON array, not an object of strings"});
  expect_rejected(R"({"__metadata__": {"format": "pt", "n": 3}})", 0,
                  {"__metadata__ must map strings to strings; 'n' holds a JSON number"});
}

TEST(SafetensorsMalformed, TruncatedFileOnDisk) {
  TempDir d;
  std::vector<uint8_t> w(64 * 4, 1);
  write_safetensors(d.file("t.safetensors"), {{"w", DType::F32, {8, 8}, w.data(), w.size()}});
  auto size = std::filesystem::file_size(d.file("t.safetensors"));
  std::filesystem::resize_file(d.file("t.safetensors"), size - 10);
  std::string e = error_of([&] { SafetensorsFile f(d.file("t.safetensors")); });
  EXPECT_NE(e.find("safetensors: " + d.file("t.safetensors") + ": tensor 'w': data_offsets [0, 256] end at byte 256 "
                   "of the data section, which has 246 bytes"),
            std::string::npos)
      << e;
  std::filesystem::resize_file(d.file("t.safetensors"), 20);  // now the header itself is cut
  e = error_of([&] { SafetensorsFile f(d.file("t.safetensors")); });
  EXPECT_NE(e.find(d.file("t.safetensors") + ": header length"), std::string::npos) << e;
  e = error_of([&] { SafetensorsFile f(d.file("missing.safetensors")); });
  EXPECT_NE(e.find("missing.safetensors"), std::string::npos) << e;
}

TEST(SafetensorsMalformed, UnusualButValidLayoutsAreAccepted) {
  // Gaps between tensors, trailing bytes, padding spaces, zero-size tensors anywhere in range, unknown keys
  // beside the three required ones (the reference reader ignores them too), an empty __metadata__.
  auto b = raw_safetensors(R"({"__metadata__": {}, "b": {"dtype": "U8", "shape": [2], "data_offsets": [10, 12], "x": 1},
                               "a": {"dtype": "I16", "shape": [2, 1], "data_offsets": [2, 6]},
                               "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]},
                               "f": {"dtype": "F64", "shape": [0], "data_offsets": [16, 16]}}     )",
                           16);
  json meta;
  auto ts = parse_safetensors(b.data(), b.size(), "ok.safetensors", &meta);
  ASSERT_EQ(ts.size(), 4u);
  EXPECT_EQ(ts[0].name, "a");  // data order
  EXPECT_EQ(ts[0].offset, 2u);
  EXPECT_EQ(ts[0].data[0], 2);  // raw_safetensors fills data byte i with i
  EXPECT_EQ(ts[1].name, "e");
  EXPECT_EQ(ts[2].name, "b");
  EXPECT_EQ(ts[2].data[1], 11);
  EXPECT_EQ(ts[3].name, "f");
  EXPECT_TRUE(meta.is_object() && meta.empty());
}

}  // namespace
}  // namespace arbor
