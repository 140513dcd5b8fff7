// Elementwise and per-row CUDA kernels: embedding gather, norms, rope, KV write, gated activations,
// residual add, softcap, row gather, bias/dtype epilogues. bf16 in and out, f32 arithmetic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/kv_rows.h"
#include "backend/cuda/qk_rows.h"

namespace arbor::cuda {

namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ld(const uint16_t* p, int64_t i) { return __bfloat162float(reinterpret_cast<const bf16*>(p)[i]); }
__device__ __forceinline__ void st(uint16_t* p, int64_t i, float v) { reinterpret_cast<bf16*>(p)[i] = __float2bfloat16(v); }

unsigned grid_for(int64_t n, int threads) {
  int64_t g = (n + threads - 1) / threads;
  return unsigned(g < 1 ? 1 : (g > (int64_t(1) << 30) ? (int64_t(1) << 30) : g));
}

__global__ void embed_kernel(const void* table, bool f16, const int32_t* tokens, const int32_t* picked, int64_t T, int64_t C, float scale,
                             uint16_t* out) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.y;
  const int32_t tok = tokens[t];
  const int64_t row = tok >= 0 ? tok : picked[-1 - int64_t(tok)];  // token_from_last_pick (ids the argmax wrote, < vocab)
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    float v = f16 ? __half2float(static_cast<const __half*>(table)[row * C + c]) : __bfloat162float(static_cast<const bf16*>(table)[row * C + c]);
    st(out, t * C + c, v * scale);
  }
}

// Sum over the threadIdx.x lanes of one row (blockDim.x threads, a multiple of 32); red holds one
// float per warp of the block. Every thread of the row gets the total.
__device__ float row_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warps_per_row = blockDim.x / 32;
  float* r = red + threadIdx.y * warps_per_row;
  __syncthreads();  // red may still be read by the previous call
  if (threadIdx.x % 32 == 0) r[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0;
  for (int w = 0; w < warps_per_row; ++w) s += r[w];
  return s;
}

// blockDim = (threads per row, rows per block). Two passes over x: statistics, then the write (each
// thread writes only the elements it read, so out may alias x). As on the CPU, b applies to LayerNorm only.
// ADD: first x += o * scale, stored as bf16 and normalised from the stored values (add_scaled + norm).
template <bool ADD>
__global__ void norm_kernel(int op, uint16_t* x, const uint16_t* o, float scale, const float* w, const float* b, float eps, int64_t R,
                            int64_t C, uint16_t* out) {
  pdl_trigger();
  pdl_wait();
  __shared__ float red[32];
  const int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = r < R;
  uint16_t* xr = x + (live ? r : 0) * C;
  if (ADD && live) {
    const uint16_t* orow = o + r * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) st(xr, c, ld(xr, c) + ld(orow, c) * scale);
  }
  float s = 0;
  for (int64_t c = threadIdx.x; live && c < C; c += blockDim.x) s += op == 2 ? ld(xr, c) : ld(xr, c) * ld(xr, c);
  s = row_sum(s, red);
  float mean = 0, inv;
  if (op == 2) {  // LayerNorm: mean, then the variance around it
    mean = s / float(C);
    float v = 0;
    for (int64_t c = threadIdx.x; live && c < C; c += blockDim.x) {
      float d = ld(xr, c) - mean;
      v += d * d;
    }
    v = row_sum(v, red);
    inv = rsqrtf(v / float(C) + eps);
  } else {
    inv = rsqrtf(s / float(C) + eps);
  }
  if (!live) return;
  uint16_t* orow = out + r * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float v = ld(xr, c);
    float y = op == 2 ? (v - mean) * inv * w[c] + (b ? b[c] : 0.0f) : op == 1 ? v * inv * (1.0f + w[c]) : v * inv * w[c];
    st(orow, c, y);
  }
}

// RMS norm (optionally fused with the residual add) for rows of C = 8 x blockDim.x elements, C a
// multiple of 256: each thread keeps its 8 elements in registers (16-byte loads of x, o and w), one
// block reduction, so a row costs one round trip to memory instead of three. Same numbers as
// norm_kernel: x + o * scale is rounded to bf16 before it is squared.
template <bool ADD>
__global__ void rms_row_kernel(uint16_t* x, const uint16_t* o, float scale, const float* w, bool plus_one, float eps, int64_t C,
                               uint16_t* out) {
  __shared__ float red[32];
  // The norm weight is no kernel's output: its load (from memory more often than not, the step's
  // weight stream having pushed it out of L2) goes out before waiting on the previous kernel.
  const float4 w0 = *reinterpret_cast<const float4*>(w + threadIdx.x * 8), w1 = *reinterpret_cast<const float4*>(w + threadIdx.x * 8 + 4);
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.x;
  const int64_t base = r * C + int64_t(threadIdx.x) * 8;
  uint4 xq = *reinterpret_cast<const uint4*>(x + base);
  float v[8];
  const bf16* xb = reinterpret_cast<const bf16*>(&xq);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(xb[i]);
  if (ADD) {
    const uint4 oq = *reinterpret_cast<const uint4*>(o + base);
    const bf16* ob = reinterpret_cast<const bf16*>(&oq);
    bf16* xs = reinterpret_cast<bf16*>(&xq);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      xs[i] = __float2bfloat16(v[i] + __bfloat162float(ob[i]) * scale);
      v[i] = __bfloat162float(xs[i]);
    }
    *reinterpret_cast<uint4*>(x + base) = xq;
  }
  float ss = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
    if (threadIdx.x == 0) red[0] = t;
  }
  __syncthreads();
  const float inv = rsqrtf(red[0] / float(C) + eps);
  const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  uint4 oq;
  bf16* ys = reinterpret_cast<bf16*>(&oq);
#pragma unroll
  for (int i = 0; i < 8; ++i) ys[i] = __float2bfloat16(v[i] * inv * (plus_one ? 1.0f + wv[i] : wv[i]));
  *reinterpret_cast<uint4*>(out + base) = oq;
}

__global__ void rope_kernel(uint16_t* x, const int32_t* rows, int64_t n_heads, int64_t head_dim, int64_t half, const float* cos,
                            const float* sin) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.y;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // over n_heads * half
  if (i >= n_heads * half) return;
  const int64_t h = i / half, j = i % half;
  const float c = cos[int64_t(rows[t]) * half + j], s = sin[int64_t(rows[t]) * half + j];
  uint16_t* v = x + (t * n_heads + h) * head_dim;
  const float a = ld(v, j), bb = ld(v, j + half);
  st(v, j, a * c - bb * s);
  st(v, j + half, bb * c + a * s);
}

__global__ void kv_write_kernel(const uint16_t* k, const uint16_t* v, const int32_t* pos, const int32_t* seq, const int32_t* tables,
                                int32_t max_blocks, int64_t row, int64_t bs, uint16_t* kp, uint16_t* vp) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.y;
  const int32_t p = pos[t];
  const int64_t block = tables[int64_t(seq[t]) * max_blocks + p / bs];
  const int64_t slot = block * bs + p % bs;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < row; i += int64_t(gridDim.x) * blockDim.x) {
    kp[slot * row + i] = k[t * row + i];
    vp[slot * row + i] = v[t * row + i];
  }
}

// One warp per (token, head) of q and k: optional per-head RMS norm (rounded to bf16 as head_norm
// stores it), rope on the first rot dims (partner element j +- rot/2, through shared memory), the
// result back into q/k, and for k heads the rotated key plus the matching v head into the KV slot.
__global__ void qk_prep_kernel(QKPrepArgs a) {
  __shared__ float sm[4][256];
  pdl_trigger();
  pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = a.n_heads + a.n_kv_heads;
  const int64_t item = int64_t(blockIdx.x) * 4 + warp;
  if (item >= int64_t(a.T) * H) return;
  const int64_t t = item / H;
  const int h = int(item % H);
  const bool is_k = h >= a.n_heads;
  const int hh = is_k ? h - a.n_heads : h, D = a.head_dim;
  uint16_t* x = is_k ? a.k + (t * a.n_kv_heads + hh) * D : a.q + (t * a.n_heads + hh) * D;
  const float* nw = is_k ? a.k_norm : a.q_norm;
  float* s = sm[warp];
  float ss = 0;
  for (int j = lane; j < D; j += 32) {
    const float v = ld(x, j);
    s[j] = v, ss += v * v;
  }
  if (nw) {
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / float(D) + a.eps);
    for (int j = lane; j < D; j += 32) s[j] = __bfloat162float(__float2bfloat16(s[j] * inv * (a.plus_one ? 1.0f + nw[j] : nw[j])));
  }
  __syncwarp();
  const int32_t p = a.pos[t], rr = a.rope_rows[t];
  int64_t kslot = 0;
  const int64_t row = int64_t(a.n_kv_heads) * D;
  if (is_k) kslot = int64_t(a.tables[int64_t(a.seq[t]) * a.max_blocks + p / a.block_size]) * a.block_size + p % a.block_size;
  for (int j = lane; j < D; j += 32) {
    float out = s[j];
    if (a.cos && j < 2 * a.half) {
      const int jj = j < a.half ? j : j - a.half;
      const float c = a.cos[int64_t(rr) * a.half + jj], sn = a.sin[int64_t(rr) * a.half + jj];
      out = j < a.half ? s[j] * c - s[j + a.half] * sn : s[j] * c + s[j - a.half] * sn;
    }
    const bf16 o = __float2bfloat16(out);
    reinterpret_cast<bf16*>(x)[j] = o;
    if (is_k && a.kc.kind == 0) reinterpret_cast<bf16*>(a.k_pool)[kslot * row + int64_t(hh) * D + j] = o;
  }
  if (is_k && a.kc.kind == 0)
    for (int j = lane; j < D; j += 32) a.v_pool[kslot * row + int64_t(hh) * D + j] = a.v[(t * a.n_kv_heads + hh) * D + j];
}

// The same with 16-byte rows: D / 8 lanes per (token, head) row, 32 / (D / 8) rows per warp (D = 32, 64,
// 128, 256; rope halves a multiple of 8 dims). One pass through registers, no shared memory: the
// scalar kernel ran at 1 TB/s in an 8192-token prefill.
template <int LPK>
__global__ void qk_prep_vec_kernel(QKPrepArgs a) {
  pdl_trigger();
  pdl_wait();
  constexpr int D = LPK * 8, RPW = 32 / LPK;
  const int lane = threadIdx.x % 32, sl = lane % LPK;
  const int H = a.n_heads + a.n_kv_heads;
  const int64_t item = (int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * RPW + lane / LPK, items = int64_t(a.T) * H;
  const bool valid = item < items;  // lanes past the end still take part in the shuffles
  const int64_t t = valid ? item / H : 0;
  const int h = valid ? int(item % H) : 0;
  const bool is_k = h >= a.n_heads;
  const int hh = is_k ? h - a.n_heads : h;
  uint16_t* x = (is_k ? a.k + (t * a.n_kv_heads + hh) * D : a.q + (t * a.n_heads + hh) * D) + sl * 8;
  const int32_t p = a.pos[t];
  float f[8];
  unpack8(*reinterpret_cast<const uint4*>(x), f);
  PrepRow r;
  load_prep_row<LPK>(a, is_k ? a.k_norm : a.q_norm, a.rope_rows[t], sl, r);
  prep_row<LPK>(a, r, lane, sl, f);
  if (a.kc.kind != 0) {
    // Coded pools: the key and value rows encoded as they are written (kv_rows.h). Every lane of the
    // warp takes part in the encoder's shuffles (q rows too, storing nothing).
    const bool store = valid && is_k;
    const int kh = is_k ? hh : 0;
    int64_t slot = 0;
    if (store) slot = int64_t(a.tables[int64_t(a.seq[t]) * a.max_blocks + p / a.block_size]) * a.block_size + p % a.block_size;
    const int64_t row = slot * a.n_kv_heads + kh;
    encode_row8<LPK>(a.kc, f, sl, reinterpret_cast<uint8_t*>(a.k_pool) + row * a.kc.row_bytes, store);
    float vf[8];
    unpack8(*reinterpret_cast<const uint4*>(a.v + (t * a.n_kv_heads + kh) * D + sl * 8), vf);
    encode_row8<LPK>(a.vc, vf, sl, reinterpret_cast<uint8_t*>(a.v_pool) + row * a.vc.row_bytes, store);
    if (valid) *reinterpret_cast<uint4*>(x) = pack8(f);
    return;
  }
  if (!valid) return;
  const uint4 o = pack8(f);
  *reinterpret_cast<uint4*>(x) = o;
  if (is_k) {
    const int64_t row = int64_t(a.n_kv_heads) * D;
    const int64_t slot = int64_t(a.tables[int64_t(a.seq[t]) * a.max_blocks + p / a.block_size]) * a.block_size + p % a.block_size;
    const int64_t off = slot * row + int64_t(hh) * D + sl * 8;
    *reinterpret_cast<uint4*>(a.k_pool + off) = o;
    *reinterpret_cast<uint4*>(a.v_pool + off) = *reinterpret_cast<const uint4*>(a.v + (t * a.n_kv_heads + hh) * D + sl * 8);
  }
}

__device__ __forceinline__ float act_at(int op, const uint16_t* gate, const uint16_t* up, int64_t i) {
  return gate ? act_value(op, ld(gate, i)) * ld(up, i) : act_value(op, ld(up, i));
}
__global__ void activation_kernel(int op, const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st(out, i, act_at(op, gate, up, i));
}
// The same with 16-byte loads and stores (8 elements per thread and step; gate, up and out 16-byte
// aligned): the scalar kernel's 2-byte accesses ran at 1.2 TB/s in a 2048-token prefill. The last
// n % 8 elements go element by element.
__global__ void activation_vec_kernel(int op, const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out) {
  pdl_trigger();
  pdl_wait();
  const int64_t nv = n / 8, stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t v = first; v < nv; v += stride) {
    const uint4 uq = reinterpret_cast<const uint4*>(up)[v];
    const uint4 gq = gate ? reinterpret_cast<const uint4*>(gate)[v] : uq;
    const bf16* ue = reinterpret_cast<const bf16*>(&uq);
    const bf16* ge = reinterpret_cast<const bf16*>(&gq);
    uint4 oq;
    bf16* oe = reinterpret_cast<bf16*>(&oq);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float a = act_value(op, __bfloat162float(ge[e]));
      oe[e] = __float2bfloat16(gate ? a * __bfloat162float(ue[e]) : a);
    }
    reinterpret_cast<uint4*>(out)[v] = oq;
  }
  if (first < n - nv * 8) st(out, nv * 8 + first, act_at(op, gate, up, nv * 8 + first));
}

__global__ void add_scaled_kernel(uint16_t* y, const uint16_t* x, int64_t n, float scale) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st(y, i, ld(y, i) + ld(x, i) * scale);
}

__global__ void scale_softcap_kernel(void* x, bool f32, int64_t n, float scale, float cap) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = (f32 ? static_cast<float*>(x)[i] : ld(static_cast<uint16_t*>(x), i)) * scale;
    if (cap > 0) v = cap * tanhf(v / cap);
    if (f32)
      static_cast<float*>(x)[i] = v;
    else
      st(static_cast<uint16_t*>(x), i, v);
  }
}

__global__ void gather_rows_kernel(const uint16_t* x, int64_t row_elems, const int32_t* rows, uint16_t* out) {
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.y;
  const uint16_t* src = x + int64_t(rows[r]) * row_elems;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < row_elems; i += int64_t(gridDim.x) * blockDim.x)
    out[r * row_elems + i] = src[i];
}

__global__ void add_bias_kernel(void* y, bool f32, const float* bias, int64_t n, int64_t N) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (f32)
      static_cast<float*>(y)[i] += bias[i % N];
    else
      st(static_cast<uint16_t*>(y), i, ld(static_cast<uint16_t*>(y), i) + bias[i % N]);
  }
}

__global__ void finish_f32_kernel(const float* src, const float* bias, int64_t n, int64_t N, void* y, bool f32) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = src[i] + (bias ? bias[i % N] : 0.0f);
    if (f32)
      static_cast<float*>(y)[i] = v;
    else
      st(static_cast<uint16_t*>(y), i, v);
  }
}

__global__ void bf16_to_f16_kernel(const uint16_t* x, int64_t n, uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    reinterpret_cast<__half*>(out)[i] = __float2half(ld(x, i));
}

__global__ void fill_random_kernel(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + uint64_t(i) * 0x9E3779B97F4A7C15ull;  // SplitMix64 of the index
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    st(p, i, float(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

constexpr int kThreads = 256;

// 16-byte aligned: the vector kernels' uint4 accesses may use the pointer.
bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
constexpr unsigned kMaxGrid = 65535;  // grid-stride loops above cover the rest

unsigned flat_grid(int64_t n) {
  unsigned g = grid_for(n, kThreads);
  return g > kMaxGrid * 16 ? kMaxGrid * 16 : g;
}

}  // namespace

void launch_embed(const void* table, DType table_dtype, const int32_t* tokens, const int32_t* picked, int64_t T, int64_t C, float scale,
                  uint16_t* out, cudaStream_t s) {
  if (T == 0) return;
  ARBOR_CU_CHECK(table_dtype == DType::BF16 || table_dtype == DType::F16, "cuda: embed: table dtype %s (BF16 or F16 expected)",
                 dtype_name(table_dtype).data());
  ARBOR_CU_CHECK(T <= 65535, "cuda: embed: %lld tokens exceed one grid dimension", (long long)T);
  dim3 grid(grid_for(C, kThreads) > 64 ? 64 : grid_for(C, kThreads), unsigned(T));
  pdl_launch(embed_kernel, grid, kThreads, 0, s, table, table_dtype == DType::F16, tokens, picked, T, C, scale, out);
  ARBOR_LAUNCH_CHECK("embed_kernel");
}

namespace {
void norm_launch(NormOp op, uint16_t* x, const uint16_t* o, float scale, const float* w, const float* b, float eps, int64_t R, int64_t C,
                 uint16_t* out, cudaStream_t s) {
  if (R == 0) return;
  int tpr = 32;  // threads per row: about 8 elements each, 32..1024
  while (tpr < 1024 && tpr * 8 < C) tpr *= 2;
  const int rows_per_block = tpr >= 256 ? 1 : 256 / tpr;
  const bool vec = aligned(x) && aligned(out) && aligned(o) && aligned(w);  // o may be null (aligned)
  if (op != NormOp::LayerNorm && C % 256 == 0 && C <= 8192 && vec && R <= 0x7fffffff) {
    const bool plus_one = op == NormOp::RMSPlusOne;
    if (o)
      pdl_launch(rms_row_kernel<true>, dim3(unsigned(R)), unsigned(C / 8), 0, s, x, o, scale, w, plus_one, eps, C, out);
    else
      pdl_launch(rms_row_kernel<false>, dim3(unsigned(R)), unsigned(C / 8), 0, s, x, nullptr, 0.0f, w, plus_one, eps, C, out);
    ARBOR_LAUNCH_CHECK("rms_row_kernel");
    return;
  }
  const dim3 block{unsigned(tpr), unsigned(rows_per_block), 1u};
  if (o)
    pdl_launch(norm_kernel<true>, dim3(grid_for(R, rows_per_block)), block, 0, s, int(op), x, o, scale, w, b, eps, R, C, out);
  else
    pdl_launch(norm_kernel<false>, dim3(grid_for(R, rows_per_block)), block, 0, s, int(op), x, nullptr, 0.0f, w, b, eps, R, C, out);
  ARBOR_LAUNCH_CHECK("norm_kernel");
}
}  // namespace

void launch_norm(NormOp op, const uint16_t* x, const float* w, const float* b, float eps, int64_t R, int64_t C, uint16_t* out,
                 cudaStream_t s) {
  norm_launch(op, const_cast<uint16_t*>(x), nullptr, 0.0f, w, b, eps, R, C, out, s);  // x is only read
}

void launch_add_norm(NormOp op, uint16_t* x, const uint16_t* o, float scale, const float* w, const float* b, float eps, int64_t R,
                     int64_t C, uint16_t* out, cudaStream_t s) {
  norm_launch(op, x, o, scale, w, b, eps, R, C, out, s);
}

void launch_qk_prep(const QKPrepArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  ARBOR_CU_CHECK(a.head_dim <= 256 && a.head_dim % 2 == 0, "cuda: qk_prep: head_dim %d (even, <= 256)", a.head_dim);
  const int64_t items = int64_t(a.T) * (a.n_heads + a.n_kv_heads);
  const bool vec = (a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256) && (!a.cos || a.half % 8 == 0) &&
                   aligned(a.q) && aligned(a.k) && aligned(a.v) && aligned(a.k_pool) && aligned(a.v_pool);
  if (vec) {
    const int64_t rows_per_block = 4 * (32 / (a.head_dim / 8));  // 4 warps
    const dim3 grid(grid_for(items, int(rows_per_block)));
    switch (a.head_dim) {
      case 32: pdl_launch(qk_prep_vec_kernel<4>, grid, 128, 0, s, a); break;
      case 64: pdl_launch(qk_prep_vec_kernel<8>, grid, 128, 0, s, a); break;
      case 128: pdl_launch(qk_prep_vec_kernel<16>, grid, 128, 0, s, a); break;
      default: pdl_launch(qk_prep_vec_kernel<32>, grid, 128, 0, s, a); break;
    }
    ARBOR_LAUNCH_CHECK("qk_prep_vec_kernel");
    return;
  }
  pdl_launch(qk_prep_kernel, dim3(grid_for(items, 4)), 128, 0, s, a);
  ARBOR_LAUNCH_CHECK("qk_prep_kernel");
  // Coded pools: the scalar kernel left the prepared keys in k; encode them (and v) into the pools.
  if (a.kc.kind != 0)
    launch_kv_write_coded(a.k, a.v, a.pos, a.seq, a.tables, a.max_blocks, a.T, a.n_kv_heads, a.head_dim, a.block_size, a.kc, a.vc,
                          reinterpret_cast<uint8_t*>(a.k_pool), reinterpret_cast<uint8_t*>(a.v_pool), s);
}

void launch_rope(uint16_t* x, const int32_t* rows, int64_t T, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const float* cos,
                 const float* sin, cudaStream_t s) {
  if (T == 0) return;
  ARBOR_CU_CHECK(T <= 65535, "cuda: rope: %lld tokens exceed one grid dimension", (long long)T);
  const int64_t half = rot_dim / 2;
  dim3 grid(grid_for(n_heads * half, 128), unsigned(T));
  pdl_launch(rope_kernel, grid, 128, 0, s, x, rows, n_heads, head_dim, half, cos, sin);
  ARBOR_LAUNCH_CHECK("rope_kernel");
}

void launch_kv_write(const uint16_t* k, const uint16_t* v, const int32_t* pos, const int32_t* seq, const int32_t* block_tables,
                     int32_t max_blocks, int64_t T, int64_t row, int64_t block_size, uint16_t* k_pool, uint16_t* v_pool,
                     cudaStream_t s) {
  if (T == 0) return;
  ARBOR_CU_CHECK(T <= 65535, "cuda: kv_write: %lld tokens exceed one grid dimension", (long long)T);
  dim3 grid(grid_for(row, kThreads) > 16 ? 16 : grid_for(row, kThreads), unsigned(T));
  pdl_launch(kv_write_kernel, grid, kThreads, 0, s, k, v, pos, seq, block_tables, max_blocks, row, block_size, k_pool, v_pool);
  ARBOR_LAUNCH_CHECK("kv_write_kernel");
}

void launch_activation(ActOp op, const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out, cudaStream_t s) {
  if (n == 0) return;
  if (aligned(up) && aligned(out) && (!gate || aligned(gate)))
    pdl_launch(activation_vec_kernel, flat_grid((n + 7) / 8), kThreads, 0, s, int(op), gate, up, n, out);
  else
    pdl_launch(activation_kernel, flat_grid(n), kThreads, 0, s, int(op), gate, up, n, out);
  ARBOR_LAUNCH_CHECK("activation_kernel");
}

void launch_add_scaled(uint16_t* y, const uint16_t* x, int64_t n, float scale, cudaStream_t s) {
  if (n == 0) return;
  pdl_launch(add_scaled_kernel, flat_grid(n), kThreads, 0, s, y, x, n, scale);
  ARBOR_LAUNCH_CHECK("add_scaled_kernel");
}

void launch_scale_softcap(void* x, DType dtype, int64_t n, float scale, float cap, cudaStream_t s) {
  if (n == 0) return;
  ARBOR_CU_CHECK(dtype == DType::F32 || dtype == DType::BF16, "cuda: scale_softcap: dtype %s (F32 or BF16)", dtype_name(dtype).data());
  pdl_launch(scale_softcap_kernel, flat_grid(n), kThreads, 0, s, x, dtype == DType::F32, n, scale, cap);
  ARBOR_LAUNCH_CHECK("scale_softcap_kernel");
}

void launch_gather_rows(const void* x, int64_t row_bytes, const int32_t* rows, int64_t R, void* out, cudaStream_t s) {
  if (R == 0) return;
  ARBOR_CU_CHECK(row_bytes % 2 == 0 && R <= 65535, "cuda: gather_rows: rows of %lld bytes, %lld rows", (long long)row_bytes, (long long)R);
  const int64_t elems = row_bytes / 2;
  dim3 grid(grid_for(elems, kThreads) > 64 ? 64 : grid_for(elems, kThreads), unsigned(R));
  pdl_launch(gather_rows_kernel, grid, kThreads, 0, s, static_cast<const uint16_t*>(x), elems, rows, static_cast<uint16_t*>(out));
  ARBOR_LAUNCH_CHECK("gather_rows_kernel");
}

void launch_add_bias(void* y, DType y_dtype, const float* bias, int64_t T, int64_t N, cudaStream_t s) {
  if (T * N == 0) return;
  pdl_launch(add_bias_kernel, flat_grid(T * N), kThreads, 0, s, y, y_dtype == DType::F32, bias, T * N, N);
  ARBOR_LAUNCH_CHECK("add_bias_kernel");
}

void launch_finish_f32(const float* src, const float* bias, int64_t T, int64_t N, void* y, DType y_dtype, cudaStream_t s) {
  if (T * N == 0) return;
  finish_f32_kernel<<<flat_grid(T * N), kThreads, 0, s>>>(src, bias, T * N, N, y, y_dtype == DType::F32);
  ARBOR_LAUNCH_CHECK("finish_f32_kernel");
}

void launch_bf16_to_f16(const uint16_t* x, int64_t n, uint16_t* out, cudaStream_t s) {
  if (n == 0) return;
  bf16_to_f16_kernel<<<flat_grid(n), kThreads, 0, s>>>(x, n, out);
  ARBOR_LAUNCH_CHECK("bf16_to_f16_kernel");
}

void launch_fill_random_bf16(uint16_t* p, int64_t n, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  fill_random_kernel<<<flat_grid(n), kThreads, 0, s>>>(p, n, seed);
  ARBOR_LAUNCH_CHECK("fill_random_kernel");
}

}  // namespace arbor::cuda
