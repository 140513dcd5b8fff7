// Sampling on the GPU: greedy argmax (several blocks per row), and seeded temperature / top-k / top-p /
// min-p (a thread-block cluster of up to 16 blocks per row on sm_90, one block elsewhere). Filters are
// thresholds on the (order-preserving) float keys found by radix select, so nothing is sorted: top-k
// keeps keys >= the k-th largest; top-p keeps the largest keys whose mass reaches top_p; min-p keeps
// p >= min_p * p_max. Ties at a threshold are all kept.
#include <cuda_runtime.h>

#include <cooperative_groups.h>

#include <atomic>
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

// ---- seeded draws ----------------------------------------------------------------------------------
// One thread-block cluster per row (sm_90; a cluster of one elsewhere): block `rank` of the cluster
// owns a contiguous part of the row, and every reduction over the row (the max, the filters' masses,
// the radix histograms, the draw's prefix) is reduced across the cluster's blocks through distributed
// shared memory, so a row's passes run on up to kSampleMaxCluster SMs at once (launch_sample).
//
// The top-k and top-p thresholds: the largest key t with W(keys >= t) >= target, where W sums a
// weight over the row's elements whose key is >= floor (top-k: 1 each; top-p: fixed-point
// probabilities). Such a t is a key of the row; three passes find its digits (11, 11 and 10 bits, high
// first) from histograms of W, each pass over the elements under the digits found so far.
constexpr int kRadixBins = 2048;
constexpr uint32_t kNoBin = 0xffffffffu;
struct SampleSmem {
  uint64_t hist[kRadixBins];    // this block's histogram of the pass
  uint64_t merged[kRadixBins];  // bins [rank * S, (rank + 1) * S) summed over the cluster, S = kRadixBins / size
  uint64_t part[kThreads / 32];
  MaxIdx mi[kThreads / 32];
  MaxIdx top;     // this block's (max, id), read by the cluster
  uint64_t z;     // this block's top-p mass
  uint64_t total;  // this block's kept mass in the draw
  uint64_t carry;
  uint32_t digit;
  int found;
  int32_t chosen;
};

// The cluster of this block (size 1 without clusters).
struct Cluster {
  int rank = 0, size = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __device__ Cluster() {
    namespace cg = cooperative_groups;
    rank = int(cg::this_cluster().block_rank()), size = int(cg::this_cluster().num_blocks());
  }
  __device__ void sync() const {
    if (size > 1) cooperative_groups::this_cluster().sync();
    else __syncthreads();
  }
  template <typename T>
  __device__ T* at(T* p, int r) const {
    return size > 1 ? cooperative_groups::this_cluster().map_shared_rank(p, r) : p;
  }
#else
  __device__ Cluster() {}
  __device__ void sync() const { __syncthreads(); }
  template <typename T>
  __device__ T* at(T* p, int) const {
    return p;
  }
#endif
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

// Over this block's part [lo, hi) of the row; the same result in every block of the cluster. 0 when
// W(keys >= floor) < target.
template <typename Weight>
__device__ uint32_t radix_select(const float* row, int64_t lo, int64_t hi, float inv_temp, uint32_t floor, uint64_t target, Weight weight,
                                 SampleSmem& sm, const Cluster& cl) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, slice = kRadixBins / cl.size;
  uint32_t prefix = 0;  // the digits found so far
  uint64_t carry = 0;   // W of the keys above the prefix's range
#pragma unroll 1
  for (int p = 0; p < 3; ++p) {
    const int shift = p == 0 ? 21 : p == 1 ? 10 : 0, bits = p == 2 ? 10 : 11, nb = 1 << bits;
    for (int b = threadIdx.x; b < kRadixBins; b += blockDim.x) sm.hist[b] = 0;
    if (threadIdx.x == 0) sm.found = 0;
    __syncthreads();
    for (int64_t base = lo + int64_t(warp) * 32; base < hi; base += blockDim.x) {  // uniform per warp
      const int64_t i = base + lane;
      uint32_t bin = kNoBin;
      uint64_t w = 0;
      if (i < hi) {
        const float x = row[i] * inv_temp;
        const uint32_t key = fkey(x);
        if (key >= floor && (uint64_t(key) >> (shift + bits)) == prefix) {
          w = weight(x);
          if (w) bin = (key >> shift) & uint32_t(nb - 1);
        }
      }
      hist_add(sm.hist, bin, w, lane);
    }
    cl.sync();  // every block's histogram is complete
    for (int b = threadIdx.x; b < slice; b += blockDim.x) {
      uint64_t v = 0;
      for (int q = 0; q < cl.size; ++q) v += cl.at(sm.hist, q)[cl.rank * slice + b];
      sm.merged[b] = v;
    }
    cl.sync();  // every slice is merged (and no histogram is read any more)
    auto merged = [&](int b) { return b < 0 ? uint64_t(0) : cl.at(sm.merged, b / slice)[b % slice]; };
    // Thread t owns bins nb-1-2t and nb-2-2t (from the top); W above them by an exclusive scan.
    const int b0 = nb - 1 - 2 * int(threadIdx.x), b1 = b0 - 1;
    const uint64_t h0 = merged(b0), h1 = merged(b1);
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
    if (!found) return 0;  // the same in every block
  }
  return prefix;
}

// Grid: rows x cluster size blocks along x, a row's blocks one cluster.
__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t vocab, const SampleRow* params, int32_t* ids,
                                                          int32_t* host_ids, int cluster) {
  pdl_trigger();
  pdl_wait();
  __shared__ SampleSmem sm;
  const Cluster cl;  // rows are counted with the launch's cluster size: cl.size is 1 in the PTX (pre-sm_90) build
  const int64_t r = blockIdx.x / cluster;
  const SampleRow pr = params[r];
  const int32_t top_k = pr.top_k;
  const float top_p = pr.top_p, min_p = pr.min_p;
  const float* row = logits + r * vocab;
  const int64_t per = (vocab + cl.size - 1) / cl.size, lo = min(vocab, cl.rank * per), hi = min(vocab, lo + per);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // The row's (max, lowest id of the max): this block's part, then over the cluster.
  MaxIdx best{-INFINITY, INT32_MAX};
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) best = better(best, MaxIdx{row[i], int32_t(i)});
  for (int o = 16; o > 0; o >>= 1) best = better(best, MaxIdx{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)});
  if (lane == 0) sm.mi[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxIdx b = sm.mi[0];
    for (int w = 1; w < int(blockDim.x / 32); ++w) b = better(b, sm.mi[w]);
    sm.top = b;
  }
  cl.sync();
  MaxIdx top = *cl.at(&sm.top, 0);
  for (int q = 1; q < cl.size; ++q) top = better(top, *cl.at(&sm.top, q));
  const int32_t top_id = top.i == INT32_MAX ? 0 : top.i;
  auto write_id = [&](int32_t id) {
    ids[r] = id;
    if (host_ids) host_ids[r] = id;
  };

  // Logits scaled by 1/temperature; inv_temp > 0 keeps their order, so the argmax is the row's.
  const float inv_temp = 1.0f / pr.temperature;
  const float m = top.v * inv_temp;
  if (!(pr.temperature > 0) || !(m > -INFINITY && m < INFINITY)) {  // a greedy row (or no finite logit: the top id)
    if (cl.rank == 0 && threadIdx.x == 0) write_id(top_id);
    cl.sync();  // no block leaves while another may read its shared memory
    return;
  }

  // Probabilities relative to the top one, in fixed point (2^-40: below counts as 0). Sums of them
  // are exact in any order, so a row's thresholds and draw do not depend on how it is cut over blocks.
  auto mass = [m](float x) { return __float2ull_rn(__expf(x - m) * 1099511627776.0f); };
  // Thresholds on the keys fkey(x), each found by a radix select (three passes over the row).
  uint32_t kmin = 0;  // kept: fkey(x) >= kmin
  if (top_k > 0 && top_k < vocab) kmin = radix_select(row, lo, hi, inv_temp, 0, uint64_t(top_k), [](float) { return uint64_t(1); }, sm, cl);
  if (top_p < 1.0f) {
    uint64_t z = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const float x = row[i] * inv_temp;
      if (fkey(x) >= kmin) z += mass(x);
    }
    z = block_reduce(z, [](uint64_t a, uint64_t b) { return a + b; }, sm.part);
    if (threadIdx.x == 0) sm.z = z;
    cl.sync();
    uint64_t zall = 0;
    for (int q = 0; q < cl.size; ++q) zall += *cl.at(&sm.z, q);
    const uint64_t target = uint64_t(ceil(double(top_p) * double(zall)));
    // Largest P with mass(keys >= max(P, kmin)) >= target.
    const uint32_t res = radix_select(row, lo, hi, inv_temp, kmin, target, mass, sm, cl);
    kmin = res > kmin ? res : kmin;
  }
  const float pmin = min_p > 0 ? min_p : 0.0f;  // p / p_max = exp(x - m)
  auto kept = [&](float x) { return fkey(x) >= kmin && __expf(x - m) >= pmin ? mass(x) : uint64_t(0); };

  // Draw u in [0, kept mass) and walk the kept tokens in id order: each block owns its part of the
  // row, each thread a contiguous chunk of that. The top token is always kept (mass 2^40).
  const int64_t n = hi - lo, chunk = (n + blockDim.x - 1) / blockDim.x;
  const int64_t c0 = lo + min(n, int64_t(threadIdx.x) * chunk), c1 = min(hi, c0 + chunk);
  uint64_t mine = 0;
  for (int64_t i = c0; i < c1; ++i) mine += kept(row[i] * inv_temp);
  // Exclusive prefix of the chunk sums (warp scan, then the warps' totals), then of the blocks'.
  uint64_t incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) sm.part[warp] = incl;
  if (threadIdx.x == 0) sm.chosen = -1;
  __syncthreads();
  uint64_t before = incl - mine, block_total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) {
    if (w < warp) before += sm.part[w];
    block_total += sm.part[w];
  }
  if (threadIdx.x == 0) sm.total = block_total;
  cl.sync();
  uint64_t offset = 0, total = 0;
  for (int q = 0; q < cl.size; ++q) {
    const uint64_t t = *cl.at(&sm.total, q);
    if (q < cl.rank) offset += t;
    total += t;
  }
  const uint64_t h = mix64(mix64(pr.seed ^ 0x9E3779B97F4A7C15ull) + pr.step * 0xD1B54A32D192ED03ull);
  const uint64_t u = __umul64hi(h, total);  // uniform in [0, total)
  // The block whose range holds u; nothing kept (min_p above 1): the first block gives the top id.
  const bool owner = total == 0 ? cl.rank == 0 : u >= offset && u < offset + block_total;
  before += offset;
  if (owner && u >= before && u < before + mine) {
    uint64_t acc = before;
    for (int64_t i = c0; i < c1; ++i) {
      acc += kept(row[i] * inv_temp);
      if (u < acc) {
        sm.chosen = int32_t(i);
        break;
      }
    }
  }
  __syncthreads();
  if (owner && threadIdx.x == 0) write_id(sm.chosen >= 0 ? sm.chosen : top_id);
  cl.sync();  // no block leaves while another may read its shared memory
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

int sample_max_cluster() {
  // sm_90 only: the kernel's cluster code is in the sm_90a build; another GPU runs the PTX, whose
  // blocks would each take a whole row. The answer is looked up once per device.
  static std::atomic<int> cached[64] = {};  // 0 = not asked yet
  int dev = 0;
  ARBOR_CUDA_CHECK(cudaGetDevice(&dev));
  if (current_device_cc() / 10 != 9 || dev >= 64) return 1;
  if (const int c = cached[dev].load(std::memory_order_relaxed)) return c;
  int best = 1;
  ARBOR_CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  for (int c = kSampleMaxCluster; c > 1 && best == 1; c /= 2) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = unsigned(c), attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(c)), cfg.blockDim = dim3(kThreads), cfg.attrs = &attr, cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, sample_kernel, &cfg) == cudaSuccess && n > 0) best = c;
    else cudaGetLastError();
  }
  cached[dev].store(best, std::memory_order_relaxed);
  return best;
}

static int forced_cluster = 0;
void set_sample_cluster(int c) { forced_cluster = c; }

void launch_sample(const float* logits, int64_t rows, int64_t vocab, const SampleRow* params, int32_t* ids, int32_t* host_ids,
                   int n_sms, cudaStream_t s) {
  if (rows == 0) return;
  ARBOR_CU_CHECK(vocab > 0 && vocab < INT32_MAX && rows <= INT32_MAX / kSampleMaxCluster, "cuda: sample: %lld rows of %lld", (long long)rows,
                 (long long)vocab);
  // As many blocks per row as leave every row's cluster a place at once (1 block of 1024 threads per SM).
  int c = sample_max_cluster();
  if (forced_cluster > 0) {
    while (c > forced_cluster) c /= 2;
  } else {
    while (c > 1 && rows * c > n_sms) c /= 2;
  }
  if (c > 1)
    pdl_launch_cluster(sample_kernel, unsigned(rows * c), kThreads, 0, s, dim3(unsigned(c), 1, 1), logits, vocab, params, ids, host_ids, c);
  else
    pdl_launch(sample_kernel, unsigned(rows), kThreads, 0, s, logits, vocab, params, ids, host_ids, 1);
  ARBOR_LAUNCH_CHECK("sample_kernel");
}

}  // namespace arbor::cuda
