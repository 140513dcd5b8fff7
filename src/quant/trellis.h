// Trellis weights (QTIP bitshift trellis, "1MAD" code; the mlx-bun layout, formats.md §3): the
// per-module config entry, the geometry of a tensor pair (.weight uint32 codes, .scales f16), and the
// host decode reference every kernel is tested against. The encoder is trellis_encode.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/tensor.h"

namespace arbor::quant {

// The 1MAD code: an L-bit state maps to a unit-variance value through one multiply-add mod 2^32 and a
// byte sum. 510 is the mean of a sum of four uniform bytes, 147.800537109375 its standard deviation.
inline constexpr uint32_t kTrellis1madMul = 34038481u;
inline constexpr uint32_t kTrellis1madAdd = 76625530u;
inline constexpr float kTrellis1madStd = 147.800537109375f;  // exact in f32

// y in [-510, 510]: the byte sum of state*34038481 + 76625530 (mod 2^32), minus 510.
inline int trellis_1mad_y(uint32_t state) {
  const uint32_t x = state * kTrellis1madMul + kTrellis1madAdd;
  return int((x & 0xff) + ((x >> 8) & 0xff) + ((x >> 16) & 0xff) + (x >> 24)) - 510;
}
// The code value as the kernels compute it: (float)y times the f32 reciprocal of the std (mlx-bun's
// served f32 product; within 1 ulp of the exact quotient y / 147.800537109375).
inline float trellis_1mad_value(uint32_t state) { return float(trellis_1mad_y(state)) * (1.0f / kTrellis1madStd); }

// The shape of a code: L state bits, T weights per block, k bits per weight. The format fixes L = 12,
// T = 256, k in {2, 3, 4}; tests use smaller blocks and states to check the encoder exhaustively.
struct TrellisParams {
  int k = 2;
  int L = 12;
  int T = 256;
  int states() const { return 1 << L; }
  int block_bits() const { return T * k; }
  int words_per_block() const { return T * k / 32; }  // 16, 24, 32 for k = 2, 3, 4 at T = 256
};
// Fails unless 1 <= k <= L <= 16, T >= 2 and T*k >= L (a block's bit string holds a whole state);
// `packed` also asks for T*k to be a multiple of 32 (whole words per block).
void check_trellis_params(const TrellisParams& p, bool packed);

// The value of every state (2^L of them), and their RMS (sqrt of the mean square; 1.00411 at L = 12).
std::vector<float> trellis_code_table(int L);
double trellis_code_rms(int L);

// State t of a packed block: the L-bit window at bit offset (T-1-t)*k (bit i of the block is bit i&31
// of word i>>5), read LSB-first and wrapping from the block's end to its start (tail-biting).
inline uint32_t trellis_state(const uint32_t* block, const TrellisParams& p, int t) {
  const int pos = (p.T - 1 - t) * p.k, wpb = p.words_per_block();
  const int wi = pos >> 5, off = pos & 31;
  uint32_t win = block[wi] >> off;
  if (off + p.L > 32) win |= block[wi + 1 == wpb ? 0 : wi + 1] << (32 - off);
  return win & ((1u << p.L) - 1u);
}

// Decoded weights: code value times the row's scale, in f32 (no intermediate rounding).
void trellis_decode_block(const uint32_t* block, const TrellisParams& p, float scale, float* out);  // out[T]
void trellis_decode_row(const uint32_t* row, int64_t cols, const TrellisParams& p, float scale, float* out);

// The per-module quantization entry {"mode": "trellis", "bits": k, "group_size": 256,
// "trellis": {"L": 12, "code": "1mad", "axis": 0|1}}.
struct TrellisConfig {
  int bits = 0;
  int group_size = 256;
  int L = 12;
  int axis = 1;  // 1: coded along the input dim, stored [out, in*k/32]; 0: stored transposed [in, out*k/32]
  TrellisParams params() const { return {bits, L, group_size}; }
};
bool is_trellis_entry(const json& entry);  // an object whose "mode" is "trellis"
// Errors name the module: "trellis: module 'model.layers.0.mlp.down_proj': bits 5 (supported: 2, 3, 4)".
TrellisConfig parse_trellis_config(const json& entry, const std::string& module);
json trellis_config_json(const TrellisConfig& c);  // the entry parse_trellis_config reads back

// A trellis tensor pair, checked. The stored matrix is [rows, cols], coded along cols in blocks of T.
struct TrellisGeometry {
  TrellisParams params;
  int axis = 1;
  int64_t rows = 0, cols = 0;  // stored: axis 1 [out, in], axis 0 [in, out]
  int64_t in_features = 0, out_features = 0;
  // k = 3, axis 0 only: the weight lies as [cols/512, rows, 48] (two blocks per 48-word row, block
  // pairs outermost) and must be de-interleaved (trellis_deinterleave_k3) before the plain decode.
  bool interleaved = false;
  int64_t words_per_row() const { return cols / params.T * params.words_per_block(); }
};
// Checks `weight` (U32 [rows, cols*k/32], or [cols/512, rows, 48] for the interleaved k = 3 axis-0
// layout) and `scales` (F16 [rows]) against the config; when expect_out / expect_in are >= 0 the
// decoded linear must be [expect_out, expect_in]. Errors name `name` (the module or tensor).
TrellisGeometry trellis_geometry(const std::string& name, const TrellisConfig& cfg, const Tensor& weight,
                                 const Tensor& scales, int64_t expect_out = -1, int64_t expect_in = -1);

// The interleaved k = 3 axis-0 layout <-> the plain one: interleaved[g][r][h*24 + w] holds
// plain[r][(2g + h)*24 + w] (h: which block of the pair, w: word within the block).
std::vector<uint32_t> trellis_deinterleave_k3(const uint32_t* interleaved, int64_t rows, int64_t cols);
std::vector<uint32_t> trellis_interleave_k3(const uint32_t* plain, int64_t rows, int64_t cols);

// The decoded linear weight, f32 [out, in] (axis 0 is transposed back). `words` is the plain layout
// [rows, words_per_row]; `scales_f16` [rows].
std::vector<float> trellis_decode_linear(const TrellisGeometry& g, const uint32_t* words, const uint16_t* scales_f16);
// The same from the tensors trellis_geometry checked (de-interleaving when needed).
std::vector<float> trellis_decode_linear(const TrellisGeometry& g, const Tensor& weight, const Tensor& scales);

}  // namespace arbor::quant
