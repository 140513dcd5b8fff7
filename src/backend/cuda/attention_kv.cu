// Coded KV cache on CUDA (quant/kv_codec.h, docs/kv-cache.md): the encode of new K/V rows (the plain
// kv_write path; the q/k prep kernel encodes through the same kv_rows.h), split-K decode attention
// reading the codes, its split merge (with TurboQuant's deferred inverse rotation), and the dequantize of
// whole blocks into bf16 that the prefill path runs the tensor-core kernels over.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>

#include "backend/cuda/attention_kv.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
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

}  // namespace arbor::cuda
