// The CUDA trellis kernels' lane decode (backend/cuda/trellis.h: which two words a lane reads, the alignment
// shift, the per-weight shift, the __dp4a byte sum into the float 2^23), run on the host, against the format's
// reference (quant::trellis_state, quant::trellis_1mad_y): every lane of random blocks, k 2/3/4, including the
// windows that wrap from the block's end to its start. The GPU runs the same functions (its intrinsics in place
// of the host emulation: __funnelshift_r, __dp4a, __uint_as_float); and the integer tensor-core kernels' maps
// (which words and windows a lane decodes, where its MMA operands and accumulators sit, the staged x layout)
// through an emulation of mma.sync m16n8k32. tests/cuda/trellis_gemv_test.cpp checks the kernels themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
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

namespace {

// trellis_imma_kernel's maps through an emulation of mma.sync.m16n8k32 (u8 A, s8 B, s32 C; PTX ISA: lane (g, j)
// holds A[g][4j..4j+3], A[g+8][4j..], A[g][16+4j..], A[g+8][16+4j..] as registers 0..3, B[4j..4j+3][g] and
// B[16+4j..][g], and C[g][2j], C[g][2j+1], C[g+8][2j], C[g+8][2j+1]): one block of 16 rows, each lane's words taken
// as the kernel takes them (trellis_im_word0, the neighbour's first word), x for four activation rows quantized
// with trellis_im_q and staged at trellis_im_seg's offsets, the 32 MMAs of the block done on the emulated
// matrices. Each accumulator pair must give Σ_i y_i·q_i exactly (128·(C_hi - 510·Σhi) + C_lo - 510·Σlo), every
// weight of every row entering exactly once.
template <int K>
void check_imma_block(std::mt19937& rng) {
  const quant::TrellisParams p{K, 12, 256};
  const int wpb = p.words_per_block();
  std::vector<uint32_t> words(size_t(16 * wpb));
  for (auto& w : words) w = uint32_t(rng());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(4 * 256);
  for (auto& v : x) v = nd(rng) * (rng() % 7 == 0 ? 50.0f : 1.0f);
  // Staging, as the kernel's prologue: columns 2t (hi) and 2t + 1 (lo), one block (b = 0).
  const int64_t cs = cuda::trellis_im_col_stride(1);
  std::vector<int8_t> xs(size_t(8 * cs), 0);
  std::vector<int> q(4 * 256);
  int64_t hsum[4] = {}, lsum[4] = {};
  for (int t = 0; t < 4; ++t) {
    float m = 0;
    for (int i = 0; i < 256; ++i) m = std::max(m, std::fabs(x[size_t(t * 256 + i)]));
    const float inv = cuda::kTrellisImQ / m;
    for (int i = 0; i < 256; ++i) {
      const int v = cuda::trellis_im_q(x[size_t(t * 256 + i)], inv), hi = v >> 7, lo = v & 127;
      ASSERT_GE(hi, -127);
      ASSERT_LE(hi, 127);
      ASSERT_EQ(hi * 128 + lo, v);
      q[size_t(t * 256 + i)] = v, hsum[t] += hi, lsum[t] += lo;
      const int64_t off = cuda::trellis_im_seg(0, i / 64) + i % 64;
      xs[size_t(2 * t * cs + off)] = int8_t(hi), xs[size_t((2 * t + 1) * cs + off)] = int8_t(lo);
    }
  }
  int64_t C[16][8] = {};
  std::vector<int> seen(16 * 256, 0);
  for (int mm = 0; mm < 32; ++mm) {
    int A[16][32], B[32][8];
    int a_writes[16][32] = {};
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, j = lane % 4, nbr = (j + 3) & 3;
      for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        const uint32_t* blk = words.data() + size_t(row * wpb);
        uint32_t W[2 * K + 1];
        for (int e = 0; e < 2 * K; ++e) W[e] = blk[cuda::trellis_im_word0<K>(j) + e];
        W[2 * K] = blk[cuda::trellis_im_word0<K>(nbr)];  // the shuffle from lane (g, nbr)
        for (int s = 0; s < 2; ++s) {
          const int r = 2 * mm + s, t = 64 * j + r;
          const uint32_t st = cuda::trellis_im_state<K>(W, r);
          ASSERT_EQ(st, quant::trellis_state(blk, p, t)) << "k=" << K << " lane " << lane << " weight " << t;
          ++seen[size_t(row * 256 + t)];
          const uint32_t word = cuda::trellis_lcg(st);
          for (int e = 0; e < 4; ++e) {
            A[row][16 * s + 4 * j + e] = int((word >> (8 * e)) & 0xff);
            ++a_writes[row][16 * s + 4 * j + e];
          }
        }
      }
      // B registers: the staged column g's bytes at the lane's inputs, repeated over four k slots.
      for (int s = 0; s < 2; ++s) {
        const int r = 2 * mm + s;
        const int8_t v = xs[size_t(g * cs + cuda::trellis_im_seg(0, j) + r)];
        for (int e = 0; e < 4; ++e) B[16 * s + 4 * j + e][g] = v;
      }
    }
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 32; ++c) ASSERT_EQ(a_writes[r][c], 1) << "MMA " << mm << " A[" << r << "][" << c << "]";
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n)
        for (int kk = 0; kk < 32; ++kk) C[r][n] += int64_t(A[r][kk]) * B[kk][n];
  }
  for (int i = 0; i < 16 * 256; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "row " << i / 256 << " weight " << i % 256;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      const int row = g + 8 * h;
      const int64_t c_hi = C[row][2 * t], c_lo = C[row][2 * t + 1];
      ASSERT_LT(std::llabs(c_hi), int64_t(1) << 31);
      const int64_t got = 128 * (c_hi - 510 * hsum[t]) + (c_lo - 510 * lsum[t]);
      int64_t want = 0;
      for (int i = 0; i < 256; ++i)
        want += int64_t(quant::trellis_1mad_y(quant::trellis_state(words.data() + size_t(row * wpb), p, i))) * q[size_t(t * 256 + i)];
      ASSERT_EQ(got, want) << "k=" << K << " row " << row << " activation row " << t;
      ASSERT_LT(std::llabs(c_hi - 510 * hsum[t]), int64_t(1) << 24) << "the kernel's float conversion is exact below 2^24";
    }
  }
}

TEST(TrellisCudaLane, IntegerMmaMapsComputeTheBlockSums) {
  std::mt19937 rng(17);
  for (int rep = 0; rep < 3; ++rep) {
    check_imma_block<2>(rng);
    check_imma_block<3>(rng);
    check_imma_block<4>(rng);
  }
}

// The staged segments: the 8 lanes of each 16-byte shared load phase (g in {2p, 2p + 1}, j 0..3, the same chunk)
// read 8 distinct 16-byte bank groups, for any block and column pair.
TEST(TrellisCudaLane, IntegerMmaStagingIsConflictFree) {
  for (int64_t blocks : {1, 2, 16, 17, 32})
    for (int64_t b = 0; b < blocks; ++b)
      for (int u = 0; u < 4; ++u)
        for (int p = 0; p < 4; ++p) {
          std::set<int64_t> groups;
          for (int g = 2 * p; g < 2 * p + 2; ++g)
            for (int j = 0; j < 4; ++j) groups.insert(((g * cuda::trellis_im_col_stride(blocks) + cuda::trellis_im_seg(b, j) + 16 * u) % 128) / 16);
          ASSERT_EQ(groups.size(), 8u) << "blocks " << blocks << " b " << b << " chunk " << u << " phase " << p;
        }
}

}  // namespace

namespace {

// trellis_imma_axis0_kernel's map, the same emulation: one 8-input step of a 256-output block's output group og,
// every lane decoding its chunk of input rows 2j and 2j + 1 through the FP32 kernels' lane decode into LCG words,
// placed as A registers (trellis.h: register r of MMA m is h[r >> 1][2m + (r & 1)]), B from the staged columns
// (hi, lo of activation row t in columns 2t, 2t + 1); each C register read back through trellis_ia0_out must be
// Σ_inputs bytesum·hi (or lo) for its output and column, each (output, activation row) once.
template <int K>
void check_imma_axis0_step(std::mt19937& rng) {
  const quant::TrellisParams p{K, 12, 256};
  const int wpb = p.words_per_block();
  std::vector<uint32_t> words(size_t(8 * wpb));  // 8 input rows, one block of 256 outputs each
  for (auto& w : words) w = uint32_t(rng());
  std::uniform_int_distribution<int> qd(-16256, 16256);
  int qv[4][8];  // activation row t, input i
  for (auto& r : qv)
    for (int& v : r) v = qd(rng);
  const int64_t ld = cuda::trellis_ia0_col_stride(64);
  std::vector<int8_t> xs(size_t(8 * ld), 0);
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 8; ++i) xs[size_t(2 * t * ld + i)] = int8_t(qv[t][i] >> 7), xs[size_t((2 * t + 1) * ld + i)] = int8_t(qv[t][i] & 127);
  for (int og = 0; og < 4; ++og) {
    std::vector<int> covered(256 * 4, 0);
    for (int m = 0; m < 4; ++m) {
      int A[16][32], B[32][8];
      int a_writes[16][32] = {};
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, j = lane % 4, chunk = cuda::trellis_a0_chunk(og, g);
        uint32_t h[2][8];
        for (int sr = 0; sr < 2; ++sr) {
          const uint32_t* blk = words.data() + size_t((2 * j + sr) * wpb);
          uint32_t lo, hi;
          cuda::trellis_lane_align(blk[cuda::trellis_lane_word<K>(chunk)], blk[cuda::trellis_lane_word2<K>(chunk)], cuda::trellis_lane_off<K>(chunk), lo, hi);
          for (int e = 0; e < 8; ++e) {
            const int sh = (7 - e) * K;
            const uint32_t st = (sh == 0 ? lo : cuda::trellis_funnel(lo, hi, sh)) & 0xfffu;
            ASSERT_EQ(st, quant::trellis_state(blk, p, 8 * chunk + e));
            h[sr][e] = cuda::trellis_lcg(st);
          }
        }
        const int arow[4] = {g, g + 8, g, g + 8}, acol[4] = {4 * j, 4 * j, 16 + 4 * j, 16 + 4 * j};
        for (int r = 0; r < 4; ++r) {
          const uint32_t word = h[r >> 1][2 * m + (r & 1)];
          for (int e = 0; e < 4; ++e) A[arow[r]][acol[r] + e] = int((word >> (8 * e)) & 0xff), ++a_writes[arow[r]][acol[r] + e];
        }
        for (int sr = 0; sr < 2; ++sr)
          for (int e = 0; e < 4; ++e) B[16 * sr + 4 * j + e][g] = xs[size_t(g * ld + 2 * j + sr)];
      }
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 32; ++c) ASSERT_EQ(a_writes[r][c], 1) << "og " << og << " MMA " << m << " A[" << r << "][" << c << "]";
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, j = lane % 4, chunk = cuda::trellis_a0_chunk(og, g);
        const int crow[4] = {g, g, g + 8, g + 8}, ccol[4] = {2 * j, 2 * j + 1, 2 * j, 2 * j + 1};
        for (int i = 0; i < 4; ++i) {
          int64_t c = 0;
          for (int kk = 0; kk < 32; ++kk) c += int64_t(A[crow[i]][kk]) * B[kk][ccol[i]];
          const int o = cuda::trellis_ia0_out(chunk, m, i), t = j;
          int64_t want = 0;
          for (int in = 0; in < 8; ++in) {
            const int part = (i & 1) ? qv[t][in] & 127 : qv[t][in] >> 7;
            want += int64_t(quant::trellis_1mad_y(quant::trellis_state(words.data() + size_t(in * wpb), p, o)) + 510) * part;
          }
          ASSERT_EQ(c, want) << "k=" << K << " og " << og << " MMA " << m << " lane " << lane << " register " << i;
          if ((i & 1) == 0) ++covered[size_t(o * 4 + t)];
        }
      }
    }
    for (int o = 64 * og; o < 64 * og + 64; ++o)
      for (int t = 0; t < 4; ++t) ASSERT_EQ(covered[size_t(o * 4 + t)], 1) << "og " << og << " output " << o << " row " << t;
  }
}

TEST(TrellisCudaLane, IntegerMmaAxis0MapComputesTheStep) {
  std::mt19937 rng(23);
  check_imma_axis0_step<2>(rng);
  check_imma_axis0_step<3>(rng);
  check_imma_axis0_step<4>(rng);
}

// Its staged columns: the 16 words one 2-byte load of a warp touches (lane (g, j): column g, byte 2j of a step)
// lie in 16 distinct banks, for rows per block that are multiples of 64.
TEST(TrellisCudaLane, IntegerMmaAxis0StagingIsConflictFree) {
  for (int64_t rpc : {64, 128, 192, 1024})
    for (int64_t at = 0; at < rpc; at += 8) {
      std::set<int64_t> words, banks;
      for (int g = 0; g < 8; ++g)
        for (int j = 0; j < 4; ++j) words.insert((g * cuda::trellis_ia0_col_stride(rpc) + at + 2 * j) / 4);
      for (int64_t w : words) banks.insert(w % 32);
      ASSERT_EQ(words.size(), 16u);
      ASSERT_EQ(banks.size(), 16u) << "rows " << rpc << " at " << at;
    }
}

}  // namespace
