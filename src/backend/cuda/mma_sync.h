// Warp-level tensor-core helpers (sm_80+): ldmatrix loads of 8x8 b16 matrices from shared memory and
// mma.sync m16n8k16 with bf16 or f16 inputs and f32 accumulators, and m16n8k32 u8 x s8 into s32. Shared by the mma.sync prefill attention
// (attention_prefill.cu), the tensor-core GEMV (gemv.cu) and the trellis tensor-core GEMV (trellis_gemv.cu). Device code: include from .cu files only.
#pragma once
#include <cstdint>

namespace arbor::cuda {

// Four 8x8 b16 matrices from shared memory (a 32-bit shared address): lanes 8i..8i+7 give the row
// addresses of matrix i; register i gets matrix i's (row lane/4, columns 2(lane%4), +1).
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// The same, each matrix transposed (register i gets matrix i's (rows 2(lane%4), +1; column lane/4)).
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// c (16x8, f32) += a (16x16 bf16, row-major fragments a0..a3) * b (16x8 bf16, column-major b0, b1).
__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with f16 a and b.
__device__ __forceinline__ void mma_f16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c (16x8, s32) += a (16x32 u8, row-major: register r holds row g + 8(r&1), k 4j + 16(r>>1) .. +3) * b (32x8 s8,
// column-major: register r holds k 4j + 16r .. +3 of column g). The trellis integer GEMV (trellis_gemv.cu).
__device__ __forceinline__ void mma_u8s8(int* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace arbor::cuda
