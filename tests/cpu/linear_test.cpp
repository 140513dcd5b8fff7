// Tests of the CPU linear kernels (every compiled ISA variant this CPU runs, GEMV and GEMM paths, all
// weight dtypes, odd shapes, bias, 1-3 threads) against linear_reference, and of the bandwidth probe.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/bandwidth.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear.h"
#include "core/error.h"

namespace arbor::cpu {
namespace {

struct Weights {
  DType type;
  std::vector<float> f32;     // used when type == F32
  std::vector<uint16_t> u16;  // f16 or bf16 bits otherwise
  const void* data() const { return type == DType::F32 ? static_cast<const void*>(f32.data()) : u16.data(); }
};

// Random non-zero-mean-free data in [-1, 1] (weights scaled like a trained layer's, ~1/sqrt(K)).
std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) {
    do x = d(rng); while (x == 0.0f);
  }
  return v;
}

Weights random_weights(DType type, int64_t N, int64_t K, uint32_t seed) {
  Weights w{type, {}, {}};
  std::vector<float> v = random_floats(size_t(N * K), seed, 1.0f / std::sqrt(float(K)) + 0.05f);
  if (type == DType::F32) {
    w.f32 = std::move(v);
  } else {
    w.u16.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) w.u16[i] = type == DType::F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
  }
  return w;
}

// max |y - ref| / max |ref|: the tolerance measure the model parity tests use.
double rel_err(const std::vector<float>& y, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) return INFINITY;
    md = std::max(md, double(std::fabs(y[i] - ref[i])));
    mr = std::max(mr, double(std::fabs(ref[i])));
  }
  return md / std::max(mr, 1e-30);
}

// All paths accumulate in f32 with x kept at >= 16 mantissa bits; 1e-5 of the largest output leaves
// ~10x margin over the worst case seen (K = 4097), while one bf16 rounding of x (~4e-3) would fail.
constexpr double kTol = 1e-5;

struct Shape {
  int64_t T, K, N;
};

std::vector<Shape> shapes() {
  // Every T of interest (GEMV 1..8, each with its own tile shape; GEMM 9+ with ragged register tiles)
  // against (K, N) pairs that cover K = 1, 3, 17, 64, 1000, 4097 (K tails, several packed K blocks)
  // and N = 1, 5, 33, 257 (row tails, several 32-column panels and 256-column groups, the small-N
  // token split).
  const std::vector<std::pair<int64_t, int64_t>> kn = {{1, 5}, {3, 33}, {17, 257}, {64, 1}, {1000, 33}, {4097, 5}, {64, 257}};
  std::vector<Shape> v;
  for (int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 9, 64, 130})
    for (auto [K, N] : kn) v.push_back({T, K, N});
  v.push_back({130, 1000, 257});
  v.push_back({4, 4097, 257});
  v.push_back({300, 64, 40});  // more tokens than one GEMM token block (kGemmBlockT = 256)
  return v;
}

TEST(CpuLinear, EveryVariantMatchesReference) {
  ThreadPool p1(1), p2(2), p3(3);
  const std::vector<LinearIsa> isas = linear_isas_supported();
  ASSERT_FALSE(isas.empty());
  uint32_t seed = 1;
  int calls = 0;
  for (const Shape& s : shapes()) {
    std::vector<float> x = random_floats(size_t(s.T * s.K), seed++, 1.0f);
    std::vector<float> bias = random_floats(size_t(s.N), seed++, 0.5f);
    for (DType type : {DType::F32, DType::F16, DType::BF16}) {
      Weights w = random_weights(type, s.N, s.K, seed++);
      std::vector<float> ref(size_t(s.T * s.N)), ref_bias(ref.size());
      linear_reference(x.data(), s.T, s.K, w.data(), type, s.N, nullptr, ref.data());
      linear_reference(x.data(), s.T, s.K, w.data(), type, s.N, bias.data(), ref_bias.data());
      // Every variant single-threaded without bias; then one variant (rotating) split over 2 or 3
      // threads (alternating) with bias, so each variant sees both bias modes and both thread splits
      // (by column panels and by tokens) without the full product, which is slow on a loaded machine.
      const size_t multi_isa = size_t(calls++) % isas.size();
      ThreadPool& multi = (calls % 2) ? p3 : p2;
      for (size_t i = 0; i <= isas.size(); ++i) {
        const bool split = i == isas.size();
        const LinearIsa isa = isas[split ? multi_isa : i];
        ThreadPool& pool = split ? multi : p1;
        std::vector<float> y(ref.size(), NAN);
        linear_with_isa(isa, pool, x.data(), s.T, s.K, w.data(), type, s.N, split ? bias.data() : nullptr, y.data());
        const double e = rel_err(y, split ? ref_bias : ref);
        ASSERT_LE(e, kTol) << linear_kernel_name(isa, type, s.T) << " " << dtype_name(type) << " T=" << s.T
                           << " K=" << s.K << " N=" << s.N << " bias=" << split << " threads=" << pool.size();
      }
    }
  }
}

TEST(CpuLinear, DispatchedKernelMatchesReference) {
  ThreadPool pool(2);
  const int64_t T = 37, K = 300, N = 70;
  std::vector<float> x = random_floats(size_t(T * K), 7, 1.0f), y(size_t(T * N)), ref(y.size());
  for (DType type : {DType::F32, DType::F16, DType::BF16}) {
    Weights w = random_weights(type, N, K, 8);
    linear_reference(x.data(), T, K, w.data(), type, N, nullptr, ref.data());
    linear(pool, x.data(), T, K, w.data(), type, N, nullptr, y.data());
    EXPECT_LE(rel_err(y, ref), kTol) << linear_kernel_name(type, T);
  }
}

// The bf16 GEMM's split of x into two bf16 halves is what keeps it at f32-level precision: rounding x
// to bf16 once would be ~100x worse. Checks both that our path is precise and that this shape is one
// where the difference shows.
TEST(CpuLinear, Bf16GemmKeepsActivationPrecision) {
  ThreadPool pool(1);
  const int64_t T = 48, K = 2048, N = 64;
  std::vector<float> x = random_floats(size_t(T * K), 11, 1.0f), y(size_t(T * N)), ref(y.size()), rounded(y.size());
  Weights w = random_weights(DType::BF16, N, K, 12);
  linear_reference(x.data(), T, K, w.data(), DType::BF16, N, nullptr, ref.data());
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
  linear_reference(xr.data(), T, K, w.data(), DType::BF16, N, nullptr, rounded.data());
  const double rounding_err = rel_err(rounded, ref);
  EXPECT_GT(rounding_err, 100 * kTol);
  for (LinearIsa isa : linear_isas_supported()) {
    linear_with_isa(isa, pool, x.data(), T, K, w.data(), DType::BF16, N, nullptr, y.data());
    const double e = rel_err(y, ref);
    EXPECT_LE(e, kTol) << linear_kernel_name(isa, DType::BF16, T);
    EXPECT_LT(e * 100, rounding_err) << linear_kernel_name(isa, DType::BF16, T);
  }
}

TEST(CpuLinear, KernelNamesFollowCpuFeatures) {
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(linear_kernel_name(LinearIsa::Scalar, DType::BF16, 1), "scalar");
  EXPECT_EQ(linear_kernel_name(LinearIsa::Avx512Bf16, DType::BF16, 1), "avx512-gemv");
  EXPECT_EQ(linear_kernel_name(LinearIsa::Avx512Bf16, DType::BF16, 9), "avx512bf16-gemm");
  EXPECT_EQ(linear_kernel_name(LinearIsa::Avx512Bf16, DType::F16, 9), "avx512-gemm");
  EXPECT_EQ(linear_kernel_name(LinearIsa::Avx2, DType::F32, 8), "avx2-gemv");
  if (f.avx512_bf16) {
    EXPECT_EQ(linear_kernel_name(DType::BF16, 512), "avx512bf16-gemm");
  } else if (f.avx512) {
    EXPECT_EQ(linear_kernel_name(DType::BF16, 512), "avx512-gemm");
  } else if (f.avx2) {
    EXPECT_EQ(linear_kernel_name(DType::BF16, 1), "avx2-gemv");
  }
  EXPECT_EQ(linear_isas_supported().size(), size_t(1 + f.avx2 + f.avx512 + f.avx512_bf16));
}

TEST(CpuLinear, RejectsBadArguments) {
  ThreadPool pool(1);
  std::vector<float> x(16, 1.0f), y(16);
  std::vector<int32_t> wi(16, 1);
  EXPECT_THROW(linear(pool, x.data(), 1, 4, wi.data(), DType::I32, 4, nullptr, y.data()), Error);
  EXPECT_THROW(linear(pool, x.data(), 1, 0, x.data(), DType::F32, 4, nullptr, y.data()), Error);
  EXPECT_THROW(linear(pool, x.data(), 1, 4, x.data(), DType::F32, 0, nullptr, y.data()), Error);
  EXPECT_THROW(linear(pool, nullptr, 1, 4, x.data(), DType::F32, 4, nullptr, y.data()), Error);
  EXPECT_THROW(linear_reference(x.data(), 1, 4, wi.data(), DType::I32, 4, nullptr, y.data()), Error);
  try {
    linear(pool, x.data(), 1, 4, wi.data(), DType::I32, 4, nullptr, y.data());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("I32"), std::string::npos) << e.what();
  }
  // T = 0 is a valid empty batch: nothing is written.
  y.assign(16, 3.0f);
  linear(pool, x.data(), 0, 4, x.data(), DType::F32, 4, nullptr, y.data());
  EXPECT_EQ(y[0], 3.0f);
}

TEST(CpuBandwidth, MeasuresAPlausibleRate) {
  ThreadPool pool(2);
  const double bw = measure_read_bandwidth(pool, size_t(64) << 20, 2);
  // Anything from an old laptop (~5 GB/s) to cache-resident (~1 TB/s) is plausible; 0 or inf is a bug.
  EXPECT_GT(bw, 1e9);
  EXPECT_LT(bw, 1e13);
  EXPECT_THROW(measure_read_bandwidth(pool, 1024, 1), Error);
  EXPECT_THROW(measure_read_bandwidth(pool, size_t(1) << 20, 0), Error);
}

TEST(CpuBandwidth, HugePageBufferIsAlignedAndZeroed) {
  HugePageBuffer b(size_t(3) << 20);
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t(2) << 20), 0u);
  EXPECT_EQ(b.as<uint8_t>()[b.size() - 1], 0);
  HugePageBuffer moved(std::move(b));
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(moved.size(), size_t(3) << 20);
}

}  // namespace
}  // namespace arbor::cpu
