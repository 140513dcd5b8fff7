// The CUDA trellis kernels' lane decode (backend/cuda/trellis.h: which two words a lane reads, the alignment
// shift, the per-weight shift, the __dp4a byte sum into the float 2^23), run on the host, against the format's
// reference (quant::trellis_state, quant::trellis_1mad_y): every lane of random blocks, k 2/3/4, including the
// windows that wrap from the block's end to its start. The GPU runs the same functions (its intrinsics in place
// of the host emulation: __funnelshift_r, __dp4a, __uint_as_float); tests/cuda/trellis_gemv_test.cpp checks
// the kernels themselves.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cuda/trellis.h"
#include "quant/trellis.h"

using namespace arbor;

namespace {

template <int K>
void check_lanes(std::mt19937& rng) {
  const quant::TrellisParams p{K, 12, 256};
  std::vector<uint32_t> block(size_t(p.words_per_block()));
  for (int rep = 0; rep < 64; ++rep) {
    for (auto& w : block) w = uint32_t(rng());
    if (rep == 0) std::fill(block.begin(), block.end(), 0xffffffffu);  // every state 4095
    if (rep == 1) std::fill(block.begin(), block.end(), 0u);           // every state 0
    for (int lane = 0; lane < 32; ++lane) {
      const int a = cuda::trellis_lane_word<K>(lane), b = cuda::trellis_lane_word2<K>(lane), off = cuda::trellis_lane_off<K>(lane);
      ASSERT_GE(a, 0);
      ASSERT_LT(a, p.words_per_block());
      ASSERT_LT(b, p.words_per_block());
      ASSERT_LE(off + 7 * K + 12, 64) << "k=" << K << " lane " << lane << ": the span leaves the two words";
      uint32_t lo, hi;
      cuda::trellis_lane_align(block[size_t(a)], block[size_t(b)], off, lo, hi);
      for (int j = 0; j < 8; ++j) {
        const int t = 8 * lane + j;
        const float want = float(quant::trellis_1mad_y(quant::trellis_state(block.data(), p, t)));
        ASSERT_EQ(cuda::trellis_lane_y<K>(lo, hi, j), want) << "k=" << K << " lane " << lane << " weight " << t << " rep " << rep;
      }
    }
  }
}

TEST(TrellisCudaLane, LaneDecodeIsTheReference) {
  std::mt19937 rng(11);
  check_lanes<2>(rng);
  check_lanes<3>(rng);
  check_lanes<4>(rng);
}

// The float trick covers every state: 2^23 + bytesum is exact and the subtraction gives y exactly.
TEST(TrellisCudaLane, ByteSumFloatIsExactForEveryState) {
  for (uint32_t s = 0; s < 4096; ++s) ASSERT_EQ(cuda::trellis_y_of_state(s), float(quant::trellis_1mad_y(s))) << s;
}

// trellis_mma_axis0_kernel's fragment map through an emulation of mma.sync.m16n8k16's registers (PTX ISA: A
// row-major, lane (g, j) holding A[g][2j..2j+1], A[g+8][2j..], A[g][2j+8..], A[g+8][2j+8..]; B holding
// B[2j..2j+1][g], B[2j+8..2j+9][g]; C holding C[g][2j], C[g][2j+1], C[g+8][2j], C[g+8][2j+1]): for each output
// group of a block and one 16-row step, the lanes' decoded weights h[r][e] placed as the kernel places them,
// the MMAs done on the emulated matrices, and each accumulator read back through trellis_a0_out / _act must be
// Σ_i W[i][o]·x[t][i] over the step's rows, every (output, activation row) of the group exactly once, and each
// A element written by exactly one lane.
TEST(TrellisCudaLane, Axis0MmaFragmentsComputeTheGemv) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-20, 20);
  // Small integers: every product and sum exact in double, so the check is equality.
  std::vector<double> W(16 * 256), x(8 * 16);
  for (auto& v : W) v = small(rng);
  for (auto& v : x) v = small(rng);
  for (int og = 0; og < 4; ++og) {
    std::vector<int> covered(256 * 8, 0);
    for (int m = 0; m < 4; ++m) {
      double A[16][16], B[16][8];
      int a_writes[16][16] = {};
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, j = lane % 4, chunk = cuda::trellis_a0_chunk(og, g);
        auto h = [&](int r, int e) { return W[size_t(cuda::trellis_a0_input(j, r) * 256 + 8 * chunk + e)]; };
        const int arow[4] = {g, g + 8, g, g + 8}, acol[4] = {2 * j, 2 * j, 2 * j + 8, 2 * j + 8};
        for (int a = 0; a < 4; ++a) {
          int r, e;
          cuda::trellis_a0_areg(m, a, r, e);
          A[arow[a]][acol[a]] = h(r, e), A[arow[a]][acol[a] + 1] = h(r + 1, e);
          ++a_writes[arow[a]][acol[a]], ++a_writes[arow[a]][acol[a] + 1];
        }
        for (int b = 0; b < 2; ++b) {
          // The kernel loads B register b from inputs 2j + 8b and 2j + 8b + 1: they must be rows (j, 2b), (j, 2b+1).
          ASSERT_EQ(cuda::trellis_a0_input(j, 2 * b), 2 * j + 8 * b);
          ASSERT_EQ(cuda::trellis_a0_input(j, 2 * b + 1), 2 * j + 8 * b + 1);
          B[2 * j + 8 * b][g] = x[size_t(g * 16 + 2 * j + 8 * b)], B[2 * j + 8 * b + 1][g] = x[size_t(g * 16 + 2 * j + 8 * b + 1)];
        }
      }
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) ASSERT_EQ(a_writes[r][c], 1) << "og " << og << " m " << m << " A[" << r << "][" << c << "]";
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, j = lane % 4, chunk = cuda::trellis_a0_chunk(og, g);
        const int crow[4] = {g, g, g + 8, g + 8}, ccol[4] = {2 * j, 2 * j + 1, 2 * j, 2 * j + 1};
        for (int i = 0; i < 4; ++i) {
          double c = 0;
          for (int kk = 0; kk < 16; ++kk) c += A[crow[i]][kk] * B[kk][ccol[i]];
          const int o = cuda::trellis_a0_out(chunk, m, i), t = cuda::trellis_a0_act(j, i);
          ASSERT_GE(o, 64 * og);
          ASSERT_LT(o, 64 * og + 64);
          double want = 0;
          for (int in = 0; in < 16; ++in) want += W[size_t(in * 256 + o)] * x[size_t(t * 16 + in)];
          ASSERT_EQ(c, want) << "og " << og << " m " << m << " lane " << lane << " i " << i << " (output " << o << ", row " << t << ")";
          ++covered[size_t(o * 8 + t)];
        }
      }
    }
    for (int o = 64 * og; o < 64 * og + 64; ++o)
      for (int t = 0; t < 8; ++t) ASSERT_EQ(covered[size_t(o * 8 + t)], 1) << "og " << og << " output " << o << " row " << t;
  }
}

}  // namespace
