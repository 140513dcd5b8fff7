// The device view of an MLX affine-quantized weight (formats.md §2) as CudaBackend::load_linear uploads it.
// This declaration matches the one the device-upload branch (cuaffine) owns in this same file; at merge
// theirs is kept.
#pragma once
#include <cstdint>

namespace arbor::cuda {

struct AffineWeights {
  const uint32_t* codes;  // [rows, cols*bits/32] exactly as in the file: a little-endian bit stream per row, code j at bit j*bits
  const uint32_t* sb;     // [rows, cols/group_size]: scale in the low 16 bits, bias in the high 16
  bool sb_f16;            // false: bf16 pair, true: f16 pair
  int64_t rows, cols;
  int bits, group_size;
};  // w[r][c] = float(scale) * q + float(bias)

}  // namespace arbor::cuda
