// Programmatic dependent launch (Hopper): a kernel launched with pdl_launch may start while the
// kernel before it on the stream is still finishing; it must call pdl_wait() before it reads anything
// that kernel wrote, and may do independent work (index math, weight prefetch) before that. Every
// kernel calls pdl_trigger() early so that its own successor can launch. On GPUs before sm_90, and
// when disabled (ARBOR_CUDA_PDL=0), the launch is an ordinary one and the device calls are no-ops.
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace arbor::cuda {

#ifdef __CUDACC__
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#endif

// Set once per process from the device's compute capability and the environment (cuda_backend.cpp).
bool pdl_enabled();

// A launch with programmatic stream serialization (when enabled) and, when `cluster` is given, a
// thread-block cluster of that many blocks (sm_90).
template <typename... KArgs, typename... Args>
cudaError_t pdl_launch_in(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, const dim3* cluster,
                          Args&&... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  if (cluster) {
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = cluster->x, attr[1].val.clusterDim.y = cluster->y, attr[1].val.clusterDim.z = cluster->z;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cfg.attrs = attr, cfg.numAttrs = cluster ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
cudaError_t pdl_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  return pdl_launch_in(kernel, grid, block, smem, s, nullptr, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
cudaError_t pdl_launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, dim3 cluster, Args&&... args) {
  return pdl_launch_in(kernel, grid, block, smem, s, &cluster, std::forward<Args>(args)...);
}

}  // namespace arbor::cuda
