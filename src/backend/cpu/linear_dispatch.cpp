// linear(): argument checks, the choice of kernel (ISA level x GEMV/GEMM) and the thread split. The one
// place that maps (weight dtype, CPU features, T) to a kernel, and fails loudly on what it cannot run.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/linear.h"
#include "core/error.h"

namespace arbor::cpu {

using linear_detail::Args;

namespace {

// Rows of W per GEMV work grain. The split is static, so each thread streams one contiguous run of
// about N/threads rows (one sequential DRAM stream per thread, the fastest pattern measured here).
constexpr int64_t kGemvGrain = 16;

bool isa_supported(LinearIsa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case LinearIsa::Scalar: return true;
    case LinearIsa::Avx2: return f.avx2;
    case LinearIsa::Avx512: return f.avx512;
    case LinearIsa::Avx512Bf16: return f.avx512_bf16;
  }
  return false;
}

LinearIsa best_isa() {
  static const LinearIsa best = linear_isas_supported().back();
  return best;
}

void check_args(const char* who, const float* x, int64_t T, int64_t K, const void* W, DType wtype, int64_t N,
                float* y) {
  ARBOR_CHECK(wtype == DType::F32 || wtype == DType::F16 || wtype == DType::BF16,
              "{}: weight dtype {} not supported (supported: F32, F16, BF16)", who, dtype_name(wtype));
  ARBOR_CHECK(T >= 0 && K >= 1 && N >= 1, "{}: bad shape x [{}, {}], W [{}, {}]", who, T, K, N, K);
  ARBOR_CHECK(T == 0 || (x && W && y), "{}: null pointer (x={}, W={}, y={})", who, fmt::ptr(x), fmt::ptr(W),
              fmt::ptr(y));
}

// Per-thread scratch that grows once and is then reused, so steady-state calls do not allocate.
template <typename T>
T* thread_scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n + 64 / sizeof(T)) buf.resize(n + 64 / sizeof(T));
  auto p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<T*>((p + 63) & ~uintptr_t(63));
}

using GemmFn = void (*)(const Args&, int64_t, int64_t, float*);

// Split a GEMM across threads: by output-column panels when there are enough of them, else by tokens
// (small N, e.g. a router or a tiny test shape).
void run_gemm(ThreadPool& pool, const Args& a, GemmFn fn) {
  const int64_t panels = (a.N + linear_detail::kGemmPanelN - 1) / linear_detail::kGemmPanelN;
  if (pool.size() == 1 || panels >= 2 * pool.size() || a.T < 2 * pool.size()) {
    pool.parallel_for(a.N, linear_detail::kGemmPanelN, [&](int, int64_t n0, int64_t n1) {
      fn(a, n0, n1, thread_scratch<float>(linear_detail::kGemmScratchFloats));
    });
    return;
  }
  pool.parallel_for(a.T, 1, [&](int, int64_t t0, int64_t t1) {
    Args s = a;
    s.x = a.x + t0 * a.K;
    s.y = a.y + t0 * a.N;
    s.T = t1 - t0;
    if (a.x_split) s.x_split = a.x_split + t0 * a.Kp;
    fn(s, 0, a.N, thread_scratch<float>(linear_detail::kGemmScratchFloats));
  });
}

void run_gemv(ThreadPool& pool, const Args& a, void (*fn)(const Args&, int64_t, int64_t)) {
  pool.parallel_for(a.N, kGemvGrain, [&](int, int64_t n0, int64_t n1) { fn(a, n0, n1); });
}

}  // namespace

std::string_view linear_isa_name(LinearIsa isa) {
  switch (isa) {
    case LinearIsa::Scalar: return "scalar";
    case LinearIsa::Avx2: return "avx2";
    case LinearIsa::Avx512: return "avx512";
    case LinearIsa::Avx512Bf16: return "avx512bf16";
  }
  return "?";
}

std::vector<LinearIsa> linear_isas_supported() {
  std::vector<LinearIsa> v;
  for (LinearIsa isa : {LinearIsa::Scalar, LinearIsa::Avx2, LinearIsa::Avx512, LinearIsa::Avx512Bf16})
    if (isa_supported(isa)) v.push_back(isa);
  return v;
}

std::string linear_kernel_name(LinearIsa isa, DType wtype, int64_t T) {
  if (isa == LinearIsa::Scalar) return "scalar";
  const bool gemv = T <= kLinearGemvMaxT;
  // The BF16 level differs from plain AVX-512 only in the bf16-weight GEMM (vdpbf16ps); its GEMV keeps
  // x in f32 and converts the weights, which is exact and still memory-bound.
  if (isa == LinearIsa::Avx512Bf16 && (gemv || wtype != DType::BF16)) isa = LinearIsa::Avx512;
  return fmt::format("{}-{}", linear_isa_name(isa), gemv ? "gemv" : "gemm");
}

std::string linear_kernel_name(DType wtype, int64_t T) { return linear_kernel_name(best_isa(), wtype, T); }

void linear_with_isa(LinearIsa isa, ThreadPool& pool, const float* x, int64_t T, int64_t K, const void* W,
                     DType wtype, int64_t N, const float* bias, float* y) {
  check_args("linear", x, T, K, W, wtype, N, y);
  ARBOR_CHECK(isa_supported(isa), "linear: kernel level '{}' not supported by this CPU ({}; supported: {})",
              linear_isa_name(isa), cpu_features().brand, cpu_features().summary());
  if (T == 0) return;
  Args a{x, T, K, W, wtype, N, bias, y};
  const bool gemv = T <= kLinearGemvMaxT;
  switch (isa) {
    case LinearIsa::Scalar:
      pool.parallel_for(N, kGemvGrain, [&](int, int64_t n0, int64_t n1) { linear_detail::gemv_scalar(a, n0, n1); });
      return;
    case LinearIsa::Avx2:
      if (gemv) return run_gemv(pool, a, linear_detail::gemv_avx2);
      return run_gemm(pool, a, linear_detail::gemm_avx2);
    case LinearIsa::Avx512:
    case LinearIsa::Avx512Bf16:
      if (gemv) return run_gemv(pool, a, linear_detail::gemv_avx512);
      if (isa == LinearIsa::Avx512Bf16 && wtype == DType::BF16) {
        a.Kp = (K + 1) / 2 * 2;
        uint32_t* xs = thread_scratch<uint32_t>(size_t(T * a.Kp));
        pool.parallel_for(T, 1, [&](int, int64_t t0, int64_t t1) {
          linear_detail::split_bf16_avx512bf16(x, K, a.Kp, t0, t1, xs);
        });
        a.x_split = xs;
        return run_gemm(pool, a, linear_detail::gemm_avx512bf16);
      }
      return run_gemm(pool, a, linear_detail::gemm_avx512);
  }
}

void linear(ThreadPool& pool, const float* x, int64_t T, int64_t K, const void* W, DType wtype, int64_t N,
            const float* bias, float* y) {
  linear_with_isa(best_isa(), pool, x, T, K, W, wtype, N, bias, y);
}

}  // namespace arbor::cpu
