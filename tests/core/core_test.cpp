// Tests for core: dtype conversions, tensor views, thread pool, mmap.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/mmap.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

using namespace arbor;

TEST(DType, Bf16RoundTripAndRounding) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0, 3);
  for (int i = 0; i < 10000; ++i) {
    float x = d(rng);
    float y = bf16_to_f32(f32_to_bf16(x));
    EXPECT_LE(std::fabs(x - y), std::fabs(x) * (1.0f / 256));
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half way between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16MatchesHardwareSemantics) {
  // Every f16 bit pattern converts to f32 and back to itself (NaNs to a NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
}

TEST(DType, Names) {
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_FALSE(dtype_from_name("Q4_K").has_value());
  EXPECT_EQ(dtype_size(DType::F64), 8u);
}

TEST(TensorView, ShapeAndSlices) {
  std::vector<float> v(12);
  Tensor t(v.data(), DType::F32, {3, 4});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.rows(), 3);
  EXPECT_EQ(t.shape_str(), "[3, 4]");
  Tensor s = t.row_slice(1, 2);
  EXPECT_EQ(s.as<float>(), v.data() + 4);
  EXPECT_THROW(t.row_slice(2, 2), Error);
}

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 64, 1001}) {
      for (int64_t grain : {1, 4, 16}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, grain, [&](int, int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
        });
        for (auto& h : hits) ASSERT_EQ(h.load(), 1);
      }
    }
  }
}

TEST(ThreadPoolTest, RethrowsWorkerErrors) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.run_on_all([](int t) {
    if (t == 1) fail("boom");
  }),
               Error);
  int ran = 0;
  pool.run_on_all([&](int t) {
    if (t == 0) ++ran;
  });
  EXPECT_EQ(ran, 1);
}

TEST(MappedFileTest, MapsAndNamesMissingFile) {
  std::string path = testing::TempDir() + "arbor_mmap_test.bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_TRUE(f);
  std::fputs("hello", f);
  std::fclose(f);
  MappedFile m(path);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m.data()[4], 'o');
  try {
    MappedFile bad("/nonexistent/x.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.safetensors"), std::string::npos);
  }
}
