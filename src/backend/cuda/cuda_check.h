// The one check macro family for CUDA runtime, cuBLAS and kernel launches: each failure throws an
// arbor::Error naming the call text, the file and the line (style.md: "every CUDA call goes through one
// macro"). The throwers live in cuda_check.cpp: nvcc cannot compile fmt's consteval format checks.
// Also the cached compute-capability lookup the launchers share.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace arbor::cuda {

[[noreturn]] void fail_cuda(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line);
// printf-style message (usable from .cu files), thrown as arbor::Error.
[[noreturn]] void fail_printf(const char* format, ...) __attribute__((format(printf, 1, 2)));

// The current device's compute capability as 10 * major + minor, looked up once per device (the
// kernels with sm_90a-only paths ask it on every launch).
int current_device_cc();

}  // namespace arbor::cuda

#define ARBOR_CUDA_CHECK(call)                                                      \
  do {                                                                              \
    cudaError_t arbor_e_ = (call);                                                  \
    if (arbor_e_ != cudaSuccess) ::arbor::cuda::fail_cuda(arbor_e_, #call, __FILE__, __LINE__); \
  } while (0)

#define ARBOR_CUBLAS_CHECK(call)                                                      \
  do {                                                                                \
    cublasStatus_t arbor_s_ = (call);                                                 \
    if (arbor_s_ != CUBLAS_STATUS_SUCCESS) ::arbor::cuda::fail_cublas(arbor_s_, #call, __FILE__, __LINE__); \
  } while (0)

// After every <<<...>>>: a bad configuration (grid, shared memory) shows up here, named by the kernel.
#define ARBOR_LAUNCH_CHECK(kernel_name)                                                        \
  do {                                                                                         \
    cudaError_t arbor_e_ = cudaGetLastError();                                                 \
    if (arbor_e_ != cudaSuccess) ::arbor::cuda::fail_cuda(arbor_e_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)

// ARBOR_CU_CHECK(cond, "cuda: gemv: %lld rows", (long long)T): argument checks inside .cu launchers.
#define ARBOR_CU_CHECK(cond, ...)                         \
  do {                                                    \
    if (!(cond)) ::arbor::cuda::fail_printf(__VA_ARGS__); \
  } while (0)
