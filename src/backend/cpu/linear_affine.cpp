// The reference affine linear kernel: per output row, unpack the codes group by group, dequantize in f32 and
// dot with each activation row. Speed comes later (issue 19 item 2: a fused GEMV reading each byte once and
// a blocked GEMM); this is what they are tested against.
#include "backend/cpu/linear_affine.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "quant/affine.h"

namespace arbor::cpu {

void affine_dequantize_row(const uint32_t* packed, const float* scales, const float* biases, int bits, int group_size, int64_t K,
                           int64_t n, float* out) {
  const int64_t words = K * bits / 32, groups = K / group_size;
  const uint32_t* row = packed + n * words;
  const float* s = scales + n * groups;
  const float* b = biases + n * groups;
  for (int64_t g = 0; g < groups; ++g) {
    const float sg = s[g], bg = b[g];
    for (int64_t j = g * group_size; j < (g + 1) * group_size; ++j) {
      const float p = sg * float(quant::affine_get_code(row, j, bits));  // separate multiply and add, as the reference
      out[j] = p + bg;
    }
  }
}

void linear_affine(ThreadPool& pool, const float* x, int64_t T, int64_t K, const uint32_t* packed, const float* scales,
                   const float* biases, int bits, int group_size, int64_t N, const float* bias, float* y) {
  ARBOR_CHECK(x && packed && scales && biases && y, "linear_affine: null pointer");
  ARBOR_CHECK(bits >= 2 && bits <= 8, "linear_affine: {} bits; supported 2..8", bits);
  ARBOR_CHECK(group_size > 0 && K > 0 && K % group_size == 0 && (K * bits) % 32 == 0,
              "linear_affine: {} columns do not divide into groups of {} and whole 32-bit words at {} bits", K, group_size, bits);
  ARBOR_CHECK(T >= 0 && N > 0, "linear_affine: bad shape T {} N {}", T, N);
  if (T == 0) return;
  // About 64 KiB of codes per chunk, at least one row.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, K * bits / 8));
  pool.parallel_for(N, grain, [&](int, int64_t n0, int64_t n1) {
    std::vector<float> w(size_t(K), 0.0f);
    for (int64_t n = n0; n < n1; ++n) {
      affine_dequantize_row(packed, scales, biases, bits, group_size, K, n, w.data());
      const float bn = bias ? bias[n] : 0.0f;
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * K;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t k = 0;
        for (; k + 8 <= K; k += 8)
          for (int u = 0; u < 8; ++u) acc[u] += w[size_t(k + u)] * xt[k + u];
        for (; k < K; ++k) acc[0] += w[size_t(k)] * xt[k];
        const float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        y[t * N + n] = sum + bn;
      }
    }
  });
}

}  // namespace arbor::cpu
