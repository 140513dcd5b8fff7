// The device view of a trellis Linear (trellis.h): what CudaBackend::load_linear uploads, read back with checks.
#include "backend/cuda/trellis.h"

#include <algorithm>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace arbor::cuda {

TrellisWeights trellis_weights(const Linear& l) {
  ARBOR_CHECK(l.format == WeightFormat::Trellis, "cuda: {} is not a trellis matrix", l.describe());
  ARBOR_CHECK((l.bits == 2 || l.bits == 3 || l.bits == 4) && (l.axis == 0 || l.axis == 1) && l.group_size == 256,
              "cuda: {}: trellis k {} axis {} block {} (k 2/3/4, axis 0/1, blocks of 256)", l.describe(), l.bits, l.axis, l.group_size);
  TrellisWeights w{};
  w.rows = l.rows(), w.cols = l.cols(), w.bits = l.bits, w.axis = l.axis;
  const int64_t R = w.coded_rows(), C = w.coded_cols();
  ARBOR_CHECK(C % 256 == 0, "cuda: {}: the coded length {} is not whole blocks of 256", l.describe(), C);
  ARBOR_CHECK(l.data.device == Device::CUDA && l.data.dtype == DType::U32 && l.data.ndim == 2 && l.data.shape[0] == R &&
                  l.data.shape[1] == C * l.bits / 32,
              "cuda: {}: words must be device U32 [{}, {}] (CudaBackend::load_linear's layout), got {} {}", l.describe(), R,
              C * l.bits / 32, dtype_name(l.data.dtype), l.data.shape_str());
  ARBOR_CHECK(l.scales.device == Device::CUDA && l.scales.dtype == DType::F32 && l.scales.ndim == 1 && l.scales.shape[0] == R,
              "cuda: {}: scales must be device F32 [{}] (CudaBackend::load_linear's layout), got {} {}", l.describe(), R,
              dtype_name(l.scales.dtype), l.scales.shape_str());
  w.words = l.data.as<const uint32_t>();
  w.scales = l.scales.as<const float>();
  return w;
}

double time_trellis_gemv(int64_t N, int64_t K, int64_t T, int bits, int axis, int reps) {
  ARBOR_CHECK(N > 0 && K > 0 && (axis == 1 ? K : N) % 256 == 0 && T >= 1 && T <= kTrellisGemvMaxRows && reps >= 1 &&
                  (bits == 2 || bits == 3 || bits == 4) && (axis == 0 || axis == 1),
              "cuda: trellis gemv timing: N {} K {} T {} k {} axis {}", N, K, T, bits, axis);
  int dev = 0, sms = 0;
  ARBOR_CUDA_CHECK(cudaGetDevice(&dev));
  ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaStream_t s = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  ARBOR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ARBOR_CUDA_CHECK(cudaEventCreate(&a));
  ARBOR_CUDA_CHECK(cudaEventCreate(&b));
  const size_t wbytes = size_t(N * K * bits / 8), coded = size_t(axis == 1 ? N : K);
  const int copies = int(std::max<size_t>(2, ((size_t(256) << 20) + wbytes - 1) / wbytes));
  TrellisWeights w0{};
  w0.rows = N, w0.cols = K, w0.bits = bits, w0.axis = axis;
  const int64_t scratch_floats = trellis_gemv_scratch_floats(w0, T, sms);
  void *words = nullptr, *scales = nullptr, *x = nullptr, *y = nullptr, *scratch = nullptr;
  ARBOR_CUDA_CHECK(cudaMalloc(&words, wbytes * size_t(copies)));
  ARBOR_CUDA_CHECK(cudaMalloc(&scales, coded * 4));
  ARBOR_CUDA_CHECK(cudaMalloc(&x, size_t(T * K) * 2));
  ARBOR_CUDA_CHECK(cudaMalloc(&y, size_t(T * N) * 2));
  if (scratch_floats > 0) ARBOR_CUDA_CHECK(cudaMalloc(&scratch, size_t(scratch_floats) * 4));
  // Random bits are valid code words; unit scales; random bf16 activations in [-1, 1).
  launch_fill_random_bf16(static_cast<uint16_t*>(words), int64_t(wbytes / 2) * copies, 4, s);
  launch_fill_random_bf16(static_cast<uint16_t*>(x), T * K, 5, s);
  const std::vector<float> ones(coded, 1.0f);
  ARBOR_CUDA_CHECK(cudaMemcpyAsync(scales, ones.data(), coded * 4, cudaMemcpyHostToDevice, s));
  auto run = [&] {
    for (int c = 0; c < copies; ++c) {
      TrellisWeights w = w0;
      w.words = reinterpret_cast<const uint32_t*>(static_cast<char*>(words) + wbytes * size_t(c));
      w.scales = static_cast<const float*>(scales);
      launch_trellis_gemv(w, static_cast<const uint16_t*>(x), nullptr, y, false, T, static_cast<float*>(scratch), sms, s);
    }
  };
  run();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    ARBOR_CUDA_CHECK(cudaEventRecord(a, s));
    run();
    ARBOR_CUDA_CHECK(cudaEventRecord(b, s));
    ARBOR_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    ARBOR_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(double(ms) * 1e-3 / copies);
  }
  cudaFree(words), cudaFree(scales), cudaFree(x), cudaFree(y), cudaFree(scratch);
  cudaEventDestroy(a), cudaEventDestroy(b);
  cudaStreamDestroy(s);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace arbor::cuda
