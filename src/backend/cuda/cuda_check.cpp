// Throwers behind the CUDA check macros (cuda_check.h).
#include "backend/cuda/cuda_check.h"

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

}  // namespace arbor::cuda
