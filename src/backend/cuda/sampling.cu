// Sampling on the GPU, one block per row of logits: greedy argmax, and seeded temperature / top-k /
// top-p / min-p. Filters are thresholds found by bisection on the bits of the (order-preserving)
// float keys, so nothing is sorted: top-k keeps keys >= the k-th largest; top-p keeps the largest
// keys whose mass reaches top_p; min-p keeps p >= min_p * p_max. Ties at a threshold are all kept.
#include <cuda_runtime.h>

#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.h"

namespace arbor::cuda {

namespace {

constexpr int kThreads = 1024;

// Order-preserving map of a float to uint32: a < b  <=>  key(a) < key(b).
__device__ __forceinline__ uint32_t fkey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* red) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // red may still be read by the previous reduction
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  T r = red[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w) r = op(r, red[w]);
  return r;
}

struct MaxIdx {
  float v;
  int32_t i;
};

__device__ __forceinline__ MaxIdx better(MaxIdx a, MaxIdx b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

// (max, lowest index of the max) of row[0..n)
__device__ MaxIdx row_argmax(const float* row, int64_t n, MaxIdx* red) {
  MaxIdx best{-INFINITY, INT32_MAX};
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) best = better(best, MaxIdx{row[i], int32_t(i)});
  for (int o = 16; o > 0; o >>= 1) {
    MaxIdx other{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)};
    best = better(best, other);
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = best;
  __syncthreads();
  MaxIdx r = red[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w) r = better(r, red[w]);
  return r;
}

// Greedy ids over several blocks per row: block b of row r reduces its kArgmaxChunk logits to one key
// (value, then lowest id), and the last block of the row to finish (a counter per row, reset by that
// block) reduces the row's keys and writes the id. One block per row read 128k logits one SM at a time
// (≈ 15 µs of a batch-1 step); 32 blocks read them at once.
constexpr int kArgmaxThreads = 256, kArgmaxPerThread = 16, kArgmaxChunk = kArgmaxThreads * kArgmaxPerThread;

// The key of logit v at id i: larger v first, then the lower id; NaN is never chosen (key 0, the key
// of "nothing": a row of NaNs gives id 0).
__device__ __forceinline__ uint64_t argmax_key(float v, int64_t i) {
  return v != v ? 0ull : (uint64_t(fkey(v)) << 32) | uint64_t(~uint32_t(i));
}
__device__ __forceinline__ int32_t argmax_id(uint64_t key) { return key == 0 ? 0 : int32_t(~uint32_t(key)); }


__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t vocab, uint64_t* part, unsigned* counters,
                                                                int32_t* ids, int32_t* host_ids) {
  pdl_trigger();
  pdl_wait();
  __shared__ uint64_t red[kArgmaxThreads / 32];
  __shared__ bool last;
  const int nb = gridDim.x, r = blockIdx.y;
  const float* row = logits + int64_t(r) * vocab;
  const int64_t c0 = int64_t(blockIdx.x) * kArgmaxChunk;
  float v[kArgmaxPerThread];
#pragma unroll
  for (int j = 0; j < kArgmaxPerThread; ++j) {  // every load issued before the first compare
    const int64_t i = c0 + j * kArgmaxThreads + threadIdx.x;
    v[j] = i < vocab ? __ldcg(row + i) : __int_as_float(0x7fc00000);  // NaN: no candidate
  }
  uint64_t k = 0;
#pragma unroll
  for (int j = 0; j < kArgmaxPerThread; ++j) k = max(k, argmax_key(v[j], c0 + j * kArgmaxThreads + threadIdx.x));
  auto kmax = [](uint64_t a, uint64_t b) { return a > b ? a : b; };
  k = block_reduce(k, kmax, red);
  auto finish = [&](uint64_t key) {
    if (threadIdx.x != 0) return;
    ids[r] = argmax_id(key);
    if (host_ids) host_ids[r] = argmax_id(key);
  };
  if (nb == 1) return finish(k);
  if (threadIdx.x == 0) {
    part[int64_t(r) * nb + blockIdx.x] = k;
    __threadfence();  // the key is visible before the block is counted
    last = atomicAdd(counters + r, 1u) == unsigned(nb - 1);
    if (last) counters[r] = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  uint64_t m = 0;
  for (int b = threadIdx.x; b < nb; b += kArgmaxThreads) m = max(m, __ldcg(part + int64_t(r) * nb + b));
  finish(block_reduce(m, kmax, red));
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t vocab, const SampleRow* params, int32_t* ids,
                                                          int32_t* host_ids) {
  pdl_trigger();
  pdl_wait();
  const SampleRow pr = params[blockIdx.x];
  const int32_t top_k = pr.top_k;
  const float top_p = pr.top_p, min_p = pr.min_p;
  __shared__ MaxIdx red_mi[32];
  __shared__ float red_f[32];
  __shared__ double red_d[32];
  __shared__ unsigned red_u[32];
  __shared__ int32_t chosen;
  const float* row = logits + blockIdx.x * vocab;
  auto sumd = [](double a, double b) { return a + b; };
  auto sumu = [](unsigned a, unsigned b) { return a + b; };

  // Logits scaled by 1/temperature; inv_temp > 0 keeps their order, so the argmax is the row's.
  const MaxIdx top = row_argmax(row, vocab, red_mi);
  if (!(pr.temperature > 0)) {  // a greedy row
    if (threadIdx.x == 0) {
      const int32_t id = top.i == INT32_MAX ? 0 : top.i;
      ids[blockIdx.x] = id;
      if (host_ids) host_ids[blockIdx.x] = id;
    }
    return;
  }
  const float inv_temp = 1.0f / pr.temperature;
  const float m = top.v * inv_temp;

  uint32_t kmin = 0;  // kept: fkey(x) >= kmin
  if (top_k > 0 && top_k < vocab) {
    uint32_t res = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = res | (1u << bit);
      unsigned c = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) c += fkey(row[i] * inv_temp) >= cand;
      if (block_reduce(c, sumu, red_u) >= unsigned(top_k)) res = cand;
    }
    kmin = res;
  }
  if (top_p < 1.0f) {
    double z = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float x = row[i] * inv_temp;
      if (fkey(x) >= kmin) z += __expf(x - m);
    }
    const double target = double(top_p) * block_reduce(z, sumd, red_d);
    // Largest P with mass(keys >= max(P, kmin)) >= target: the predicate falls as P grows.
    uint32_t res = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = res | (1u << bit), lim = cand > kmin ? cand : kmin;
      double s = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = row[i] * inv_temp;
        if (fkey(x) >= lim) s += __expf(x - m);
      }
      if (block_reduce(s, sumd, red_d) >= target) res = cand;
    }
    kmin = res > kmin ? res : kmin;
  }
  const float pmin = min_p > 0 ? min_p : 0.0f;  // p / p_max = exp(x - m)

  // Draw u in [0, mass) and walk the kept tokens in id order: each thread owns a contiguous chunk.
  const int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t c0 = threadIdx.x * chunk < vocab ? threadIdx.x * chunk : vocab, c1 = c0 + chunk < vocab ? c0 + chunk : vocab;
  float mine = 0;
  for (int64_t i = c0; i < c1; ++i) {
    const float x = row[i] * inv_temp, p = __expf(x - m);
    if (fkey(x) >= kmin && p >= pmin) mine += p;
  }
  // Exclusive prefix of the chunk sums (warp scan, then the warps' totals).
  float incl = mine;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 1; o < 32; o <<= 1) {
    const float v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  __syncthreads();
  if (lane == 31) red_f[warp] = incl;
  if (threadIdx.x == 0) chosen = -1;
  __syncthreads();
  float before = incl - mine, total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) {
    if (w < warp) before += red_f[w];
    total += red_f[w];
  }
  const uint64_t h = mix64(mix64(pr.seed ^ 0x9E3779B97F4A7C15ull) + pr.step * 0xD1B54A32D192ED03ull);
  const float u = float(double(h >> 11) * (1.0 / 9007199254740992.0)) * total;
  if (mine > 0 && u >= before && u < before + mine) {
    float acc = before;
    int32_t pick = -1;
    for (int64_t i = c0; i < c1; ++i) {
      const float x = row[i] * inv_temp, p = __expf(x - m);
      if (fkey(x) >= kmin && p >= pmin) {
        pick = int32_t(i);
        acc += p;
        if (u < acc) break;
      }
    }
    chosen = pick;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t id = chosen >= 0 ? chosen : (top.i == INT32_MAX ? 0 : top.i);  // rounding at the end: the top token
    ids[blockIdx.x] = id;
    if (host_ids) host_ids[blockIdx.x] = id;
  }
}

}  // namespace

int64_t argmax_blocks(int64_t vocab) { return (vocab + kArgmaxChunk - 1) / kArgmaxChunk; }

void launch_argmax(const float* logits, int64_t rows, int64_t vocab, uint64_t* part, unsigned* counters, int32_t* ids, int32_t* host_ids,
                   cudaStream_t s) {
  if (rows == 0) return;
  ARBOR_CU_CHECK(vocab > 0 && vocab < INT32_MAX && rows <= 65535, "cuda: argmax: %lld rows of %lld", (long long)rows, (long long)vocab);
  const int64_t nb = argmax_blocks(vocab);
  ARBOR_CU_CHECK(nb == 1 || (part && counters), "cuda: argmax: %lld blocks per row need partials and counters", (long long)nb);
  pdl_launch(argmax_kernel, dim3(unsigned(nb), unsigned(rows)), kArgmaxThreads, 0, s, logits, vocab, part, counters, ids, host_ids);
  ARBOR_LAUNCH_CHECK("argmax_kernel");
}

void launch_sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* ids, int32_t* host_ids,
                   cudaStream_t s) {
  if (rows == 0) return;
  ARBOR_CU_CHECK(vocab > 0 && vocab < INT32_MAX && rows <= INT32_MAX, "cuda: sample: %lld rows of %lld", (long long)rows, (long long)vocab);
  pdl_launch(sample_kernel, unsigned(rows), kThreads, 0, s, logits, vocab, params, ids, host_ids);
  ARBOR_LAUNCH_CHECK("sample_kernel");
}

}  // namespace arbor::cuda
