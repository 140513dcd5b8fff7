// Flash attention for prefill over the paged bf16 KV cache, on tensor cores (mma.sync m16n8k16,
// bf16 in, f32 accumulators), with online softmax. A block owns 64 query rows = (tokens of one
// sequence) x (the query heads of one GQA group), so the group shares every K/V tile it loads; each
// of its 4 warps owns 16 rows. K/V tiles are gathered block by block through the block table, the next
// tile's copy (cp.async, double-buffered) overlapping this tile's math.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace arbor::cuda {

namespace {

constexpr int kRows = kPrefillRows;  // 64
constexpr int kThreads = 128;

__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(const void* p, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// 16 bytes global -> shared without passing through registers (sm_80+); valid == false zero-fills.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, bool valid) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(smem_dst));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem_src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// D: head_dim; KT: keys per tile. Shared rows are padded by 8 elements (16 bytes) so the 8 rows a
// fragment load touches fall in distinct banks. K/V tiles are double-buffered and fetched with
// cp.async, the next tile's copy in flight while the tensor cores work on this one.
template <int D, int KT>
__global__ void __launch_bounds__(kThreads) attn_prefill_kernel(AttnArgs a, const int32_t* tiles) {
  constexpr int LD = D + 8;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* Qs = smem;                  // [kRows][LD]
  uint16_t* Ks = Qs + kRows * LD;       // [2][KT][LD]
  uint16_t* Vs = Ks + 2 * KT * LD;      // [2][KT][LD]

  const int32_t* tile = tiles + blockIdx.x * 8;
  const int32_t tok0 = tile[0], ntok = tile[1], seq = tile[2], min_pos = tile[3], max_pos = tile[4];
  const int g = blockIdx.y, G = a.n_heads / a.n_kv_heads;
  const int64_t qrow = int64_t(a.n_heads) * D, kvrow = int64_t(a.n_kv_heads) * D;
  const int32_t* table = a.block_tables + int64_t(seq) * a.max_blocks;

  for (int idx = threadIdx.x; idx < kRows * (D / 8); idx += kThreads) {
    const int r = idx / (D / 8), c = idx % (D / 8), ti = r / G, hi = r % G;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (ti < ntok) v = *reinterpret_cast<const uint4*>(a.q + int64_t(tok0 + ti) * qrow + int64_t(g * G + hi) * D + c * 8);
    *reinterpret_cast<uint4*>(Qs + r * LD + c * 8) = v;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
  const int rA = warp * 16 + gq, rB = rA + 8;
  const bool validA = rA / G < ntok, validB = rB / G < ntok;
  const int32_t posA = validA ? a.pos[tok0 + rA / G] : -1, posB = validB ? a.pos[tok0 + rB / G] : -1;
  const int32_t loA = a.window > 0 ? posA - a.window + 1 : 0, loB = a.window > 0 ? posB - a.window + 1 : 0;
  const int32_t kv_lo = a.window > 0 ? max(0, min_pos - a.window + 1) : 0, kv_hi = max_pos + 1;

  float o[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;

  // Copies K/V tile [kt, kt + KT) into Kd/Vd with cp.async (keys past kv_hi are zero-filled: V rows
  // of masked keys must be finite, P = 0 times them must stay 0).
  auto fetch = [&](uint16_t* Kd, uint16_t* Vd, int32_t kt) {
    for (int idx = threadIdx.x; idx < KT * (D / 8); idx += kThreads) {
      const int j = idx / (D / 8), c = idx % (D / 8);
      const int32_t kp = kt + j;
      const bool ok = kp < kv_hi;
      const int64_t off = ok ? kv_slot(a, table, kp) * kvrow + int64_t(g) * D + c * 8 : 0;
      cp_async16(Kd + j * LD + c * 8, a.k_pool + off, ok);
      cp_async16(Vd + j * LD + c * 8, a.v_pool + off, ok);
    }
  };
  if (kv_lo < kv_hi) fetch(Ks, Vs, kv_lo);
  cp_async_commit();
  int step = 0;
  for (int32_t kt = kv_lo; kt < kv_hi; kt += KT, ++step) {
    const int buf = step & 1;
    const uint16_t* Kc = Ks + buf * KT * LD;
    const uint16_t* Vc = Vs + buf * KT * LD;
    // The other buffer was read in the previous step, which ended with a barrier.
    if (kt + KT < kv_hi) fetch(Ks + (buf ^ 1) * KT * LD, Vs + (buf ^ 1) * KT * LD, kt + KT);
    cp_async_commit();
    cp_async_wait<1>();  // every group but the one just committed: this step's tile is in
    __syncthreads();     // ... for every thread's copies (and Qs is written, first time round)

    // S = Q Kᵀ for this warp's 16 rows and the tile's KT keys.
    float sc[KT / 8][4];
#pragma unroll
    for (int j = 0; j < KT / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(Qs + rA * LD + kk * 16 + 2 * tq);
      const uint32_t a1 = *reinterpret_cast<const uint32_t*>(Qs + rB * LD + kk * 16 + 2 * tq);
      const uint32_t a2 = *reinterpret_cast<const uint32_t*>(Qs + rA * LD + kk * 16 + 8 + 2 * tq);
      const uint32_t a3 = *reinterpret_cast<const uint32_t*>(Qs + rB * LD + kk * 16 + 8 + 2 * tq);
#pragma unroll
      for (int j = 0; j < KT / 8; ++j) {
        const uint16_t* kr = Kc + (j * 8 + gq) * LD + kk * 16 + 2 * tq;
        mma_bf16(sc[j], a0, a1, a2, a3, *reinterpret_cast<const uint32_t*>(kr), *reinterpret_cast<const uint32_t*>(kr + 8));
      }
    }

    // Scale, softcap, mask (causal, window, padding rows), then the online softmax update.
    float mxA = -INFINITY, mxB = -INFINITY;
#pragma unroll
    for (int j = 0; j < KT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int32_t key = kt + j * 8 + 2 * tq + (e & 1);
        float s = sc[j][e] * a.scale;
        if (a.softcap > 0) s = a.softcap * tanhf(s / a.softcap);
        const bool ok = e < 2 ? (key >= loA && key <= posA) : (key >= loB && key <= posB);
        sc[j][e] = ok ? s : -INFINITY;
        if (e < 2) mxA = fmaxf(mxA, sc[j][e]);
        else mxB = fmaxf(mxB, sc[j][e]);
      }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, o2));
      mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, o2));
    }
    const float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
    const float bA = nA == -INFINITY ? 0.0f : nA, bB = nB == -INFINITY ? 0.0f : nB;
    const float cA = __expf(mA - bA), cB = __expf(mB - bB);
    mA = nA, mB = nB;
    float sA = 0.0f, sB = 0.0f;
#pragma unroll
    for (int j = 0; j < KT / 8; ++j) {
      sc[j][0] = __expf(sc[j][0] - bA), sc[j][1] = __expf(sc[j][1] - bA);
      sc[j][2] = __expf(sc[j][2] - bB), sc[j][3] = __expf(sc[j][3] - bB);
      sA += sc[j][0] + sc[j][1], sB += sc[j][2] + sc[j][3];
    }
    lA = lA * cA + sA, lB = lB * cB + sB;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) o[d][0] *= cA, o[d][1] *= cA, o[d][2] *= cB, o[d][3] *= cB;

    // O += P V: P's accumulator layout is the A-fragment layout of the next mma (two key octets).
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      const uint32_t a0 = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), a1 = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
      const uint32_t a2 = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), a3 = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
      for (int d = 0; d < D / 8; d += 2) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(Vc + (kk * 16 + (lane & 15)) * LD + d * 8 + (lane >= 16 ? 8 : 0), b0, b1, b2, b3);
        mma_bf16(o[d], a0, a1, a2, a3, b0, b1);
        mma_bf16(o[d + 1], a0, a1, a2, a3, b2, b3);
      }
    }
    __syncthreads();  // this buffer is refilled two steps on
  }

#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    lA += __shfl_xor_sync(0xffffffffu, lA, o2);
    lB += __shfl_xor_sync(0xffffffffu, lB, o2);
  }
  const float iA = lA > 0 ? 1.0f / lA : 0.0f, iB = lB > 0 ? 1.0f / lB : 0.0f;
  uint16_t* outA = a.out + int64_t(tok0 + rA / G) * qrow + int64_t(g * G + rA % G) * D;
  uint16_t* outB = a.out + int64_t(tok0 + rB / G) * qrow + int64_t(g * G + rB % G) * D;
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    const int col = d * 8 + 2 * tq;
    if (validA) *reinterpret_cast<uint32_t*>(outA + col) = pack_bf16(o[d][0] * iA, o[d][1] * iA);
    if (validB) *reinterpret_cast<uint32_t*>(outB + col) = pack_bf16(o[d][2] * iB, o[d][3] * iB);
  }
}

template <int D, int KT>
void launch_p(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  constexpr size_t smem = size_t(kRows + 4 * KT) * (D + 8) * 2;  // Q, then K and V twice
  static bool attr_set = false;  // once per instantiation (the limit is a property of the function)
  if (!attr_set) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<D, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr_set = true;
  }
  dim3 grid(unsigned(n_tiles), unsigned(a.n_kv_heads));
  attn_prefill_kernel<D, KT><<<grid, kThreads, smem, s>>>(a, tiles);
  ARBOR_LAUNCH_CHECK("attn_prefill_kernel");
}

}  // namespace

void launch_attention_prefill(const AttnArgs& a, const int32_t* tiles, int64_t n_tiles, cudaStream_t s) {
  if (n_tiles == 0) return;
  ARBOR_CU_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.n_heads / a.n_kv_heads <= kRows,
                 "cuda: attention prefill: %d query heads over %d kv heads (groups up to %d)", a.n_heads, a.n_kv_heads, kRows);
  switch (a.head_dim) {
    case 32: launch_p<32, 64>(a, tiles, n_tiles, s); break;
    case 64: launch_p<64, 64>(a, tiles, n_tiles, s); break;
    case 96: launch_p<96, 64>(a, tiles, n_tiles, s); break;
    case 128: launch_p<128, 64>(a, tiles, n_tiles, s); break;
    case 256: launch_p<256, 32>(a, tiles, n_tiles, s); break;
    default: fail_printf("cuda: prefill attention: head_dim %d is not supported (32, 64, 96, 128, 256)", a.head_dim);
  }
}

}  // namespace arbor::cuda
