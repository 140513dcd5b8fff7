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

struct CUstream_st;  // cudaStream_t without the CUDA headers

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

// ---- affine_gemv.cu: decode GEMV, 1..kAffineGemvMaxRows rows of bf16 activations ------------------------
// y [T, rows] = x [T, cols] · Wᵀ (+ bias f32 [rows]), W dequantized on the fly: per 32-code unit of a row
// (always inside one group) the kernel sums x·(2^bits + code) in f32, then adds scale·that + (bias −
// scale·2^bits)·Σx, Σx the unit's activation sum (= scale·Σx·code + bias·Σx). Every packed byte is read
// once with 16-byte loads where rows are 16-byte aligned. y bf16 or f32.
constexpr int64_t kAffineGemvMaxRows = 8;
// Rows the GEMV takes at `bits`: kAffineGemvMaxRows, or up to kAffineWideMaxRows for 4/8-bit codes where the wide
// kernel is chosen (by default 4-bit to 32 rows, 8-bit to 16; ARBOR_CUDA_AFFINE_WIDE=8|16|32 sets both widths, as does
// set_affine_wide_rows(8|16|32); -1 back to the environment's).
constexpr int64_t kAffineWideMaxRows = 32;
int64_t affine_gemv_max_rows(int bits);
void set_affine_wide_rows(int rows);
// The wide kernel reads x through a pre-pass image in the launch's scratch (B registers in load order, Σx per piece):
// 1 (opt-in, where scratch is given) or 0 (the default: session 30, an H100, the 8B at 4-bit, two rounds: b=16 2381.4 /
// 2362.1 tok/s with it against 2512.9 / 2526.2 without, b=32 3057.6 / 3047.8 against 3018.1 / 3018.5); -1 back to
// ARBOR_CUDA_AFFINE_WIDE_IMG.
void set_affine_wide_image(int on);
struct AffineGemvOut {
  AffineWeights w;
  const float* bias;  // [rows] or null
  void* y;            // [T, rows]
};
// Up to kAffineGemvMaxSegments matrices over the same x (fused q/k/v) in one launch. They must agree on
// cols, bits, group_size and sb_f16 (the launcher checks).
constexpr int kAffineGemvMaxSegments = 3;
// scratch: affine_gemv_scratch_floats(w, T) floats for the v5 kernel's x image (null or none asked: v5 does not run).
void launch_affine_gemv_multi(const AffineGemvOut* outs, int n, const uint16_t* x, bool y_f32, int64_t T, int n_sms, CUstream_st* s,
                              float* scratch = nullptr);
// Floats of scratch a launch of the two launchers here over w's shape and T rows can use (v5's x image; 0 where v5
// does not run): 16·cols bytes plus 64 per group.
int64_t affine_gemv_scratch_floats(const AffineWeights& w, int64_t T);
// Gated MLP input in one launch: y [T, rows] bf16 = act(x · gateᵀ + b) * (x · upᵀ + b), each rounded to
// bf16 before the product (as the unfused ops store them); act: ActOp's order (SiLU, GeLU, GeLUTanh).
void launch_affine_gemv_gated(const AffineGemvOut& gate, const AffineGemvOut& up, int act, const uint16_t* x, uint16_t* y, int64_t T,
                              int n_sms, CUstream_st* s, float* scratch = nullptr);
// Which GEMV kernel the two launchers above run: 1 the register kernel, 2 the tensor-core kernel for 4-
// and 8-bit codes (others still run 1), 3 the same with a cp.async ring of steps in shared memory, 5 the
// integer tensor-core kernel (4-bit codes, x as 15-bit integers; needs scratch), 6 the default but 5 from 2 rows; 0 back
// to the environment (ARBOR_CUDA_AFFINE_GEMV=1/2/3 forces one; unset or 4, the default as measured on an
// H100: for one activation row the streaming kernel (4-bit codes, K a multiple of 1024 up to 16384) or
// else 1, for 2..8 rows 2). Not thread-safe: set it
// before launching (tests, benchmarks).
void set_affine_gemv_variant(int v);
// v2's x loads: 0 just before their MMAs, 1 or 2 pieces ahead (A/B; -1: ARBOR_CUDA_AFFINE_V2_XPF, unset 2).
void set_affine_v2_x_ahead(int pieces);
// v4 (the streaming GEMV): 1 stages x as 16-bit integers per 32 columns and sums code·x with __dp4a, 0 as bf16
// with float FMAs (A/B; -1: ARBOR_CUDA_AFFINE_STREAM_INT, unset 1).
void set_affine_stream_int_x(int on);
// v2/v5's L2 prefetch of the codes and scale/bias words that many steps ahead, 0 none (A/B; -1: ARBOR_CUDA_AFFINE_V2_PF,
// unset: 1 for 4- and 8-bit codes, 0 for the others, as measured).
void set_affine_v2_prefetch(int steps);
// Embedding gather from an affine table: out [T, cols] bf16 = (scale·code + bias) · mul for row tokens[t]
// (an id < 0: picked[-1 - id], as launch_embed); scale·code and + bias rounded separately, as the
// reference dequantization.
void launch_affine_embed(const AffineWeights& w, const int32_t* tokens, const int32_t* picked, int64_t T, float mul, uint16_t* out,
                         CUstream_st* s);

// Seconds per affine GEMV y[T, N] = x[T, K]·Wᵀ (random codes, bf16 scale/bias pairs, bf16 out), median of reps,
// rotating over enough weight copies (> 256 MiB) that L2 holds none (ceilings.cpp; arbor bench-linear).
double time_affine_gemv(int64_t N, int64_t K, int64_t T, int bits, int group_size, int reps);
// The bytes one such call reads from its weights: codes plus the scale/bias words.
inline double affine_weight_bytes(int64_t N, int64_t K, int bits, int group_size) {
  return double(N) * double(K) * bits / 8.0 + double(N) * double(K / group_size) * 4.0;
}

}  // namespace arbor::cuda
