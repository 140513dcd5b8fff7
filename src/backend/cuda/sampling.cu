// Sampling on the GPU: greedy argmax (several blocks per row), and seeded temperature / top-k / top-p /
// min-p (one block per row). Filters are thresholds on the (order-preserving) float keys found by
// radix select, so nothing is sorted: top-k keeps keys >= the k-th largest; top-p keeps the largest
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

// ---- radix select --------------------------------------------------------------------------------
// The top-k and top-p thresholds: the largest key t with W(keys >= t) >= target, where W sums a
// weight over the row's elements whose key is >= floor (top-k: 1 each; top-p: fixed-point
// probabilities). Such a t is a key of the row; three passes find its digits (11, 11 and 10 bits, high
// first) from histograms of W in shared memory, each pass over the elements under the digits found.
constexpr int kRadixBins = 2048;
constexpr uint32_t kNoBin = 0xffffffffu;
struct RadixSmem {
  uint64_t hist[kRadixBins];
  uint64_t part[kThreads / 32];
  uint64_t carry;
  uint32_t digit;
  int found;
};

// hist[bin] += w for every lane with a bin (w < 2^40). Lanes that share a bin are summed first (the
// largest groups, up to 4, with warp reductions), so that a bin most of the row falls into does not
// serialise 32 atomics per warp; the rest add one by one.
__device__ __forceinline__ void hist_add(uint64_t* hist, uint32_t bin, uint64_t w, int lane) {
  unsigned todo = __ballot_sync(0xffffffffu, bin != kNoBin);
  for (int it = 0; it < 4 && todo; ++it) {  // todo is the same in every lane
    const int leader = __ffs(int(todo)) - 1;
    const uint32_t b = __shfl_sync(0xffffffffu, bin, leader);
    const bool mine = bin == b;
    const unsigned group = __ballot_sync(0xffffffffu, mine);
    const unsigned lo = __reduce_add_sync(0xffffffffu, mine ? unsigned(w & 0xffffffu) : 0u);
    const unsigned hi = __reduce_add_sync(0xffffffffu, mine ? unsigned(w >> 24) : 0u);
    if (lane == leader) atomicAdd(reinterpret_cast<unsigned long long*>(hist + b), (uint64_t(hi) << 24) + lo);
    todo &= ~group;
  }
  if ((todo >> lane) & 1u) atomicAdd(reinterpret_cast<unsigned long long*>(hist + bin), w);
}

// 0 when W(keys >= floor) < target.
template <typename Weight>
__device__ uint32_t radix_select(const float* row, int64_t vocab, float inv_temp, uint32_t floor, uint64_t target, Weight weight,
                                 RadixSmem& sm) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t prefix = 0;  // the digits found so far
  uint64_t carry = 0;   // W of the keys above the prefix's range
#pragma unroll 1
  for (int p = 0; p < 3; ++p) {
    const int shift = p == 0 ? 21 : p == 1 ? 10 : 0, bits = p == 2 ? 10 : 11, nb = 1 << bits;
    for (int b = threadIdx.x; b < kRadixBins; b += blockDim.x) sm.hist[b] = 0;
    if (threadIdx.x == 0) sm.found = 0;
    __syncthreads();
    for (int64_t base = int64_t(warp) * 32; base < vocab; base += blockDim.x) {  // uniform per warp
      const int64_t i = base + lane;
      uint32_t bin = kNoBin;
      uint64_t w = 0;
      if (i < vocab) {
        const float x = row[i] * inv_temp;
        const uint32_t key = fkey(x);
        if (key >= floor && (uint64_t(key) >> (shift + bits)) == prefix) {
          w = weight(x);
          if (w) bin = (key >> shift) & uint32_t(nb - 1);
        }
      }
      hist_add(sm.hist, bin, w, lane);
    }
    __syncthreads();
    // Thread t owns bins nb-1-2t and nb-2-2t (from the top); W above them by an exclusive scan.
    const int b0 = nb - 1 - 2 * int(threadIdx.x), b1 = b0 - 1;
    const uint64_t h0 = b0 >= 0 ? sm.hist[b0] : 0, h1 = b1 >= 0 ? sm.hist[b1] : 0;
    uint64_t incl = h0 + h1;
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) sm.part[warp] = incl;
    __syncthreads();
    uint64_t above = carry + incl - h0 - h1;
    for (int v = 0; v < warp; ++v) above += sm.part[v];
    if (above < target) {
      if (above + h0 >= target) sm.digit = uint32_t(b0), sm.carry = above, sm.found = 1;
      else if (b1 >= 0 && above + h0 + h1 >= target) sm.digit = uint32_t(b1), sm.carry = above + h0, sm.found = 1;
    }
    __syncthreads();
    const bool found = sm.found != 0;
    prefix = (prefix << bits) | sm.digit;
    carry = sm.carry;
    __syncthreads();  // read before the next pass resets them
    if (!found) return 0;
  }
  return prefix;
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
  __shared__ RadixSmem sel;
  __shared__ int32_t chosen;
  const float* row = logits + blockIdx.x * vocab;

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

  // Thresholds on the keys fkey(x), each found by a radix select (three passes over the row).
  uint32_t kmin = 0;  // kept: fkey(x) >= kmin
  if (top_k > 0 && top_k < vocab) kmin = radix_select(row, vocab, inv_temp, 0, uint64_t(top_k), [](float) { return uint64_t(1); }, sel);
  if (top_p < 1.0f) {
    // Probabilities relative to the top one, in fixed point (sums are exact, so the same row always
    // gives the same thresholds); below 2^-40 counts as 0.
    auto mass = [m](float x) { return __float2ull_rn(__expf(x - m) * 1099511627776.0f); };
    uint64_t z = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float x = row[i] * inv_temp;
      if (fkey(x) >= kmin) z += mass(x);
    }
    z = block_reduce(z, [](uint64_t a, uint64_t b) { return a + b; }, sel.part);
    const uint64_t target = uint64_t(ceil(double(top_p) * double(z)));
    // Largest P with mass(keys >= max(P, kmin)) >= target.
    const uint32_t res = radix_select(row, vocab, inv_temp, kmin, target, mass, sel);
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
