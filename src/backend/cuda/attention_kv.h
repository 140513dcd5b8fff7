// Coded decode attention with the q/k prep inside (attention_kv.cu); beside kernels.h's coded
// launchers.
#pragma once
#include "backend/cuda/kernels.h"

namespace arbor::cuda {

// launch_attention_decode_coded with prep (one token per sequence; codecs for which
// coded_decode_takes_prep): the q/k prep and the encode of each token's own key and value happen
// inside, as launch_attention_decode's prep (q and k are left unchanged); the token attends to its own
// row as coded.
void launch_attention_decode_coded_prep(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int n_splits, float* scratch,
                                        cudaStream_t s, const QKPrepArgs* prep);
// The codecs whose decode kernel is compiled with the prep inside: affine8, affine4, k8v4, k8v3.
inline bool coded_decode_takes_prep(const KVCodecDev& k, const KVCodecDev& v) {
  const int affine = int(KVCodecKind::Affine), tk = int(KVCodecKind::TurboKey), tv = int(KVCodecKind::TurboValue);
  return (k.kind == affine && v.kind == affine && k.bits == v.bits && (k.bits == 8 || k.bits == 4)) ||
         (k.kind == tk && v.kind == tv && k.bits == 8 && (v.bits == 4 || v.bits == 3));
}

// The tensor-core decode kernel (attention_kv.cu, attn_decode_mma_kernel; fragment layout in
// kv_mma_layout.h): plain bf16, affine8, affine4, k8v4 and k8v3 rows at head_dim 64 and 128, GQA groups
// of up to 16 heads (head_dim 256 and other codecs keep the kernels above). On by default for coded rows
// (checked and measured on an H100 in session 18); ARBOR_CUDA_KV_ATTN=v1 turns it off, v2all on for bf16 rows too;
// set_kv_decode_mma(mode) for tests (0 off, 1 coded, 2 coded and bf16, -1 back to the environment);
// ARBOR_CUDA_KV_MMA_SPLITS=N fixes its split count (otherwise one wave of blocks by occupancy, at most
// the caller's n_splits).
void set_kv_decode_mma(int mode);
// Whether it is on and takes this codec pair, head_dim and GQA group.
bool kv_decode_mma_takes(KVCodecDev kc, KVCodecDev vc, int head_dim, int group);
// Runs it when kv_decode_mma_takes (and scratch is there for TurboQuant values) and returns true;
// otherwise returns false and launches nothing. scratch: [T, n_heads, max_splits, head_dim + 2] f32, or
// null (then one split). With prep, launch_qk_prep runs first (prep->q must be a.q).
bool launch_attention_decode_mma(const AttnArgs& a, KVCodecDev kc, KVCodecDev vc, int64_t T, int max_splits, float* scratch, cudaStream_t s,
                                 const QKPrepArgs* prep);

}  // namespace arbor::cuda
