// The hardware ceilings a benchmark compares against, measured in the same run: device-to-device copy
// bandwidth (bytes read + written) and the cuBLASLt bf16 GEMM rate on random operands (METHOD.md:
// never time on zeros). Each is the median of `reps` event-timed runs after warm-up.
#include <algorithm>
#include <vector>

#include "backend/cuda/affine.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace arbor {

namespace {

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t bytes) { ARBOR_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DevMem() { cudaFree(p); }
};

struct Timing {
  cudaStream_t s = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  Timing() {
    ARBOR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ARBOR_CUDA_CHECK(cudaEventCreate(&a));
    ARBOR_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Timing() {
    cudaEventDestroy(a), cudaEventDestroy(b);
    cudaStreamDestroy(s);
  }
  // Median seconds of f() over reps, after `warm` untimed calls.
  template <typename F>
  double median(int warm, int reps, F&& f) {
    for (int i = 0; i < warm; ++i) f();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      ARBOR_CUDA_CHECK(cudaEventRecord(a, s));
      f();
      ARBOR_CUDA_CHECK(cudaEventRecord(b, s));
      ARBOR_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      ARBOR_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(double(ms) * 1e-3);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

}  // namespace

CudaMemory cuda_device_memory() {
  size_t free_b = 0, total_b = 0;
  ARBOR_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {uint64_t(total_b - free_b), uint64_t(total_b)};
}

double cuda_measure_copy_bandwidth(uint64_t bytes, int reps) {
  ARBOR_CHECK(bytes >= 2 && reps >= 1, "cuda: copy bandwidth: {} bytes, {} reps", bytes, reps);
  Timing tm;
  DevMem src(bytes), dst(bytes);
  cuda::launch_fill_random_bf16(static_cast<uint16_t*>(src.p), int64_t(bytes / 2), 1, tm.s);
  const double sec = tm.median(2, reps, [&] { ARBOR_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, tm.s)); });
  return 2.0 * double(bytes) / sec;
}

double cuda_measure_bf16_gemm_rate(int64_t n, int reps) {
  ARBOR_CHECK(n >= 64 && reps >= 1, "cuda: gemm rate: n {}, {} reps", n, reps);
  Timing tm;
  const size_t bytes = size_t(n * n) * 2, ws_bytes = size_t(32) << 20;
  DevMem a(bytes), b(bytes), c(bytes), ws(ws_bytes);
  cuda::launch_fill_random_bf16(static_cast<uint16_t*>(a.p), n * n, 2, tm.s);
  cuda::launch_fill_random_bf16(static_cast<uint16_t*>(b.p), n * n, 3, tm.s);
  cublasLtHandle_t lt;
  ARBOR_CUBLAS_CHECK(cublasLtCreate(&lt));
  struct LtGuard {
    cublasLtHandle_t h;
    ~LtGuard() { cublasLtDestroy(h); }
  } guard{lt};
  const double sec = tm.median(3, reps, [&] { cuda::lt_gemm(lt, a.p, b.p, DType::BF16, c.p, DType::BF16, n, n, n, ws.p, ws_bytes, tm.s); });
  return 2.0 * double(n) * double(n) * double(n) / sec;
}

double cuda_time_gemv(int64_t N, int64_t K, int64_t T, int warps_per_sm, int reps, bool l2_hot) {
  ARBOR_CHECK(N > 0 && K > 0 && T >= 1 && T <= cuda::kGemvMaxRows && reps >= 1, "cuda: gemv timing: N {} K {} T {}", N, K, T);
  Timing tm;
  int dev = 0, sms = 0;
  ARBOR_CUDA_CHECK(cudaGetDevice(&dev));
  ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t wbytes = size_t(N * K) * 2;
  const int copies = l2_hot ? 1 : int(std::max<size_t>(2, ((size_t(256) << 20) + wbytes - 1) / wbytes));
  DevMem w(wbytes * size_t(copies)), x(size_t(T * K) * 2), y(size_t(T * N) * 2);
  cuda::launch_fill_random_bf16(static_cast<uint16_t*>(w.p), int64_t(wbytes / 2) * copies, 4, tm.s);
  cuda::launch_fill_random_bf16(static_cast<uint16_t*>(x.p), T * K, 5, tm.s);
  cuda::set_gemv_warps_per_sm(warps_per_sm);
  const double sec = tm.median(1, reps, [&] {
    for (int c = 0; c < copies; ++c)
      cuda::launch_gemv(static_cast<char*>(w.p) + wbytes * size_t(c), DType::BF16, static_cast<uint16_t*>(x.p), nullptr, y.p,
                        DType::BF16, T, N, K, sms, tm.s);
  });
  cuda::set_gemv_warps_per_sm(32);
  return sec / copies;
}

namespace cuda {

double time_affine_gemv(int64_t N, int64_t K, int64_t T, int bits, int group_size, int reps) {
  ARBOR_CHECK(N > 0 && K > 0 && K % group_size == 0 && T >= 1 && T <= kAffineGemvMaxRows && reps >= 1,
              "cuda: affine gemv timing: N {} K {} T {} group {}", N, K, T, group_size);
  Timing tm;
  int dev = 0, sms = 0;
  ARBOR_CUDA_CHECK(cudaGetDevice(&dev));
  ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t cbytes = size_t(N * K * bits / 8), sbytes = size_t(N * (K / group_size)) * 4;
  const size_t wbytes = cbytes + sbytes;
  const int copies = int(std::max<size_t>(2, ((size_t(256) << 20) + wbytes - 1) / wbytes));
  DevMem c(cbytes * size_t(copies)), sb(sbytes * size_t(copies)), x(size_t(T * K) * 2), y(size_t(T * N) * 2);
  // Random bits are random codes; random bf16 values in [-1, 1) are valid scale/bias pairs.
  launch_fill_random_bf16(static_cast<uint16_t*>(c.p), int64_t(cbytes / 2) * copies, 4, tm.s);
  launch_fill_random_bf16(static_cast<uint16_t*>(sb.p), int64_t(sbytes / 2) * copies, 6, tm.s);
  launch_fill_random_bf16(static_cast<uint16_t*>(x.p), T * K, 5, tm.s);
  std::vector<AffineGemvOut> outs;
  for (int i = 0; i < copies; ++i) {
    AffineWeights w{};
    w.codes = reinterpret_cast<const uint32_t*>(static_cast<char*>(c.p) + cbytes * size_t(i));
    w.sb = reinterpret_cast<const uint32_t*>(static_cast<char*>(sb.p) + sbytes * size_t(i));
    w.sb_f16 = false, w.rows = N, w.cols = K, w.bits = bits, w.group_size = group_size;
    outs.push_back({w, nullptr, y.p});
  }
  const int64_t scratch_floats = affine_gemv_scratch_floats(outs[0].w, T);  // v5's x image, where it runs
  DevMem scratch(size_t(std::max<int64_t>(scratch_floats, 1)) * 4);
  float* sp = scratch_floats > 0 ? static_cast<float*>(scratch.p) : nullptr;
  const double sec = tm.median(1, reps, [&] {
    for (const auto& o : outs) launch_affine_gemv_multi(&o, 1, static_cast<uint16_t*>(x.p), false, T, sms, tm.s, sp);
  });
  return sec / copies;
}

}  // namespace cuda

}  // namespace arbor
