// CudaBackend::linear on MLX affine weights past the GEMV's 8 rows, through the kernels pick_linear chooses:
// the in-loop dequantizing tensor-core GEMM (9 rows up to the dequant threshold; the wide GEMV, which takes 9..32 rows of
// 4/8-bit codes by default, turned off) and W dequantized to bf16
// slice by slice then cuBLASLt (from the threshold on), against W dequantized on the host, rounded to bf16
// as both kernels multiply it, and a float64 matmul. Slices forced small so a matrix takes several, with a
// last partial one; bias and no bias; bf16 and f32 outputs. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cuda/affine.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/affine.h"

using namespace arbor;
using namespace arbor::cuda_test;

namespace {

struct HostMatrix {
  int64_t R, C;
  int bits, gs;
  std::vector<uint32_t> codes;
  std::vector<uint16_t> scales, biases;
  std::vector<float> bias, w;  // w: dequantized, rounded to bf16
  HostMatrix(std::mt19937& rng, int64_t r, int64_t c, int b, int g, bool with_bias) : R(r), C(c), bits(b), gs(g) {
    const quant::AffineShape shape = quant::affine_shape(R, C, {gs, bits}, "test");
    codes.assign(size_t(R * shape.words_per_row()), 0u);
    std::uniform_int_distribution<uint32_t> code(0, (1u << bits) - 1);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j) quant::affine_or_code(codes.data() + i * shape.words_per_row(), j, bits, code(rng));
    std::uniform_real_distribution<float> us(0.002f, 0.03f), ub(-0.5f, 0.5f);
    for (int64_t i = 0; i < R * shape.groups_per_row(); ++i) scales.push_back(f32_to_bf16(us(rng))), biases.push_back(f32_to_bf16(ub(rng)));
    if (with_bias) bias = random_bf16(rng, size_t(R), 0.5f);
    w.resize(size_t(R * C));
    quant::affine_dequantize(codes.data(), scales.data(), biases.data(), DType::BF16, shape, w.data());
    for (auto& v : w) v = bf16_to_f32(f32_to_bf16(v));
  }
  Linear host_linear() {
    Linear l;
    l.format = WeightFormat::Affine, l.n_rows = R, l.n_cols = C, l.bits = bits, l.group_size = gs;
    l.data = Tensor(codes.data(), DType::U32, {R, C * bits / 32});
    l.scales = Tensor(scales.data(), DType::BF16, {R, C / gs});
    l.biases = Tensor(biases.data(), DType::BF16, {R, C / gs});
    if (!bias.empty()) l.bias = Tensor(bias.data(), DType::F32, {R});
    return l;
  }
};

TEST(CudaAffineLinear, PrefillKernelsMatchTheReference) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu(0);
  std::mt19937 rng(31);
  // R = 300 rows of C columns in slices of 128 rows (300 = 128 + 128 + 44).
  gpu.set_affine_dequant(65, size_t(128) * 2 * 320);
  cuda::set_affine_wide_rows(8);  // 9..32 rows of 4/8-bit codes: the GEMM here (the wide GEMV: affine_gemv_test.cpp)
  int case_no = 0;
  for (int bits : {3, 4, 8})
    for (int64_t T : {9, 40, 64, 65, 130}) {
      const int gs = bits == 3 ? 32 : bits == 4 ? 64 : 128;
      const int64_t R = 300, C = 320 / gs * gs + (gs == 32 ? 32 : 0);
      const bool with_bias = case_no % 2 == 0, f32 = case_no % 3 == 0;
      gpu.set_dq_streams(1 + (case_no / 4) % 2);  // the slices on one stream, or alternating over two
      ++case_no;
      HostMatrix a(rng, R, C, bits, gs, with_bias);
      const Linear l = gpu.load_linear(a.host_linear());
      EXPECT_EQ(gpu.pick_linear(l, T), T < 65 ? CudaBackend::LinearKernel::GemmAffine : CudaBackend::LinearKernel::DequantAffineLt);
      std::vector<float> x = random_bf16(rng, size_t(T * C));
      Tensor xd = dev_bf16(gpu, x, {T, C});
      Tensor yd = gpu.alloc(f32 ? DType::F32 : DType::BF16, {T, R});
      gpu.linear(xd, l, yd);
      const std::vector<float> y = host_f32(gpu, yd);
      int bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < R; ++r) {
          double s = with_bias ? a.bias[size_t(r)] : 0.0, mag = std::fabs(s);
          for (int64_t k = 0; k < C; ++k) {
            const double p = double(x[size_t(t * C + k)]) * a.w[size_t(r * C + k)];
            s += p, mag += std::fabs(p);
          }
          // bf16 output: one rounding of the sum; past the threshold the bias is added after cuBLASLt has
          // rounded its product (as the dense path does), a second rounding of (s - bias).
          const double second = with_bias && T >= 65 ? std::fabs(s - a.bias[size_t(r)]) : 0.0;
          const double tol = 1e-5 * mag + (f32 ? 0.0 : std::ldexp(std::fabs(s) + second, -8)) + 1e-6;
          const float got = y[size_t(t * R + r)];
          if (!(std::fabs(got - s) <= tol) && ++bad <= 5)
            ADD_FAILURE() << bits << "-bit g" << gs << " T=" << T << ": y[" << t << "][" << r << "] = " << got << ", reference " << s;
        }
      EXPECT_EQ(bad, 0) << bits << "-bit T=" << T;
    }
  cuda::set_affine_wide_rows(-1);
}

}  // namespace
