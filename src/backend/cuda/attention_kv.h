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

}  // namespace arbor::cuda
