// MLX affine (group-wise) weights (formats.md §2): the config block, the packing of codes, and the host
// quantize/dequantize references, bit for bit as MLX's quantize kernels (Metal and CUDA) compute them.
//
// For a row of `cols` weights and groups of G along it, per group (all in float32):
//   w_min = min(w), w_max = max(0, max(w))         (MLX's GPU kernels start the max at 0)
//   scale = max((w_max - w_min) / (2^B - 1), 1e-7)
//   side  = |w_min| > |w_max|;  if !side: scale = -scale
//   edge  = side ? w_min : w_max;  q0 = round(edge / scale)
//   if q0 != 0: scale = edge / q0, bias = edge     (the edge value is exactly representable)
//   else:       bias = 0
//   code  = min(round((w - bias) / scale), 2^B - 1)  (never below 0 by construction)
// round is half away from zero. The stored scale and bias are the float32 values cast to the model's dtype
// (bf16/f16 round to nearest even); codes use the float32 values. value = scale * code + bias.
// MLX's CPU kernel differs in two corners: it rounds half to even (std::rint) and starts the max at -inf, so a
// group whose values are all negative gets a negative scale anchored at its max there. mlx-community
// checkpoints come from the GPU kernels (mlx_lm.convert on Apple silicon), which this follows.
//
// Packing: a row's codes form one little-endian bit stream, code j at bits [j*B, j*B + B), stored as uint32
// words: [rows, cols*B/32]. For B = 2, 4, 8 a word holds 32/B whole codes; for 3, 5 and 6 bits a code may
// straddle two words (MLX packs 8, 8 and 4 codes into 3, 5 and 3 bytes, the same stream).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/json.h"
#include "quant/trellis.h"

namespace arbor {
class ThreadPool;
}

namespace arbor::quant {

struct AffineParams {
  int group_size = 64;
  int bits = 4;
  bool operator==(const AffineParams&) const = default;
};

inline constexpr int kAffineBits[] = {2, 3, 4, 5, 6, 8};
inline constexpr int kAffineGroupSizes[] = {32, 64, 128};
bool affine_bits_supported(int bits);
bool affine_group_supported(int group_size);
// Fails "<what>: ..." unless bits is one of 2/3/4/5/6/8 and group_size one of 32/64/128.
void check_affine_params(const AffineParams& p, std::string_view what);

// Geometry of a quantized [rows, cols] matrix. Fails "<what>: ..." naming the numbers when cols is not a
// multiple of the group size (every supported group size is a multiple of 32, so the words come out whole).
struct AffineShape {
  int64_t rows = 0, cols = 0;
  AffineParams p;
  int64_t words_per_row() const { return cols * p.bits / 32; }
  int64_t groups_per_row() const { return cols / p.group_size; }
};
AffineShape affine_shape(int64_t rows, int64_t cols, const AffineParams& p, std::string_view what);

// Reads / writes code j of a row's bit stream.
inline uint32_t affine_get_code(const uint32_t* row, int64_t j, int bits) {
  const uint64_t bit = uint64_t(j) * uint64_t(bits);
  const uint64_t w = bit >> 5;
  const int off = int(bit & 31);
  uint64_t v = row[w] >> off;
  if (off + bits > 32) v |= uint64_t(row[w + 1]) << (32 - off);
  return uint32_t(v) & ((1u << bits) - 1);
}
// The row must start zeroed; codes are OR-ed in.
inline void affine_or_code(uint32_t* row, int64_t j, int bits, uint32_t code) {
  const uint64_t bit = uint64_t(j) * uint64_t(bits);
  const uint64_t w = bit >> 5;
  const int off = int(bit & 31);
  row[w] |= code << off;
  if (off + bits > 32) row[w + 1] |= code >> (32 - off);
}

// One group's scale and bias in float32 (the values the codes are computed with).
struct AffineGroup {
  float scale = 0, bias = 0;
};
AffineGroup affine_group_params(const float* w, int n, int bits);
// The code of one value given its group's float32 parameters.
uint32_t affine_code(float w, const AffineGroup& g, int bits);

// Quantizes one row of `cols` float32 values: packed gets cols*bits/32 words (overwritten), scales and biases
// cols/group_size float32 values each. cols must be a multiple of the group size.
void affine_quantize_row(const float* w, int64_t cols, const AffineParams& p, uint32_t* packed, float* scales, float* biases);

// Quantizes a [rows, cols] matrix stored as `src_dtype` (F32, F16 or BF16): packed [rows, words_per_row],
// scales and biases [rows, groups_per_row] stored as `out_dtype` (F32, F16 or BF16). Values are first rounded
// to out_dtype when it differs (mlx-lm casts a model to its dtype before quantizing). Rows are independent and
// split over `pool` when given; the result does not depend on the split. Fails naming `what` for an
// unsupported dtype, a bad shape, or a value that is not finite (naming its row and column).
void affine_quantize(const void* src, DType src_dtype, const AffineShape& s, uint32_t* packed, void* scales,
                     void* biases, DType out_dtype, std::string_view what, ThreadPool* pool = nullptr);

// The reference dequantization: out[r*cols + j] = float(scale) * code + float(bias), scale and bias read from
// `dtype` (F32, F16 or BF16), one float multiply and one float add (not fused).
void affine_dequantize(const uint32_t* packed, const void* scales, const void* biases, DType dtype, const AffineShape& s,
                       float* out);

// config.json's quantization block (formats.md §2).
struct AffineQuantConfig {
  AffineParams defaults;
  // Per-module overrides keyed by module path ("model.layers.0.mlp.down_proj"): params, or nullopt for a
  // module the config keeps dense (an entry `false`).
  std::map<std::string, std::optional<AffineParams>, std::less<>> modules;
  // The parameters for a module: its override when there is one, else the defaults; nullopt when the config
  // keeps it dense. (Whether a module is quantized at all is decided by its .scales tensor being present.)
  std::optional<AffineParams> for_module(std::string_view path) const;
  json to_json() const;  // {"group_size", "bits", "mode": "affine", module: {...} or false ...}

  // Trellis modules (formats.md §3) in the same block: per-module entries with "mode": "trellis", and a block
  // whose own mode is "trellis" (its group_size/bits/trellis are then the default for every module without an
  // entry; `defaults` keeps its affine default and serves no module). trellis_for(path): the module's trellis
  // entry, else nullopt when it has another entry, else trellis_default.
  std::map<std::string, TrellisConfig, std::less<>> trellis;
  std::optional<TrellisConfig> trellis_default;
  std::optional<TrellisConfig> trellis_for(std::string_view path) const;
};
// Reads `quantization`, else `quantization_config` (mlx-lm writes both; a config holding both uses the
// first), from a model config. nullopt when neither is present. Fails "<where>: quantization...: ..." naming
// the key for: a block that is not an object, a missing or non-integer group_size/bits, unsupported values, a
// mode other than "affine", a quant_method (another format's block: awq, gptq, fp8, ...), and a module entry
// that is neither an object with group_size/bits nor a bool (true: the defaults, as mlx-lm's loader reads it).
// Trellis entries (mode "trellis", the block's own or a module's) are read by parse_trellis_config, errors
// naming the module.
std::optional<AffineQuantConfig> parse_affine_quant_config(const json& config, std::string_view where);

}  // namespace arbor::quant
