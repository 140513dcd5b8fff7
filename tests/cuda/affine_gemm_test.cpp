// The tensor-core affine GEMM (affine_gemm.cu) against the reference: weights dequantized on the host with
// quant::affine_dequantize, rounded to bf16 as the kernel feeds them to the tensor cores, and a float64
// matmul. Random codes, scales and biases at odd shapes: every bit width x group size, T = 9, 17, 64, 100,
// 513 (and the other T > 64 kernels), bf16 and f16 scale/bias, with and without bias, bf16 and f32 output, K split and unsplit, and the
// K tail of group size 32 (cols not a multiple of 64). Skipped without a GPU.
#include <cuda_runtime.h>

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/affine_gemm.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/affine.h"

using namespace arbor;
using namespace arbor::cuda_test;

namespace {

template <class T>
struct DevBuf {
  T* p = nullptr;
  explicit DevBuf(size_t n) {
    if (n) {
      EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    }
  }
  explicit DevBuf(const std::vector<T>& v) : DevBuf(v.size()) {
    if (!v.empty()) {
      EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

struct Case {
  int64_t rows, cols, T;
  int bits, gs;
  bool sb_f16, with_bias, y_f32, split;
};

// Runs one case, failing the test (at most 5 messages) where an output is off.
void run_case(const Case& c, std::mt19937& rng, int n_sms) {
  SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.cols << " T=" << c.T << " bits=" << c.bits << " g=" << c.gs
                                    << (c.sb_f16 ? " f16" : " bf16") << (c.with_bias ? " bias" : "") << (c.y_f32 ? " y=f32" : " y=bf16")
                                    << (c.split ? " split" : " unsplit"));
  const quant::AffineShape shape = quant::affine_shape(c.rows, c.cols, {c.gs, c.bits}, "test");
  const int64_t W = shape.words_per_row(), G = shape.groups_per_row();
  std::vector<uint32_t> codes(size_t(c.rows * W), 0);
  std::uniform_int_distribution<uint32_t> code(0, (1u << c.bits) - 1);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t j = 0; j < c.cols; ++j) quant::affine_or_code(codes.data() + r * W, j, c.bits, code(rng));
  // Scales of either sign (MLX anchors at the larger-magnitude edge), biases around the code range's middle.
  std::uniform_real_distribution<float> us(0.002f, 0.03f), ub(-0.5f, 0.5f);
  std::vector<uint16_t> scales(size_t(c.rows * G)), biases(scales.size());
  std::vector<uint32_t> sb(scales.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    const float sc = (rng() & 1 ? 1.0f : -1.0f) * us(rng), bi = ub(rng);
    scales[i] = c.sb_f16 ? f32_to_f16(sc) : f32_to_bf16(sc);
    biases[i] = c.sb_f16 ? f32_to_f16(bi) : f32_to_bf16(bi);
    sb[i] = uint32_t(scales[i]) | (uint32_t(biases[i]) << 16);
  }
  std::vector<float> w(size_t(c.rows * c.cols));
  quant::affine_dequantize(codes.data(), scales.data(), biases.data(), c.sb_f16 ? DType::F16 : DType::BF16, shape, w.data());
  for (auto& v : w) v = bf16_to_f32(f32_to_bf16(v));  // what the tensor cores multiply
  std::vector<float> x = random_bf16(rng, size_t(c.T * c.cols), 1.0f);
  std::vector<float> bias = c.with_bias ? random_bf16(rng, size_t(c.rows), 0.5f) : std::vector<float>{};

  DevBuf<uint32_t> dcodes(codes), dsb(sb);
  DevBuf<uint16_t> dx(to_bf16(x));
  DevBuf<float> dbias(bias);
  const size_t ysize = c.y_f32 ? 4 : 2;
  DevBuf<unsigned char> dy(size_t(c.T * c.rows) * ysize);
  ASSERT_EQ(cudaMemset(dy.p, 0xff, size_t(c.T * c.rows) * ysize), cudaSuccess);  // NaN everywhere: every output must be written
  const cuda::AffineWeights aw{dcodes.p, dsb.p, c.sb_f16, c.rows, c.cols, c.bits, c.gs};
  const int64_t scratch_n = c.split ? cuda::affine_gemm_scratch_floats(aw, c.T, n_sms) : 0;
  DevBuf<float> scratch{static_cast<size_t>(scratch_n)};
  cuda::launch_affine_gemm(aw, dx.p, c.with_bias ? dbias.p : nullptr, dy.p, c.y_f32 ? DType::F32 : DType::BF16, c.T, scratch.p, n_sms,
                           nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> y(size_t(c.T * c.rows));
  if (c.y_f32) {
    ASSERT_EQ(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  } else {
    std::vector<uint16_t> h(y.size());
    ASSERT_EQ(cudaMemcpy(h.data(), dy.p, h.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < h.size(); ++i) y[i] = bf16_to_f32(h[i]);
  }
  int bad = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t r = 0; r < c.rows; ++r) {
      double s = 0, mag = 0;
      const float* wr = w.data() + r * c.cols;
      const float* xr = x.data() + t * c.cols;
      for (int64_t k = 0; k < c.cols; ++k) s += double(wr[k]) * xr[k], mag += std::fabs(double(wr[k]) * xr[k]);
      if (c.with_bias) s += bias[size_t(r)], mag += std::fabs(bias[size_t(r)]);
      // f32 accumulation in any order, plus the bf16 rounding of the output.
      const double tol = 1e-5 * mag + (c.y_f32 ? 0.0 : std::ldexp(std::fabs(s), -8)) + 1e-6;
      const float got = y[size_t(t * c.rows + r)];
      if (!(std::fabs(got - s) <= tol) && ++bad <= 5)
        ADD_FAILURE() << "y[" << t << "][" << r << "] = " << got << ", reference " << s << " (tolerance " << tol << ")";
    }
  EXPECT_EQ(bad, 0);
}

int sm_count() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n;
}

TEST(CudaAffineGemm, EveryBitsGroupAndRowCount) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(19);
  const int n_sms = sm_count();
  int i = 0;
  for (int bits : quant::kAffineBits)
    for (int gs : quant::kAffineGroupSizes)
      for (int64_t T : {9, 17, 64, 100, 513})
        for (bool f16 : {false, true}) {
          ++i;
          // Odd row counts; cols a multiple of the group, 32-groups with an odd count (a K tail of 32).
          const int64_t rows = (i % 3 == 0) ? 131 : (i % 3 == 1) ? 77 : 260;
          const int64_t cols = gs == 32 ? 32 * (3 + 2 * (i % 5)) : int64_t(gs) * (2 + i % 4);
          run_case({rows, cols, T, bits, gs, f16, i % 2 == 0, i % 4 == 1, i % 3 != 0}, rng, n_sms);
        }
}

// The other T > 64 kernels (set_affine_gemm_variant: 1 pipelined, 2 with 256 activation rows per block) on
// the same kind of cases.
TEST(CudaAffineGemm, PrefillVariants) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(22);
  const int n_sms = sm_count();
  for (int variant : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    cuda::set_affine_gemm_variant(variant);
    int i = 0;
    for (int bits : quant::kAffineBits)
      for (int gs : quant::kAffineGroupSizes)
        for (int64_t T : {65, 100, 513}) {
          ++i;
          const int64_t rows = (i % 3 == 0) ? 131 : (i % 3 == 1) ? 77 : 260;
          const int64_t cols = gs == 32 ? 32 * (3 + 2 * (i % 5)) : int64_t(gs) * (2 + i % 4);
          run_case({rows, cols, T, bits, gs, i % 2 == 1, i % 2 == 0, i % 4 == 1, i % 3 != 0}, rng, n_sms);
        }
    run_case({300, 2048 + 32, 200, 4, 32, false, true, false, true}, rng, n_sms);
    run_case({300, 2048 + 32, 200, 4, 32, false, true, false, false}, rng, n_sms);
    run_case({300, 2048 + 64, 600, 8, 64, true, true, false, true}, rng, n_sms);
  }
  cuda::set_affine_gemm_variant(0);
}

TEST(CudaAffineGemm, LongRowsSplitAndUnsplit) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(20);
  const int n_sms = sm_count();
  // These shapes leave most SMs idle unsplit: the launcher splits K when given scratch.
  EXPECT_GT(cuda::affine_gemm_scratch_floats({nullptr, nullptr, false, 300, 2048, 4, 64}, 33, n_sms), 0);
  EXPECT_GT(cuda::affine_gemm_scratch_floats({nullptr, nullptr, false, 129, 4096 + 32, 4, 32}, 9, n_sms), 0);
  for (int bits : {3, 4, 8})
    for (bool split : {true, false}) {
      run_case({300, 2048, 33, bits, 64, false, true, false, split}, rng, n_sms);
      run_case({129, 4096 + 32, 9, bits, 32, true, false, true, split}, rng, n_sms);
    }
}

TEST(CudaAffineGemm, ForcedSplits) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(21);
  const int n_sms = sm_count();
  for (int splits : {2, 3, 7}) {
    cuda::set_affine_gemm_splits(splits);
    run_case({200, 1024 + 64, 150, 5, 64, false, true, false, true}, rng, n_sms);
    run_case({200, 1024 + 128, 20, 6, 128, true, true, true, true}, rng, n_sms);
  }
  cuda::set_affine_gemm_splits(0);
}

// launch_affine_dequant: rows [row0, row0 + n) to bf16, bit for bit the host dequantization rounded to bf16
// (the arithmetic is the same: one multiply, one add, no FMA), every bit width and group size, a window of
// rows not at the start, cols with an odd count of 8-code chunks per word pair.
TEST(CudaAffineGemm, DequantIsBitExact) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(23);
  const int n_sms = sm_count();
  // Codes at a 16-byte aligned address and one word past it; a small matrix, and one whose slice takes several of the
  // grid's passes.
  for (int bits : quant::kAffineBits)
    for (int gs : quant::kAffineGroupSizes)
      for (int shape_no = 0; shape_no < 3; ++shape_no) {
        const bool f16 = shape_no == 1, big = shape_no == 2;
        const int64_t off = shape_no == 1 ? 1 : 0;
        if (big && gs != 64) continue;
        SCOPED_TRACE(::testing::Message() << "bits " << bits << " g" << gs << (f16 ? " f16" : " bf16") << " codes +" << off << " words"
                                          << (big ? " big" : ""));
        const int64_t rows = big ? 6001 : 37, cols = big ? 4096 + 64 : int64_t(gs) * 3, row0 = 5, n = big ? 5990 : 29;
        const quant::AffineShape shape = quant::affine_shape(rows, cols, {gs, bits}, "test");
        const int64_t W = shape.words_per_row(), G = shape.groups_per_row();
        std::vector<uint32_t> codes(size_t(rows * W), 0);
        std::uniform_int_distribution<uint32_t> code(0, (1u << bits) - 1);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < cols; ++j) quant::affine_or_code(codes.data() + r * W, j, bits, code(rng));
        std::uniform_real_distribution<float> us(-0.03f, 0.03f), ub(-0.5f, 0.5f);
        std::vector<uint16_t> scales(size_t(rows * G)), biases(scales.size());
        std::vector<uint32_t> sb(scales.size());
        for (size_t i = 0; i < sb.size(); ++i) {
          scales[i] = f16 ? f32_to_f16(us(rng)) : f32_to_bf16(us(rng));
          biases[i] = f16 ? f32_to_f16(ub(rng)) : f32_to_bf16(ub(rng));
          sb[i] = uint32_t(scales[i]) | (uint32_t(biases[i]) << 16);
        }
        std::vector<float> w(size_t(rows * cols));
        quant::affine_dequantize(codes.data(), scales.data(), biases.data(), f16 ? DType::F16 : DType::BF16, shape, w.data());
        std::vector<uint32_t> placed(size_t(off), 0u);
        placed.insert(placed.end(), codes.begin(), codes.end());
        DevBuf<uint32_t> dcodes(placed), dsb(sb);
        DevBuf<uint16_t> dout(size_t(n * cols));
        ASSERT_EQ(cudaMemset(dout.p, 0xff, size_t(n * cols) * 2), cudaSuccess);
        cuda::launch_affine_dequant({dcodes.p + off, dsb.p, f16, rows, cols, bits, gs}, row0, n, dout.p, n_sms, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint16_t> got(size_t(n * cols));
        ASSERT_EQ(cudaMemcpy(got.data(), dout.p, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        int bad = 0;
        for (int64_t i = 0; i < n * cols; ++i)
          if (got[size_t(i)] != f32_to_bf16(w[size_t(row0 * cols + i)]) && ++bad <= 5)
            ADD_FAILURE() << "row " << row0 + i / cols << " col " << i % cols << ": " << bf16_to_f32(got[size_t(i)]) << ", reference "
                          << w[size_t(row0 * cols + i)];
        EXPECT_EQ(bad, 0);
      }
  const cuda::AffineWeights w{reinterpret_cast<const uint32_t*>(16), reinterpret_cast<const uint32_t*>(16), false, 8, 64, 4, 64};
  EXPECT_THROW(cuda::launch_affine_dequant(w, 4, 5, reinterpret_cast<uint16_t*>(16), 132, nullptr), Error);  // rows past the end
}

TEST(CudaAffineGemm, BadInputFailsNamingIt) {
  ARBOR_REQUIRE_GPU();
  const cuda::AffineWeights bad_bits{reinterpret_cast<const uint32_t*>(16), reinterpret_cast<const uint32_t*>(16), false, 8, 64, 7, 64};
  EXPECT_THROW(cuda::launch_affine_gemm(bad_bits, nullptr, nullptr, nullptr, DType::BF16, 9, nullptr, 132, nullptr), Error);
  const cuda::AffineWeights bad_cols{reinterpret_cast<const uint32_t*>(16), reinterpret_cast<const uint32_t*>(16), false, 8, 96, 4, 64};
  EXPECT_THROW(cuda::launch_affine_gemm(bad_cols, nullptr, nullptr, nullptr, DType::BF16, 9, nullptr, 132, nullptr), Error);
}

}  // namespace
