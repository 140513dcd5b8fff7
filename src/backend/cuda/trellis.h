// Trellis weights on the device (QTIP bitshift trellis, 1MAD code, L = 12, blocks of 256; formats.md §3): the
// layout CudaBackend::load_linear uploads and the decode GEMV (trellis_gemv.cu) reads.
//
// The device Linear holds: data = the words in the plain layout, U32 [coded rows, coded cols*k/32] (the k = 3
// axis-0 interleaved file layout is de-interleaved on the host first; quant::trellis_deinterleave_k3);
// scales = F32 [coded rows], the file's f16 scale as f32 (exact). Axis 1: coded rows are the output rows,
// coded along the inputs; axis 0: coded rows are the input columns, coded along the outputs (the transposed
// down projection). trellis_weights() reads that back (checking it). Plain C++ (no fmt, no CUDA headers): .cu
// files include it too.
//
// Decode of weight t of a 256-weight block (words w[0..wpb)): the 12-bit window at bit (255-t)*k, wrapping
// from the block's end to its start; x = state*34038481 + 76625530 (mod 2^32); y = bytesum(x) - 510;
// weight = float(y) * (1/147.800537109375) * scale. The kernels sum y·x per coded row (axis 1) or y·(x·scale)
// (axis 0) in f32 and apply the constant factors once, so they agree with quant::trellis_decode_linear's f32
// weights to f32 rounding (not bit for bit).
#pragma once
#include <cstdint>
#include <cstring>

struct CUstream_st;  // cudaStream_t without the CUDA headers

namespace arbor {
struct Linear;
}

namespace arbor::cuda {

struct TrellisWeights {
  const uint32_t* words;  // [coded rows, coded cols*bits/32], plain layout
  const float* scales;    // [coded rows]
  int64_t rows, cols;     // the linear's [out, in]
  int bits, axis;
  int64_t coded_rows() const { return axis == 1 ? rows : cols; }
  int64_t coded_cols() const { return axis == 1 ? cols : rows; }
};

// The device view of a trellis Linear that CudaBackend::load_linear returned. Fails (arbor::Error) naming the
// layer when it is not one: another format, host tensors, or tensors not in the layout above.
TrellisWeights trellis_weights(const Linear& l);

// ---- the lane decode the kernels use (host-callable, so a CPU test checks its index math) ------------------
// Lane l of a warp decodes weights 8l..8l+7 of a 256-weight block. Their bits, with the 12-bit windows of all
// eight, are the 7k + 12 bits from bit (248 - 8l)·k: inside words trellis_lane_word and trellis_lane_word2
// (the next one, wrapping to word 0 for lane 0: tail-biting), from bit trellis_lane_off of the first. The
// lane aligns them once (lo = funnel(w0, w1, off), hi = w1 >> off); weight 8l + j's y is then
// trellis_lane_y<K>(lo, hi, j).
#if defined(__CUDACC__)
#define ARBOR_TRELLIS_HD __host__ __device__ __forceinline__
#else
#define ARBOR_TRELLIS_HD inline
#endif
template <int K>
ARBOR_TRELLIS_HD int trellis_lane_word(int lane) {
  return ((248 - 8 * lane) * K) >> 5;
}
template <int K>
ARBOR_TRELLIS_HD int trellis_lane_word2(int lane) {
  return trellis_lane_word<K>(lane) + 1 == 8 * K ? 0 : trellis_lane_word<K>(lane) + 1;
}
template <int K>
ARBOR_TRELLIS_HD int trellis_lane_off(int lane) {
  return ((248 - 8 * lane) * K) & 31;
}
// Bits [s, s + 32) of the pair hi:lo, s in 0..31 (__funnelshift_r).
ARBOR_TRELLIS_HD uint32_t trellis_funnel(uint32_t lo, uint32_t hi, int s) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, unsigned(s));
#else
  return uint32_t(((uint64_t(hi) << 32) | lo) >> (s & 31));
#endif
}
// y = bytesum(state·34038481 + 76625530) - 510 as an exact float: __dp4a sums the bytes into the accumulator
// 0x4B000000 (the float 2^23), giving the float 2^23 + bytesum; subtracting 2^23 + 510 is exact.
ARBOR_TRELLIS_HD float trellis_y_of_state(uint32_t state) {
  const uint32_t x = state * 34038481u + 76625530u;
#if defined(__CUDA_ARCH__)
  const uint32_t d = __dp4a(x, 0x01010101u, 0x4B000000u);
  return __uint_as_float(d) - (8388608.0f + 510.0f);
#else
  const uint32_t d = 0x4B000000u + (x & 0xff) + ((x >> 8) & 0xff) + ((x >> 16) & 0xff) + (x >> 24);
  float f;
  std::memcpy(&f, &d, 4);
  return f - (8388608.0f + 510.0f);
#endif
}
// The lane's span aligned to bit 0 of hi:lo, from its two words.
ARBOR_TRELLIS_HD void trellis_lane_align(uint32_t w0, uint32_t w1, int off, uint32_t& lo, uint32_t& hi) {
  lo = trellis_funnel(w0, w1, off), hi = w1 >> off;
}
template <int K>
ARBOR_TRELLIS_HD float trellis_lane_y(uint32_t lo, uint32_t hi, int j) {
  const int s = (7 - j) * K;  // a constant once the callers' loops are unrolled; < 32
  return trellis_y_of_state((s == 0 ? lo : trellis_funnel(lo, hi, s)) & 0xfffu);
}
// Axis 0's output chunks: lane (g, j) of output group og (64 outputs of a 256-output block) decodes the 8 outputs of
// chunk trellis_a0_chunk(og, g) (8 consecutive outputs, the FP32 kernels' lane decode of two words).
ARBOR_TRELLIS_HD int trellis_a0_chunk(int og, int g) { return 8 * og + g; }

// ---- the integer tensor-core kernels' maps (host-callable: tests/quant/trellis_cuda_lane_test.cpp runs them
// through an emulation of mma.sync m16n8k32's registers) ----------------------------------------------------
// The 1MAD weight is bytesum(lcg(state)) - 510, so Σ_i y_i·q_i = Σ_i Σ_bytes byte·q_i - 510·Σ_i q_i: the LCG word
// itself is four u8 entries of A (k slots 4i..4i+3 of input i) against q_i repeated in four s8 entries of B, and
// mma.sync m16n8k32 (u8 x s8, s32 accumulate) does the byte sums and the products at once. Lane (g = lane/4,
// j = lane%4) decodes weights 64j .. 64j+63 of each block of its rows: their bits start at (192 - 64j)·k, in the
// 2k words from trellis_im_word0 plus the next word of the block (lane (g, j-1 mod 4)'s first: tail-biting for
// j = 0); weight 64j + r's state is trellis_im_state(W, r) of those 2k + 1 words. MMA m (0..31) of a block takes
// lane-relative weights 2m (A's k slots 4j..4j+3, B's rows 4j..4j+3) and 2m + 1 (slots 16 + 4j..).
template <int K>
ARBOR_TRELLIS_HD int trellis_im_word0(int j) {
  return (6 - 2 * j) * K;
}
template <int K>
ARBOR_TRELLIS_HD uint32_t trellis_im_state(const uint32_t* W, int r) {
  const int rel = (63 - r) * K, w = rel >> 5, off = rel & 31;  // constants once the kernel's loops are unrolled
  return (off + 12 <= 32 ? W[w] >> off : trellis_funnel(W[w], W[w + 1], off)) & 0xfffu;
}
ARBOR_TRELLIS_HD uint32_t trellis_lcg(uint32_t state) { return state * 34038481u + 76625530u; }
// Activations enter as integers per block of 256 inputs: q = rint(x · kTrellisImQ / max|x|) in [-16256, 16256], x ≈ q ·
// max/kTrellisImQ, split q = 128·hi + lo (hi in [-127, 127], lo in [0, 127]): two s8 columns of B per activation row
// (2t: hi, 2t + 1: lo), so an activation keeps 15 bits against its block's largest.
constexpr float kTrellisImQ = 16256.0f;
ARBOR_TRELLIS_HD int trellis_im_q(float v, float inv) {
  const float r = v * inv;
  const int q = int(r + (r >= 0.0f ? 0.5f : -0.5f));  // half away from zero; |r| <= kTrellisImQ
  return q > 16256 ? 16256 : q < -16256 ? -16256 : q;
}
// Staged x in shared memory: column c (2t + part) at c · trellis_im_col_stride(blocks) bytes; in it, the 64 inputs
// 64j.. of block b (lane j's) at (4b + j) · 80 (16 bytes of padding a segment, and a column stride of 64 mod 128:
// the 8 lanes of each 16-byte load phase hit 8 distinct bank groups).
ARBOR_TRELLIS_HD int64_t trellis_im_seg(int64_t b, int j) { return (4 * b + j) * 80; }
ARBOR_TRELLIS_HD int64_t trellis_im_col_stride(int64_t blocks) { return blocks * 320 + (blocks % 2 == 0 ? 64 : 0); }
// Axis 0 (trellis_imma_axis0_kernel): outputs are A's rows, inputs its k. Lane (g, j) of output group og decodes
// chunk trellis_a0_chunk(og, g) (8 outputs, the FP32 kernels' lane decode) of input rows i0 + 2j (A's k slots
// 4j..4j+3) and i0 + 2j + 1 (slots 16 + 4j..) of an 8-input step: weights h[s][e], s the row, e the output. MMA m
// (0..3) takes outputs 2m (A row g) and 2m + 1 (row g + 8): A register r is h[r >> 1][2m + (r & 1)]. B register s
// is staged column g's byte at input i0 + 2j + s, repeated. C register i is output 8·chunk + 2m + (i >> 1) and
// column 2j + (i & 1) (activation row j of the n-tile, hi or lo). Staged x·scale/std: groups of 64 inputs, each
// its own scale; column c at c · trellis_ia0_col_stride(rows) bytes (a multiple of 64 plus 8: the 16 words a warp's
// 2-byte load touches lie in 16 distinct banks).
ARBOR_TRELLIS_HD int trellis_ia0_out(int chunk, int m, int i) { return 8 * chunk + 2 * m + (i >> 1); }
ARBOR_TRELLIS_HD int64_t trellis_ia0_col_stride(int64_t rows) { return (rows + 63) / 64 * 64 + 8; }
#undef ARBOR_TRELLIS_HD

// ---- trellis_gemv.cu: decode GEMV, 1..kTrellisGemvMaxRows rows of bf16 activations -----------------------
// y [T, rows] = x [T, cols] · Wᵀ (+ bias f32 [rows]), each weight decoded once in registers (two word loads
// per 8 weights, a funnel shift and mask per weight, the 1MAD multiply-add, the byte sum with __dp4a whose
// accumulator is the bits of 2^23 so the sum lands as an exact float). Axis 1: a warp owns two output rows
// (K split over up to 8 warps for small N), lane l decodes weights 8l..8l+7 of each block and FMAs them with
// x; axis 0: a block of 8 warps owns 256 outputs and a range of input rows (x·scale staged in shared memory),
// lane l accumulates outputs 8l..8l+7 over its warp's rows; ranges split over blocks write f32 partials to
// `scratch` (trellis_gemv_scratch_floats) that a second kernel sums in a fixed order. y bf16 or f32.
// 9-16 rows: the integer kernels still decode each weight once for all rows (four n-tiles of 4 rows); the FP32 ones
// (and axis 1's integer kernel where the rows of staged x would not fit: 16 rows past 4096 inputs, 6 past 12288) run
// launches of 8 rows.
constexpr int64_t kTrellisGemvMaxRows = 16;
// Up to kTrellisGemvMaxSegments axis-1 matrices over the same x in one launch (fused q/k/v: the same k and
// columns), each into its own y; and the gated form: gate and up (axis 1, the same shape) into
// y = act(bf16(gate)) * bf16(up) rounded to bf16 (act: an ActOp's value), as linear + activation store it.
constexpr int kTrellisGemvMaxSegments = 3;
struct TrellisGemvOut {
  TrellisWeights w;
  const float* bias;  // [w.rows] or null
  void* y;            // [T, w.rows]; gated: unused
};
// scratch: trellis_gemv_fused_scratch_floats(cols, T) floats (may be null when that is 0; without it the launch still
// runs, staging x in every CTA).
void launch_trellis_gemv_multi(const TrellisGemvOut* outs, int n, const uint16_t* x, bool y_f32, int64_t T, float* scratch, int n_sms,
                               CUstream_st* s);
void launch_trellis_gemv_gated(const TrellisGemvOut& gate, const TrellisGemvOut& up, int act, const uint16_t* x, uint16_t* y, int64_t T,
                               float* scratch, int n_sms, CUstream_st* s);
int64_t trellis_gemv_fused_scratch_floats(int64_t cols, int64_t T);
// Which GEMVs run launches of 1..16 rows: 1 the integer tensor-core ones (trellis_gemv.cu's trellis_imma_kernel,
// trellis_imma_axis0_kernel; axis 1 only where K <= 8192), 0 the FP32 ones; -1 back to the environment's choice
// (ARBOR_CUDA_TRELLIS_MMA=0: FP32; otherwise the integer ones). Tests and A/B runs.
void set_trellis_gemv_mma(int mode);
// The integer kernels' variants, as ARBOR_CUDA_TRELLIS_V / _MT / _PREPASS set them (-1: back to the environment's;
// unset, the defaults: 1, 2, 1): variant 0 (window by shift and mask) or 1 (by an IMAD lift and a shift), small_tiles
// 0 (32-row tiles), 1 (16-row tiles where 32-row ones leave under two a SM) or 2 (16-row tiles everywhere), prepass 0
// (x staged in every CTA), 1 (once per launch from 2 rows) or 2 (at every row count); wide_ctas (ARBOR_CUDA_TRELLIS_W16,
// unset 1) 1 runs 9..16 rows in CTAs of 16 warps, 0 in CTAs of 8; occupancy (ARBOR_CUDA_TRELLIS_OCC, unset 0) 1 runs 1-4 rows
// of one-m-tile launches in instances bounded to 64 registers (four CTAs an SM). Tests and A/B runs.
void set_trellis_gemv_options(int variant, int small_tiles, int prepass, int wide_ctas = -1, int occupancy = -1);
// The encoder's Viterbi on the GPU (trellis_encode.cu): for each of `blocks` blocks of 256 targets (code
// units, host memory, [blocks][256]) the tail-biting path quant::TrellisViterbi::encode_block chooses with
// TailBiting::rotate (L = 12, k 2/3/4), bit for bit, into states[blocks][256] (host). Targets must be finite.
void cuda_trellis_viterbi(int k, const float* targets, int64_t blocks, uint16_t* states);

// Floats of scratch launch_trellis_gemv needs for these weights and rows (0: none): axis 0's split partials, axis 1's
// staged-x image (the integer kernel's pre-pass).
int64_t trellis_gemv_scratch_floats(const TrellisWeights& w, int64_t T, int n_sms);
void launch_trellis_gemv(const TrellisWeights& w, const uint16_t* x, const float* bias, void* y, bool y_f32, int64_t T, float* scratch,
                         int n_sms, CUstream_st* s);

// Rows [row0, row0 + n) of W ([rows, cols] = [out, in]) decoded to bf16 [n, cols] at out (16-byte aligned):
// bf16((y · (1/147.800537109375)) · scale), quant::trellis_decode_linear's f32 weights rounded to bf16. For
// many activation rows CudaBackend decodes W a slice at a time and runs cuBLASLt on it. Axis 0: row0 and n
// whole blocks of 256 (its blocks run along the outputs).
void launch_trellis_decode(const TrellisWeights& w, int64_t row0, int64_t n, uint16_t* out, int n_sms, CUstream_st* s);

// Seconds per trellis GEMV y[T, N] = x[T, K]·Wᵀ (random words, unit scales, bf16 out) on `axis`, median of
// reps, rotating over enough weight copies (> 256 MiB) that L2 holds none (arbor bench-linear --device cuda
// --format trellis; the bandwidth test).
double time_trellis_gemv(int64_t N, int64_t K, int64_t T, int bits, int axis, int reps);
// The bytes one such call reads from its weights: the words plus the f32 scales.
inline double trellis_weight_bytes(int64_t N, int64_t K, int bits, int axis) {
  return double(N) * double(K) * bits / 8.0 + double(axis == 1 ? N : K) * 4.0;
}

}  // namespace arbor::cuda
