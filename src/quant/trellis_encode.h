// The trellis encoder (host side): per block of T weights a Viterbi search over the 2^L states for
// the tail-biting path whose 1MAD values are closest in squared error, packing into the words
// trellis.h decodes, row scales, and a matrix encode threaded over rows.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "quant/trellis.h"

namespace arbor::quant {

// Which Viterbi step kernel runs. All give bit-identical paths (same operations, same tie rule: the
// lowest predecessor wins); the SIMD ones need L - k >= 4 (AVX-512) or >= 3 (AVX2), else scalar runs.
enum class TrellisIsa { scalar, avx2, avx512 };
bool trellis_isa_supported(TrellisIsa isa);  // does this CPU run it
TrellisIsa trellis_best_isa();
const char* trellis_isa_name(TrellisIsa isa);

// Tail-biting (the first state's high L-k bits are the last state's low L-k bits: the window of the
// last weights wraps to the block's start). `rotate` is QTIP's Algorithm 4: Viterbi without the
// constraint over the block rotated by T/2, whose path at the original t = 0 fixes those shared bits
// (the "overlap"), then one Viterbi constrained to that overlap. `exact` tries every overlap
// (2^(L-k) runs) and keeps the best: the optimum, for tests and for measuring what rotate loses.
enum class TailBiting { rotate, exact };

// One thread's Viterbi: owns the cost and back-pointer scratch for its TrellisParams.
class TrellisViterbi {
 public:
  explicit TrellisViterbi(const TrellisParams& p, TrellisIsa isa = trellis_best_isa());
  ~TrellisViterbi();
  TrellisViterbi(const TrellisViterbi&) = delete;
  TrellisViterbi& operator=(const TrellisViterbi&) = delete;

  const TrellisParams& params() const { return p_; }
  TrellisIsa isa() const { return isa_; }

  // The path s_0..s_{T-1} (each s_t = (s_{t-1} << k | b_t) mod 2^L) minimising sum_t (x_t - value(s_t))^2
  // over x[T] (targets in code units). overlap < 0: any start and end; overlap >= 0: only tail-biting
  // paths with s_0 >> k == overlap == s_{T-1} mod 2^(L-k). Writes states[T]; returns the squared error.
  double path(const float* x, int overlap, uint16_t* states);
  // The tail-biting path for one block; returns its squared error.
  double encode_block(const float* x, uint16_t* states, TailBiting mode = TailBiting::rotate);

 private:
  TrellisParams p_;
  TrellisIsa isa_;
  std::vector<float> value_, value_sq_;  // [2^L] code value and its square
  std::vector<float> rotated_;           // [T]
  std::vector<uint16_t> rotated_states_;  // [T]
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;  // costs [2][2^L], back-pointers [T][2^(L-k)]
};

// Packs a tail-biting path into T*k/32 words: symbol b_t = s_t mod 2^k at bit offset (T-1-t)*k.
void trellis_pack_block(const uint16_t* states, const TrellisParams& p, uint32_t* block);
// Whether states[T] is a tail-biting path (every transition, the wrap from s_{T-1} to s_0 included).
bool trellis_is_tail_biting(const uint16_t* states, const TrellisParams& p);

// f16 bits of gain * RMS(row) / code_rms, clamped to the smallest positive f16; an all-zero row gets 1.
// formats.md and issue 20 give gain 1 (the RMS ratio). The 1MAD values are a sum of four uniform bytes,
// bounded at +-3.45 and lighter-tailed than a Gaussian, so a somewhat larger scale serves the tails
// better: on an i.i.d. Gaussian source the distortion falls until a gain of about 1.04 / 1.11 / 1.14 at
// k = 2 / 3 / 4 (measured, docs/benchmarks.md "Trellis encoder (CPU)"), by 0.4% / 3% / 10%.
uint16_t trellis_row_scale(const float* row, int64_t n, double code_rms, float gain = 1.0f);
float trellis_default_scale_gain(int k);  // 1.04, 1.10, 1.14 for k = 2, 3, 4 (the measured optima, rounded down)

// Another Viterbi for whole matrices at once (the GPU's, cuda_trellis_viterbi): the rotate-mode paths of
// blocks[256] finite targets into states[blocks][256], the same paths TrellisViterbi::encode_block chooses.
using TrellisBlockViterbi = std::function<void(int k, const float* targets, int64_t blocks, uint16_t* states)>;

struct TrellisEncodeOptions {
  float scale_gain = 0.0f;  // <= 0: trellis_default_scale_gain(k); 1: the RMS ratio of formats.md
  TailBiting tail_biting = TailBiting::rotate;
  TrellisIsa isa = trellis_best_isa();
  // Set (and tail_biting rotate): the row scales and targets are made on the CPU as always, the paths by it.
  TrellisBlockViterbi block_viterbi;
};

// The paths of many blocks at once: opt.block_viterbi when it is set (and tail_biting rotate), else the CPU's
// TrellisViterbi, blocks spread over the pool, one Viterbi (and its scratch) per thread kept across calls.
class TrellisBlockPaths {
 public:
  TrellisBlockPaths(const TrellisParams& p, ThreadPool* pool, const TrellisEncodeOptions& opt);
  ~TrellisBlockPaths();
  // targets [blocks, T] (code units, finite) -> tail-biting states [blocks, T].
  void run(const float* targets, int64_t blocks, uint16_t* states);

 private:
  TrellisParams p_;
  ThreadPool* pool_;
  const TrellisEncodeOptions& opt_;
  std::vector<std::unique_ptr<TrellisViterbi>> vit_;
};

// An encoded linear: the plain layout [rows, cols*k/32] (never interleaved) and f16 scales [rows].
struct TrellisEncoded {
  TrellisGeometry geometry;
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales;
};

// Encodes the stored matrix [rows, cols] (each row coded along cols; cols a multiple of 256) at k bits,
// rows spread over `pool` (nullptr: this thread). `axis` only labels the result's geometry. Fails on a
// non-finite weight, naming `name` and the row.
TrellisEncoded trellis_encode_stored(const std::string& name, const float* stored, int64_t rows, int64_t cols, int k,
                                     int axis, ThreadPool* pool, const TrellisEncodeOptions& opt = {});
// Encodes a linear weight w [out, in]: axis 1 codes each output row along the input dim; axis 0 codes
// the transpose (stored [in, out]).
TrellisEncoded trellis_encode_linear(const std::string& name, const float* w, int64_t out, int64_t in, int k, int axis,
                                     ThreadPool* pool, const TrellisEncodeOptions& opt = {});

}  // namespace arbor::quant
