// KV-cache codecs (formats.md §4): how one head's row of K or V (head_dim values of one token) is stored
// in a paged KV block, with scalar reference encoders and decoders. The kernels that read codes live in
// the backends and are tested against these.
//
// Codecs (one for K and one for V, per layer; KVCodecPair):
//   plain        the backend's own KV type (f32 on the CPU, bf16 on CUDA); spelled "bf16".
//   affine<b>    b-bit unsigned codes, groups of 64 along head_dim, value = code * scale + bias (MLX's
//                affine quantize: the larger-magnitude extreme is the bias, so it and 0 are exact).
//   k<kb>v<vb>   TurboQuant, groups of 32: keys affine (8-bit signed codes around an f16 zero point,
//                2..6-bit unsigned), values rotated by a sign-flipped, normalised Walsh–Hadamard
//                transform and coded with Lloyd-Max centroids for a unit Gaussian (2..4 bits), one
//                f16 RMS scale per group; head_dim 64/128/256/512.
//
// Byte layout of one head row (head_dim d, groups of g, G = d/g groups, b bits): the codes first, as a
// flat little-endian bit stream (element j at bit j*b of the row; 8-bit codes are bytes, int8 for
// TurboQuant keys), then G f16 scales, then (affine and TurboQuant keys) G f16 biases / zero points.
// Row bytes: d*b/8 + 2G (TurboQuant values) or d*b/8 + 4G (the others). A token's KV in one layer is
// n_kv_heads such rows for K and as many for V; docs/kv-cache.md has the totals.
// Included by backend.h, hence by CUDA sources compiled as C++17: keep this header C++17.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

namespace arbor {

enum class KVCodecKind : uint8_t { Plain, Affine, TurboKey, TurboValue };

// One side's (K or V) codec.
struct KVCodec {
  KVCodecKind kind = KVCodecKind::Plain;
  int bits = 0;   // code bits (0: plain)
  int group = 0;  // values per scale along head_dim (0: plain)

  bool plain() const { return kind == KVCodecKind::Plain; }
  // Bytes of one head row of d values; a plain row holds d values of plain_bytes each.
  int64_t row_bytes(int64_t d, int64_t plain_bytes) const {
    if (plain()) return d * plain_bytes;
    const int64_t G = d / group;
    return d * bits / 8 + (kind == KVCodecKind::TurboValue ? 2 : 4) * G;
  }
  bool operator==(const KVCodec& o) const { return kind == o.kind && bits == o.bits && group == o.group; }
  bool operator!=(const KVCodec& o) const { return !(*this == o); }

  static KVCodec affine(int bits) { return {KVCodecKind::Affine, bits, 64}; }
  static KVCodec turbo_key(int bits) { return {KVCodecKind::TurboKey, bits, 32}; }
  static KVCodec turbo_value(int bits) { return {KVCodecKind::TurboValue, bits, 32}; }
};

// A layer's K and V codecs, named as --kv-cache spells them: "bf16", "affine8", "k8v3".
struct KVCodecPair {
  KVCodec k, v;
  bool plain() const { return k.plain() && v.plain(); }
  std::string name() const {
    if (plain()) return "bf16";
    if (k.kind == KVCodecKind::Affine && k == v) return fmt::format("affine{}", k.bits);
    if (k.kind == KVCodecKind::TurboKey && v.kind == KVCodecKind::TurboValue) return fmt::format("k{}v{}", k.bits, v.bits);
    return "mixed";  // not made by parse_kv_codec
  }
  // Bytes of one token's K and V in one layer.
  int64_t token_bytes(int64_t n_kv_heads, int64_t head_dim, int64_t plain_bytes) const {
    return n_kv_heads * (k.row_bytes(head_dim, plain_bytes) + v.row_bytes(head_dim, plain_bytes));
  }
  bool operator==(const KVCodecPair& o) const { return k == o.k && v == o.v; }
};

// "bf16", "affine<b>" (b in 2..8), "k<kb>v<vb>" (kb in 2..6 or 8, vb in 2..4). Throws naming the text.
KVCodecPair parse_kv_codec(const std::string& name);
// The per-layer spec of --kv-cache: comma-separated entries, one bare codec (every layer; default bf16)
// and any number of LAYERS:codec overrides, where LAYERS is a layer index (negative: from the end, -1 the
// last layer) or an inclusive range A..B; later entries win. "k8v3,0:bf16,-1:bf16" keeps the first and
// last layers plain. Checks every chosen codec against head_dim (check_kv_codec). One pair per layer.
std::vector<KVCodecPair> resolve_kv_cache_spec(const std::string& spec, int64_t n_layers, int64_t head_dim);
// Throws unless the codec can code rows of head_dim values (groups divide it; TurboQuant: a power of
// two in 64..512).
void check_kv_codec(const KVCodecPair& c, int64_t head_dim);

// Reference encoder / decoder of one head row (not plain). decode gives the values as stored: for
// TurboQuant values that includes the inverse rotation.
void kv_encode_row(const KVCodec& c, const float* x, int64_t d, uint8_t* out);
void kv_decode_row(const KVCodec& c, const uint8_t* in, int64_t d, float* x);
// TurboQuant values in the rotated domain (centroid * scale), before turbo_unrotate.
void kv_decode_row_rotated(const KVCodec& c, const uint8_t* in, int64_t d, float* y);

// The code of element j of a b-bit little-endian bit stream, and setting it (the row must start zeroed).
inline uint32_t kv_get_code(const uint8_t* codes, int64_t j, int bits) {
  const int64_t bit = j * bits;
  const uint8_t* p = codes + (bit >> 3);
  uint32_t w = uint32_t(p[0]) | (uint32_t(p[1]) << 8);  // b <= 8: a code spans at most two bytes
  return (w >> (bit & 7)) & ((1u << bits) - 1);
}
void kv_set_code(uint8_t* codes, int64_t j, int bits, uint32_t code);

// TurboQuant's rotation: y = FWHT(x ⊙ signs) / sqrt(d), and its inverse x = FWHT(y) / sqrt(d) ⊙ signs
// (the normalised transform is its own inverse). d a power of two.
void fwht(float* x, int64_t n);  // unnormalised, in place
const float* turbo_signs(int64_t d);  // the fixed ±1 vector (a prefix of one sequence, d <= 512)
void turbo_rotate(const float* x, int64_t d, float* y);
void turbo_unrotate(const float* y, int64_t d, float* x);
// Lloyd-Max centroids of a unit Gaussian at `bits` (2..4), 2^bits of them, ascending.
const float* lloyd_max_centroids(int bits);

}  // namespace arbor
