// Compatibility with the reference implementation (the Hugging Face `safetensors` package): a file arbor wrote
// (committed, checked by the reference reader in tests/io/reference_safetensors.py) must stay byte-identical, and
// a file the reference wrote must read back to the values the reference recorded beside it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/json.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace arbor {
namespace {

const std::string kData = std::string(ARBOR_SOURCE_DIR) + "/tests/io/data/";

// The tensors of arbor_written.safetensors. reference_safetensors.py rebuilds the same values with torch from
// the same formulas; keep the two in step.
struct Fixture {
  std::vector<float> f32;      // [3, 5]: (i % 7) * 0.25 - 1
  std::vector<uint16_t> f16;   // [2, 3]: same formula, exact in f16
  std::vector<uint16_t> bf16;  // [4]:    same formula, exact in bf16
  std::vector<double> f64 = {0.1, -3.0};
  std::vector<int64_t> i64 = {-5, int64_t(1) << 40};
  std::vector<uint8_t> u8 = {0, 128, 255};
  std::vector<uint8_t> boolean = {1, 0};
  float scalar = 2.5f;
  std::vector<TensorToWrite> tensors;
  Fixture() {
    for (int i = 0; i < 15; ++i) f32.push_back(float(i % 7) * 0.25f - 1.f);
    for (int i = 0; i < 6; ++i) f16.push_back(f32_to_f16(f32[i]));
    for (int i = 0; i < 4; ++i) bf16.push_back(f32_to_bf16(f32[i]));
    tensors = {{"layers.0.f32", DType::F32, {3, 5}, f32.data(), 60},
               {"layers.0.f16", DType::F16, {2, 3}, f16.data(), 12},
               {"bf16", DType::BF16, {4}, bf16.data(), 8},
               {"f64", DType::F64, {2}, f64.data(), 16},
               {"i64", DType::I64, {2, 1}, i64.data(), 16},
               {"u8", DType::U8, {3}, u8.data(), 3},
               {"bool", DType::BOOL, {2}, boolean.data(), 2},
               {"scalar", DType::F32, {}, &scalar, 4},
               {"empty", DType::BF16, {0, 2}, nullptr, 0}};
  }
};

const json kFixtureMeta = {{"format", "pt"}, {"producer", "arbor"}};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(SafetensorsReference, WriterOutputIsStable) {
  Fixture fx;
  std::string bytes = serialize_safetensors(fx.tensors, kFixtureMeta);
  const std::string path = kData + "arbor_written.safetensors";
  if (std::getenv("ARBOR_REGENERATE_FIXTURES")) write_safetensors(path, fx.tensors, kFixtureMeta);
  // The committed bytes were loaded and checked value by value by the reference reader.
  EXPECT_EQ(bytes, read_bytes(path)) << "the writer's output changed; regenerate with ARBOR_REGENERATE_FIXTURES=1 and "
                                        "re-check it with tests/io/reference_safetensors.py";
}

// Decodes element i of a tensor to double, whatever its dtype (the fixture uses no F8).
double element(const TensorInfo& t, size_t i) {
  const uint8_t* p = t.data + i * dtype_size(t.dtype);
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t.dtype) {
    case DType::F32: return load(float{});
    case DType::F64: return load(double{});
    case DType::F16: return f16_to_f32(load(uint16_t{}));
    case DType::BF16: return bf16_to_f32(load(uint16_t{}));
    case DType::I8: return load(int8_t{});
    case DType::U8: case DType::BOOL: return load(uint8_t{});
    case DType::I16: return load(int16_t{});
    case DType::U16: return load(uint16_t{});
    case DType::I32: return load(int32_t{});
    case DType::U32: return load(uint32_t{});
    case DType::I64: return double(load(int64_t{}));
    case DType::U64: return double(load(uint64_t{}));
    default: fail("test: no decoder for {}", dtype_name(t.dtype));
  }
}

TEST(SafetensorsReference, ReadsWhatTheReferenceWrote) {
  // reference_written.safetensors: written by safetensors.torch.save_file; reference_written.json: the names,
  // dtypes, shapes and element values torch had in memory.
  SafetensorsFile f(kData + "reference_written.safetensors");
  json want = read_json_file(kData + "reference_written.json");
  EXPECT_EQ(f.metadata(), want["metadata"]);
  ASSERT_EQ(f.tensors().size(), want["tensors"].size());
  for (auto it = want["tensors"].begin(); it != want["tensors"].end(); ++it) {
    const TensorInfo* t = f.find(it.key());
    ASSERT_NE(t, nullptr) << it.key();
    EXPECT_EQ(dtype_name(t->dtype), (*it)["dtype"].get<std::string>()) << it.key();
    EXPECT_EQ(t->shape, (*it)["shape"].get<std::vector<int64_t>>()) << it.key();
    const json& vals = (*it)["values"];
    ASSERT_EQ(size_t(t->numel()), vals.size()) << it.key();
    for (size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(element(*t, i), vals[i].get<double>()) << it.key() << "[" << i << "]";
  }
}

}  // namespace
}  // namespace arbor
