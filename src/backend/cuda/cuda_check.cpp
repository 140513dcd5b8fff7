// Throwers behind the CUDA check macros, and the compute-capability lookup (cuda_check.h).
#include "backend/cuda/cuda_check.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

#include "core/error.h"

namespace arbor::cuda {

void fail_cuda(cudaError_t e, const char* call, const char* file, int line) {
  fail("cuda: {} failed: {} ({}) at {}:{}", call, cudaGetErrorString(e), cudaGetErrorName(e), file, line);
}

void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  fail("cuda: {} failed: cuBLAS status {} ({}) at {}:{}", call, int(s), cublasGetStatusString(s), file, line);
}

void fail_printf(const char* format, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  throw Error(buf);
}

int current_device_cc() {
  static std::atomic<int> cc_of[64] = {};
  int dev = 0;
  ARBOR_CUDA_CHECK(cudaGetDevice(&dev));
  int cc = dev < 64 ? cc_of[dev].load(std::memory_order_relaxed) : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    cc = major * 10 + minor;
    if (dev < 64) cc_of[dev].store(cc, std::memory_order_relaxed);
  }
  return cc;
}

}  // namespace arbor::cuda
