// Coded KV cache on CUDA (quant/kv_codec.h, docs/kv-cache.md): the encode of new K/V rows (the plain
// kv_write path; the q/k prep kernel encodes through the same kv_rows.h), split-K decode attention
// reading the codes, its split merge (with TurboQuant's deferred inverse rotation), and the dequantize of
// whole blocks into bf16 that the prefill path runs the tensor-core kernels over.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_kv.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_mma_layout.h"
#include "backend/cuda/kv_rows.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/qk_rows.h"

namespace arbor::cuda {

namespace {

constexpr int kAffine = int(KVCodecKind::Affine), kTurboKey = int(KVCodecKind::TurboKey), kTurboValue = int(KVCodecKind::TurboValue);

unsigned grid_for(int64_t n, int per) { return unsigned((n + per - 1) / per < 1 ? 1 : (n + per - 1) / per); }

// One head row held 8 per lane into `row`: coded, or plain bf16 (16 bytes a lane).
template <int LPK>
__device__ __forceinline__ void write_row8(const KVCodecDev& c, const float* f, int sl, uint8_t* row, bool write) {
  if (c.kind == 0) {
    if (write) *reinterpret_cast<uint4*>(row + sl * 16) = pack8(f);
    return;
  }
  encode_row8<LPK>(c, f, sl, row, write);
}

// The values of one head row held 8 per lane, as stored (TurboQuant values rotated back across the
// row's lanes: butterflies in the reference's order, then (1 / sqrt(D)) * sign). Every lane calls it.
template <int LPK>
__device__ void decode_row8(const KVCodecDev& c, const uint8_t* row, int sl, float* f) {
  constexpr int D = LPK * 8;
  if (c.kind == 0) {
    unpack8(*reinterpret_cast<const uint4*>(row + sl * 16), f);
    return;
  }
  const int bits = c.bits, code_bytes = D * bits / 8, G = D / c.group, grp = sl * 8 / c.group;
  const uint64_t w = load_codes<0>(row, sl, bits);
  const float s = f16_value(*reinterpret_cast<const uint16_t*>(row + code_bytes + 2 * grp));
  if (c.kind == kTurboValue) {
    const float* cent = kLloydMax[bits - 2];
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = cent[code_at(w, e, bits)] * s;
#pragma unroll
    for (int h = 1; h < 8; h *= 2)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (!(e & h)) {
          const float a = f[e], b = f[e + h];
          f[e] = a + b, f[e + h] = a - b;
        }
#pragma unroll
    for (int m = 1; m < LPK; m *= 2) {
      const bool upper = sl & m;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float o = __shfl_xor_sync(0xffffffffu, f[e], m);
        f[e] = upper ? o - f[e] : f[e] + o;
      }
    }
    const float inv = 1.0f / sqrtf(float(D));
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] *= inv * turbo_sign(sl * 8 + e);
    return;
  }
  const float z = f16_value(*reinterpret_cast<const uint16_t*>(row + code_bytes + 2 * G + 2 * grp));
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const uint32_t q = code_at(w, e, bits);
    if (c.kind == kAffine) f[e] = float(q) * s + z;
    else f[e] = (bits == 8 ? float(int8_t(uint8_t(q))) + z : float(q) + z) * s;
  }
}

// Row item of a grid of 4-warp blocks, 32 / LPK rows a warp.
template <int LPK>
__device__ __forceinline__ int64_t row_item() {
  return (int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * (32 / LPK) + (threadIdx.x % 32) / LPK;
}

template <int LPK>
__global__ void kv_write_coded_kernel(const uint16_t* k, const uint16_t* v, const int32_t* pos, const int32_t* seq, const int32_t* tables,
                                      int32_t max_blocks, int T, int H, int64_t bs, KVCodecDev kc, KVCodecDev vc, uint8_t* kp, uint8_t* vp) {
  pdl_trigger();
  pdl_wait();
  constexpr int D = LPK * 8;
  const int sl = threadIdx.x % LPK;
  const int64_t item = row_item<LPK>();
  const bool valid = item < int64_t(T) * H;  // lanes past the end still take part in the shuffles
  const int64_t t = valid ? item / H : 0;
  const int h = valid ? int(item % H) : 0;
  int64_t slot = 0;
  if (valid) {
    const int32_t p = pos[t];
    slot = int64_t(tables[int64_t(seq[t]) * max_blocks + p / bs]) * bs + p % bs;
  }
  const int64_t src = (t * H + h) * D + sl * 8;
  float f[8];
  unpack8(*reinterpret_cast<const uint4*>(k + src), f);
  write_row8<LPK>(kc, f, sl, kp + (slot * H + h) * kc.row_bytes, valid);
  unpack8(*reinterpret_cast<const uint4*>(v + src), f);
  write_row8<LPK>(vc, f, sl, vp + (slot * H + h) * vc.row_bytes, valid);
}

template <int LPK>
__global__ void kv_dequant_kernel(const uint8_t* kp, const uint8_t* vp, KVCodecDev kc, KVCodecDev vc, const int32_t* src_blocks, int64_t bs,
                                  int H, uint16_t* ko, uint16_t* vo) {
  pdl_trigger();
  pdl_wait();
  constexpr int D = LPK * 8;
  const int sl = threadIdx.x % LPK;
  const int64_t rows = bs * H, item = row_item<LPK>();
  const bool valid = item < rows;
  const int64_t r = valid ? item : 0, i = blockIdx.y;
  const int64_t src = int64_t(src_blocks[i]) * rows + r, dst = i * rows + r;
  float f[8];
  decode_row8<LPK>(kc, kp + src * kc.row_bytes, sl, f);
  if (valid) *reinterpret_cast<uint4*>(ko + dst * D + sl * 8) = pack8(f);
  decode_row8<LPK>(vc, vp + src * vc.row_bytes, sl, f);
  if (valid) *reinterpret_cast<uint4*>(vo + dst * D + sl * 8) = pack8(f);
}

// Split-K decode over coded rows: the block layout of attention_decode.cu's kernel (one block per
// (key range, kv head, token), D/8 lanes per key row, up to kHeads query heads sharing every load),
// each lane reading its 8 dims' codes (b bytes), its group's f16 scale and bias / zero point, and
// dequantizing in registers. TURBO: keys TurboQuant affine, values TurboQuant (accumulated as
// centroid * scale, in the rotated domain; the merge rotates back). KB / VB: the code bits when fixed
// at compile time (0: read from the codec). Partials (o, max, sum) always go to scratch.
// PREP (one token per sequence): the q/k prep of launch_qk_prep inside, as attention_decode.cu's
// kernel does it; the split holding the token's own position encodes its key and value (every block
// of that split, in registers: the lanes' codes and scales are what they would load) and the first
// head chunk's block stores them in the pools.
template <int D, int kHeads, bool TURBO, int KB, int VB, bool PREP>
__global__ void __launch_bounds__(128) attn_decode_coded_kernel(AttnArgs a, KVCodecDev kc, KVCodecDev vc, int n_splits, int head_chunks,
                                                                float* scratch, QKPrepArgs pa) {
  pdl_trigger();
  constexpr int kWarps = 4;
  constexpr int LPK = D / 8, KPW = 32 / LPK, NSG = kWarps * KPW;
  constexpr int NPRE = kHeads <= 4 ? 4 : 2;  // key steps in flight per lane
  constexpr int GRP = TURBO ? 32 : 64;       // values per scale
  __shared__ float sm_o[NSG][kHeads][D];
  __shared__ float sm_m[NSG][kHeads], sm_l[NSG][kHeads];
  __shared__ float cent[16];

  const int kbits = KB > 0 ? KB : kc.bits, vbits = VB > 0 ? VB : vc.bits;
  if (TURBO && threadIdx.x < (1 << vbits)) cent[threadIdx.x] = kLloydMax[vbits - 2][threadIdx.x];

  const int split = blockIdx.x, g = blockIdx.y / head_chunks, chunk = blockIdx.y % head_chunks;
  const int64_t t = blockIdx.z;
  const int G = a.n_heads / a.n_kv_heads;
  const int h0 = g * G + chunk * kHeads;
  const int nh = min(kHeads, G - chunk * kHeads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / LPK, sl = lane % LPK;
  const int sg = warp * KPW + sub;

  const int32_t pos = a.pos[t];
  const int32_t lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int32_t split_len = (pos + 1 - lo + n_splits - 1) / n_splits;
  const int32_t k_begin = lo + split * split_len, k_end = min(pos + 1, k_begin + split_len);
  const int32_t* table = a.block_tables + int64_t(a.seq[t]) * a.max_blocks;
  const int64_t qrow = int64_t(a.n_heads) * D;
  const uint8_t* kpool = reinterpret_cast<const uint8_t*>(a.k_pool);
  const uint8_t* vpool = reinterpret_cast<const uint8_t*>(a.v_pool);
  const int grp = sl * 8 / GRP;
  const int ks_off = D * kbits / 8 + 2 * grp, kz_off = ks_off + 2 * (D / GRP);
  const int vs_off = D * vbits / 8 + 2 * grp, vz_off = vs_off + 2 * (D / GRP);

  struct Raw {
    uint64_t kw, vw;
    uint16_t ks, kz, vs, vz;
  };
  Raw own;  // PREP: this token's own key and value, encoded here
  own.kw = own.vw = 0, own.ks = own.kz = own.vs = own.vz = 0;
  auto load = [&](int32_t kp, Raw& r) {
    if (PREP && kp == pos) {
      r = own;
      return;
    }
    if (kp >= k_end) {
      r.kw = r.vw = 0, r.ks = r.kz = r.vs = r.vz = 0;
      return;
    }
    const int64_t row = kv_slot(a, table, kp) * a.n_kv_heads + g;
    const uint8_t* kr = kpool + row * kc.row_bytes;
    const uint8_t* vr = vpool + row * vc.row_bytes;
    r.kw = load_codes<KB>(kr, sl, kbits);
    r.vw = load_codes<VB>(vr, sl, vbits);
    r.ks = *reinterpret_cast<const uint16_t*>(kr + ks_off);
    r.kz = *reinterpret_cast<const uint16_t*>(kr + kz_off);
    r.vs = *reinterpret_cast<const uint16_t*>(vr + vs_off);
    r.vz = TURBO ? uint16_t(0) : *reinterpret_cast<const uint16_t*>(vr + vz_off);
  };

  // With PREP every cache row but this step's was written by earlier steps: the first key steps' rows
  // and the prep's constants are loaded before waiting on the previous kernel (which writes q, k, v).
  Raw ring[NPRE];
  const int32_t kp0 = k_begin + warp * KPW + sub;
  const bool owner = PREP && k_begin <= pos && pos < k_end;
  PrepRow q_prep, k_prep;
  if (PREP) {
#pragma unroll
    for (int j = 0; j < NPRE; ++j) load(kp0 + j * NSG, ring[j]);  // own (zero for now) at pos
    const int32_t rope_row = pa.rope_rows[t];
    load_prep_row<LPK>(pa, pa.q_norm, rope_row, sl, q_prep);
    if (owner) load_prep_row<LPK>(pa, pa.k_norm, rope_row, sl, k_prep);
  }
  pdl_wait();  // the previous kernel writes q and this step's key and value
  if (!PREP)
#pragma unroll
    for (int j = 0; j < NPRE; ++j) load(kp0 + j * NSG, ring[j]);

  float q[kHeads][8], acc[kHeads][8], m[kHeads], l[kHeads];
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    m[i] = -INFINITY, l[i] = 0.0f;
    if (i < nh) {
      unpack8(*reinterpret_cast<const uint4*>(a.q + t * qrow + int64_t(h0 + i) * D + sl * 8), q[i]);
      if (PREP) prep_row<LPK>(pa, q_prep, lane, sl, q[i]);
#pragma unroll
      for (int e = 0; e < 8; ++e) q[i][e] *= a.scale;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
  }
  if (owner) {
    // Every row slot of every warp encodes the same own key and value (the encoder's shuffles stay
    // within a row's lanes); one row of the first head chunk's block stores them.
    const int64_t kvrow = int64_t(a.n_kv_heads) * D;
    float kf[8], vf[8];
    unpack8(*reinterpret_cast<const uint4*>(pa.k + t * kvrow + int64_t(g) * D + sl * 8), kf);
    prep_row<LPK>(pa, k_prep, lane, sl, kf);
    unpack8(*reinterpret_cast<const uint4*>(pa.v + t * kvrow + int64_t(g) * D + sl * 8), vf);
    const bool store = chunk == 0 && warp == 0 && sub == 0;
    const int64_t row = kv_slot(a, table, pos) * a.n_kv_heads + g;
    const CodedRow8 ke = encode_row8<LPK>(kc, kf, sl, reinterpret_cast<uint8_t*>(pa.k_pool) + row * kc.row_bytes, store);
    const CodedRow8 ve = encode_row8<LPK>(vc, vf, sl, reinterpret_cast<uint8_t*>(pa.v_pool) + row * vc.row_bytes, store);
    own.kw = ke.codes, own.ks = ke.s, own.kz = ke.z, own.vw = ve.codes, own.vs = ve.s, own.vz = ve.z;
#pragma unroll
    for (int j = 0; j < NPRE; ++j)
      if (kp0 + j * NSG == pos) ring[j] = own;
  }
  __syncthreads();  // cent

  for (int32_t base = k_begin + warp * KPW; base < k_end; base += NSG) {
    const int32_t kp = base + sub;
    const bool live = kp < k_end;
    const Raw cur = ring[0];
#pragma unroll
    for (int j = 0; j + 1 < NPRE; ++j) ring[j] = ring[j + 1];
    load(kp + NPRE * NSG, ring[NPRE - 1]);
    float kf[8], vf[8];
    const float ks = f16_value(cur.ks), kz = f16_value(cur.kz), vs = f16_value(cur.vs), vz = f16_value(cur.vz);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint32_t kq = code_at(cur.kw, e, kbits), vq = code_at(cur.vw, e, vbits);
      if (!TURBO) kf[e] = fmaf(float(kq), ks, kz);
      else kf[e] = (kbits == 8 ? float(int8_t(uint8_t(kq))) + kz : float(kq) + kz) * ks;
      if (!TURBO) vf[e] = fmaf(float(vq), vs, vz);
      else vf[e] = cent[vq] * vs;
    }
#pragma unroll
    for (int i = 0; i < kHeads; ++i) {
      if (i >= nh) break;
      float s = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) s = fmaf(q[i][e], kf[e], s);
#pragma unroll
      for (int o = LPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (!live) continue;
      if (a.softcap > 0) s = a.softcap * tanhf(s / a.softcap);
      // Online softmax rescaling only when the running max grows (after the first keys, rarely): one
      // exp and 8 FMAs a key otherwise, where always rescaling costs two exps and 8 more multiplies.
      // The condition is uniform over the key's lanes.
      if (s > m[i]) {
        const float corr = __expf(m[i] - s);  // 0 for the first key (m = -inf; acc and l are 0)
        l[i] *= corr;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][e] *= corr;
        m[i] = s;
      }
      const float p = __expf(s - m[i]);
      l[i] += p;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[i][e] = fmaf(p, vf[e], acc[i][e]);
    }
  }

  // Merge the NSG key slots of the block, then this split's partial to scratch.
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    if (i >= nh) break;
#pragma unroll
    for (int e = 0; e < 8; ++e) sm_o[sg][i][sl * 8 + e] = acc[i][e];
    if (sl == 0) sm_m[sg][i] = m[i], sm_l[sg][i] = l[i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nh * D; idx += blockDim.x) {
    const int i = idx / D, d = idx % D;
    float M = -INFINITY;
    for (int j = 0; j < NSG; ++j) M = fmaxf(M, sm_m[j][i]);
    float L = 0, O = 0;
    if (M > -INFINITY) {
      for (int j = 0; j < NSG; ++j) {
        const float w = __expf(sm_m[j][i] - M);
        L += sm_l[j][i] * w;
        O += sm_o[j][i][d] * w;
      }
    }
    float* p = scratch + ((t * a.n_heads + h0 + i) * n_splits + split) * (D + 2);
    p[d] = O;
    if (d == 0) p[D] = M, p[D + 1] = L;
  }
}

// The split merge, one block of D threads per (head, token): out = Σ_s O_s e^{M_s - M} / Σ_s L_s e^{M_s - M};
// with turbo the merged head is in TurboQuant's rotated domain and is rotated back here, once per
// output head: the FWHT through shared memory (the reference's butterflies and order), then
// (1 / sqrt(D)) * sign.
__global__ void attn_combine_coded_kernel(const float* scratch, int n_splits, int D, int n_heads, bool turbo, uint16_t* out) {
  __shared__ float wgt[kDecodeMaxSplits];
  __shared__ float red[8];
  __shared__ float x[256];
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, d = threadIdx.x, lane = d % 32, warp = d / 32, warps = D / 32;
  const int64_t t = blockIdx.y;
  const float* p = scratch + (t * n_heads + h) * n_splits * (D + 2);
  float m = -INFINITY;
  for (int s = d; s < n_splits; s += D) m = fmaxf(m, p[int64_t(s) * (D + 2) + D]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  float M = red[0];
  for (int w = 1; w < warps; ++w) M = fmaxf(M, red[w]);
  __syncthreads();
  float l = 0;
  for (int s = d; s < n_splits; s += D) {
    const float ms = p[int64_t(s) * (D + 2) + D];
    const float w = ms == -INFINITY ? 0.0f : __expf(ms - M);
    wgt[s] = w, l += w * p[int64_t(s) * (D + 2) + D + 1];
  }
  for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
  if (lane == 0) red[warp] = l;
  __syncthreads();
  float L = 0;
  for (int w = 0; w < warps; ++w) L += red[w];
  float O = 0;
#pragma unroll 8
  for (int s = 0; s < n_splits; ++s) O += p[int64_t(s) * (D + 2) + d] * wgt[s];
  float o = L > 0 ? O / L : 0.0f;
  if (turbo) {
    x[d] = o;
    __syncthreads();
    for (int hh = 1; hh < D; hh *= 2) {
      const float a = x[d], b = x[d ^ hh];
      __syncthreads();
      x[d] = (d & hh) ? b - a : a + b;
      __syncthreads();
    }
    const float inv = 1.0f / sqrtf(float(D));
    o = x[d] * (inv * turbo_sign(d));
  }
  out[(t * n_heads + h) * D + d] = __bfloat16_as_ushort(__float2bfloat16(o));
}


// ---- Tensor-core decode attention (attn_decode_mma_kernel) ----------------------------------------
// Split-K decode over KV rows as mma.sync m16n8k16 tiles (kv_mma_layout.h: which lane holds which
// element): one block of 4 warps per (key range, kv head, token), the GQA group's heads (up to 16) as
// the M rows, each warp walking 16-key tiles of the block's range (warp w takes tiles w, w + 4, ...)
// with NR tiles' loads in flight. A lane loads one contiguous run of each row it needs (a key row's
// quarter, a value row's eighth: codes, then its group's scale and bias), so no element is dequantized
// twice and the softmax runs once per (head, key) instead of once per lane of a row.
//   Keys: dequantized to f16 (affine c s + z; TurboQuant (c + z) s, one rounding each) and multiplied
//   with q in f16 (q's bf16 values are exact in f16 unless beyond its range), scores in f32.
//   Values: dequantized to f16 in registers, two keys' codes of one dim per f16x2 FMA (affine c s + z,
//   TurboQuant centroid s from a table of centroid pairs, in the rotated domain: the merge rotates
//   back); the probabilities P as f16 (bf16 rows: P and V in bf16).
//   Plain bf16 rows (KB = VB = 16): bf16 operands straight from the loads.
// The softmax is online per tile in base 2; partials (o, max, sum) go to scratch in attn_decode_coded
// kernel's format (max in natural-log units), or, with one split and no rotation to undo, the block
// writes the output. UNCHECKED on a GPU as of this commit (no device this session): off by default,
// ARBOR_CUDA_KV_ATTN=v2 selects it for coded rows, v2all for bf16 rows too (set_kv_decode_mma for tests).
namespace mma {

constexpr uint32_t kH1024 = 0x64006400u, kH1152 = 0x64806480u, kHInv16 = 0x2c002c00u, kHNeg64 = 0xd400d400u;

__device__ __forceinline__ uint32_t hsub2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hadd2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
// 1024 + c -> c, and 1024 + 16 c -> c (exact).
__device__ __forceinline__ uint32_t from_lo(uint32_t r) { return hsub2(r, kH1024); }
__device__ __forceinline__ uint32_t from_hi(uint32_t r) { return hfma2(r, kHInv16, kHNeg64); }

template <bool BF>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (BF) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
__device__ __forceinline__ uint16_t bf16_to_f16_bits(uint16_t b) { return __half_as_ushort(__float2half_rn(__uint_as_float(uint32_t(b) << 16))); }

// c (16x8 f32) += a (16x16) b (16x8), f16 or bf16 operands.
template <bool BF>
__device__ __forceinline__ void mma16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (BF)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

constexpr int lowbit16(int x) { return (x & -x) > 16 ? 16 : (x & -x); }

// N 32-bit words from p, aligned to ALIGN bytes, in the widest loads that allows.
template <int N, int ALIGN>
__device__ __forceinline__ void ldw(const uint8_t* p, uint32_t* w) {
  if constexpr (ALIGN >= 16 && N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 x = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
    }
  } else if constexpr (ALIGN >= 8 && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const uint2 x = reinterpret_cast<const uint2*>(p)[i];
      w[2 * i] = x.x, w[2 * i + 1] = x.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = reinterpret_cast<const uint32_t*>(p)[i];
  }
}

// Compile-time shape of one (D, codec) instance. KB / VB: code bits, 16 for plain bf16 rows.
template <int D, int KB, int VB, bool TURBO>
struct Shape {
  static constexpr bool BF = KB == 16;
  static constexpr int GRP = TURBO ? 32 : 64;
  static constexpr int KCB = D * KB / 8, VCB = D * VB / 8;                   // code bytes of a row
  static constexpr int KRB = BF ? 2 * D : KCB + 4 * (D / GRP);               // row bytes (kv_codec.h)
  static constexpr int VRB = BF ? 2 * D : VCB + (TURBO ? 2 : 4) * (D / GRP);
  static constexpr int KW = D / 4 * KB / 32;                                 // words of a key row per lane
  static constexpr int VW = VB == 3 ? 2 : D / 8 * VB / 32;                   // words of a value row per lane
  static constexpr int KOFF = D / 4 * KB / 8;                                // lane q's key bytes start at q KOFF
  static constexpr int VOFF = D / 8 * VB / 8;                                // lane g's value bytes at g VOFF (VB 3: bits / 8, see vspan)
  static constexpr int KALIGN = lowbit16(KRB) < lowbit16(KOFF) ? lowbit16(KRB) : lowbit16(KOFF);
  static constexpr int VALIGN = VB == 3 ? 4 : (lowbit16(VRB) < lowbit16(VOFF) ? lowbit16(VRB) : lowbit16(VOFF));
  static constexpr int NR = (BF && D == 128) ? 1 : 2;  // tiles in flight per warp (bf16 rows at D 128: 64 registers a tile)
  static_assert(D == 64 || D == 128, "the mma decode kernel takes head_dim 64 and 128");
  static_assert(BF ? VB == 16 && !TURBO : (KB == 4 || KB == 8) && (VB == 3 || VB == 4 || VB == 8), "codec bits");
  static_assert(!TURBO || (KB == 8 && (VB == 3 || VB == 4)), "TurboQuant: 8-bit keys, 3- or 4-bit values");
};

template <int D, int KB, int VB, bool TURBO>
struct Tile {
  using S = Shape<D, KB, VB, TURBO>;
  uint32_t k[2][S::KW];  // keys g and g + 8 of the tile: this lane's quarter of each row
  uint32_t v[4][S::VW];  // values of keys 2q, 2q + 1, 2q + 8, 2q + 9: this lane's eighth
  uint32_t ks[2], kz[2], vs[4], vz[4];  // f16 scale and bias / zero point of the lane's group (coded)
};

}  // namespace mma

template <int D, int KB, int VB, bool TURBO, bool ROWS16>
__global__ void __launch_bounds__(128) attn_decode_mma_kernel(AttnArgs a, int n_splits, float* scratch) {
  using namespace mma;
  using S = Shape<D, KB, VB, TURBO>;
  using TileT = Tile<D, KB, VB, TURBO>;
  constexpr bool BF = S::BF;
  constexpr int kWarps = 4, ROWS = ROWS16 ? 16 : 8, NCH = D / 16, NT = D / 8, NR = S::NR;
  constexpr int kTab = TURBO ? 1 << (2 * VB) : 1;
  constexpr int kQBytes = 16 * D * 2, kOBytes = kWarps * ROWS * D * 4;
  __shared__ __align__(16) uint8_t smem[kQBytes > kOBytes ? kQBytes : kOBytes];
  __shared__ uint32_t tab[kTab];  // TURBO: (cent[i & m], cent[i >> VB]) as f16x2
  __shared__ float sm_m[kWarps][ROWS], sm_l[kWarps][ROWS];
  pdl_trigger();

  const int split = blockIdx.x, g = blockIdx.y;
  const int64_t t = blockIdx.z;
  const int G = a.n_heads / a.n_kv_heads, h0 = g * G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
  if constexpr (TURBO) {
    for (int i = threadIdx.x; i < kTab; i += blockDim.x) {
      const float* cent = kLloydMax[VB - 2];
      tab[i] = pack2<false>(cent[i & ((1 << VB) - 1)], cent[i >> VB]);
    }
  }
  pdl_wait();  // q and the cache rows come from the kernels before

  const int32_t pos = a.pos[t];
  const int32_t lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int32_t split_len = (pos + 1 - lo + n_splits - 1) / n_splits;
  const int32_t k_begin = lo + split * split_len, k_end = min(pos + 1, k_begin + split_len);
  const int32_t* table = a.block_tables + int64_t(a.seq[t]) * a.max_blocks;
  const int64_t qrow = int64_t(a.n_heads) * D;

  // q of the group's heads (rows >= G zero) staged in shared memory as the operand type, then each
  // lane's A fragments gathered with k_dim's map: qa[c][0] rows g (a0), qa[c][1] (a2); qb: rows g + 8.
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);
  for (int idx = threadIdx.x; idx < 16 * D; idx += blockDim.x) {
    const int i = idx / D, d = idx % D;
    const uint16_t b = i < G ? a.q[t * qrow + int64_t(h0 + i) * D + d] : uint16_t(0);
    qs[idx] = BF ? b : bf16_to_f16_bits(b);
  }
  __syncthreads();
  uint32_t qa[NCH][2], qb[NCH][2];
#pragma unroll
  for (int c = 0; c < NCH; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int d0 = kvmma::k_dim<KB, D>(tq, c, 2 * h), d1 = kvmma::k_dim<KB, D>(tq, c, 2 * h + 1);
      qa[c][h] = uint32_t(qs[gq * D + d0]) | uint32_t(qs[gq * D + d1]) << 16;
      qb[c][h] = ROWS16 ? uint32_t(qs[(gq + 8) * D + d0]) | uint32_t(qs[(gq + 8) * D + d1]) << 16 : 0u;
    }
  __syncthreads();  // smem is reused for the block merge

  const uint8_t* kpool = reinterpret_cast<const uint8_t*>(a.k_pool);
  const uint8_t* vpool = reinterpret_cast<const uint8_t*>(a.v_pool);
  const int kgrp = tq * (D / 4) / S::GRP, vgrp = gq * (D / 8) / S::GRP;  // the lane's scale group in its key / value runs
  const int ks_off = S::KCB + 2 * kgrp, kz_off = S::KCB + 2 * (D / S::GRP) + 2 * kgrp;
  const int vs_off = S::VCB + 2 * vgrp, vz_off = S::VCB + 2 * (D / S::GRP) + 2 * vgrp;
  const int vbyte = VB == 3 ? (gq * (D / 8) * 3 / 8) & ~3 : gq * S::VOFF;       // first word of the lane's value bits
  const int vshift = VB == 3 ? ((gq * (D / 8) * 3) % 32) : 0;                     // their first bit in that word pair
  auto row_of = [&](int32_t kp) { return kv_slot(a, table, kp) * a.n_kv_heads + g; };
  auto load_tile = [&](int32_t base, TileT& tl) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int32_t kp = base + nt * 8 + gq;
      if (kp < k_end) {
        const uint8_t* r = kpool + row_of(kp) * S::KRB;
        ldw<S::KW, S::KALIGN>(r + tq * S::KOFF, tl.k[nt]);
        if (!BF) tl.ks[nt] = *reinterpret_cast<const uint16_t*>(r + ks_off), tl.kz[nt] = *reinterpret_cast<const uint16_t*>(r + kz_off);
      } else {
#pragma unroll
        for (int i = 0; i < S::KW; ++i) tl.k[nt][i] = 0;
        tl.ks[nt] = tl.kz[nt] = 0;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int32_t kp = base + 2 * tq + (i & 1) + 8 * (i >> 1);
      tl.vs[i] = tl.vz[i] = 0;
      if (kp < k_end) {
        const uint8_t* r = vpool + row_of(kp) * S::VRB;
        ldw<S::VW, S::VALIGN>(r + vbyte, tl.v[i]);
        if (!BF) tl.vs[i] = *reinterpret_cast<const uint16_t*>(r + vs_off);
        if (!BF && !TURBO) tl.vz[i] = *reinterpret_cast<const uint16_t*>(r + vz_off);
      } else {
#pragma unroll
        for (int j = 0; j < S::VW; ++j) tl.v[i][j] = 0;
      }
    }
  };

  float acc[NT][4], m[2], l[2];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;
  const float kLog2e = 1.4426950408889634f, scale_log2 = a.scale * kLog2e;

  TileT ring[NR];
#pragma unroll
  for (int j = 0; j < NR; ++j) load_tile(k_begin + (warp + kWarps * j) * 16, ring[j]);

  for (int32_t base = k_begin + warp * 16; base < k_end; base += kWarps * 16) {
    const TileT cur = ring[0];
#pragma unroll
    for (int j = 0; j + 1 < NR; ++j) ring[j] = ring[j + 1];
    load_tile(base + NR * kWarps * 16, ring[NR - 1]);

    // S = Q Kᵀ for the tile's two 8-key n-tiles.
    float c[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.0f;
      const uint32_t s2 = cur.ks[nt] | cur.ks[nt] << 16, z2 = cur.kz[nt] | cur.kz[nt] << 16;
      if constexpr (KB == 4) {
#pragma unroll
        for (int u = 0; u < S::KW; ++u) {
          uint32_t r[4];
          kvmma::k_unpack4(cur.k[nt][u], r);
          const uint32_t b0 = hfma2(from_lo(r[0]), s2, z2), b1 = hfma2(from_hi(r[1]), s2, z2);
          const uint32_t b2 = hfma2(from_lo(r[2]), s2, z2), b3 = hfma2(from_hi(r[3]), s2, z2);
          mma16816<false>(c[nt], qa[2 * u][0], qb[2 * u][0], qa[2 * u][1], qb[2 * u][1], b0, b1);
          mma16816<false>(c[nt], qa[2 * u + 1][0], qb[2 * u + 1][0], qa[2 * u + 1][1], qb[2 * u + 1][1], b2, b3);
        }
      } else if constexpr (KB == 8) {
#pragma unroll
        for (int u = 0; u < S::KW; ++u) {
          uint32_t r[2];
          kvmma::k_unpack8(cur.k[nt][u], TURBO, r);
          uint32_t b0, b1;
          if constexpr (TURBO) {
            b0 = hmul2(hadd2(hsub2(r[0], kH1152), z2), s2), b1 = hmul2(hadd2(hsub2(r[1], kH1152), z2), s2);
          } else {
            b0 = hfma2(from_lo(r[0]), s2, z2), b1 = hfma2(from_lo(r[1]), s2, z2);
          }
          mma16816<false>(c[nt], qa[u][0], qb[u][0], qa[u][1], qb[u][1], b0, b1);
        }
      } else {
#pragma unroll
        for (int u = 0; u < NCH; ++u) mma16816<true>(c[nt], qa[u][0], qb[u][0], qa[u][1], qb[u][1], cur.k[nt][2 * u], cur.k[nt][2 * u + 1]);
      }
    }

    // Online softmax (base 2) per row: c[nt][2r + e] is row g + 8r, key base + 8 nt + 2q + e.
    float p[2][4], corr[2];
#pragma unroll
    for (int r = 0; r < (ROWS16 ? 2 : 1); ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int32_t kp = base + nt * 8 + 2 * tq + e;
          float x = c[nt][2 * r + e];
          if (a.softcap > 0) x = a.softcap * tanhf(x * a.scale / a.softcap) * kLog2e;
          else x *= scale_log2;
          x = kp < k_end ? x : -INFINITY;
          p[nt][2 * r + e] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[r], mx);
      corr[r] = mn == -INFINITY ? 1.0f : exp2f(m[r] - mn);
      float sum = 0;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = mn == -INFINITY ? 0.0f : exp2f(p[nt][2 * r + e] - mn);
          p[nt][2 * r + e] = pv, sum += pv;
        }
      m[r] = mn, l[r] = l[r] * corr[r] + sum;
    }
    if (!ROWS16) corr[1] = 1.0f, p[0][2] = p[0][3] = p[1][2] = p[1][3] = 0.0f;
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < NT; ++j) acc[j][0] *= corr[0], acc[j][1] *= corr[0], acc[j][2] *= corr[1], acc[j][3] *= corr[1];
    }

    // P (f16; bf16 rows: bf16) as the A operand: keys 2q, 2q + 1 (n-tile 0) and 2q + 8, 2q + 9 (n-tile 1).
    const uint32_t pa0 = pack2<BF>(p[0][0], p[0][1]), pa2 = pack2<BF>(p[1][0], p[1][1]);
    const uint32_t pa1 = ROWS16 ? pack2<BF>(p[0][2], p[0][3]) : 0u;
    const uint32_t pa3 = ROWS16 ? pack2<BF>(p[1][2], p[1][3]) : 0u;
    // The value scale (and bias) of keys (2q, 2q + 1) and (2q + 8, 2q + 9) as f16 pairs: each B register
    // holds one dim of two keys, so one f16x2 FMA dequantizes both.
    const uint32_t vs01 = cur.vs[0] | cur.vs[1] << 16, vs23 = cur.vs[2] | cur.vs[3] << 16;
    const uint32_t vz01 = cur.vz[0] | cur.vz[1] << 16, vz23 = cur.vz[2] | cur.vz[3] << 16;

    // O += P V over the D / 8 n-tiles: b0 = values of keys 2q, 2q + 1 at dim v_dim(g, j), b1 of 2q + 8, 2q + 9.
    if constexpr (TURBO) {
      uint64_t sp[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) sp[i] = (uint64_t(cur.v[i][0]) | (S::VW > 1 ? uint64_t(cur.v[i][S::VW > 1 ? 1 : 0]) << 32 : 0ull)) >> vshift;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint32_t b0 = hmul2(tab[kvmma::span_code<VB>(sp[0], j) | kvmma::span_code<VB>(sp[1], j) << VB], vs01);
        const uint32_t b1 = hmul2(tab[kvmma::span_code<VB>(sp[2], j) | kvmma::span_code<VB>(sp[3], j) << VB], vs23);
        mma16816<false>(acc[j], pa0, pa1, pa2, pa3, b0, b1);
      }
    } else if constexpr (VB == 4) {
#pragma unroll
      for (int u = 0; u < S::VW; ++u) {
        uint32_t x[8], y[8];
        kvmma::v_unpack4(cur.v[0][u], cur.v[1][u], x);
        kvmma::v_unpack4(cur.v[2][u], cur.v[3][u], y);
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const uint32_t c0 = jj % 2 ? from_hi(x[jj]) : from_lo(x[jj]), c1 = jj % 2 ? from_hi(y[jj]) : from_lo(y[jj]);
          mma16816<false>(acc[8 * u + jj], pa0, pa1, pa2, pa3, hfma2(c0, vs01, vz01), hfma2(c1, vs23, vz23));
        }
      }
    } else if constexpr (VB == 8) {
#pragma unroll
      for (int u = 0; u < S::VW; ++u) {
        uint32_t x[4], y[4];
        kvmma::v_unpack8(cur.v[0][u], cur.v[1][u], x);
        kvmma::v_unpack8(cur.v[2][u], cur.v[3][u], y);
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          mma16816<false>(acc[4 * u + jj], pa0, pa1, pa2, pa3, hfma2(from_lo(x[jj]), vs01, vz01), hfma2(from_lo(y[jj]), vs23, vz23));
      }
    } else {
#pragma unroll
      for (int u = 0; u < S::VW; ++u) {
        uint32_t x[2], y[2];
        kvmma::v_pair16(cur.v[0][u], cur.v[1][u], x);
        kvmma::v_pair16(cur.v[2][u], cur.v[3][u], y);
        mma16816<true>(acc[2 * u], pa0, pa1, pa2, pa3, x[0], y[0]);
        mma16816<true>(acc[2 * u + 1], pa0, pa1, pa2, pa3, x[1], y[1]);
      }
    }
  }

  // The warp's rows: the sums over the 4 lanes of a row, then the merge of the 4 warps through shared
  // memory.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  float* sm_o = reinterpret_cast<float*>(smem);  // [kWarps][ROWS][D]
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = gq + 8 * (e >> 1), d = kvmma::v_dim<D>(2 * tq + (e & 1), j);
      if (row < ROWS) sm_o[(warp * ROWS + row) * D + d] = acc[j][e];
    }
  if (tq == 0) {
    sm_m[warp][gq] = m[0], sm_l[warp][gq] = l[0];
    if (ROWS16) sm_m[warp][gq + 8] = m[1], sm_l[warp][gq + 8] = l[1];
  }
  __syncthreads();
  const float kLn2 = 0.6931471805599453f;
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int i = idx / D, d = idx % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][i]);
    float L = 0, O = 0;
    if (M > -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wt = exp2f(sm_m[w][i] - M);  // 0 for a warp that saw no key (m = -inf)
        L += sm_l[w][i] * wt, O += sm_o[(w * ROWS + i) * D + d] * wt;
      }
    }
    const int h = h0 + i;
    if (n_splits == 1 && !TURBO) {
      a.out[t * qrow + int64_t(h) * D + d] = __bfloat16_as_ushort(__float2bfloat16(L > 0 ? O / L : 0.0f));
    } else {
      float* pp = scratch + ((t * a.n_heads + h) * n_splits + split) * (D + 2);
      pp[d] = O;
      if (d == 0) pp[D] = M == -INFINITY ? M : M * kLn2, pp[D + 1] = L;
    }
  }
}

// ARBOR_CUDA_KV_ATTN: "v2" (or unset, the default) the tensor-core kernel for coded rows, "v2all" for plain
// bf16 rows too, "v1" neither; read once, set_kv_decode_mma overrides it. v2 is the default since an H100
// run (session 18) passed its tests under memcheck and measured the 8B at ctx 32768: affine8 142.9 tok/s,
// k8v3 142.3 against v1's 109.8 / 100.7 (bf16 rows: 115.9 either way). ARBOR_CUDA_KV_MMA_SPLITS (0: by occupancy).
int g_kv_mma = -1;
int kv_mma_mode() {
  if (g_kv_mma < 0) {
    const char* e = std::getenv("ARBOR_CUDA_KV_ATTN");
    const std::string v = e ? e : "";
    if (v == "v1") g_kv_mma = 0;
    else if (v.empty() || v == "v2") g_kv_mma = 1;
    else if (v == "v2all") g_kv_mma = 2;
    else fail_printf("cuda: ARBOR_CUDA_KV_ATTN=%s (takes v1, v2, v2all)", v.c_str());
  }
  return g_kv_mma;
}
int kv_mma_env_splits() {
  static const int n = [] {
    const char* e = std::getenv("ARBOR_CUDA_KV_MMA_SPLITS");
    return e ? std::max(0, std::atoi(e)) : 0;
  }();
  return n;
}

// Splits: as many (split, kv head, token) blocks as fit on the device at once (one wave, each block
// walking its range with every tile's loads in flight), at most max_splits (the scratch the caller
// sized); one split when there is no scratch.
template <int D, int KB, int VB, bool TURBO, bool ROWS16>
void launch_mma(const AttnArgs& a, int64_t T, int max_splits, float* scratch, cudaStream_t s) {
  auto* kernel = attn_decode_mma_kernel<D, KB, VB, TURBO, ROWS16>;
  static int occ = 0, sms = 0;
  if (occ == 0) {
    int dev = 0;
    ARBOR_CUDA_CHECK(cudaGetDevice(&dev));
    ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    ARBOR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, 128, 0));
    occ = std::max(occ, 1);
  }
  const int64_t per_split = T * a.n_kv_heads;
  int64_t splits = std::clamp<int64_t>(int64_t(occ) * sms / per_split, 1, max_splits);
  if (kv_mma_env_splits() > 0) splits = std::min<int64_t>(kv_mma_env_splits(), max_splits);
  if (!scratch) splits = 1;
  const dim3 grid(unsigned(splits), unsigned(a.n_kv_heads), unsigned(T));
  pdl_launch(kernel, grid, 128, 0, s, a, int(splits), scratch);
  ARBOR_LAUNCH_CHECK("attn_decode_mma_kernel");
  if (splits > 1 || TURBO) {
    pdl_launch(attn_combine_coded_kernel, dim3(unsigned(a.n_heads), unsigned(T)), unsigned(D), 0, s, static_cast<const float*>(scratch),
               int(splits), D, a.n_heads, TURBO, a.out);
    ARBOR_LAUNCH_CHECK("attn_combine_coded_kernel");
  }
}
template <int D, int KB, int VB, bool TURBO>
void launch_mma_g(const AttnArgs& a, int64_t T, int max_splits, float* scratch, cudaStream_t s) {
  if (a.n_heads / a.n_kv_heads > 8) launch_mma<D, KB, VB, TURBO, true>(a, T, max_splits, scratch, s);
  else launch_mma<D, KB, VB, TURBO, false>(a, T, max_splits, scratch, s);
}
template <int D>
bool launch_mma_codec(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int max_splits, float* scratch, cudaStream_t s) {
  const bool affine = kc.kind == kAffine && vc.kind == kAffine && kc.bits == vc.bits;
  const bool turbo = kc.kind == kTurboKey && vc.kind == kTurboValue && kc.bits == 8;
  const bool plain = kc.kind == 0 && vc.kind == 0;
  auto rows_ok = [&](int kb, int vb) { return kc.row_bytes == kb && vc.row_bytes == vb; };
#define ARBOR_MMA(KB, VB, TU)                                                                            \
  do {                                                                                                   \
    using Sh = mma::Shape<D, KB, VB, TU>;                                                                \
    ARBOR_CU_CHECK(rows_ok(Sh::KRB, Sh::VRB), "cuda: mma decode attention: row bytes %d/%d, expected %d/%d", kc.row_bytes, vc.row_bytes, \
                   Sh::KRB, Sh::VRB);                                                                    \
    launch_mma_g<D, KB, VB, TU>(a, T, max_splits, scratch, s);                                           \
    return true;                                                                                         \
  } while (0)
  if (plain) ARBOR_MMA(16, 16, false);
  if (affine && kc.bits == 8) ARBOR_MMA(8, 8, false);
  if (affine && kc.bits == 4) ARBOR_MMA(4, 4, false);
  if (turbo && vc.bits == 4) ARBOR_MMA(8, 4, true);
  if (turbo && vc.bits == 3) ARBOR_MMA(8, 3, true);
#undef ARBOR_MMA
  return false;
}

template <int D, bool TURBO, int KB, int VB, bool PREP>
void launch_dc(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int n_splits, float* scratch, const QKPrepArgs& pa,
               cudaStream_t s) {
  const int G = a.n_heads / a.n_kv_heads, hb = G <= 4 ? 4 : 8, chunks = (G + hb - 1) / hb;
  const dim3 grid(unsigned(n_splits), unsigned(a.n_kv_heads * chunks), unsigned(T));
  if (hb == 4) pdl_launch(attn_decode_coded_kernel<D, 4, TURBO, KB, VB, PREP>, grid, 128, 0, s, a, kc, vc, n_splits, chunks, scratch, pa);
  else pdl_launch(attn_decode_coded_kernel<D, 8, TURBO, KB, VB, PREP>, grid, 128, 0, s, a, kc, vc, n_splits, chunks, scratch, pa);
  ARBOR_LAUNCH_CHECK("attn_decode_coded_kernel");
}
template <int D, bool TURBO, int KB, int VB>
void launch_dp(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int n_splits, float* scratch, const QKPrepArgs* pa,
               cudaStream_t s) {
  if (pa) launch_dc<D, TURBO, KB, VB, true>(a, kc, vc, T, n_splits, scratch, *pa, s);
  else launch_dc<D, TURBO, KB, VB, false>(a, kc, vc, T, n_splits, scratch, QKPrepArgs{}, s);
}

template <int D>
void launch_dcodec(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int n_splits, float* scratch, const QKPrepArgs* pa,
                   cudaStream_t s) {
  if (kc.kind == kAffine) {
    if (kc.bits == 8 && vc.bits == 8) launch_dp<D, false, 8, 8>(a, kc, vc, T, n_splits, scratch, pa, s);
    else if (kc.bits == 4 && vc.bits == 4) launch_dp<D, false, 4, 4>(a, kc, vc, T, n_splits, scratch, pa, s);
    else launch_dc<D, false, 0, 0, false>(a, kc, vc, T, n_splits, scratch, QKPrepArgs{}, s);
  } else {
    if (kc.bits == 8 && vc.bits == 4) launch_dp<D, true, 8, 4>(a, kc, vc, T, n_splits, scratch, pa, s);
    else if (kc.bits == 8 && vc.bits == 3) launch_dp<D, true, 8, 3>(a, kc, vc, T, n_splits, scratch, pa, s);
    else launch_dc<D, true, 0, 0, false>(a, kc, vc, T, n_splits, scratch, QKPrepArgs{}, s);
  }
}

}  // namespace

void launch_kv_write_coded(const uint16_t* k, const uint16_t* v, const int32_t* pos, const int32_t* seq, const int32_t* block_tables,
                           int32_t max_blocks, int64_t T, int n_kv_heads, int head_dim, int64_t block_size, KVCodecDev kc, KVCodecDev vc,
                           uint8_t* k_pool, uint8_t* v_pool, cudaStream_t s) {
  if (T == 0) return;
  const int64_t rows = T * n_kv_heads;
  const int lpk = head_dim / 8, per_block = 4 * (32 / lpk);
  const dim3 grid(grid_for(rows, per_block));
  switch (head_dim) {
    case 64: pdl_launch(kv_write_coded_kernel<8>, grid, 128, 0, s, k, v, pos, seq, block_tables, max_blocks, int(T), n_kv_heads, block_size, kc, vc, k_pool, v_pool); break;
    case 128: pdl_launch(kv_write_coded_kernel<16>, grid, 128, 0, s, k, v, pos, seq, block_tables, max_blocks, int(T), n_kv_heads, block_size, kc, vc, k_pool, v_pool); break;
    case 256: pdl_launch(kv_write_coded_kernel<32>, grid, 128, 0, s, k, v, pos, seq, block_tables, max_blocks, int(T), n_kv_heads, block_size, kc, vc, k_pool, v_pool); break;
    default: fail_printf("cuda: coded kv write: head_dim %d (coded KV on cuda takes 64, 128, 256)", head_dim);
  }
  ARBOR_LAUNCH_CHECK("kv_write_coded_kernel");
}

void launch_kv_dequant_blocks(const uint8_t* k_pool, const uint8_t* v_pool, KVCodecDev kc, KVCodecDev vc, const int32_t* src_blocks,
                              int64_t n, int64_t block_size, int n_kv_heads, int head_dim, uint16_t* k_out, uint16_t* v_out,
                              cudaStream_t s) {
  if (n == 0) return;
  ARBOR_CU_CHECK(n <= 65535, "cuda: kv dequant: %lld blocks exceed one grid dimension", (long long)n);
  const int64_t rows = block_size * n_kv_heads;
  const int lpk = head_dim / 8, per_block = 4 * (32 / lpk);
  const dim3 grid(grid_for(rows, per_block), unsigned(n));
  switch (head_dim) {
    case 64: pdl_launch(kv_dequant_kernel<8>, grid, 128, 0, s, k_pool, v_pool, kc, vc, src_blocks, block_size, n_kv_heads, k_out, v_out); break;
    case 128: pdl_launch(kv_dequant_kernel<16>, grid, 128, 0, s, k_pool, v_pool, kc, vc, src_blocks, block_size, n_kv_heads, k_out, v_out); break;
    case 256: pdl_launch(kv_dequant_kernel<32>, grid, 128, 0, s, k_pool, v_pool, kc, vc, src_blocks, block_size, n_kv_heads, k_out, v_out); break;
    default: fail_printf("cuda: kv dequant: head_dim %d (coded KV on cuda takes 64, 128, 256)", head_dim);
  }
  ARBOR_LAUNCH_CHECK("kv_dequant_kernel");
}

void launch_attention_decode_coded(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int n_splits, float* scratch,
                                   cudaStream_t s) {
  launch_attention_decode_coded_prep(a, kc, vc, T, n_splits, scratch, s, nullptr);
}

void launch_attention_decode_coded_prep(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int n_splits, float* scratch,
                                        cudaStream_t s, const QKPrepArgs* prep) {
  if (T == 0) return;
  if (launch_attention_decode_mma(a, kc, vc, T, n_splits, scratch, s, prep)) return;
  ARBOR_CU_CHECK(!prep || (coded_decode_takes_prep(kc, vc) && prep->half % 8 == 0 && prep->head_dim == a.head_dim &&
                           prep->kc.kind == kc.kind && prep->kc.bits == kc.bits && prep->vc.kind == vc.kind && prep->vc.bits == vc.bits),
                 "cuda: coded decode attention with q/k prep: codec kinds %d/%d bits %d/%d, rope half %d (a multiple of 8), head_dim %d",
                 kc.kind, vc.kind, kc.bits, vc.bits, prep ? prep->half : 0, a.head_dim);
  const bool affine = kc.kind == kAffine && vc.kind == kAffine, turbo = kc.kind == kTurboKey && vc.kind == kTurboValue;
  ARBOR_CU_CHECK(affine || turbo, "cuda: coded decode attention: K codec kind %d / V codec kind %d (affine/affine or TurboQuant k/v)",
                 kc.kind, vc.kind);
  ARBOR_CU_CHECK(T <= 65535 && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && n_splits >= 1 && n_splits <= kDecodeMaxSplits && scratch,
                 "cuda: coded decode attention: T %lld, heads %d/%d, splits %d (1..%d)", (long long)T, a.n_heads, a.n_kv_heads, n_splits,
                 kDecodeMaxSplits);
  switch (a.head_dim) {
    case 64: launch_dcodec<64>(a, kc, vc, T, n_splits, scratch, prep, s); break;
    case 128: launch_dcodec<128>(a, kc, vc, T, n_splits, scratch, prep, s); break;
    case 256: launch_dcodec<256>(a, kc, vc, T, n_splits, scratch, prep, s); break;
    default: fail_printf("cuda: coded decode attention: head_dim %d (coded KV on cuda takes 64, 128, 256)", a.head_dim);
  }
  const dim3 grid(unsigned(a.n_heads), unsigned(T));
  pdl_launch(attn_combine_coded_kernel, grid, unsigned(a.head_dim), 0, s, static_cast<const float*>(scratch), n_splits, a.head_dim, a.n_heads,
             turbo, a.out);
  ARBOR_LAUNCH_CHECK("attn_combine_coded_kernel");
}

void set_kv_decode_mma(int mode) { g_kv_mma = mode < 0 ? -1 : mode; }

bool kv_decode_mma_takes(KVCodecDev kc, KVCodecDev vc, int head_dim, int group) {
  const int mode = kv_mma_mode();
  if (mode == 0 || (head_dim != 64 && head_dim != 128) || group < 1 || group > 16) return false;
  const bool plain = kc.kind == 0 && vc.kind == 0 && mode == 2;
  const bool affine = kc.kind == kAffine && vc.kind == kAffine && kc.bits == vc.bits && (kc.bits == 8 || kc.bits == 4);
  const bool turbo = kc.kind == kTurboKey && vc.kind == kTurboValue && kc.bits == 8 && (vc.bits == 4 || vc.bits == 3);
  return plain || affine || turbo;
}

bool launch_attention_decode_mma(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int max_splits, float* scratch, cudaStream_t s,
                                 const QKPrepArgs* prep) {
  if (T == 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || !kv_decode_mma_takes(kc, vc, a.head_dim, a.n_heads / a.n_kv_heads))
    return false;
  const bool turbo = kc.kind == kTurboKey;
  if (!scratch && turbo) return false;  // TurboQuant's rotation is undone in the merge, which reads scratch
  ARBOR_CU_CHECK(T <= 65535 && max_splits >= 1 && max_splits <= kDecodeMaxSplits, "cuda: mma decode attention: T %lld, splits %d (1..%d)",
                 (long long)T, max_splits, kDecodeMaxSplits);
  if (prep) {
    // The kernel has no q/k prep inside: the prep kernel first (in place on q and k, and the cache write).
    ARBOR_CU_CHECK(prep->q == a.q && prep->T == int(T), "cuda: mma decode attention: the prep's q is not the attention's");
    launch_qk_prep(*prep, s);
  }
  if (a.head_dim == 64) return launch_mma_codec<64>(a, kc, vc, T, max_splits, scratch, s);
  return launch_mma_codec<128>(a, kc, vc, T, max_splits, scratch, s);
}

}  // namespace arbor::cuda
