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

}  // namespace
