// The fused multi-matrix GEMV launches (q/k/v or gate/up over one x in one grid) number their work units
// consecutively over the matrices: matrix i's first unit is first[i]. These find a unit's matrix and read
// the segment arrays by selects, never by a runtime index (which would copy the kernel-parameter struct
// to local memory). Used by gemv.cu and affine_gemv.cu.
#pragma once
#include <cstdint>

namespace arbor::cuda {

#ifdef __CUDACC__
// Which of the n (1..3) matrices owns unit u.
template <int N>
__device__ __forceinline__ int unit_segment(int n, const int64_t (&first)[N], int64_t u) {
  static_assert(N == 3, "three segments at most");
  return n > 2 && u >= first[2] ? 2 : n > 1 && u >= first[1] ? 1 : 0;
}

// a[i] for i in 0..2.
template <typename V, int N>
__device__ __forceinline__ V seg_pick(const V (&a)[N], int i) {
  static_assert(N == 3, "three segments at most");
  return i == 0 ? a[0] : i == 1 ? a[1] : a[2];
}
#endif

}  // namespace arbor::cuda
