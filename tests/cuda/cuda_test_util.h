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

// ---- the quantized GEMV tests' reference (affine_gemv_test, trellis_gemv_test) ----------------------------

// y [T, R] = x · wᵀ (+ bias) in double for a decoded weight w [R, C] (bias [R] or empty), and Σ|x·w| per
// output (the scale of its rounding error).
inline void reference_linear(const std::vector<float>& w, const std::vector<float>& bias, int64_t R, int64_t C, const std::vector<float>& x,
                             int64_t T, std::vector<float>& y, std::vector<float>& mag) {
  y.assign(size_t(T * R), 0.0f), mag.assign(y.size(), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < R; ++n) {
      double s = bias.empty() ? 0.0 : bias[size_t(n)], m = std::fabs(s);
      for (int64_t k = 0; k < C; ++k) {
        const double p = double(x[size_t(t * C + k)]) * w[size_t(n * C + k)];
        s += p, m += std::fabs(p);
      }
      y[size_t(t * R + n)] = float(s), mag[size_t(t * R + n)] = float(m);
    }
}

// Every output within 2e-5·Σ|x·w| of the reference, plus the bf16 rounding of a bf16 output.
inline void expect_linear_close(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& mag, bool bf16_out,
                                const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = 2e-5f * mag[i] + (bf16_out ? std::ldexp(std::fabs(ref[i]), -8) : 0.0f) + 1e-30f;
    if (!(std::fabs(got[i] - ref[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": output " << i << " is " << got[i] << ", reference " << ref[i] << " (tolerance " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what;
}

// One GEMV case: x random bf16 [T, C], y = x · wᵀ (+ bias) through `l` on the GPU into an f32 or bf16
// output, against reference_linear.
inline void check_linear(CudaBackend& gpu, const Linear& l, const std::vector<float>& w, const std::vector<float>& bias, int64_t R, int64_t C,
                         int64_t T, bool f32_out, std::mt19937& rng, const std::string& what) {
  std::vector<float> x = random_bf16(rng, size_t(T * C));
  Tensor xd = dev_bf16(gpu, x, {T, C});
  Tensor yd = gpu.alloc(f32_out ? DType::F32 : DType::BF16, {T, R});
  gpu.linear(xd, l, yd);
  std::vector<float> ref, mag;
  reference_linear(w, bias, R, C, x, T, ref, mag);
  expect_linear_close(host_f32(gpu, yd), ref, mag, !f32_out, what);
}

// The fused gate/up's output act(g) · u (SiLU or tanh GeLU), given the reference gate and up outputs (rg,
// ru) and their magnitudes (mg, mu): each input within expect_linear_close's tolerance and the two bf16
// roundings of the fused kernel; the activations' slopes are at most 1.1 (SiLU) and about 1.13 (GeLU).
inline void expect_gated_close(const std::vector<float>& got, const std::vector<float>& rg, const std::vector<float>& mg,
                               const std::vector<float>& ru, const std::vector<float>& mu, ActOp act, const std::string& what) {
  ASSERT_TRUE(act == ActOp::SiLU || act == ActOp::GeLUTanh) << what;
  ASSERT_EQ(got.size(), rg.size()) << what;
  const float slope = act == ActOp::SiLU ? 1.1f : 1.2f;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double gv = rg[i], uv = ru[i];
    const double a = act == ActOp::SiLU ? gv / (1.0 + std::exp(-gv))
                                        : 0.5 * gv * (1.0 + std::tanh(0.7978845608028654 * (gv + 0.044715 * gv * gv * gv)));
    const float ref = float(a * uv);
    const float dg = 2e-5f * mg[i] + std::ldexp(std::fabs(float(gv)), -8), du = 2e-5f * mu[i] + std::ldexp(std::fabs(float(uv)), -8);
    const float tol = (std::fabs(float(uv)) * slope * dg + (std::fabs(float(gv)) + dg) * du) + std::ldexp(std::fabs(ref), -7) + 1e-30f;
    if (!(std::fabs(got[i] - ref) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": output " << i << " is " << got[i] << ", reference " << ref << " (tolerance " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what;
}

}  // namespace arbor::cuda_test
