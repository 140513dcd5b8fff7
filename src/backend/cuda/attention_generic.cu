// Attention over the paged bf16 KV cache for any head_dim up to kGenericMaxHeadDim: the path for the
// head_dims the tuned kernels (attention_decode.cu, attention_prefill*.cu) do not take, prefill and
// decode steps alike. One warp per (token, query head): the lanes score 32 keys at a time, each lane
// one whole key row (f32 dot product against q in shared memory), fold them into an online softmax,
// then accumulate the 32 value rows with the output dims strided over the lanes (dim lane + 32 i).
// Simple rather than fast: every score and sum in f32, the output rounded to bf16 once.
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.h"

namespace arbor::cuda {

namespace {

constexpr int kGenericWarps = 4;

__device__ __forceinline__ float bf16_at(const uint16_t* p, int64_t i) { return __uint_as_float(uint32_t(p[i]) << 16); }

// DPL: output dims per lane (head_dim <= 32 * DPL).
template <int DPL>
__global__ void __launch_bounds__(kGenericWarps * 32) attn_generic_kernel(AttnArgs a, int64_t T) {
  __shared__ float q_sm[kGenericWarps][32 * DPL];
  pdl_trigger();
  pdl_wait();  // q and this step's keys come from the previous kernels
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = int64_t(blockIdx.x) * kGenericWarps + warp;
  if (item >= T * a.n_heads) return;  // the whole warp: no shuffle below is left short
  const int64_t t = item / a.n_heads;
  const int h = int(item % a.n_heads), D = a.head_dim, g = h / (a.n_heads / a.n_kv_heads);
  const int32_t pos = a.pos[t], lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int32_t* table = a.block_tables + int64_t(a.seq[t]) * a.max_blocks;
  const int64_t kvrow = int64_t(a.n_kv_heads) * D;
  float* q = q_sm[warp];
  const uint16_t* qh = a.q + (t * a.n_heads + h) * D;
  for (int d = lane; d < D; d += 32) q[d] = bf16_at(qh, d);
  __syncwarp();

  float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
  for (int32_t k0 = lo; k0 <= pos; k0 += 32) {
    const int32_t kp = k0 + lane;
    float s = -INFINITY;
    if (kp <= pos) {
      const uint16_t* kr = a.k_pool + kv_slot(a, table, kp) * kvrow + int64_t(g) * D;
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += q[d] * bf16_at(kr, d);
      s = dot * a.scale;
      if (a.softcap > 0) s = a.softcap * tanhf(s / a.softcap);
    }
    float mx = s;
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m, mx);  // finite: key k0 is always in range
    const float corr = expf(m - m_new);  // 0 on the first step (m = -inf)
    const float p = kp <= pos ? expf(s - m_new) : 0.0f;
    float ps = p;
    for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
    l = l * corr + ps;
    m = m_new;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] *= corr;
    const int nk = min(32, pos + 1 - k0);
    for (int j = 0; j < nk; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const uint16_t* vr = a.v_pool + kv_slot(a, table, k0 + j) * kvrow + int64_t(g) * D;
#pragma unroll
      for (int i = 0; i < DPL; ++i)
        if (lane + 32 * i < D) acc[i] += pj * bf16_at(vr, lane + 32 * i);
    }
  }
  uint16_t* out = a.out + (t * a.n_heads + h) * D;
  const float inv = l > 0 ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < DPL; ++i)
    if (lane + 32 * i < D) out[lane + 32 * i] = __bfloat16_as_ushort(__float2bfloat16(acc[i] * inv));
}

}  // namespace

bool attention_tuned_head_dim(int head_dim, bool decode) {
  if (decode) return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

void launch_attention_generic(const AttnArgs& a, int64_t T, cudaStream_t s) {
  if (T == 0) return;
  ARBOR_CU_CHECK(a.head_dim >= 1 && a.head_dim <= kGenericMaxHeadDim, "cuda: attention: head_dim %d (1..%d)", a.head_dim,
                 kGenericMaxHeadDim);
  ARBOR_CU_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "cuda: attention: %d query heads over %d kv heads", a.n_heads,
                 a.n_kv_heads);
  const int64_t items = T * a.n_heads;
  const dim3 grid(unsigned((items + kGenericWarps - 1) / kGenericWarps));
  if (a.head_dim <= 128) pdl_launch(attn_generic_kernel<4>, grid, kGenericWarps * 32, 0, s, a, T);
  else if (a.head_dim <= 256) pdl_launch(attn_generic_kernel<8>, grid, kGenericWarps * 32, 0, s, a, T);
  else pdl_launch(attn_generic_kernel<16>, grid, kGenericWarps * 32, 0, s, a, T);
  ARBOR_LAUNCH_CHECK("attn_generic_kernel");
}

}  // namespace arbor::cuda
