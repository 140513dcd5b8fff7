// The GPU Viterbi (cuda_trellis_viterbi) against the CPU encoder: the same tail-biting path, state for state,
// for k 2/3/4 on Gaussian blocks, blocks with ties everywhere (all zero, constant, a repeated pair), large
// targets, and more blocks than one launch's grid; and `trellis_encode_linear` through the hook giving the
// CPU encoder's words.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cuda/trellis.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "quant/trellis_encode.h"

using namespace arbor;

namespace {

std::vector<float> target_blocks(int64_t blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(size_t(blocks * 256));
  for (auto& v : x) v = n(rng);
  // Special blocks at the front: all zero, constant, alternating, large, the code's extremes.
  for (int t = 0; t < 256; ++t) {
    x[size_t(t)] = 0.0f;
    x[size_t(256 + t)] = 0.75f;
    x[size_t(512 + t)] = t % 2 ? -1.5f : 1.5f;
    x[size_t(768 + t)] = 40.0f * n(rng);
    x[size_t(1024 + t)] = t % 3 ? 3.45f : -3.45f;
  }
  return x;
}

}  // namespace

TEST(CudaTrellisEncode, GpuPathsAreTheCpuPaths) {
  ARBOR_REQUIRE_GPU();
  for (int k : {2, 3, 4}) {
    const int64_t blocks = k == 2 ? 600 : 301;  // 600: more blocks than the grid (2 per SM) on any GPU here
    const std::vector<float> x = target_blocks(blocks, 40 + uint32_t(k));
    std::vector<uint16_t> gpu(size_t(blocks * 256), 0xffff);
    const auto t0 = std::chrono::steady_clock::now();
    cuda::cuda_trellis_viterbi(k, x.data(), blocks, gpu.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ k=%d ] %lld blocks on the GPU in %.3f s (%.3g weights/s, with the copies and first-launch setup)\n", k,
                (long long)blocks, s, double(blocks * 256) / s);
    quant::TrellisViterbi vit(quant::TrellisParams{k, 12, 256});
    std::vector<uint16_t> cpu(256);
    int64_t mismatched = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      vit.encode_block(x.data() + b * 256, cpu.data());
      for (int t = 0; t < 256; ++t)
        if (cpu[size_t(t)] != gpu[size_t(b * 256 + t)]) {
          if (mismatched++ < 5)
            ADD_FAILURE() << "k=" << k << " block " << b << " t=" << t << ": cpu state " << cpu[size_t(t)] << ", gpu " << gpu[size_t(b * 256 + t)];
        }
    }
    EXPECT_EQ(mismatched, 0) << "k=" << k;
  }
}

TEST(CudaTrellisEncode, EncodeThroughTheHookGivesTheCpuWords) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 0.02f);
  std::vector<float> w(size_t(7 * 512));
  for (auto& v : w) v = n(rng);
  ThreadPool pool(2);
  quant::TrellisEncodeOptions gpu;
  gpu.block_viterbi = cuda::cuda_trellis_viterbi;
  for (int k : {2, 3, 4})
    for (int axis : {1, 0}) {
      const int64_t o = axis == 1 ? 7 : 512, i = axis == 1 ? 512 : 7;
      const quant::TrellisEncoded a = quant::trellis_encode_linear("w", w.data(), o, i, k, axis, &pool, gpu);
      const quant::TrellisEncoded b = quant::trellis_encode_linear("w", w.data(), o, i, k, axis, &pool);
      EXPECT_EQ(a.words, b.words) << "k=" << k << " axis=" << axis;
      EXPECT_EQ(a.scales, b.scales) << "k=" << k << " axis=" << axis;
    }
}
