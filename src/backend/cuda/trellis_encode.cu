// The trellis encoder's Viterbi on the GPU (trellis_encode.h's cuda_trellis_viterbi): one thread block per
// 256-weight block at a time, both passes of QTIP's Algorithm 4 (the block rotated by T/2 without the
// tail-biting constraint, whose state at the original t = 0 fixes the overlap; then the block itself
// constrained to it), the same float operations in the same order as quant::TrellisViterbi, so the paths are
// bit-identical to the CPU encoder's (the test checks them).
//
// Per step, thread q (q = tid + 256·i) takes the minimum of its 2^k predecessors q + j·Q (strict <, so the
// lowest j wins ties, as on the CPU), the warp writes m + fma(-2x, v[s], v²[s]) for its q's 2^k states each
// (s = q << k | b, stored by consecutive lanes), and its argmin's k bits go to shared memory as k warp
// ballots (bit plane i of 32 consecutive q per word): the
// back-pointers of a block are T·Q·k bits (64 KB at k = 2, 48 at 3, 32 at 4), the two cost rows 32 KB. The
// end state is the lowest-index minimum (a block reduction), and one thread walks the path back.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/trellis.h"
#include "quant/trellis.h"

namespace arbor::cuda {

namespace {

constexpr int kVL = 12, kVS = 1 << kVL, kVT = 256, kVThreads = 256;

template <int K>
constexpr size_t viterbi_smem() {
  return size_t(2 * kVS) * 4 + size_t(kVT) * K * ((kVS >> K) / 32) * 4;
}

template <int K>
__global__ void __launch_bounds__(kVThreads)
    trellis_viterbi_kernel(const float* __restrict__ targets, int64_t blocks, const float* __restrict__ value,
                           const float* __restrict__ value_sq, uint16_t* __restrict__ states_out) {
  constexpr int Q = kVS >> K, FAN = 1 << K, QW = Q / 32, half = kVT / 2;
  extern __shared__ __align__(16) uint32_t vt_smem[];
  float* cost = reinterpret_cast<float*>(vt_smem);  // [2][kVS]
  uint32_t* bp = vt_smem + 2 * kVS;                 // [kVT][K][QW]
  __shared__ float xs[kVT];
  __shared__ uint16_t st[kVT];
  __shared__ float red_c[kVThreads / 32];
  __shared__ int red_i[kVThreads / 32];
  __shared__ int overlap_sh;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float inf = __int_as_float(0x7f800000);
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const float* x = targets + blk * kVT;
    for (int pass = 0; pass < 2; ++pass) {
      const int overlap = pass == 0 ? -1 : overlap_sh;
      xs[tid] = pass == 0 ? x[(tid + half) % kVT] : x[tid];  // kVThreads == kVT
      __syncthreads();
      float* prev = cost;
      float* cur = cost + kVS;
      const float x0 = -2.0f * xs[0];
      for (int s = tid; s < kVS; s += kVThreads)
        prev[s] = overlap < 0 || (s >> K) == overlap ? fmaf(x0, __ldg(value + s), __ldg(value_sq + s)) : inf;
      __syncthreads();
      for (int t = 1; t < kVT; ++t) {
        const float x2n = -2.0f * xs[t];
        for (int q = tid; q < Q; q += kVThreads) {
          float m = prev[q];
          int arg = 0;
#pragma unroll
          for (int j = 1; j < FAN; ++j) {
            const float c = prev[q + j * Q];
            if (c < m) m = c, arg = j;
          }
#pragma unroll
          for (int i = 0; i < K; ++i) {
            const uint32_t word = __ballot_sync(0xffffffffu, (arg >> i) & 1);
            if (lane == 0) bp[(t * K + i) * QW + q / 32] = word;
          }
          // The warp's 32 q own 32·2^K consecutive states; lane l writes state (q0 << K) + 32g + l of each group g,
          // taking its q's minimum from lane (32g + l) >> K: conflict-free stores, coalesced table reads.
          const int s0 = (q - lane) << K;
#pragma unroll
          for (int g = 0; g < FAN; ++g) {
            const float mm = __shfl_sync(0xffffffffu, m, (32 * g + lane) >> K);
            const int s = s0 + 32 * g + lane;
            cur[s] = mm + fmaf(x2n, __ldg(value + s), __ldg(value_sq + s));
          }
        }
        __syncthreads();
        float* tmp = prev;
        prev = cur, cur = tmp;
      }
      // The end state: the lowest index among the minima (any state, or the 2^k whose low L-k bits are the overlap).
      float bc = inf;
      int bi = -1;
      for (int s = tid; s < kVS; s += kVThreads) {
        if (overlap >= 0 && (s & (Q - 1)) != overlap) continue;
        if (prev[s] < bc) bc = prev[s], bi = s;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float c2 = __shfl_xor_sync(0xffffffffu, bc, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        if (c2 < bc || (c2 == bc && i2 >= 0 && (bi < 0 || i2 < bi))) bc = c2, bi = i2;
      }
      if (lane == 0) red_c[warp] = bc, red_i[warp] = bi;
      __syncthreads();
      if (tid == 0) {
        for (int w = 1; w < kVThreads / 32; ++w)
          if (red_c[w] < bc || (red_c[w] == bc && red_i[w] >= 0 && (bi < 0 || red_i[w] < bi))) bc = red_c[w], bi = red_i[w];
        uint32_t s = bi < 0 ? 0u : uint32_t(bi);  // no finite path: the host rejects non-finite targets first
        for (int t = kVT - 1; t >= 0; --t) {
          st[t] = uint16_t(s);
          if (t > 0) {
            const uint32_t q = s >> K;
            uint32_t arg = 0;
#pragma unroll
            for (int i = 0; i < K; ++i) arg |= ((bp[(t * K + i) * QW + q / 32] >> (q % 32)) & 1u) << i;
            s = q + (arg << (kVL - K));
          }
        }
        if (pass == 0) overlap_sh = int(st[kVT - half] >> K);
      }
      __syncthreads();
    }
    states_out[blk * kVT + tid] = st[tid];
    __syncthreads();
  }
}

template <int K>
void run_viterbi(const float* d_targets, int64_t blocks, const float* d_value, const float* d_value_sq, uint16_t* d_states, int n_sms) {
  static bool attr = false;
  if (!attr) {
    ARBOR_CUDA_CHECK(cudaFuncSetAttribute(trellis_viterbi_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(viterbi_smem<K>())));
    attr = true;
  }
  const unsigned grid = unsigned(std::min<int64_t>(blocks, int64_t(n_sms) * 2));
  trellis_viterbi_kernel<K><<<grid, kVThreads, viterbi_smem<K>()>>>(d_targets, blocks, d_value, d_value_sq, d_states);
  ARBOR_LAUNCH_CHECK("trellis_viterbi_kernel");
}

}  // namespace

void cuda_trellis_viterbi(int k, const float* targets, int64_t blocks, uint16_t* states) {
  ARBOR_CU_CHECK(k >= 2 && k <= 4, "cuda: trellis viterbi: k = %d (2, 3, 4)", k);
  ARBOR_CU_CHECK(blocks >= 0, "cuda: trellis viterbi: %lld blocks", (long long)blocks);
  if (blocks == 0) return;
  int dev = 0, n_sms = 0;
  ARBOR_CUDA_CHECK(cudaGetDevice(&dev));
  ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev));
  // The code table and its squares as the CPU encoder holds them (f32 values, f32 products).
  const std::vector<float> v = quant::trellis_code_table(kVL);
  std::vector<float> v2(v.size());
  for (size_t s = 0; s < v.size(); ++s) v2[s] = v[s] * v[s];
  constexpr int64_t kChunk = 1 << 16;  // blocks per upload: 64 MiB of targets
  const int64_t chunk = std::min(blocks, kChunk);
  float *d_v = nullptr, *d_v2 = nullptr, *d_x = nullptr;
  uint16_t* d_st = nullptr;
  ARBOR_CUDA_CHECK(cudaMalloc(&d_v, v.size() * 4));
  ARBOR_CUDA_CHECK(cudaMalloc(&d_v2, v.size() * 4));
  ARBOR_CUDA_CHECK(cudaMalloc(&d_x, size_t(chunk) * kVT * 4));
  ARBOR_CUDA_CHECK(cudaMalloc(&d_st, size_t(chunk) * kVT * 2));
  ARBOR_CUDA_CHECK(cudaMemcpy(d_v, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  ARBOR_CUDA_CHECK(cudaMemcpy(d_v2, v2.data(), v2.size() * 4, cudaMemcpyHostToDevice));
  for (int64_t b0 = 0; b0 < blocks; b0 += chunk) {
    const int64_t n = std::min(chunk, blocks - b0);
    ARBOR_CUDA_CHECK(cudaMemcpy(d_x, targets + b0 * kVT, size_t(n) * kVT * 4, cudaMemcpyHostToDevice));
    if (k == 2) run_viterbi<2>(d_x, n, d_v, d_v2, d_st, n_sms);
    else if (k == 3) run_viterbi<3>(d_x, n, d_v, d_v2, d_st, n_sms);
    else run_viterbi<4>(d_x, n, d_v, d_v2, d_st, n_sms);
    ARBOR_CUDA_CHECK(cudaMemcpy(states + b0 * kVT, d_st, size_t(n) * kVT * 2, cudaMemcpyDeviceToHost));
  }
  cudaFree(d_v), cudaFree(d_v2), cudaFree(d_x), cudaFree(d_st);
}

}  // namespace arbor::cuda
