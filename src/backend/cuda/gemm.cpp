// cuBLASLt GEMM with a per-shape plan cache. Row-major y[T,N] = x[T,K]·Wᵀ is, column-major,
// yᵀ[N,T] = op_T(W as [K,N], ld K) · xᵀ[K,T], so no operand is copied or transposed in memory.
#include "backend/cuda/gemm.h"

#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace arbor::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    case DType::F32: return CUDA_R_32F;
    default: fail("cuda: gemm: dtype {} is not supported (BF16, F16, F32)", dtype_name(t));
  }
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

using Key = std::tuple<cublasLtHandle_t, int64_t, int64_t, int64_t, int, int, size_t, int64_t>;

// Plans live for the process (a handful of shapes per model); they are never destroyed.
Plan& plan_for(cublasLtHandle_t lt, int64_t T, int64_t N, int64_t K, DType ab, DType yt, size_t ws, int64_t ldy) {
  static std::mutex mu;
  static std::map<Key, Plan> plans;
  std::lock_guard<std::mutex> lock(mu);
  Key key{lt, T, N, K, int(ab), int(yt), ws, ldy};
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  Plan p;
  ARBOR_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  ARBOR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT));
  ARBOR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN));
  ARBOR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(ab), uint64_t(K), uint64_t(N), K));
  ARBOR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(ab), uint64_t(K), uint64_t(T), K));
  ARBOR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(yt), uint64_t(N), uint64_t(T), ldy));
  cublasLtMatmulPreference_t pref;
  ARBOR_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  ARBOR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t res{};
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || n == 0)
    fail("cuda: gemm: cuBLASLt has no algorithm for [{}, {}] x [{}, {}]ᵀ ({} -> {}), status {}", T, K, N, K, dtype_name(ab),
         dtype_name(yt), int(st));
  p.algo = res.algo;
  return plans.emplace(key, p).first->second;
}

}  // namespace

void lt_gemm(cublasLtHandle_t lt, const void* w, const void* x, DType ab_dtype, void* y, DType y_dtype, int64_t T, int64_t N,
             int64_t K, void* workspace, size_t workspace_bytes, cudaStream_t s, int64_t ldy) {
  if (ldy == 0) ldy = N;
  ARBOR_CHECK(ldy >= N, "cuda: gemm: output row stride {} is less than its {} columns", ldy, N);
  Plan& p = plan_for(lt, T, N, K, ab_dtype, y_dtype, workspace_bytes, ldy);
  const float alpha = 1.0f, beta = 0.0f;
  ARBOR_CUBLAS_CHECK(cublasLtMatmul(lt, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace, workspace_bytes, s));
}

}  // namespace arbor::cuda
