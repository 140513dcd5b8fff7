// The tensor-core affine GEMM (src/backend/cuda/affine_gemm.cu) at the Llama-3.1-8B linear shapes against
// cuBLASLt bf16 on the same shape: microseconds per call, TFLOP/s, and GB/s of the bytes a call must move
// (codes + scale/bias + x + y). Weights (affine and bf16 alike) are used from enough copies that every call
// reads them from HBM, not L2. Usage: bench_affine_gemm [--splits N] [--reps N] [--bits B] [--group G] [--T t]
// [--variant 0|1|2] (the T > 64 kernel: plain, pipelined, or plain with 256 activation rows per block).
#include <cuda_runtime.h>
#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/affine_gemm.h"
#include "backend/cuda/kernels.h"

namespace {

using namespace arbor;

struct Shape {
  const char* name;
  int64_t N, K;
};

// Median of `reps` timings of `calls` back-to-back calls each, in microseconds per call.
template <class F>
double time_us(F&& f, int reps, int calls) {
  cudaEvent_t a, b;
  ARBOR_CUDA_CHECK(cudaEventCreate(&a));
  ARBOR_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < calls; ++i) f(i);  // warm-up
  std::vector<double> ts;
  for (int r = 0; r < reps; ++r) {
    ARBOR_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < calls; ++i) f(i);
    ARBOR_CUDA_CHECK(cudaEventRecord(b));
    ARBOR_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    ARBOR_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(double(ms) * 1e3 / calls);
  }
  std::sort(ts.begin(), ts.end());
  ARBOR_CUDA_CHECK(cudaEventDestroy(a));
  ARBOR_CUDA_CHECK(cudaEventDestroy(b));
  return ts[ts.size() / 2];
}

std::vector<uint32_t> random_words(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& w : v) s = s * 1664525u + 1013904223u, w = s;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int forced_splits = 0, reps = 9, only_bits = 0, group = 64, variant = 0;
  int64_t only_T = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--splits")) forced_splits = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bits")) only_bits = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--group")) group = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--T")) only_T = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--variant")) variant = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_affine_gemm: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    cuda::set_affine_gemm_splits(forced_splits);
    cuda::set_affine_gemm_variant(variant);
    int dev = 0, n_sms = 0;
    ARBOR_CUDA_CHECK(cudaGetDevice(&dev));
    ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop{};
    ARBOR_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("bench_affine_gemm: %s, %d SMs, group size %d, splits %s, T > 64 kernel: %s\n", prop.name, n_sms, group,
                forced_splits ? std::to_string(forced_splits).c_str() : "auto", variant == 1 ? "pipelined" : variant == 2 ? "plain BN=256" : "plain");
    cublasLtHandle_t lt;
    ARBOR_CUBLAS_CHECK(cublasLtCreate(&lt));
    const size_t ws_bytes = size_t(32) << 20;
    void* ws = nullptr;
    ARBOR_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    const std::vector<Shape> shapes = {{"q/o 4096x4096", 4096, 4096}, {"gate/up 14336x4096", 14336, 4096}, {"down 4096x14336", 4096, 14336}};
    const std::vector<int64_t> Ts = {16, 64, 512, 2048};
    const size_t rotate_bytes = size_t(512) << 20;  // > 8x the 50 MB L2
    std::printf("%-20s %5s %4s | %9s %8s %8s %6s | %9s %8s | %s\n", "shape", "T", "bits", "us", "TFLOP/s", "GB/s", "splits",
                "cuBLAS us", "TFLOP/s", "affine / cuBLAS");
    for (const Shape& sh : shapes) {
      // cuBLAS bf16 weights, several copies.
      const size_t wb = size_t(sh.N * sh.K) * 2;
      const int nb = int(std::max<size_t>(2, rotate_bytes / wb));
      std::vector<void*> bw(static_cast<size_t>(nb));
      for (auto& p : bw) {
        ARBOR_CUDA_CHECK(cudaMalloc(&p, wb));
        cuda::launch_fill_random_bf16(static_cast<uint16_t*>(p), sh.N * sh.K, uint64_t(reinterpret_cast<uintptr_t>(p)), nullptr);
      }
      const int64_t maxT = 2048;
      uint16_t *x = nullptr, *y = nullptr;
      ARBOR_CUDA_CHECK(cudaMalloc(&x, size_t(maxT * sh.K) * 2));
      ARBOR_CUDA_CHECK(cudaMalloc(&y, size_t(maxT * sh.N) * 2));
      cuda::launch_fill_random_bf16(x, maxT * sh.K, 7, nullptr);
      for (int bits : {4, 8}) {
        if (only_bits && bits != only_bits) continue;
        const int64_t words = sh.N * sh.K * bits / 32, groups = sh.N * sh.K / group;
        const size_t qb = size_t(words + groups) * 4;
        const int nq = int(std::max<size_t>(2, rotate_bytes / qb));
        std::vector<cuda::AffineWeights> aw;
        std::vector<void*> owned;
        // Codes random; scale/bias words: bf16 scale ~0.01, bias ~-0.08 (finite, no NaN).
        const std::vector<uint32_t> hc = random_words(size_t(words), 1);
        std::vector<uint32_t> hs = random_words(size_t(groups), 2);
        for (auto& w : hs) w = 0x3C24u | (0xBDA4u << 16) | 0;  // scale 0.01001, bias -0.0801
        for (int c = 0; c < nq; ++c) {
          uint32_t *codes = nullptr, *sb = nullptr;
          ARBOR_CUDA_CHECK(cudaMalloc(&codes, size_t(words) * 4));
          ARBOR_CUDA_CHECK(cudaMalloc(&sb, size_t(groups) * 4));
          ARBOR_CUDA_CHECK(cudaMemcpy(codes, hc.data(), size_t(words) * 4, cudaMemcpyHostToDevice));
          ARBOR_CUDA_CHECK(cudaMemcpy(sb, hs.data(), size_t(groups) * 4, cudaMemcpyHostToDevice));
          owned.push_back(codes), owned.push_back(sb);
          aw.push_back({codes, sb, false, sh.N, sh.K, bits, group});
        }
        for (int64_t T : Ts) {
          if (only_T && T != only_T) continue;
          const int64_t sn = cuda::affine_gemm_scratch_floats(aw[0], T, n_sms);
          float* scratch = nullptr;
          if (sn) ARBOR_CUDA_CHECK(cudaMalloc(&scratch, size_t(sn) * 4));
          const int calls = T >= 512 ? 20 : 100;
          const double us = time_us(
              [&](int i) { cuda::launch_affine_gemm(aw[size_t(i) % aw.size()], x, nullptr, y, DType::BF16, T, scratch, n_sms, nullptr); },
              reps, calls);
          const double cu = time_us(
              [&](int i) {
                cuda::lt_gemm(lt, bw[size_t(i) % bw.size()], x, DType::BF16, y, DType::BF16, T, sh.N, sh.K, ws, ws_bytes, nullptr);
              },
              reps, calls);
          const double flop = 2.0 * double(T) * double(sh.N) * double(sh.K);
          const double bytes = double(qb) + double(T * sh.K * 2) + double(T * sh.N * 2);
          const int splits = sn ? int(sn / (T * sh.N)) : 1;
          std::printf("%-20s %5lld %4d | %9.1f %8.1f %8.0f %6d | %9.1f %8.1f | %5.1f%%\n", sh.name, (long long)T, bits, us,
                      flop / us / 1e6, bytes / us / 1e3, splits, cu, flop / cu / 1e6, 100.0 * cu / us);
          std::fflush(stdout);
          if (scratch) ARBOR_CUDA_CHECK(cudaFree(scratch));
        }
        for (void* p : owned) ARBOR_CUDA_CHECK(cudaFree(p));
      }
      for (void* p : bw) ARBOR_CUDA_CHECK(cudaFree(p));
      ARBOR_CUDA_CHECK(cudaFree(x));
      ARBOR_CUDA_CHECK(cudaFree(y));
    }
    ARBOR_CUDA_CHECK(cudaFree(ws));
    cublasLtDestroy(lt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_affine_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
