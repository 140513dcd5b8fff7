// Tests of the safetensors writer and reader: round trips of every dtype and odd shape, and the writer's checks.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "io_test_util.h"

namespace arbor {
namespace {

using test::error_of;
using test::random_bytes;
using test::TempDir;

struct Owned {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<TensorToWrite> views(const std::vector<Owned>& ts) {
  std::vector<TensorToWrite> out;
  for (const auto& t : ts) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

Owned make(std::string name, DType dt, std::vector<int64_t> shape, uint32_t seed) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return {std::move(name), dt, std::move(shape), random_bytes(size_t(n) * dtype_size(dt), seed)};
}

void expect_same(const std::vector<Owned>& want, const SafetensorsFile& f) {
  ASSERT_EQ(f.tensors().size(), want.size());
  for (const auto& w : want) {
    const TensorInfo* t = f.find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, w.dtype) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
    ASSERT_EQ(t->nbytes, w.bytes.size()) << w.name;
    EXPECT_EQ(int64_t(t->nbytes), t->numel() * int64_t(dtype_size(t->dtype))) << w.name;
    EXPECT_TRUE(t->nbytes == 0 || std::memcmp(t->data, w.bytes.data(), t->nbytes) == 0) << w.name;
    EXPECT_EQ(t->file, f.path());
    EXPECT_GE(t->data, f.mapping().data());
    EXPECT_LE(t->data + t->nbytes, f.mapping().data() + f.mapping().size());
  }
}

TEST(Safetensors, RoundTripEveryDtypeAndOddShapes) {
  TempDir dir;
  std::vector<Owned> ts;
  uint32_t seed = 1;
  for (int d = 0; d <= int(DType::F8_E5M2); ++d) {
    DType dt = DType(d);
    std::string n(dtype_name(dt));
    ts.push_back(make("w." + n, dt, {3, 5, 7}, seed++));
    ts.push_back(make("scalar." + n, dt, {}, seed++));
    ts.push_back(make("empty." + n, dt, {0, 4}, seed++));
    ts.push_back(make("vec." + n, dt, {13}, seed++));
  }
  ts.push_back(make("empty.last_dim", DType::BF16, {7, 0}, seed++));
  ts.push_back(make("rank5", DType::F16, {1, 2, 1, 3, 1}, seed++));
  json meta = {{"format", "pt"}, {"note", "unicode ✓"}};
  write_safetensors(dir.file("a.safetensors"), views(ts), meta);
  SafetensorsFile f(dir.file("a.safetensors"));
  expect_same(ts, f);
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.find("absent"), nullptr);
  EXPECT_EQ(f.find("scalar.F32")->numel(), 1);
  EXPECT_EQ(f.find("empty.F32")->numel(), 0);
}

TEST(Safetensors, FloatValuesSurviveTheRoundTrip) {
  // Values written as f32/f16/bf16 decode to the same floats (the bytes are little-endian as on x86).
  std::vector<float> vals = {0.f, -1.5f, 3.140625f, 65504.f, -2.f, 1e-3f, 7.f};
  std::vector<uint16_t> h, b;
  for (float v : vals) h.push_back(f32_to_f16(v)), b.push_back(f32_to_bf16(v));
  std::vector<TensorToWrite> w = {{"f32", DType::F32, {7}, vals.data(), 28},
                                  {"f16", DType::F16, {7}, h.data(), 14},
                                  {"bf16", DType::BF16, {1, 7}, b.data(), 14}};
  std::string bytes = serialize_safetensors(w);
  auto ts = parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem");
  ASSERT_EQ(ts.size(), 3u);
  for (const auto& t : ts) {
    for (size_t i = 0; i < vals.size(); ++i) {
      float got;
      if (t.dtype == DType::F32) {
        std::memcpy(&got, t.data + 4 * i, 4);
      } else {
        uint16_t u;
        std::memcpy(&u, t.data + 2 * i, 2);
        got = t.dtype == DType::F16 ? f16_to_f32(u) : bf16_to_f32(u);
      }
      float want = t.dtype == DType::F32 ? vals[i] : t.dtype == DType::F16 ? f16_to_f32(h[i]) : bf16_to_f32(b[i]);
      EXPECT_EQ(got, want) << t.name << "[" << i << "]";
    }
  }
}

TEST(Safetensors, WriterLaysOutDataInOrderWithAlignedHeader) {
  std::vector<Owned> ts = {make("z", DType::U8, {3}, 1), make("a", DType::F32, {2}, 2), make("m", DType::BF16, {5}, 3)};
  std::string bytes = serialize_safetensors(views(ts));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 3 + 8 + 10);
  auto parsed = parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem");
  ASSERT_EQ(parsed.size(), 3u);  // returned in data order, which is the given order
  EXPECT_EQ(parsed[0].name, "z");
  EXPECT_EQ(parsed[0].offset, 0u);
  EXPECT_EQ(parsed[1].name, "a");
  EXPECT_EQ(parsed[1].offset, 3u);
  EXPECT_EQ(parsed[2].name, "m");
  EXPECT_EQ(parsed[2].offset, 11u);
  // The header is plain JSON the reference reader understands: __metadata__ absent when empty.
  json h = json::parse(bytes.substr(8, n));
  EXPECT_FALSE(h.contains("__metadata__"));
  EXPECT_EQ(h["m"]["data_offsets"], json({11, 21}));
  EXPECT_EQ(h["a"]["dtype"], "F32");
}

TEST(Safetensors, EmptyFileHasNoTensors) {
  TempDir dir;
  write_safetensors(dir.file("e.safetensors"), {});
  SafetensorsFile f(dir.file("e.safetensors"));
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().is_object());
  EXPECT_TRUE(f.metadata().empty());
}

TEST(Safetensors, FileMovesKeepPointersValid) {
  TempDir dir;
  std::vector<Owned> ts = {make("a", DType::F32, {4, 4}, 7)};
  write_safetensors(dir.file("m.safetensors"), views(ts));
  SafetensorsFile f(dir.file("m.safetensors"));
  SafetensorsFile g(std::move(f));
  expect_same(ts, g);
}

TEST(Safetensors, WriterRejectsBadInput) {
  std::vector<uint8_t> buf(64);
  EXPECT_NE(error_of([&] { serialize_safetensors({{"a", DType::F32, {3}, buf.data(), 8}}); })
                .find("tensor 'a': shape [3] of F32 needs 12 bytes, got 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              serialize_safetensors({{"a", DType::U8, {1}, buf.data(), 1}, {"a", DType::U8, {1}, buf.data(), 1}});
            }).find("'a' is empty, reserved or used twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] { serialize_safetensors({{"__metadata__", DType::U8, {1}, buf.data(), 1}}); })
                .find("reserved"),
            std::string::npos);
  EXPECT_NE(error_of([&] { serialize_safetensors({{"a", DType::U8, {-1}, buf.data(), 1}}); }).find("negative"),
            std::string::npos);
  EXPECT_NE(error_of([&] { serialize_safetensors({}, json{{"k", 3}}); }).find("metadata 'k' is a JSON number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_safetensors("/nonexistent-dir/x.safetensors", {}); }).find("cannot create"),
            std::string::npos);
}

}  // namespace
}  // namespace arbor
