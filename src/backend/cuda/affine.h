// MLX affine weights on the device (formats.md §2): the layout CudaBackend::load_linear uploads and every
// affine kernel reads. Codes stay packed exactly as in the file; each group's scale and bias travel as one
// 32-bit word (scale in the low 16 bits, bias in the high 16), in their file dtype (bf16 or f16, never
// rounded from one to the other; F32 scales/biases, which MLX does not write for bf16/f16 models, are
// rounded to bf16 as dense F32 weights are). value = float(scale) * code + float(bias).
//
// The device Linear holds them as: data = codes, U32 [rows, cols*bits/32]; scales = the pairs, BF16 or F16
// [rows, cols/group_size, 2] (element 0 of a pair the scale, 1 the bias: the same bytes as the words
// above, little-endian); biases empty. affine_weights() reads that back (checking it). Plain C++ (no fmt,
// no CUDA headers): .cu files include it too.
#pragma once
#include <cstdint>

namespace arbor {
struct Linear;
}

namespace arbor::cuda {

struct AffineWeights {
  const uint32_t* codes;  // [rows, cols*bits/32] exactly as in the file: code j of a row at bit j*bits of its stream
  const uint32_t* sb;     // [rows, cols/group_size]: scale in the low 16 bits, bias in the high 16
  bool sb_f16;            // false: bf16 pair, true: f16 pair
  int64_t rows, cols;
  int bits, group_size;
};

// The device view of an affine Linear that CudaBackend::load_linear returned. Fails (arbor::Error) naming
// the layer when it is not one: another format, host tensors, or tensors not in the layout above.
AffineWeights affine_weights(const Linear& l);

}  // namespace arbor::cuda
