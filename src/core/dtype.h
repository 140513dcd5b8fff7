// Element types of tensors and their scalar conversions (f16/bf16 <-> f32).
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace arbor {

enum class DType : uint8_t { F32, F16, BF16, F64, I8, U8, I16, U16, I32, U32, I64, U64, BOOL, F8_E4M3, F8_E5M2 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // the safetensors spelling: "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view s);
inline bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// The types weights and activations are read from as floats (load_float).
inline bool float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Element i of an F32, F16 or BF16 array as f32 (any other dtype: 0).
inline float load_float(const void* p, DType t, int64_t i) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, b + 4 * i, 4);
    return f;
  }
  if (t != DType::F16 && t != DType::BF16) return 0;
  uint16_t h;
  std::memcpy(&h, b + 2 * i, 2);
  return t == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

}  // namespace arbor
