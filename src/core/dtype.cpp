// Element types: sizes, names, and IEEE half conversions.
#include "core/dtype.h"

namespace arbor {

namespace {
struct DTypeInfo {
  DType t;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kTypes[] = {
    {DType::F32, "F32", 4},    {DType::F16, "F16", 2},         {DType::BF16, "BF16", 2},
    {DType::F64, "F64", 8},    {DType::I8, "I8", 1},           {DType::U8, "U8", 1},
    {DType::I16, "I16", 2},    {DType::U16, "U16", 2},         {DType::I32, "I32", 4},
    {DType::U32, "U32", 4},    {DType::I64, "I64", 8},         {DType::U64, "U64", 8},
    {DType::BOOL, "BOOL", 1},  {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};
}  // namespace

size_t dtype_size(DType t) { return kTypes[size_t(t)].size; }
std::string_view dtype_name(DType t) { return kTypes[size_t(t)].name; }

std::optional<DType> dtype_from_name(std::string_view s) {
  for (const auto& i : kTypes)
    if (i.name == s) return i.t;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        man <<= 1;
        ++e;
      } while (!(man & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00);  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // overflow to inf (rounded)
  if (absu < 0x38800000u) {                                 // subnormal or zero in f16
    if (absu < 0x33000000u) return uint16_t(sign);
    uint32_t e = absu >> 23;
    uint32_t man = (absu & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e;  // 113 - e + 13
    uint32_t r = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - (uint32_t(127 - 15) << 23);
  return uint16_t(sign | (r >> 13));
}

}  // namespace arbor
