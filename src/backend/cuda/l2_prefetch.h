// Prefetch of a byte range into L2, spread over a grid: a latency-bound kernel (decode attention at
// short contexts) leaves HBM idle while it runs, so it can pull the weight the next kernel streams
// (the o projection) into L2 for it. Every block takes an equal slice of the range, the lanes of the
// calling warp split the slice; the prefetch is a hint (no result, nothing to wait for).
#pragma once
#include <cstdint>

namespace arbor::cuda {

#ifdef __CUDACC__
// [p, p + bytes): p 16-byte aligned, bytes a multiple of 16. Called by one whole warp of every block.
__device__ __forceinline__ void l2_prefetch_slice(const char* p, uint64_t bytes) {
  const uint64_t blocks = uint64_t(gridDim.x) * gridDim.y * gridDim.z;
  const uint64_t b = blockIdx.x + uint64_t(gridDim.x) * (blockIdx.y + uint64_t(gridDim.y) * blockIdx.z);
  const uint64_t per_block = ((bytes + blocks - 1) / blocks + 511) & ~uint64_t(511);
  const uint64_t per_lane = per_block / 32;  // a multiple of 16
  const uint64_t lo = b * per_block + (threadIdx.x % 32) * per_lane;
  const uint64_t hi = min(lo + per_lane, bytes);
  if (lo >= hi) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + lo), "r"(unsigned(hi - lo)) : "memory");
#else
  for (uint64_t off = lo; off < hi; off += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#endif
}
#endif

}  // namespace arbor::cuda
