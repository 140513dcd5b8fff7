// Where the tensor-core decode attention over KV rows (attention_kv.cu's attn_decode_mma_kernel) keeps
// each key and value element in the mma.sync m16n8k16 fragments, and the bit tricks that turn a lane's
// loaded code words into f16 fragment halves. Host and device: tests/cuda/kv_codec_cuda_test.cpp runs
// the same functions on the CPU against a plain model of the fragment layout (PTX ISA, "Matrix Fragments
// for mma.m16n8k16"), so the index math is checked without a GPU.
//
// S = Q Kᵀ: M = query heads (16 rows, the GQA group's G used), N = 8 keys per n-tile, K = head dims, 16
// per chunk. A lane (g = lane / 4, q = lane % 4) holds as B operand the key of column g and, per chunk,
// the logical dims 2q, 2q + 1 (register b0) and 2q + 8, 2q + 9 (b1). A dot product does not care in
// which order the dims are summed, so the logical dims are mapped onto the physical ones so that a lane
// reads one contiguous run of its key row: dims [q D/4, (q + 1) D/4), in the order the unpack below
// produces them (k_dim). Q's A fragments are gathered with the same map.
//
// O = P V: M = heads, N = 8 head dims per n-tile (D/8 n-tiles), K = 16 keys of a tile. The B operand
// holds V[key][dim] for keys 2q, 2q + 1 (b0) and 2q + 8, 2q + 9 (b1) of the tile, at logical column g:
// physical dim g D/8 + j in n-tile j (v_dim), so a lane reads dims [g D/8, (g + 1) D/8) of four rows.
// The output C fragment of n-tile j holds columns 2q, 2q + 1, i.e. physical dims (2q) D/8 + j and
// (2q + 1) D/8 + j (o_dim).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define ARBOR_KVMMA_HD __host__ __device__ __forceinline__
#else
#define ARBOR_KVMMA_HD inline
#endif

namespace arbor::cuda::kvmma {

constexpr uint32_t kMagic = 0x64006400u;  // f16 1024.0 in both halves: 1024 + c for a code c < 1024 in the mantissa

// prmt (byte permute) with selector nibbles 0..7, as __byte_perm.
ARBOR_KVMMA_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = uint64_t(y) << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// The physical dim (of D) of B-operand element kk of chunk `chunk` for lane sub-index q, keys coded
// with KB bits (4, 8) or plain bf16 (KB = 16): kk 0, 1 are the low and high halves of b0, kk 2, 3 of b1.
//   KB 4: a code word holds 8 dims; word u feeds chunks 2u and 2u + 1 (k_unpack4).
//   KB 8: a code word holds 4 dims and feeds one chunk (k_unpack8).
//   KB 16: two bf16 words hold 4 consecutive dims, b0 = dims 0, 1 and b1 = dims 2, 3.
template <int KB, int D>
ARBOR_KVMMA_HD int k_dim(int q, int chunk, int kk) {
  const int base = q * (D / 4);
  if (KB == 4) return base + 8 * (chunk / 2) + 2 * (chunk % 2) + (kk >> 1) + 4 * (kk & 1);
  if (KB == 8) return base + 4 * chunk + (kk >> 1) + 2 * (kk & 1);
  return base + 4 * chunk + kk;
}

// The physical dim of V's B-operand column g in n-tile j (and so of the output fragment's columns).
template <int D>
ARBOR_KVMMA_HD int v_dim(int g, int j) {
  return g * (D / 8) + j;
}

// 4-bit key codes: word w (dims 0..7, code e at bits 4e) into four f16x2 registers, r[0] = (d0, d4),
// r[1] = (d1, d5), r[2] = (d2, d6), r[3] = (d3, d7); r[0], r[2] hold 1024 + c ("lo"), r[1], r[3] hold
// 1024 + 16 c ("hi": the nibble above the mask's). Chunk 2u: b0 = r[0], b1 = r[1]; chunk 2u + 1: b0 =
// r[2], b1 = r[3].
ARBOR_KVMMA_HD void k_unpack4(uint32_t w, uint32_t* r) {
  const uint32_t w8 = w >> 8;
  r[0] = (w & 0x000f000fu) | kMagic;
  r[1] = (w & 0x00f000f0u) | kMagic;
  r[2] = (w8 & 0x000f000fu) | kMagic;
  r[3] = (w8 & 0x00f000f0u) | kMagic;
}

// 8-bit key codes: word w (dims 0..3) into r[0] = (d0, d2), r[1] = (d1, d3), each 1024 + c; with
// sign8 (TurboQuant keys: two's-complement int8 codes) 1152 + c instead (the sign bit flipped: c + 128).
ARBOR_KVMMA_HD void k_unpack8(uint32_t w, bool sign8, uint32_t* r) {
  const uint32_t x = sign8 ? 0x00800080u : 0u;
  r[0] = ((w & 0x00ff00ffu) | kMagic) ^ x;
  r[1] = (((w >> 8) & 0x00ff00ffu) | kMagic) ^ x;
}

// 4-bit value codes of two keys a and b (wa, wb: 8 dims each) into eight f16x2 registers, r[i] =
// (a's dim i, b's dim i): even i "lo" (1024 + c), odd i "hi" (1024 + 16 c).
ARBOR_KVMMA_HD void v_unpack4(uint32_t wa, uint32_t wb, uint32_t* r) {
  const uint32_t x0 = byte_perm(wa, wb, 0x5410), x1 = byte_perm(wa, wb, 0x7632);
  const uint32_t xs[4] = {x0, x0 >> 8, x1, x1 >> 8};
  for (int i = 0; i < 4; ++i) {
    r[2 * i] = (xs[i] & 0x000f000fu) | kMagic;
    r[2 * i + 1] = (xs[i] & 0x00f000f0u) | kMagic;
  }
}

// 8-bit value codes of two keys (4 dims each) into r[i] = (a's dim i, b's dim i), each 1024 + c.
ARBOR_KVMMA_HD void v_unpack8(uint32_t wa, uint32_t wb, uint32_t* r) {
  const uint32_t x0 = byte_perm(wa, wb, 0x5410), x1 = byte_perm(wa, wb, 0x7632);
  r[0] = (x0 & 0x00ff00ffu) | kMagic;
  r[1] = ((x0 >> 8) & 0x00ff00ffu) | kMagic;
  r[2] = (x1 & 0x00ff00ffu) | kMagic;
  r[3] = ((x1 >> 8) & 0x00ff00ffu) | kMagic;
}

// bf16 values of two keys (2 dims a word): r[0] = (a's dim 0, b's dim 0), r[1] = (a's dim 1, b's dim 1).
ARBOR_KVMMA_HD void v_pair16(uint32_t wa, uint32_t wb, uint32_t* r) {
  r[0] = byte_perm(wa, wb, 0x5410);
  r[1] = byte_perm(wa, wb, 0x7632);
}

// Code e (VB bits) of a lane's span of value codes (code 0 at bit 0).
template <int VB>
ARBOR_KVMMA_HD uint32_t span_code(uint64_t span, int e) {
  return uint32_t(span >> (VB * e)) & ((1u << VB) - 1u);
}

}  // namespace arbor::cuda::kvmma
