// Shared helpers for the CUDA tests: the GPU skip, the source tree, random bf16-exact data, and moving host f32
// arrays to and from device bf16/f32 tensors. Every test compares against the CPU backend.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"

namespace arbor::cuda_test {

// Every GPU test starts with this: without a device it is skipped, saying why.
#define ARBOR_REQUIRE_GPU()                                                            \
  do {                                                                                 \
    std::string why_;                                                                  \
    if (!::arbor::cuda_device_available(&why_)) GTEST_SKIP() << "no CUDA GPU: " << why_; \
  } while (0)

// The source tree: ARBOR_SOURCE_DIR from the environment when set (the binary may run from a copy of the
// tree, as on the GPU machine), else the one it was built from.
inline std::string source_dir() {
  const char* env = std::getenv("ARBOR_SOURCE_DIR");
  return env ? env : ARBOR_SOURCE_DIR;
}

// Values in [-scale, scale), rounded to bf16 so the CPU (f32) and the GPU (bf16) see the same inputs.
inline std::vector<float> random_bf16(std::mt19937& rng, size_t n, float scale = 1.0f, float center = 0.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(center + u(rng)));
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}

// A device bf16 tensor holding v.
inline Tensor dev_bf16(CudaBackend& be, const std::vector<float>& v, std::initializer_list<int64_t> shape) {
  Tensor t = be.alloc(DType::BF16, shape);
  EXPECT_EQ(size_t(t.numel()), v.size());
  auto h = to_bf16(v);
  be.upload(h.data(), t);
  return t;
}

// Device tensor (bf16 or f32) back to host f32.
inline std::vector<float> host_f32(CudaBackend& be, const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::F32) {
    be.download(t, out.data());
  } else {
    std::vector<uint16_t> h(out.size());
    be.download(t, h.data());
    for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
  }
  return out;
}

// A host f32 tensor view over v (the CPU backend's activations).
inline Tensor host_view(std::vector<float>& v, std::initializer_list<int64_t> shape) { return Tensor(v.data(), DType::F32, shape); }

inline float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// max |a - b| (NaN counts as infinite).
inline float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    float d = std::fabs(a[i] - b[i]);
    if (!(d == d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

// One sequence per entry of `lens`, tokens at positions [start, start + n) each, with its own blocks
// (shuffled ids, so paging is exercised). Returns the batch; n_blocks is what the pool must hold.
inline BatchInfo paged_batch(const std::vector<int32_t>& ctx, const std::vector<int32_t>& n_query, int64_t block_size,
                             std::mt19937& rng, int64_t* n_blocks) {
  BatchInfo b;
  int32_t max_blocks = 0;
  for (auto c : ctx) max_blocks = std::max<int32_t>(max_blocks, int32_t((c + block_size - 1) / block_size));
  int32_t total = 0;
  for (auto c : ctx) total += int32_t((c + block_size - 1) / block_size);
  std::vector<int32_t> ids(size_t(total) + 3);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  *n_blocks = int64_t(ids.size());
  b.max_blocks = max_blocks;
  b.block_tables.assign(ctx.size() * size_t(max_blocks), -1);
  size_t next = 0;
  for (size_t s = 0; s < ctx.size(); ++s) {
    for (int32_t j = 0; j < int32_t((ctx[s] + block_size - 1) / block_size); ++j) b.block_tables[s * size_t(max_blocks) + size_t(j)] = ids[next++];
    for (int32_t p = ctx[s] - n_query[s]; p < ctx[s]; ++p) {
      b.logit_rows.push_back(int32_t(b.tokens.size()));
      b.tokens.push_back(int32_t(p % 7));
      b.pos.push_back(p);
      b.seq.push_back(int32_t(s));
    }
    b.ctx_len.push_back(ctx[s]);
  }
  return b;
}

}  // namespace arbor::cuda_test
